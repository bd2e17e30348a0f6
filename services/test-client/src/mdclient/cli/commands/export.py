"""`mdclient export TICKER... --channel --format --out`: a dataset, one file per ticker
and UTC day, from Iceberg (no relay needed); resumable (mdclient.export).

    parse args -> channel, range, tickers checked (exit 2 before any read)
      -> IcebergSource -> export_range: a line per file (reading, written, skipped,
         not recorded) on stderr
      -> summary -> exit code: 6 when no day holds data, 11 with --verify unless every
         day's report is complete
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING, cast

from mdclient import timeparse
from mdclient.cli.args import UsageError, parse_ticker, settings_from_args
from mdclient.cli.commands import Subparsers
from mdclient.errors import InvalidRequest
from mdclient.exit_codes import ExitCode

if TYPE_CHECKING:
    from rich.console import Console

    from mdclient.export import DayResult, Format


def add_parser(sub: Subparsers[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    export = sub.add_parser(
        "export",
        parents=[common],
        help="write stored trades, candles or book samples to Parquet/CSV, a file per "
        "ticker and UTC day (resumable)",
        description="Writes OUT/<channel>/<exchange>/<symbol>/<YYYY-MM-DD>.<ext> for each "
        "ticker and UTC day of [start, end), with <YYYY-MM-DD>.report.json beside it (the "
        "day's integrity report). A file gets its name only when complete: rerun the same "
        "command after an interruption and the days already written are skipped. Needs no "
        "relay.",
    )
    export.add_argument("tickers", nargs="+", metavar="TICKER", help="EXCHANGE:BASE/QUOTE")
    export.add_argument(
        "--start", required=True, help="2026-11-20, 2026-11-20T10:00, -2d, epoch ms"
    )
    export.add_argument("--end", default="now", help="same formats; range is [start, end)")
    export.add_argument(
        "--channel",
        default="trades",
        help="trades (market.ticks), candles:PERIOD (stored candles, e.g. candles:1m), or "
        "book (the book sampled every --every, --depth levels per side)",
    )
    export.add_argument("--format", choices=("parquet", "csv"), default="parquet")
    export.add_argument("--out", type=Path, required=True, metavar="DIR", help="output folder")
    export.add_argument("--every", default="1s", help="book: sample step (100ms, 1s, 1m)")
    export.add_argument("--depth", type=int, default=10, help="book: levels per side")
    export.add_argument(
        "--verify", action="store_true", help="exit 11 unless every day's report is complete"
    )


def run(args: argparse.Namespace, err: Console) -> int:
    """Reads Iceberg only, like `trades`."""
    from mdclient.export import export_dataset, parse_channel
    from mdclient.frames import IcebergReader

    tickers = list(dict.fromkeys(parse_ticker(t) for t in args.tickers))
    try:
        every_ms = timeparse.parse_step_ms(args.every)
        start_ms, end_ms = timeparse.parse_range(
            args.start, args.end, now_ms=int(time.time() * 1000)
        )
        channel = parse_channel(args.channel, every_ms=every_ms, depth=args.depth).folder
    except timeparse.TimeFormatError as exc:
        raise UsageError(str(exc)) from None
    except InvalidRequest as exc:
        raise UsageError(exc.reason) from None
    if start_ms < 0:
        raise UsageError(f"the range starts before 1970 ({start_ms} ms)")
    out: Path = args.out.expanduser()
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} is a file, not a folder")
    settings = settings_from_args(args)
    reader = IcebergReader(settings.catalog_properties(), catalog_name=settings.catalog_name)

    def show(day: DayResult) -> None:
        if args.quiet and day.outcome == "reading":
            return
        err.print(progress_line(day), highlight=False, markup=False, soft_wrap=True)

    summary = export_dataset(
        reader, settings, tickers, start_ms, end_ms, out, channel=args.channel,
        fmt=cast("Format", args.format), every_ms=every_ms, depth=args.depth, progress=show,
    )  # fmt: skip
    written, skipped = summary.count("written"), summary.count("skipped")
    missing = summary.count("not_recorded")
    err.print(
        f"{written} written, {skipped} skipped (already complete), {missing} not recorded: "
        f"{channel} of {len(tickers)} ticker(s) in {out / channel}",
        highlight=False,
        markup=False,
    )
    if written + skipped == 0:
        return ExitCode.NOT_FOUND
    if args.verify and not summary.complete:
        return ExitCode.INCOMPLETE
    return ExitCode.OK


def progress_line(day: DayResult) -> str:
    """`[3/14] BINANCE:BTC/USDT 2026-11-20: written, 1,234 rows, complete -> PATH`."""
    head = f"[{day.index}/{day.total}] {day.ticker} {day.day.isoformat()}"
    if day.outcome == "reading":
        return f"{head}: reading ..."
    if day.outcome == "not_recorded":
        return f"{head}: not recorded (report only: {day.path.stem}.report.json)"
    verb = "skipped, already complete" if day.outcome == "skipped" else "written"
    return f"{head}: {verb}, {day.rows:,} rows, {day.state} -> {day.path}"
