"""The candle frame every read returns, whatever the source (Iceberg or legacy).

Columns: ticker, period_seconds, open_time (UTC, microseconds), open, high,
low, close, volume, trade_count; sorted by open_time.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc

from mdproto.messages import OHLC

SCHEMA = pa.schema(
    [
        pa.field("ticker", pa.string()),
        pa.field("period_seconds", pa.int32()),
        pa.field("open_time", pa.timestamp("us", tz="UTC")),
        pa.field("open", pa.float64()),
        pa.field("high", pa.float64()),
        pa.field("low", pa.float64()),
        pa.field("close", pa.float64()),
        pa.field("volume", pa.float64()),
        pa.field("trade_count", pa.int64()),
    ]
)
COLUMNS: tuple[str, ...] = tuple(SCHEMA.names)


def empty_candles() -> pa.Table:
    return SCHEMA.empty_table()


def candles_from_ohlc(rows: Iterable[OHLC]) -> pa.Table:
    """Legacy `Response.candles` -> the candle frame."""
    items = list(rows)
    table = pa.table(
        {
            "ticker": [r.ticker for r in items],
            "period_seconds": [r.period_seconds for r in items],
            "open_time": [r.open_time_ms * 1000 for r in items],
            "open": [r.open for r in items],
            "high": [r.high for r in items],
            "low": [r.low for r in items],
            "close": [r.close for r in items],
            "volume": [r.volume for r in items],
            "trade_count": [r.trade_count if r.HasField("trade_count") else None for r in items],
        },
        schema=SCHEMA,
    )
    return sort_candles(table)


def normalise(table: pa.Table) -> pa.Table:
    """Any table with the candle columns -> exactly SCHEMA, sorted (Iceberg types vary)."""
    missing = [name for name in COLUMNS if name not in table.column_names]
    if missing:
        raise ValueError(f"candle table lacks columns {missing}")
    return sort_candles(table.select(list(COLUMNS)).cast(SCHEMA))


def sort_candles(table: pa.Table) -> pa.Table:
    if table.num_rows < 2:
        return table
    return table.take(pc.sort_indices(table, sort_keys=[("open_time", "ascending")]))


def closed_ohlc(table: pa.Table) -> list[OHLC]:
    """Candle frame -> `OHLC(closed=True)` messages (stored candles are closed)."""
    micros = table.column("open_time").cast(pa.int64()).to_pylist()
    rows = table.drop_columns(["open_time"]).to_pylist()
    return [
        OHLC(
            open_time_ms=us // 1000,
            closed=True,
            **{k: v for k, v in row.items() if v is not None},
        )
        for us, row in zip(micros, rows, strict=True)
    ]
