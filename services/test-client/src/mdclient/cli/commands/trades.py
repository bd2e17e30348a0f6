"""`mdclient trades TICKER --start --end`: stored trades from Iceberg, no relay needed.

    parse args -> settings -> check output paths -> IcebergReader
      -> open_trade_batches (the integrity report; NotRecorded: exit 6)
      -> batches streamed to --csv / --parquet, head and tail kept for the table
      -> integrity lines on stderr -> exit code (--verify: 11 unless complete)

Batches, not one table: a CSV or Parquet file of a long range is written with one
group of files (about a day of the ticker) in memory at a time.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from mdclient import timeparse
from mdclient.cli.args import UsageError, add_stored_range, check_outputs, settings_from_args
from mdclient.cli.commands import Subparsers
from mdclient.cli.output import (
    TradeEnds,
    TradeFiles,
    report_lines,
    stdout_console,
    trade_table,
)
from mdclient.errors import InvalidRequest, NotRecorded
from mdclient.exit_codes import ExitCode

if TYPE_CHECKING:
    from rich.console import Console


def add_parser(sub: Subparsers[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    trades = sub.add_parser(
        "trades",
        parents=[common],
        help="stored trades of a ticker over a range, with their integrity report (Iceberg)",
        description="Trades of market.ticks in [start, end), in trade-time order, and the "
        "range's integrity report from market.gaps on stderr: recorded since, gaps in the "
        "range (open, repairing, repaired, unrepairable), not recorded before the recording "
        "began. A range with no recording exits 6. Needs no relay.",
    )
    trades.add_argument("ticker", help="EXCHANGE:BASE/QUOTE, e.g. BINANCE:BTC/USDT")
    add_stored_range(trades, "trades")
    trades.add_argument(
        "--verify", action="store_true", help="exit 11 unless the integrity report is complete"
    )


def run(args: argparse.Namespace, err: Console) -> int:
    """Reads Iceberg only, like `recording`."""
    from mdclient.frames import IcebergReader
    from mdclient.trades import open_trade_batches, trade_range

    try:
        query = trade_range(
            args.ticker.strip().upper(), args.start, args.end, now_ms=int(time.time() * 1000)
        )
    except InvalidRequest as exc:
        raise UsageError(exc.reason) from None
    if args.rows < 0:
        raise UsageError("--rows must be 0 or more")
    check_outputs(args.csv, args.parquet)
    settings = settings_from_args(args)
    reader = IcebergReader(settings.catalog_properties(), catalog_name=settings.catalog_name)
    start, end = timeparse.format_ms(query.start_ms), timeparse.format_ms(query.end_ms)
    what = f"{query.ticker} trades [{start}, {end})"
    try:
        batches = open_trade_batches(reader, settings, query)
    except NotRecorded as exc:
        for line in report_lines(exc.report):
            err.print(line, highlight=False, markup=False, soft_wrap=True)
        return ExitCode.NOT_FOUND
    view = TradeEnds(args.rows)
    with TradeFiles(args.csv, args.parquet, batches.schema, batches.report) as files:
        for batch in batches:
            files.write(batch)
            view.add(batch)
    report = batches.report
    if not args.quiet:
        err.print(f"{batches.rows:,} trades: {what}", highlight=False, markup=False)
    for line in report_lines(report):  # even with --quiet: it says what the rows are worth
        err.print(line, highlight=False, markup=False, soft_wrap=True)
    if not args.no_table and batches.rows:
        stdout_console().print(trade_table(view, title=what))
    if args.verify and report.state != "complete":
        return ExitCode.INCOMPLETE
    return ExitCode.OK
