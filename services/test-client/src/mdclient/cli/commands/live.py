"""`mdclient live`: ticks and candles as they arrive, one line each on stdout; feed
statuses and sequence gaps on stderr."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from mdclient import timeparse
from mdclient.cli.args import UsageError, parse_ticker, settings_from_args
from mdclient.cli.commands import Subparsers, open_client
from mdclient.cli.views import live_line, until
from mdclient.exit_codes import ExitCode

if TYPE_CHECKING:
    from rich.console import Console

    from mdclient.dispatch import SequenceEvent
    from mdproto.messages import FeedStatus


def add_parser(sub: Subparsers[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    live = sub.add_parser("live", parents=[common], help="stream ticks and/or candles")
    live.add_argument("ticker", help="EXCHANGE:BASE/QUOTE")
    live.add_argument("--ticks", action="store_true", help="stream trades (default if no --ohlc)")
    live.add_argument(
        "--ohlc", action="append", default=[], metavar="PERIOD", help="stream candles (repeatable)"
    )
    live.add_argument("--count", type=int, help="stop after N messages (exit 0)")
    live.add_argument("--duration", type=float, help="stop after N seconds (exit 0)")


def run(args: argparse.Namespace, err: Console) -> int:
    from rich.console import Console

    from mdclient.live import describe_status

    ticker = parse_ticker(args.ticker)
    try:
        periods = [timeparse.parse_period(p) for p in args.ohlc]
    except timeparse.TimeFormatError as exc:
        raise UsageError(str(exc)) from None
    want_ticks = args.ticks or not periods
    settings = settings_from_args(args)
    out = Console(highlight=False, soft_wrap=True)

    def on_status(status: FeedStatus) -> None:  # stderr: stdout stays data only
        err.print(f"status: {describe_status(status)}", highlight=False, markup=False)

    def on_sequence(event: SequenceEvent) -> None:  # gaps and their recovery, also stderr
        err.print(f"sequence: {event.describe()}", highlight=False, markup=False)

    with (
        open_client(settings) as client,
        client.live(
            ticker, ticks=want_ticks, ohlc=periods, on_status=on_status, on_sequence=on_sequence
        ) as s,
    ):
        if not args.quiet:
            err.print(f"streaming {', '.join(s.topics)} (Ctrl-C to stop)", highlight=False)
        for message in until(s, args.count, args.duration):
            out.print(live_line(message), markup=False)
        if s.dropped and not args.quiet:
            err.print(f"{s.dropped} messages dropped (terminal too slow)")
    return ExitCode.OK
