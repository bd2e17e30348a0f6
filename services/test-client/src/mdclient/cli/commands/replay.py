"""`mdclient replay TICKER... --start --end`: stored trades, book changes and candles of
several tickers in event-time order, one line each on stdout, from Iceberg (no relay).

    parse args -> replay_query (InvalidRequest: exit 2) -> IcebergReader -> replay_from
      (UnknownTicker: exit 6) -> a line per message (paced by --speed) -> "replay
      complete" and the cursor on stderr; Ctrl-C prints the cursor to resume with
      (--cursor) and exits 130.
    --follow: Client.replay_into_live (the relay's live topics after the seam) instead.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from mdclient.cli.args import UsageError, settings_from_args
from mdclient.cli.commands import Subparsers
from mdclient.cli.views import replay_line
from mdclient.errors import InvalidRequest
from mdclient.exit_codes import ExitCode

if TYPE_CHECKING:
    from rich.console import Console

    from mdclient.config import ClientSettings


def add_parser(sub: Subparsers[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    replay = sub.add_parser(
        "replay",
        parents=[common],
        help="replay stored trades, book changes and candles in event-time order (Iceberg)",
        description="The stored messages of the tickers in [start, end), merged in event-time "
        "order as the live topics carry them, one line each; at --speed 1, 10, ... with the "
        "recorded spacing divided by it, at max as fast as the terminal reads. Ends with "
        "'replay complete' and a cursor on stderr; Ctrl-C prints the cursor, and --cursor "
        "with the same tickers, range and channels resumes with the rest. Needs no relay.",
    )
    replay.add_argument("tickers", nargs="+", metavar="TICKER", help="EXCHANGE:BASE/QUOTE")
    replay.add_argument(
        "--start", default="-10m", help="now, -1h, 2026-11-20, 2026-11-20T10:00, epoch ms"
    )
    replay.add_argument("--end", default="now", help="same formats; range is [start, end)")
    replay.add_argument(
        "--channels",
        default="trades",
        help="comma-separated: trades, book, ohlc:PERIOD (e.g. trades,book,ohlc:1m)",
    )
    replay.add_argument("--speed", default="max", help="1, 10, 0.5 (x real time) or max")
    replay.add_argument("--cursor", help="resume where a replay stopped (its printed cursor)")
    replay.add_argument("--count", type=int, help="stop after N messages (exit 0, cursor printed)")
    replay.add_argument(
        "--follow",
        action="store_true",
        help="go on into live trades and candles after the stored range, with no gap or "
        "duplicate at the seam (needs the relay; --end must be now; no book, no --cursor)",
    )


def run(args: argparse.Namespace, err: Console) -> int:
    from rich.console import Console

    from mdclient.frames import IcebergReader
    from mdclient.replay import ReplayComplete, replay_from, replay_query

    try:
        query = replay_query(
            args.tickers,
            args.start,
            args.end,
            channels=[c for c in args.channels.split(",") if c.strip()],
            speed=args.speed,
            cursor=args.cursor,
            now_ms=int(time.time() * 1000),
        )
    except InvalidRequest as exc:
        raise UsageError(str(exc)) from None
    if args.count is not None and args.count < 1:
        raise UsageError("--count must be 1 or more")
    settings = settings_from_args(args)
    if args.follow:
        if args.end != "now" or args.cursor:
            raise UsageError("--follow replays up to now and goes on live: no --end, no --cursor")
        return _follow(args, settings, out=Console(highlight=False, soft_wrap=True), err=err)
    reader = IcebergReader(settings.catalog_properties(), catalog_name=settings.catalog_name)
    replay = replay_from(reader, settings, query)
    out = Console(highlight=False, soft_wrap=True)
    try:
        for message in replay:
            if isinstance(message, ReplayComplete):
                err.print(
                    f"replay complete: {message.messages:,} messages; cursor {message.cursor}",
                    highlight=False,
                    markup=False,
                    soft_wrap=True,
                )
                return ExitCode.OK
            out.print(replay_line(replay.topic, message), markup=False, highlight=False)
            if args.count is not None and replay.messages >= args.count:
                break
    except KeyboardInterrupt:
        err.print(f"interrupted; resume with --cursor {replay.cursor}", markup=False)
        return ExitCode.INTERRUPTED
    err.print(
        f"stopped after {replay.messages:,} messages; resume with --cursor {replay.cursor}",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    return ExitCode.OK


def _follow(args: argparse.Namespace, settings: ClientSettings, out: Console, err: Console) -> int:
    """The stored range, a "replay complete" line at the seam, then live until Ctrl-C."""
    from mdclient import Client
    from mdclient.replay import ReplayComplete

    channels = [c for c in args.channels.split(",") if c.strip()]
    delivered = 0
    with Client(settings=settings) as client:
        try:
            follow = client.replay_into_live(
                args.tickers, args.start, channels=channels, speed=args.speed
            )
        except InvalidRequest as exc:
            raise UsageError(str(exc)) from None
        try:
            for message in follow:
                if isinstance(message, ReplayComplete):
                    err.print(f"replay complete: {message.messages:,} messages; live from here")
                    continue
                out.print(replay_line(follow.topic, message), markup=False, highlight=False)
                delivered += 1
                if args.count is not None and delivered >= args.count:
                    break
        except KeyboardInterrupt:
            return ExitCode.INTERRUPTED
        finally:
            follow.close()
    return ExitCode.OK
