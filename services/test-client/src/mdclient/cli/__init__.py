"""`mdclient` command line: the entry point, its parser, and the error-to-exit-code step.

    argv -> join_relative_times -> build_parser().parse_args
      -> COMMANDS[command](args, stderr console) -> exit code (mdclient.exit_codes)

Modules: `args` (options every command takes, settings, input checks), `commands/`
(one module per command: its parser and its run), `output` (tables, CSV, Parquet,
report lines), `views` (spinner, order book ladder, live lines). Rendering is the
CLI's alone; the SDK never imports rich.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from mdclient import errors, exit_codes
from mdclient.cli.args import UsageError, common_options, join_relative_times
from mdclient.cli.commands import (
    book,
    export,
    history,
    live,
    markets,
    recording,
    replay,
    status,
    trades,
    trigger,
)
from mdclient.exit_codes import ExitCode

if TYPE_CHECKING:
    from rich.console import Console

Command = Callable[[argparse.Namespace, "Console"], int]

#: Each command's run, by name (the parser's subcommand).
COMMANDS: dict[str, Command] = {
    "history": history.run_history,
    "legacy": history.run_legacy,
    "live": live.run,
    "book": book.run,
    "book-samples": book.run_samples,
    "status": status.run,
    "markets": markets.run,
    "recording": recording.run,
    "trigger": trigger.run,
    "trades": trades.run,
    "replay": replay.run,
    "export": export.run,
}
#: The parsers, in the order `mdclient --help` lists the commands.
_PARSERS = (history, live, book, status, markets, recording, trigger, trades, replay, export)

log = logging.getLogger("mdclient")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mdclient",
        parents=[common_options(in_command=False)],
        description="History, live and legacy client of the market-data platform.",
        epilog=exit_codes.help_section(),
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the epilog's table as it is
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = common_options(in_command=True)
    for module in _PARSERS:
        module.add_parser(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (the console script exits with it)."""
    parser = build_parser()
    try:
        args = parser.parse_args(join_relative_times(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # argparse: --help is 0, bad usage is 2
        return int(exc.code or 0)
    _setup_logging(args.verbose)
    from rich.console import Console
    from rich.markup import escape  # server reasons and codes ("[no_ingestor]") are not markup

    err = Console(stderr=True, quiet=False)
    try:
        return COMMANDS[args.command](args, err)
    except KeyboardInterrupt:
        err.print("interrupted")
        return ExitCode.INTERRUPTED
    except UsageError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}", highlight=False)
        return ExitCode.USAGE
    except errors.MdClientError as exc:
        err.print(f"[red]{type(exc).__name__}:[/] {escape(str(exc))}", highlight=False)
        return exit_codes.for_error(exc)
    except Exception as exc:  # a bug: say so in one line, the traceback with -v
        log.debug("unexpected error", exc_info=True)
        err.print(f"[red]internal error:[/] {type(exc).__name__}: {escape(str(exc))} (run with -v)")
        return ExitCode.INTERNAL


def run() -> None:
    """The `mdclient` console script (pyproject.toml) and `python -m mdclient`."""
    sys.exit(main())


def _setup_logging(verbose: bool) -> None:
    level = "DEBUG" if verbose else os.environ.get("LOG_LEVEL", "WARNING").upper()
    logging.basicConfig(
        level=level if level in logging.getLevelNamesMapping() else "WARNING",
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
