"""`mdclient recording [EXCHANGE]`: what the platform records, per market its stored
trades and gaps. Reads Iceberg only (no relay), like `markets`. The notes (gap counts
unknown, each unrepairable gap) follow the table on stdout; after CSV or JSON they go
to stderr."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from mdclient.cli.args import settings_from_args
from mdclient.cli.commands import Subparsers
from mdclient.cli.output import (
    recording_notes,
    recording_table,
    stdout_console,
    write_recording_csv,
)
from mdclient.exit_codes import ExitCode

if TYPE_CHECKING:
    from rich.console import Console


def add_parser(sub: Subparsers[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    recording = sub.add_parser(
        "recording",
        parents=[common],
        help="what the platform records: per market its stored trades and gaps (Iceberg)",
        description="Per ticker with trades in market.ticks or gaps in market.gaps: the "
        "oldest and newest stored trade, trades of the current UTC day, and gaps open, "
        "repairing, repaired and unrepairable (each unrepairable one with its reason).",
    )
    recording.add_argument("exchange", nargs="?", help="e.g. BINANCE (default: every exchange)")
    recording.add_argument(
        "--format",
        choices=["table", "csv", "json"],
        default="table",
        help="table (default), or csv / json on stdout for scripts",
    )


def run(args: argparse.Namespace, err: Console) -> int:
    import json

    from mdclient.client import exchange_name
    from mdclient.frames import IcebergReader
    from mdclient.recording import read_recording

    exchange = exchange_name(args.exchange) if args.exchange else None
    settings = settings_from_args(args)
    reader = IcebergReader(settings.catalog_properties(), catalog_name=settings.catalog_name)
    status = read_recording(reader, settings, exchange, int(time.time() * 1000))
    notes_to = err
    if args.format == "json":
        print(json.dumps(status.as_dict(), indent=2))
    elif args.format == "csv":
        write_recording_csv(status, sys.stdout)
    elif status.markets:
        notes_to = stdout_console()
        notes_to.print(recording_table(status))
    if not status.markets:
        where = f" of {exchange}" if exchange else ""
        gaps = "" if status.gaps_note else f", no gaps in {settings.gaps_table}"
        err.print(
            f"nothing recorded{where}: no trades in {settings.ticks_table}{gaps}",
            highlight=False,
            markup=False,
        )
    for line in recording_notes(status):
        notes_to.print(line, highlight=False, markup=False, soft_wrap=True)
    return ExitCode.OK if status.markets else ExitCode.NOT_FOUND
