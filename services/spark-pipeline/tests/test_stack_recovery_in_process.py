"""Queries failing right after a commit are restarted in-process from their
checkpoints: the replays add no row and notify once, the process serves on."""

from __future__ import annotations

import re
from typing import Any

import pytest

from infra.testing import poll_until
from mdproto import envelope
from mdproto.messages import HistoryReadyNotification, Status

pytestmark = [pytest.mark.stack, pytest.mark.spark, pytest.mark.heavy(seconds=60)]


def test_failed_queries_restart_in_process_and_write_exactly_once(
    make_run: Any, tools: Any, build: Any
) -> None:
    """Micro-batches fail right after their commit (as when a commit's state is unknown but
    it landed): each query restarts from its checkpoint, the process and the other
    queries run on, the replays add no row and notify once, and the pipeline keeps
    serving. A table from before gets the commit-retry properties at start."""
    from pyiceberg.catalog import load_catalog

    from pipeline.lake import COMMIT_RETRY_PROPERTIES
    from pipeline.markets import MARKETS_SCHEMA

    run = make_run(
        PIPELINE_CEP__ENABLED="false",
        PIPELINE_FAIL_AT="history-after-ohlc-commit,history-after-requests-commit,"
        "live-after-ticks-commit",
        PIPELINE_RESTART__BACKOFF_INITIAL_S="0.5",
    )
    endpoints = run.endpoints
    catalog = load_catalog(endpoints.catalog_name, **endpoints.pyiceberg_catalog_properties())
    catalog.create_namespace(run.namespace)
    catalog.create_table(  # as an older pipeline left it: Iceberg's 4 commit retries
        f"{run.namespace}.markets", MARKETS_SCHEMA, properties={"format-version": "2"}
    )
    sub = tools.Subscriber(run.pub_endpoint)
    kafka = tools.Kafka(run.endpoints.kafka_bootstrap)
    lake = tools.Lake(run.endpoints, run.namespace)
    t0, n = build.T0, 600

    def request(request_id: str, first: int) -> None:
        start = t0 + first * build.MINUTE
        rows = [build.candle(i, t0=start) for i in range(n)]
        meta = build.metadata(request_id, start=start, end=start + n * build.MINUTE)
        kafka.send(run.batches_topic, build.request_records(request_id, rows, meta=meta))

    b = 1_704_067_200_000  # 2024-01-01T00:00:00Z

    def trades(first: int, last: int) -> list[Any]:
        return [build.tick(f"t{i}", 100.0 + i % 7, b + i * 1000) for i in range(first, last)]

    sent = trades(0, 40)
    request("restart-1", 0)
    kafka.send(run.ticks_topic, [envelope.encode_record(x) for x in [*sent, *sent[:5]]])

    run.start()
    run.wait_ready()
    # History fails after the ohlc commit, then, replayed, after the requests commit;
    # ticks-persist after its first commit. Each replay then gets through.
    sub.wait_for(tools.is_notification("restart-1"))
    restarts = {"history": 2.0, "ticks-persist": 1.0}

    def restarted() -> bool:
        samples = run.metrics()
        return all(
            samples.get(f'pipeline_query_restarts_total{{query="{q}"}}') == count
            for q, count in restarts.items()
        )

    poll_until(f"restarts {restarts}", restarted, tools.WAIT_S, interval_s=0.5)
    # Still serving: a new request and new trades after the restarts.
    more = trades(40, 60)
    request("restart-2", n)
    kafka.send(run.ticks_topic, [envelope.encode_record(x) for x in more])
    sub.wait_for(tools.is_notification("restart-2"))
    everything = sorted((x.ticker, x.trade_id) for x in [*sent, *more])
    poll_until(
        "every trade stored",
        lambda: len(lake.rows("ticks")) >= len(everything),
        tools.WAIT_S,
        interval_s=0.5,
    )

    assert run.process is not None and run.process.poll() is None, "the pipeline exited"
    samples = run.metrics()
    for query in ("candles-store", "markets"):
        assert samples[f'pipeline_query_restarts_total{{query="{query}"}}'] == 0.0
        assert samples[f'pipeline_query_active{{query="{query}"}}'] == 1.0
    writes = {k: v for k, v in samples.items() if k.startswith("pipeline_iceberg_writes_total")}
    assert writes['pipeline_iceberg_writes_total{path="driver-append",table="ticks"}'] >= 1, writes
    assert writes['pipeline_iceberg_writes_total{path="driver-append",table="ohlc"}'] >= 1, writes
    assert not any('path="append-then-merge"' in k for k in writes), writes
    for query in restarts:
        assert samples[f'pipeline_query_active{{query="{query}"}}'] == 1.0
    # Exactly once: one notification per request (restart-1's replays came before
    # restart-2's), every candle and trade once, one requests row each.
    for request_id in ("restart-1", "restart-2"):
        [got] = sub.matching(tools.is_notification(request_id))
        assert isinstance(got.message, HistoryReadyNotification)
        assert (got.message.status, got.message.row_count) == (Status.OK, n)
    candles = lake.rows("ohlc", "source = 'history'")
    assert len(candles) == 2 * n
    assert len({(r["ticker"], r["period_seconds"], r["open_time"]) for r in candles}) == 2 * n
    assert sorted(r["request_id"] for r in lake.rows("requests")) == ["restart-1", "restart-2"]
    assert sorted((r["ticker"], r["trade_id"]) for r in lake.rows("ticks")) == everything
    log = run.log_text()
    assert "query history failed: InjectedFailureError: injected failure at history-after" in log
    assert "query ticks-persist restarted from its checkpoint" in log
    # The replayed ticks batch found its own trades stored (read on the driver) and
    # appended none; every write went one way (write_paths.WriteRule), none fell back.
    assert re.search(r"ticks-persist batch \d+: \d+ unique ticks stored \(append 0\)", log), log
    properties = lake.table("markets").properties
    assert {k: properties.get(k) for k in COMMIT_RETRY_PROPERTIES} == COMMIT_RETRY_PROPERTIES

    run.stop()
    assert run.process.returncode == 0
    sub.close()
