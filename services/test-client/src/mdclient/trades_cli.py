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
import collections
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mdclient import timeparse
from mdclient.cli import (
    EXIT_INCOMPLETE,
    EXIT_NOT_FOUND,
    EXIT_OK,
    UsageError,
    check_writable,
    settings_from_args,
)
from mdclient.errors import InvalidRequest, NotRecorded
from mdproto.tables import Ticks

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq
    from rich.console import Console
    from rich.table import Table

    from mdclient.trades import RangeGap, TradeIntegrity


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
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
    trades.add_argument(
        "--start", default="-1h", help="now, -1h, 2026-11-20, 2026-11-20T10:00, epoch ms"
    )
    trades.add_argument("--end", default="now", help="same formats; range is [start, end)")
    trades.add_argument(
        "--verify", action="store_true", help="exit 11 unless the integrity report is complete"
    )
    out = trades.add_argument_group("output")
    out.add_argument("--rows", type=int, default=20, help="table rows: head+tail (0 = all)")
    out.add_argument("--no-table", action="store_true", help="print no table")
    out.add_argument("--csv", type=Path, metavar="FILE", help="write the trades as CSV")
    out.add_argument("--parquet", type=Path, metavar="FILE", help="write the trades as Parquet")


def run(args: argparse.Namespace, err: Console) -> int:
    """Reads Iceberg only, like `recording`."""
    from rich.console import Console

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
    for path in (args.csv, args.parquet):
        if path is not None:
            try:
                check_writable(path)
            except OSError as exc:
                raise UsageError(str(exc)) from None
    settings = settings_from_args(args)
    reader = IcebergReader(settings.catalog_properties(), catalog_name=settings.catalog_name)
    start, end = timeparse.format_ms(query.start_ms), timeparse.format_ms(query.end_ms)
    what = f"{query.ticker} trades [{start}, {end})"
    try:
        batches = open_trade_batches(reader, settings, query)
    except NotRecorded as exc:
        for line in report_lines(exc.report):
            err.print(line, highlight=False, markup=False, soft_wrap=True)
        return EXIT_NOT_FOUND
    view = _Ends(args.rows)
    with _Files(args.csv, args.parquet, batches.schema, batches.report) as files:
        for batch in batches:
            files.write(batch)
            view.add(batch)
    report = batches.report
    if not args.quiet:
        err.print(f"{batches.rows:,} trades: {what}", highlight=False, markup=False)
    for line in report_lines(report):  # even with --quiet: it says what the rows are worth
        err.print(line, highlight=False, markup=False, soft_wrap=True)
    if not args.no_table and batches.rows:
        out = Console()
        if not out.is_terminal:
            out = Console(width=max(out.width, 160))
        out.print(trade_table(view, title=what))
    if args.verify and report.state != "complete":
        return EXIT_INCOMPLETE
    return EXIT_OK


class _Ends:
    """The first and last rows of a stream of batches, for a head+tail table (0: all)."""

    def __init__(self, rows: int) -> None:
        self.limit = rows
        self.total = 0
        self.head: list[dict[str, Any]] = []
        self.tail: collections.deque[dict[str, Any]] = collections.deque(
            maxlen=None if rows == 0 else rows - rows // 2
        )

    def add(self, batch: pa.RecordBatch) -> None:
        want = self.limit // 2 - len(self.head) if self.limit else 0
        rows = batch.slice(0, want).to_pylist() if want > 0 else []
        self.head.extend(rows)
        self.total += batch.num_rows
        rest = batch.slice(len(rows))
        keep = self.tail.maxlen
        self.tail.extend(
            (rest if keep is None else rest.slice(max(0, len(rest) - keep))).to_pylist()
        )

    @property
    def hidden(self) -> int:
        return self.total - len(self.head) - len(self.tail)


class _Files:
    """The CSV and Parquet files of a trade read, written batch by batch."""

    def __init__(
        self, csv: Path | None, parquet: Path | None, schema: pa.Schema, report: TradeIntegrity
    ) -> None:
        self._csv_path, self._parquet_path = csv, parquet
        self._schema, self._report = schema, report
        self._csv: pacsv.CSVWriter | None = None
        self._parquet: pq.ParquetWriter | None = None

    def __enter__(self) -> _Files:
        if self._csv_path is not None:
            import pyarrow.csv as pacsv

            self._csv = pacsv.CSVWriter(
                self._csv_path,
                csv_schema(self._schema),
                write_options=pacsv.WriteOptions(quoting_header="none"),
            )
        if self._parquet_path is not None:
            import pyarrow.parquet as pq

            from mdclient.trades import with_report

            self._parquet = pq.ParquetWriter(
                self._parquet_path, with_report(self._schema, self._report)
            )
        return self

    def write(self, batch: pa.RecordBatch) -> None:
        if self._csv is not None:
            self._csv.write_batch(csv_batch(batch))
        if self._parquet is not None:
            self._parquet.write_batch(batch)

    def __exit__(self, *exc: object) -> None:
        for writer in (self._csv, self._parquet):
            if writer is not None:
                writer.close()


# --- rendering ----------------------------------------------------------------------------

TIME_MS = "trade_time_ms"


def csv_schema(schema: pa.Schema) -> pa.Schema:
    """The trade columns, times as ISO-8601 UTC text, plus trade_time_ms (epoch ms, for
    scripts) after trade_time: the candle CSV's convention."""
    import pyarrow as pa

    fields = [pa.field(f.name, pa.string()) if pa.types.is_timestamp(f.type) else f for f in schema]
    at = schema.get_field_index(Ticks.TRADE_TIME) + 1
    return pa.schema(fields).insert(at, pa.field(TIME_MS, pa.int64()))


def csv_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = [
        pc.strftime(c, format="%Y-%m-%dT%H:%M:%SZ") if pa.types.is_timestamp(c.type) else c
        for c in batch.columns
    ]
    at = batch.schema.get_field_index(Ticks.TRADE_TIME)
    micros = batch.column(at).cast(pa.int64())
    millis = pc.divide(micros, pa.scalar(1000, pa.int64()))
    return pa.RecordBatch.from_arrays(
        [*columns[: at + 1], millis, *columns[at + 1 :]], schema=csv_schema(batch.schema)
    )


def _utc(ms: int | None) -> str:
    return "-" if ms is None else timeparse.format_ms(ms)


def gap_line(gap: RangeGap) -> str:
    missing = f", {gap.missing_ids:,} ids missing" if gap.missing_ids else ""
    recovered = f", {gap.trades_recovered:,} recovered" if gap.trades_recovered else ""
    why = f": {gap.reason}" if gap.reason else ""
    return (
        f"  gap {gap.status.lower()}: {_utc(gap.from_time_ms)} -> {_utc(gap.to_time_ms)} "
        f"({gap.cause or 'cause unknown'}{missing}{recovered}){why}"
    )


def report_lines(report: TradeIntegrity) -> list[str]:
    """The report as a person reads it: state, recorded since, what is not recorded,
    the gap counts, then each gap that is not repaired."""
    if report.state == "not_recorded":
        since = (
            f"; recorded {_utc(report.recorded_since_ms)} to {_utc(report.last_trade_ms)}"
            if report.recorded_since_ms is not None
            else ""
        )
        return [f"not recorded: {report.reason}{since}"]
    lines = [
        f"integrity: {report.state}; recorded since {_utc(report.recorded_since_ms)}, "
        f"newest stored trade {_utc(report.last_trade_ms)}"
    ]
    if report.not_recorded_until_ms is not None:
        lines.append(
            f"  not recorded: {_utc(report.start_ms)} -> {_utc(report.not_recorded_until_ms)} "
            "(before the recording began)"
        )
    counts = report.counts
    if counts is None:
        lines.append(f"  gaps unknown: {report.gaps_note}")
    else:
        lines.append(
            f"  gaps in the range: {counts.repaired} repaired, {counts.unrepairable} "
            f"unrepairable, {counts.open} open, {counts.repairing} repairing"
        )
    lines += [gap_line(g) for g in report.gaps or () if g.status != "REPAIRED"]
    return lines


def trade_table(view: _Ends, *, title: str) -> Table:
    from mdclient.cli import _table

    out = _table(title)
    out.add_column("trade_time (UTC)", no_wrap=True)
    for name in ("price", "amount", "side", "trade_id"):
        out.add_column(name, justify="right" if name in ("price", "amount") else "left")
    for row in view.head:
        _trade_row(out, row)
    if view.hidden:
        out.add_row(f"… {view.hidden:,} more rows", "…", "…", "…", "…", style="dim")
    for row in view.tail:
        _trade_row(out, row)
    return out


def _trade_row(out: Table, row: dict[str, Any]) -> None:
    at = row[Ticks.TRADE_TIME]
    out.add_row(
        at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3],
        "" if row.get(Ticks.PRICE) is None else f"{row[Ticks.PRICE]:g}",
        "" if row.get(Ticks.AMOUNT) is None else f"{row[Ticks.AMOUNT]:g}",
        row.get(Ticks.SIDE) or "-",
        row.get(Ticks.TRADE_ID) or "",
    )
