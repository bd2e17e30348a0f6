"""Shared test helpers: protocol record builders (pure) and, for stack tests, the pipeline run."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pytest

from mdproto import envelope, topics
from mdproto.messages import OHLC, BatchMetadata, OHLCBatch, Status, TakerSide, Tick

TICKER = "BINANCE:BTC/USDT"
MINUTE = 60_000
T0 = 1_700_000_040_000  # a minute boundary (2023-11-14T22:14:00Z)


def candle(i: int, *, ticker: str = TICKER, period: int = 60, t0: int = T0, **kw: float) -> OHLC:
    """The i-th 1-minute candle from t0 with distinct, recognisable prices."""
    values = {"open": 100.0 + i, "high": 110.0 + i, "low": 90.0 + i, "close": 105.0 + i}
    values.update(kw)
    return OHLC(
        ticker=ticker,
        period_seconds=period,
        open_time_ms=t0 + i * period * 1000,
        volume=1.5,
        trade_count=7,
        **values,
    )


def metadata(
    request_id: str,
    *,
    client_id: str = "client-1",
    ticker: str = TICKER,
    period: int = 60,
    start: int = T0,
    end: int = T0 + 10 * MINUTE,
    topic: str | None = None,
) -> BatchMetadata:
    return BatchMetadata(
        request_id=request_id,
        client_id=client_id,
        ticker=ticker,
        period_seconds=period,
        start_time_ms=start,
        end_time_ms=end,
        notification_topic=topic
        if topic is not None
        else topics.notification_topic(0, request_id, client_id),
        ingestor_id="ingestor-a",
    )


def request_records(
    request_id: str,
    rows: Sequence[OHLC],
    *,
    per_record: int = 1000,
    status: int = Status.OK,
    meta: BatchMetadata | None = None,
    reason: str = "",
    error_code: str = "",
) -> list[bytes]:
    """The Kafka values an ingestor writes for one request: sequence 0..n, then the marker."""
    meta = meta or metadata(request_id)
    values = []
    chunks = [rows[i : i + per_record] for i in range(0, len(rows), per_record)] or [[]]
    for seq, chunk in enumerate(chunks):
        batch = OHLCBatch(request_id=request_id, sequence=seq, rows=list(chunk))
        if seq == 0:
            batch.metadata.CopyFrom(meta)
        if chunk or seq == 0:
            values.append(envelope.encode_record(batch))
    final = BatchMetadata()
    final.CopyFrom(meta)
    final.status = status  # type: ignore[assignment]
    final.total_rows = len(rows)
    final.total_batches = len(values)
    final.reason = reason
    final.error_code = error_code
    marker = OHLCBatch(request_id=request_id, sequence=len(values), metadata=final, is_final=True)
    values.append(envelope.encode_record(marker))
    return values


def tick(
    trade_id: str | int,
    price: float,
    ts: int,
    *,
    amount: float = 1.0,
    ticker: str = TICKER,
    ingested_at_ms: int = 0,
) -> Tick:
    return Tick(
        ticker=ticker,
        trade_id=str(trade_id),
        price=price,
        amount=amount,
        timestamp_ms=ts,
        side=TakerSide.BUY,
        ingested_at_ms=ingested_at_ms,
    )


def kafka_table(
    values: Sequence[bytes | None],
    *,
    key: bytes | None = TICKER.encode(),
    partition: int = 0,
    first_offset: int = 0,
    timestamp_ms: int = T0,
) -> pa.Table:
    """What `batch_df.select(key, value, partition, offset, timestamp).toArrow()` gives."""
    n = len(values)
    return pa.table(
        {
            "key": pa.array([key] * n, pa.binary()),
            "value": pa.array(values, pa.binary()),
            "partition": pa.array([partition] * n, pa.int32()),
            "offset": pa.array(range(first_offset, first_offset + n), pa.int64()),
            "timestamp": pa.array([timestamp_ms * 1000] * n, pa.int64()).cast(
                pa.timestamp("us", tz="UTC")
            ),
        }
    )


class Builders:
    """The helpers above, reachable from tests (importlib mode: conftest is not importable)."""

    TICKER = TICKER
    MINUTE = MINUTE
    T0 = T0
    candle = staticmethod(candle)
    metadata = staticmethod(metadata)
    request_records = staticmethod(request_records)
    tick = staticmethod(tick)
    kafka_table = staticmethod(kafka_table)


@pytest.fixture
def build() -> type[Builders]:
    return Builders
