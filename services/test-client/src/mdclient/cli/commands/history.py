"""`mdclient history` and `mdclient legacy`: candles over a range.

    parse args -> settings (YAML < env < flags) -> check output paths
      -> Client (connect, per-client subscribe) -> history (spinner on stderr)
      -> table on stdout / CSV / Parquet / chart PNG -> exit code

`legacy` sends the deprecated synchronous OHLCRequest instead and has no `--verify`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from mdclient import extras
from mdclient.chart import FEATURE as CHART_FEATURE
from mdclient.cli.args import (
    UsageError,
    check_outputs,
    describe,
    parse_range_args,
    settings_from_args,
)
from mdclient.cli.commands import Subparsers, open_client
from mdclient.cli.output import (
    candle_table,
    integrity_line,
    stdout_console,
    write_csv,
    write_parquet,
)
from mdclient.cli.views import Progress
from mdclient.exit_codes import ExitCode

if TYPE_CHECKING:
    from rich.console import Console

    from mdclient.history import HistoryResult


def add_parser(sub: Subparsers[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    range_args = argparse.ArgumentParser(add_help=False)
    range_args.add_argument("ticker", help="EXCHANGE:BASE/QUOTE, e.g. BINANCE:BTC/USDT")
    range_args.add_argument(
        "--period",
        default="1m",
        help="60, 1m, 5m, 1h, 1d (default 1m); history: a period the exchange lacks "
        "(5s, 7m) is built from recorded trades, and so are tick bars (100ticks: every "
        "100 trades) and volume bars (2.5vol: every 2.5 of base volume)",
    )
    range_args.add_argument(
        "--start", default="-24h", help="now, -24h, 2026-11-20, 2026-11-20T10:00, epoch ms"
    )
    range_args.add_argument("--end", default="now", help="same formats; range is [start, end)")
    range_args.add_argument("--timeout", type=float, help="seconds to wait per attempt")
    range_args.add_argument("--attempts", type=int, help="attempts, each with a new request_id")
    out = range_args.add_argument_group("output")
    out.add_argument("--rows", type=int, default=20, help="table rows: head+tail (0 = all)")
    out.add_argument("--no-table", action="store_true", help="print no table")
    out.add_argument("--csv", type=Path, metavar="FILE", help="write the candles as CSV")
    out.add_argument("--parquet", type=Path, metavar="FILE", help="write the candles as Parquet")
    out.add_argument("--chart", type=Path, metavar="PNG", help="candlestick + volume chart")

    history = sub.add_parser(
        "history",
        parents=[common, range_args],
        help="request history, wait for the notification, read Iceberg",
    )
    history.add_argument(
        "--notify",
        choices=["per_client", "per_request"],
        help="notification pattern: RESPONSE:{client_id} or HISTORY_READY:{request_id}",
    )
    history.add_argument(
        "--no-pin", action="store_true", help="read the current snapshot, not the notified one"
    )
    history.add_argument(
        "--refetch",
        action="store_true",
        help="fetch the whole range from the exchange even where it is stored",
    )
    history.add_argument(
        "--verify",
        action="store_true",
        help="exit 11 unless the integrity report shows no missing candles",
    )

    legacy = sub.add_parser(
        "legacy", parents=[common, range_args], help="deprecated synchronous OHLCRequest"
    )
    legacy.add_argument("--limit", type=int, default=0, help="max candles (0 = no limit)")


def run_history(args: argparse.Namespace, err: Console) -> int:
    return _fetch(args, err, legacy=False)


def run_legacy(args: argparse.Namespace, err: Console) -> int:
    return _fetch(args, err, legacy=True)


def _fetch(args: argparse.Namespace, err: Console, *, legacy: bool) -> int:
    ticker, period, start_ms, end_ms = parse_range_args(args)
    check_outputs(args.csv, args.parquet, args.chart)
    if isinstance(period, str) and (legacy or args.chart):
        raise UsageError(f"{period} bars: only `history` serves them, without --chart")
    if args.chart and not extras.installed("chart"):  # before asking the platform anything
        raise UsageError(extras.missing_message("chart", CHART_FEATURE))
    settings = settings_from_args(args)
    what = describe(ticker, period, start_ms, end_ms)
    with open_client(settings) as client, Progress(err, what, quiet=args.quiet) as progress:
        if legacy:
            progress.note("legacy request (synchronous)")
            result = client.fetch_ohlc_sync(
                ticker, period, start_ms, end_ms,
                limit=args.limit, timeout_s=args.timeout, attempts=args.attempts,
            )  # fmt: skip
        else:
            result = client.history(
                ticker, period, start_ms, end_ms,
                timeout_s=args.timeout, attempts=args.attempts,
                progress=progress.update, pin_snapshot=False if args.no_pin else None,
                refetch=args.refetch,
            )  # fmt: skip
    return _emit(args, err, result, what, period)


def _emit(
    args: argparse.Namespace, err: Console, result: HistoryResult, what: str, period: int | str
) -> int:
    snapshot = f", snapshot {result.snapshot_id}" if result.snapshot_id else ""
    note = result.notification
    integrity = None if note is None else integrity_line(note)
    if not args.quiet:
        err.print(
            f"{result.status}: {len(result)} rows, request {result.request_id}{snapshot}, "
            f"{result.attempts} attempt(s), {result.elapsed_s:.1f}s",
            highlight=False,
        )
        if integrity is not None:
            err.print(f"integrity: {integrity}", highlight=False)
    if result.snapshot_note:  # even with --quiet: the rows may not be the notified ones
        err.print(f"note: {result.snapshot_note}", highlight=False, markup=False)
    if args.csv:
        write_csv(result.table, args.csv)
    if args.parquet:
        write_parquet(result.table, args.parquet)
    if result.empty:
        err.print(f"no candles for {what}", highlight=False)
        return ExitCode.NOT_FOUND
    if getattr(args, "verify", False):  # `history` only; legacy answers carry no report
        if note is None or integrity is None:
            err.print("cannot verify: the platform sent no integrity report", highlight=False)
            return ExitCode.INCOMPLETE
        if note.missing_candles:
            err.print(f"incomplete: {note.missing_candles} candles missing", highlight=False)
            return ExitCode.INCOMPLETE
    if args.chart:
        from mdclient.chart import candlestick_png

        assert isinstance(period, int)  # refused for bars before asking
        candlestick_png(result.table, args.chart, title=what, period_seconds=period)
    if not args.no_table:
        stdout_console().print(candle_table(result.table, title=what, max_rows=args.rows))
    return ExitCode.OK
