"""The Iceberg catalog restarted and the S3 store gone for 20 s, mid-stream: the pipeline
process runs on (failed queries restart from their checkpoints), data sent after the
outages lands, and every row is stored exactly once.

The S3 store is stopped and started again rather than SIGSTOPped: a stopped store refuses
connections, which is what a crashed or redeployed store looks like; a frozen one would
only test the client's read timeouts.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from infra.testing import poll_until
from mdproto import envelope
from mdproto.messages import HistoryReadyNotification, Status

pytestmark = [pytest.mark.stack, pytest.mark.spark, pytest.mark.heavy(seconds=175)]

OUTAGE_S = 20.0


def _ms(value: Any) -> int:
    return round(value.timestamp() * 1000) if hasattr(value, "timestamp") else int(value)


def test_catalog_restart_and_s3_outage_lose_and_duplicate_nothing(
    local_stack: Any, make_run: Any, tools: Any, build: Any
) -> None:
    run = make_run(
        PIPELINE_CEP__ENABLED="false",
        PIPELINE_MARKETS__ENABLED="false",
        PIPELINE_GAPS__ENABLED="false",
    )
    sub = tools.Subscriber(run.pub_endpoint)
    kafka = tools.Kafka(run.endpoints.kafka_bootstrap)
    lake = tools.Lake(run.endpoints, run.namespace)
    t0, n = build.T0, 300
    b = 1_704_067_200_000  # 2024-01-01T00:00:00Z
    sent_trades: list[Any] = []
    requests: list[str] = []

    def send(step: int) -> None:
        """Request `out-{step}` (n candles of its own) and 20 trades, plus 5 redelivered."""
        request_id = f"out-{step}"
        start = t0 + step * n * build.MINUTE
        rows = [build.candle(i, t0=start) for i in range(n)]
        meta = build.metadata(request_id, start=start, end=start + n * build.MINUTE)
        kafka.send(run.batches_topic, build.request_records(request_id, rows, meta=meta))
        trades = [
            build.tick(f"t{i}", 100.0 + i % 7, b + i * 1000)
            for i in range(step * 20, step * 20 + 20)
        ]
        kafka.send(run.ticks_topic, [envelope.encode_record(x) for x in [*trades, *trades[:5]]])
        sent_trades.extend(trades)
        requests.append(request_id)

    def landed() -> None:
        for request_id in requests:
            sub.wait_for(tools.is_notification(request_id))
        poll_until(
            "every trade stored",
            lambda: len(lake.rows("ticks")) >= len(sent_trades),
            tools.WAIT_S,
            interval_s=0.5,
        )

    def alive() -> None:
        assert run.process is not None and run.process.poll() is None, (
            f"the pipeline exited:\n{run.tail()}"
        )

    send(0)
    run.start()
    run.wait_ready()
    landed()
    try:
        # (a) The catalog restarted mid-stream (its tables are in PostgreSQL).
        send(1)
        local_stack.stop("iceberg-rest")
        local_stack.up()
        send(2)
        landed()
        alive()
        # (b) The S3 store unavailable for 20 s mid-stream.
        send(3)
        local_stack.stop("seaweedfs")
        time.sleep(OUTAGE_S)  # the outage itself
        local_stack.up()
        send(4)
        landed()
        alive()
    finally:
        local_stack.up()  # the session's stack, whole again whatever happened

    for request_id in requests:
        [got] = sub.matching(tools.is_notification(request_id))
        assert isinstance(got.message, HistoryReadyNotification)
        assert (got.message.status, got.message.row_count) == (Status.OK, n), request_id
    candles = lake.rows("ohlc", "source = 'history'")
    keys = [(r["ticker"], r["period_seconds"], _ms(r["open_time"])) for r in candles]
    assert len(keys) == len(set(keys)) == len(requests) * n
    expected = {
        (build.TICKER, 60, t0 + (step * n + i) * build.MINUTE)
        for step in range(len(requests))
        for i in range(n)
    }
    assert set(keys) == expected
    assert sorted(r["request_id"] for r in lake.rows("requests")) == sorted(requests)
    stored = [(r["ticker"], r["trade_id"]) for r in lake.rows("ticks")]
    assert sorted(stored) == sorted((x.ticker, x.trade_id) for x in sent_trades)
    live = lake.rows("ohlc", "source = 'live'")
    live_keys = [(r["ticker"], r["period_seconds"], r["open_time"]) for r in live]
    assert len(live_keys) == len(set(live_keys))
    alive()
    run.stop()
    assert run.process.returncode == 0
    sub.close()
