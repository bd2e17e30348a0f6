"""Small helpers for tests and benchmarks against the local stack (no sleeps: poll with
deadlines)."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa
    from confluent_kafka import Consumer, Message

    from infra.localstack import StackEndpoints
    from mdclient import HistoryResult


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pipeline_env(
    endpoints: StackEndpoints,
    *,
    namespace: str,
    batches_topic: str,
    ticks_topic: str,
    checkpoint_dir: Path,
    pub_endpoint: str,
    ready_file: Path,
) -> dict[str, str]:
    """The environment of a `python -m pipeline` on the stack with its own namespace,
    topics, checkpoints and PUB: this process's, without its PIPELINE_* variables."""
    from infra.artifacts import spark_jars

    e = endpoints
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    env.update(
        {
            "PYSPARK_PYTHON": sys.executable,
            "PIPELINE_KAFKA__BOOTSTRAP_SERVERS": e.kafka_bootstrap,
            "PIPELINE_KAFKA__TOPIC_OHLC_BATCHES": batches_topic,
            "PIPELINE_KAFKA__TOPIC_TICKS": ticks_topic,
            **e.catalog_env("PIPELINE_CATALOG__"),
            "PIPELINE_CATALOG__NAMESPACE": namespace,
            "PIPELINE_SPARK__MASTER": "local[2]",
            "PIPELINE_SPARK__JARS": json.dumps([str(j) for j in spark_jars()]),
            "PIPELINE_CHECKPOINT_DIR": str(checkpoint_dir),
            "PIPELINE_PUB_ENDPOINT": pub_endpoint,
            "PIPELINE_READY_FILE": str(ready_file),
        }
    )
    return env


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
    return table_rows(result.table)


def table_rows(t: pa.Table) -> list[tuple[float, ...]]:
    """Candle frame rows (mdclient.frames) in the same shape as `exchange_rows`."""
    times = [int(ts.timestamp() * 1000) for ts in t.column("open_time").to_pylist()]
    columns = [t.column(name).to_pylist() for name in ("open", "high", "low", "close", "volume")]
    return [(float(ms), *values) for ms, *values in zip(times, *columns, strict=True)]
