"""One module per command (history and legacy share one): each adds its parser with
`add_parser(sub, common)` and runs with `run(args, err) -> exit code`."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mdclient.client import Client
    from mdclient.config import ClientSettings

Subparsers = argparse._SubParsersAction  # argparse's own type of `add_subparsers()`


def open_client(settings: ClientSettings) -> Client:
    """The SDK client, imported only by the commands that talk to a relay."""
    from mdclient.client import Client

    return Client(settings=settings)
