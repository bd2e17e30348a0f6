"""What the commands write: rich tables on stdout, CSV and Parquet files, and the
report lines (integrity, recording notes, a trade range's gaps). The SDK never
imports rich; rendering is the CLI's alone.

CSV convention of every command: times as ISO-8601 UTC text plus `*_ms` (epoch ms,
for scripts) after them; an unknown value is an empty field.
"""

from __future__ import annotations

import collections
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from rich import box
from rich.table import Table

from mdclient import timeparse
from mdproto.messages import HistoryReadyNotification, HistorySource
from mdproto.tables import Markets, Ohlc, Ticks

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq
    from rich.console import Console

    from mdclient.recording import LostGap, RecordingStatus
    from mdclient.trades import RangeGap, TradeIntegrity


def stdout_console() -> Console:
    """The console tables go to; piped, never squeezed into an 80-column guess."""
    from rich.console import Console

    out = Console()
    return out if out.is_terminal else Console(width=max(out.width, 160))


def _table(title: str) -> Table:
    return Table(
        title=title,
        title_justify="left",
        header_style="bold",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )


def _utc(ms: int | None) -> str:
    """Whole seconds, for the recording table."""
    if ms is None:
        return "-"
    return timeparse.format_ms(ms - ms % 1000).replace("T", " ").removesuffix("Z")


# --- candles (history, legacy) ---

PRICE_COLUMNS = (Ohlc.OPEN, Ohlc.HIGH, Ohlc.LOW, Ohlc.CLOSE)
_SOURCES = {
    HistorySource.SOURCE_EXCHANGE: "from the exchange",
    HistorySource.SOURCE_STORAGE: "from storage (the exchange was not asked)",
    HistorySource.SOURCE_STORAGE_AND_EXCHANGE: "from storage, the gaps from the exchange",
    HistorySource.SOURCE_TRADES: "bars built from recorded trades",
}


def integrity_line(note: HistoryReadyNotification) -> str | None:
    """The notification's integrity report in one line; None from a platform without it."""
    if note.expected_candles == 0:
        return None
    if note.bars:  # tick or volume bars: no slots, every full bar is stored
        return f"{note.row_count} full {note.bars} bars; {_SOURCES[HistorySource.SOURCE_TRADES]}"
    missing = f"{note.missing_candles} missing" if note.missing_candles else "none missing"
    return (
        f"{note.expected_candles} candle slots: {note.row_count} rows, "
        f"{note.exchange_gaps} without trades at the exchange, {missing}; "
        f"{_SOURCES.get(note.source, 'source unknown')}"
    )


def decimals_for(values: list[float]) -> int:
    """Enough decimals for the typical magnitude: BTC 2, ETH/alts 4, sub-cent coins 8."""
    magnitudes = [abs(v) for v in values if v == v]  # skip NaN
    if not magnitudes:
        return 2
    typical = statistics.median(magnitudes)
    if typical >= 1000:
        return 2
    if typical >= 1:
        return 4
    return 8


def candle_table(table: pa.Table, *, title: str, max_rows: int = 20) -> Table:
    """A rich table; with more than `max_rows` rows shows the head and the tail."""
    rows = table.to_pylist()
    decimals = decimals_for([row[Ohlc.CLOSE] for row in rows])
    out = _table(title)
    out.add_column("open_time (UTC)", no_wrap=True)
    for name in (*PRICE_COLUMNS, "volume", "trades"):
        out.add_column(name, justify="right", no_wrap=True)
    shown: list[dict[str, Any] | None] = list(rows)
    if 0 < max_rows < len(rows):
        head = max_rows // 2
        tail = max_rows - head
        shown = [*rows[:head], None, *rows[-tail:]]
    for row in shown:
        if row is None:
            hidden = len(rows) - max_rows
            out.add_row(f"… {hidden} more rows", *["…"] * 6, style="dim")
            continue
        out.add_row(
            row[Ohlc.OPEN_TIME].strftime("%Y-%m-%d %H:%M:%S"),
            *(f"{row[name]:.{decimals}f}" for name in PRICE_COLUMNS),
            f"{row[Ohlc.VOLUME]:.4f}",
            "" if row[Ohlc.TRADE_COUNT] is None else str(row[Ohlc.TRADE_COUNT]),  # unknown: blank
        )
    return out


def write_csv(table: pa.Table, path: Path) -> None:
    """CSV with ISO-8601 UTC open_time plus open_time_ms for scripts.

    The csv module, not pandas (an optional extra): an unknown (null) trade
    count is an empty field, and numbers are written as Python prints them.
    """
    import csv

    import pyarrow as pa

    names = list(table.column_names)
    at = names.index(Ohlc.OPEN_TIME) + 1
    micros = table.column(Ohlc.OPEN_TIME).cast(pa.int64()).to_pylist()
    with path.open("w", newline="") as out:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([*names[:at], "open_time_ms", *names[at:]])
        for row, us in zip(table.to_pylist(), micros, strict=True):
            values = [row[name] for name in names]
            values[at - 1] = row[Ohlc.OPEN_TIME].strftime("%Y-%m-%dT%H:%M:%SZ")
            writer.writerow([*values[:at], us // 1000, *values[at:]])


def write_parquet(table: pa.Table, path: Path) -> None:
    import pyarrow.parquet as pq

    pq.write_table(table, path)


# --- markets ---

MARKET_NUMBERS = (
    ("price step", Markets.PRICE_PRECISION),
    ("amount step", Markets.AMOUNT_PRECISION),
    ("min amount", Markets.MIN_AMOUNT),
    ("max amount", Markets.MAX_AMOUNT),
    ("min price", Markets.MIN_PRICE),
    ("max price", Markets.MAX_PRICE),
    ("min cost", Markets.MIN_COST),
)


def market_table(table: pa.Table, *, title: str) -> Table:
    """Rows of Iceberg `market.markets`: 0 in a precision or limit is "not given" (-)."""
    out = _table(title)
    out.add_column("ticker", no_wrap=True)
    out.add_column("active")
    for header, _ in MARKET_NUMBERS:
        out.add_column(header, justify="right", no_wrap=True)
    out.add_column("updated (UTC)", no_wrap=True)
    for row in table.to_pylist():
        updated = row[Markets.UPDATED_AT]
        out.add_row(
            row[Markets.TICKER],
            "yes" if row[Markets.ACTIVE] else "no",
            *(f"{row[name]:g}" if row[name] else "-" for _, name in MARKET_NUMBERS),
            updated.strftime("%Y-%m-%d %H:%M:%S") if updated is not None else "-",
            style=None if row[Markets.ACTIVE] else "dim",
        )
    return out


# --- recording ---

_STATE_STYLES = {"repairing": "yellow", "incomplete": "red", "unknown": "dim"}


def recording_table(status: RecordingStatus) -> Table:
    """One line per recorded market; gap counts "?" when market.gaps was not read."""
    where = f" of {status.exchange}" if status.exchange else ""
    out = _table(f"Recording{where}: {len(status.markets)} markets (today = {status.day} UTC)")
    out.add_column("ticker", no_wrap=True)
    out.add_column("state", no_wrap=True)
    out.add_column("since (UTC)", no_wrap=True)
    out.add_column("last trade (UTC)", no_wrap=True)
    out.add_column("trades today", justify="right", no_wrap=True)
    for header in ("gaps open", "repairing", "repaired", "unrepairable"):
        out.add_column(header, justify="right", no_wrap=True)
    for market in status.markets:
        gaps = market.gaps
        counts = (
            ["?"] * 4
            if gaps is None
            else [str(gaps.open), str(gaps.repairing), str(gaps.repaired), str(gaps.unrepairable)]
        )
        out.add_row(
            market.ticker,
            market.state,
            _utc(market.since_ms),
            _utc(market.last_trade_ms),
            f"{market.trades_today:,}",
            *counts,
            style=_STATE_STYLES.get(market.state),
        )
    return out


def lost_gap_line(gap: LostGap) -> str:
    """One unrepairable gap: where, why it opened, what is known lost, and the reason."""
    missing = f", {gap.missing_ids:,} ids missing" if gap.missing_ids else ""
    return (
        f"unrepairable: {gap.ticker} {_utc(gap.from_time_ms)} -> {_utc(gap.to_time_ms)} "
        f"({gap.cause or 'cause unknown'}{missing}, {gap.trades_recovered:,} recovered): "
        f"{gap.reason or 'no reason given'}"
    )


def recording_notes(status: RecordingStatus) -> list[str]:
    """The lines a person must not miss: gap counts unknown, and every unrepairable gap."""
    lines = [f"gaps unknown: {status.gaps_note}"] if status.gaps_note else []
    return lines + [lost_gap_line(gap) for gap in status.lost_gaps]


RECORDING_CSV = (
    "ticker", "state", "since", "since_ms", "last_trade", "last_trade_ms", "trades_today",
    "gaps_open", "gaps_repairing", "gaps_repaired", "gaps_unrepairable", "unrepairable_reasons",
)  # fmt: skip


def write_recording_csv(status: RecordingStatus, out: TextIO) -> None:
    """ISO times plus epoch ms, as the candle CSV; unknown gap counts are empty fields."""
    import csv

    def iso(ms: int | None) -> str:
        return "" if ms is None else timeparse.format_ms(ms)

    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(RECORDING_CSV)
    for m in status.markets:
        gaps = m.gaps
        counts = (
            ["", "", "", ""]
            if gaps is None
            else [gaps.open, gaps.repairing, gaps.repaired, gaps.unrepairable]
        )
        writer.writerow(
            [
                m.ticker, m.state, iso(m.since_ms), m.since_ms if m.since_ms is not None else "",
                iso(m.last_trade_ms), m.last_trade_ms if m.last_trade_ms is not None else "",
                m.trades_today, *counts, " | ".join(g.reason for g in m.unrepairable),
            ]
        )  # fmt: skip


# --- trades ---

TIME_MS = "trade_time_ms"


class TradeEnds:
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


class TradeFiles:
    """The CSV and Parquet files of a trade read, written batch by batch."""

    def __init__(
        self, csv: Path | None, parquet: Path | None, schema: pa.Schema, report: TradeIntegrity
    ) -> None:
        self._csv_path, self._parquet_path = csv, parquet
        self._schema, self._report = schema, report
        self._csv: pacsv.CSVWriter | None = None
        self._parquet: pq.ParquetWriter | None = None

    def __enter__(self) -> TradeFiles:
        if self._csv_path is not None:
            import pyarrow.csv as pacsv

            self._csv = pacsv.CSVWriter(
                self._csv_path,
                trade_csv_schema(self._schema),
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
            self._csv.write_batch(trade_csv_batch(batch))
        if self._parquet is not None:
            self._parquet.write_batch(batch)

    def __exit__(self, *exc: object) -> None:
        for writer in (self._csv, self._parquet):
            if writer is not None:
                writer.close()


def trade_csv_schema(schema: pa.Schema) -> pa.Schema:
    """The trade columns, times as ISO-8601 UTC text, plus trade_time_ms (epoch ms, for
    scripts) after trade_time: the candle CSV's convention."""
    import pyarrow as pa

    fields = [pa.field(f.name, pa.string()) if pa.types.is_timestamp(f.type) else f for f in schema]
    at = schema.get_field_index(Ticks.TRADE_TIME) + 1
    return pa.schema(fields).insert(at, pa.field(TIME_MS, pa.int64()))


def trade_csv_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
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
        [*columns[: at + 1], millis, *columns[at + 1 :]], schema=trade_csv_schema(batch.schema)
    )


def _utc_ms(ms: int | None) -> str:
    """To the millisecond, for a trade range's report."""
    return "-" if ms is None else timeparse.format_ms(ms)


def gap_line(gap: RangeGap) -> str:
    missing = f", {gap.missing_ids:,} ids missing" if gap.missing_ids else ""
    recovered = f", {gap.trades_recovered:,} recovered" if gap.trades_recovered else ""
    if gap.awaiting_trades:
        recovered += f", {gap.trades_stored:,} of them stored yet"
    why = f": {gap.reason}" if gap.reason else ""
    return (
        f"  gap {gap.status.lower()}: {_utc_ms(gap.from_time_ms)} -> {_utc_ms(gap.to_time_ms)} "
        f"({gap.cause or 'cause unknown'}{missing}{recovered}){why}"
    )


def report_lines(report: TradeIntegrity) -> list[str]:
    """The report as a person reads it: state, recorded since, what is not recorded,
    the gap counts, then each gap that is not repaired (or whose trades are not all
    stored yet)."""
    if report.state == "not_recorded":
        since = (
            f"; recorded {_utc_ms(report.recorded_since_ms)} to {_utc_ms(report.last_trade_ms)}"
            if report.recorded_since_ms is not None
            else ""
        )
        return [f"not recorded: {report.reason}{since}"]
    lines = [
        f"integrity: {report.state}; recorded since {_utc_ms(report.recorded_since_ms)}, "
        f"newest stored trade {_utc_ms(report.last_trade_ms)}"
    ]
    if report.not_recorded_until_ms is not None:
        lines.append(
            f"  not recorded: {_utc_ms(report.start_ms)} -> "
            f"{_utc_ms(report.not_recorded_until_ms)} (before the recording began)"
        )
    counts = report.counts
    if counts is None:
        lines.append(f"  gaps unknown: {report.gaps_note}")
    else:
        lines.append(
            f"  gaps in the range: {counts.repaired} repaired, {counts.unrepairable} "
            f"unrepairable, {counts.open} open, {counts.repairing} repairing"
        )
    lines += [gap_line(g) for g in report.gaps or () if g.status != "REPAIRED" or g.awaiting_trades]
    return lines


def trade_table(view: TradeEnds, *, title: str) -> Table:
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


# --- book samples ---


def write_samples_csv(table: pa.Table, path: Path) -> None:
    """Book samples as CSV: each time as ISO-8601 UTC text (to the microsecond) followed by
    its `*_ms` column; an empty level is an empty field. No value needs quotes (times,
    numbers, booleans): none are written."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    columns: dict[str, pa.Array | pa.ChunkedArray] = {}
    for name in table.column_names:
        column = table[name]
        if not pa.types.is_timestamp(column.type):
            columns[name] = column
            continue
        columns[name] = pc.strftime(column, format="%Y-%m-%dT%H:%M:%SZ")
        columns[f"{name}_ms"] = pc.divide(column.cast(pa.int64()), 1000)
    options = pacsv.WriteOptions(quoting_header="none", quoting_style="none")
    pacsv.write_csv(pa.table(columns), path, write_options=options)


def sample_table(table: pa.Table, *, title: str, max_rows: int = 20) -> Table:
    """Each sample's time, exactness, best bid and ask (the whole depth is in the files);
    with more than `max_rows` rows the head and the tail."""
    out = _table(title)
    out.add_column("time (UTC)", no_wrap=True)
    for name in ("exact", "bid", "bid amount", "ask", "ask amount", "levels"):
        out.add_column(name, justify="left" if name == "exact" else "right", no_wrap=True)
    depth = sum(name.startswith("bid_price_") for name in table.column_names)
    rows = table.to_pylist()
    shown: list[dict[str, Any] | None] = list(rows)
    if 0 < max_rows < len(rows):
        head = max_rows // 2
        shown = [*rows[:head], None, *rows[-(max_rows - head) :]]
    for row in shown:
        if row is None:
            out.add_row(f"… {len(rows) - max_rows:,} more rows", *["…"] * 6, style="dim")
            continue
        levels = [
            sum(row[f"{side}_price_{i}"] is not None for i in range(depth))
            for side in ("bid", "ask")
        ]
        out.add_row(
            row["time"].strftime("%Y-%m-%d %H:%M:%S.%f")[:-3],
            "yes" if row["exact"] else "no",
            *(_number(row.get(n)) for n in ("bid_price_0", "bid_amount_0")),
            *(_number(row.get(n)) for n in ("ask_price_0", "ask_amount_0")),
            f"{levels[0]}/{levels[1]}",
        )
    return out


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:g}"
