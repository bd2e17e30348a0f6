"""A ticks batch over the record threshold is decoded and appended by Spark's executors
(ADR 0021): every trade stored once, the replay of the same batch stores none, and a
small batch after it still goes the driver's way."""

from __future__ import annotations

import re
from typing import Any

import pytest

from infra.testing import poll_until
from mdproto import envelope

pytestmark = [pytest.mark.stack, pytest.mark.spark, pytest.mark.heavy(seconds=90)]

TICKERS = ("BINANCE:BTC/USDT", "BINANCE:ETH/USDT", "KRAKEN:SOL/EUR")
B = 1_704_067_200_000  # 2024-01-01T00:00:00Z


def test_a_large_ticks_batch_is_written_by_the_executors_once_and_its_replay_adds_none(
    make_run: Any, tools: Any, build: Any
) -> None:
    run = make_run(
        PIPELINE_CEP__ENABLED="false",
        PIPELINE_HISTORY__ENABLED="false",
        PIPELINE_CATALOG__EXECUTOR_APPEND_MIN_RECORDS="100",
        # The first ticks batch fails after its commit: the restarted query replays it.
        PIPELINE_FAIL_AT="live-after-ticks-commit",
        PIPELINE_RESTART__BACKOFF_INITIAL_S="0.5",
    )
    kafka = tools.Kafka(run.endpoints.kafka_bootstrap)
    lake = tools.Lake(run.endpoints, run.namespace)

    def trades(ticker: str, first: int, last: int, ingested_at_ms: int = 0) -> list[bytes]:
        def tick(i: int) -> Any:
            at = B + i * 1000
            return build.tick(
                f"{ticker[:3]}-{i}", 100.0 + i % 7, at, ticker=ticker, ingested_at_ms=ingested_at_ms
            )

        return [envelope.encode_record(tick(i)) for i in range(first, last)]

    # One batch of 3 x 100 trades, 20 of them delivered again later (the later copy's
    # ingested_at wins) and a record that is no tick: 321 records >= 100.
    for ticker in TICKERS:
        kafka.send(run.ticks_topic, trades(ticker, 0, 100, B + 1), key=ticker)
    kafka.send(run.ticks_topic, trades(TICKERS[0], 0, 20, B + 2), key=TICKERS[0])
    kafka.send(run.ticks_topic, [b"not a tick"], key=TICKERS[0])

    run.start()
    run.wait_ready()

    def replayed() -> bool:
        return run.metrics().get('pipeline_query_restarts_total{query="ticks-persist"}') == 1.0

    poll_until("ticks-persist restarted", replayed, tools.WAIT_S, interval_s=0.5)
    poll_until(
        "the replay logged",
        lambda: "unique ticks stored (executor-append 0)" in run.log_text(),
        tools.WAIT_S,
        interval_s=0.5,
    )
    # Below the threshold: the driver's way.
    kafka.send(run.ticks_topic, trades(TICKERS[1], 100, 110), key=TICKERS[1])
    poll_until("the small batch stored", lambda: len(lake.rows("ticks")) >= 310, tools.WAIT_S)

    rows = lake.rows("ticks")
    keys = sorted((r["ticker"], r["trade_id"]) for r in rows)
    assert len(keys) == len(set(keys)) == 310  # every trade once
    again = {r["trade_id"]: r["ingested_at"] for r in rows if r["ticker"] == TICKERS[0]}
    assert {int(again[f"BIN-{i}"].timestamp() * 1000) for i in range(20)} == {B + 2}
    assert int(again["BIN-20"].timestamp() * 1000) == B + 1

    writes = {k: v for k, v in run.metrics().items() if k.startswith("pipeline_iceberg_writes")}
    executor = 'pipeline_iceberg_writes_total{path="executor-append",table="ticks"}'
    assert writes[executor] == 2.0, writes  # the batch and its replay
    assert writes['pipeline_iceberg_writes_total{path="driver-append",table="ticks"}'] >= 1.0
    assert not any('path="append-then-merge"' in k for k in writes), writes
    log = run.log_text()
    stored = re.findall(r"ticks-persist batch 0: (\d+) unique ticks stored \(([^)]*)\)", log)
    # The first run failed after its commit (before its log line); the replay found them.
    assert stored == [("300", "executor-append 0")], stored
    assert "ticks-persist on an executor: dropped" in log  # the worker logs the reject
    run.stop()
    assert run.process is not None and run.process.returncode == 0
