"""Turning a candle frame into what the CLI shows or writes (table, CSV, Parquet)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich import box
from rich.table import Table

from mdclient.live import LiveMessage
from mdclient.timeparse import format_ms, format_period
from mdproto.messages import OHLC, HistoryReadyNotification, HistorySource, TakerSide

if TYPE_CHECKING:
    import pyarrow as pa

PRICE_COLUMNS = ("open", "high", "low", "close")


_SOURCES = {
    HistorySource.SOURCE_EXCHANGE: "from the exchange",
    HistorySource.SOURCE_STORAGE: "from storage (the exchange was not asked)",
    HistorySource.SOURCE_STORAGE_AND_EXCHANGE: "from storage, the gaps from the exchange",
}


def integrity_line(note: HistoryReadyNotification) -> str | None:
    """The notification's integrity report in one line; None from a platform without it."""
    if note.expected_candles == 0:
        return None
    missing = f"{note.missing_candles} missing" if note.missing_candles else "none missing"
    return (
        f"{note.expected_candles} candle slots: {note.row_count} rows, "
        f"{note.exchange_gaps} without trades at the exchange, {missing}; "
        f"{_SOURCES.get(note.source, 'source unknown')}"
    )


def check_writable(path: Path) -> None:
    """Fail before the request, not after a long wait: the folder must exist."""
    parent = path.expanduser().resolve().parent
    if not parent.is_dir():
        raise FileNotFoundError(f"folder {parent} does not exist (for output {path})")
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder, not a file name")


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


def _table(title: str) -> Table:
    return Table(
        title=title,
        title_justify="left",
        header_style="bold",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )


def candle_table(table: pa.Table, *, title: str, max_rows: int = 20) -> Table:
    """A rich table; with more than `max_rows` rows shows the head and the tail."""
    rows = table.to_pylist()
    decimals = decimals_for([row["close"] for row in rows])
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
            row["open_time"].strftime("%Y-%m-%d %H:%M:%S"),
            *(f"{row[name]:.{decimals}f}" for name in PRICE_COLUMNS),
            f"{row['volume']:.4f}",
            "" if row["trade_count"] is None else str(row["trade_count"]),  # unknown: blank
        )
    return out


MARKET_NUMBERS = (
    ("price step", "price_precision"),
    ("amount step", "amount_precision"),
    ("min amount", "min_amount"),
    ("max amount", "max_amount"),
    ("min price", "min_price"),
    ("max price", "max_price"),
    ("min cost", "min_cost"),
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
        updated = row["updated_at"]
        out.add_row(
            row["ticker"],
            "yes" if row["active"] else "no",
            *(f"{row[name]:g}" if row[name] else "-" for _, name in MARKET_NUMBERS),
            updated.strftime("%Y-%m-%d %H:%M:%S") if updated is not None else "-",
            style=None if row["active"] else "dim",
        )
    return out


def write_csv(table: pa.Table, path: Path) -> None:
    """CSV with ISO-8601 UTC open_time plus open_time_ms for scripts."""
    import pyarrow as pa

    # As text, an unknown (null) trade count is an empty field; as a pandas int
    # column with nulls it would turn every count into a float ("7.0").
    index = table.schema.get_field_index("trade_count")
    table = table.set_column(index, "trade_count", table.column(index).cast(pa.string()))
    frame = table.to_pandas()
    frame.insert(3, "open_time_ms", frame["open_time"].astype("int64") // 1000)
    frame["open_time"] = frame["open_time"].dt.strftime("%Y-%m-%dT%H:%M:%SZ")
    frame.to_csv(path, index=False)


def write_parquet(table: pa.Table, path: Path) -> None:
    import pyarrow.parquet as pq

    pq.write_table(table, path)


def live_line(message: LiveMessage) -> str:
    """One terminal line per live message."""
    if isinstance(message, OHLC):
        # A correction re-publishes a closed candle a late trade changed (docs/protocol.md).
        state = "fixed " if message.correction else "closed" if message.closed else "open  "
        trades = message.trade_count if message.HasField("trade_count") else ""
        return (
            f"{format_ms(message.open_time_ms)}  {message.ticker}  "
            f"ohlc:{format_period(message.period_seconds):>3} {state}  "
            f"O {message.open:g}  H {message.high:g}  L {message.low:g}  C {message.close:g}  "
            f"V {message.volume:g}  n {trades}"
        )
    side = TakerSide.Name(message.side).replace("SIDE_UNSPECIFIED", "-")
    return (
        f"{format_ms(message.timestamp_ms)}  {message.ticker}  tick  {side:<4}  "
        f"{message.price:g} x {message.amount:g}  #{message.trade_id}"
    )
