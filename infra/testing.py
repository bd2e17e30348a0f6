"""Small helpers for tests against the local stack (no sleeps: poll with deadlines)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from confluent_kafka import Consumer, Message

    from mdclient import HistoryResult


def consume(consumer: Consumer, count: int, timeout_s: float = 60.0) -> list[Message]:
    """Poll until ``count`` messages arrived; fail with the count seen after ``timeout_s``.

    Partition-EOF events are skipped; any other consumer error fails the test.
    """
    from confluent_kafka import KafkaError

    got: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"only {len(got)}/{count} messages within {timeout_s} s")
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                continue
            raise AssertionError(f"consumer error: {err}")
        got.append(msg)
    return got


def exchange_rows(symbol: str, start: int, end: int) -> list[tuple[float, ...]]:
    """The simulator's 1-minute candles for [start, end) as (open_ms, o, h, l, c, v)."""
    from infra.exchange_sim import expected_klines

    return [
        tuple(float(v) for v in k.ohlcv())
        for k in expected_klines(symbol, "1m", start, end)
        if k.open_time < end
    ]


def result_rows(result: HistoryResult) -> list[tuple[float, ...]]:
    """A history answer's rows in the same shape as `exchange_rows`."""
    t = result.table
    times = [int(ts.timestamp() * 1000) for ts in t.column("open_time").to_pylist()]
    columns = [t.column(name).to_pylist() for name in ("open", "high", "low", "close", "volume")]
    return [(float(ms), *values) for ms, *values in zip(times, *columns, strict=True)]
