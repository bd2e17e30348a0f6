"""Table upkeep: the plan of procedure calls (pure), and a real round on a real stack."""

from __future__ import annotations

import time
from typing import Any

import pytest

from pipeline.config import UpkeepConfig
from pipeline.lake import TableNames
from pipeline.upkeep import plan

NAMES = TableNames("lake", "market")
T = 1_795_132_800_000  # 2026-11-20T00:00Z


def test_each_table_is_compacted_then_expired_keeping_recent_snapshots() -> None:
    cfg = UpkeepConfig(snapshot_retain_s=3600, retain_last_snapshots=5, min_input_files=4)
    steps = plan(NAMES, cfg, now_ms=T)
    assert [(s.table, s.action) for s in steps[:4]] == [
        ("market.ohlc", "rewrite_data_files"),
        ("market.ohlc", "rewrite_position_delete_files"),
        ("market.ohlc", "rewrite_manifests"),
        ("market.ohlc", "expire_snapshots"),
    ]
    assert {s.table for s in steps} == {
        "market.ohlc",
        "market.ticks",
        "market.requests",
        "market.markets",
        "market.book_snapshots",
        "market.book_deltas",
        "market.gaps",
        "market.trade_bars",
    }
    assert steps[2].sql == "CALL lake.system.rewrite_manifests(table => 'market.ohlc')"
    expire = steps[3].sql
    assert expire.startswith("CALL lake.system.expire_snapshots(table => 'market.ohlc'")
    assert "TIMESTAMP '2026-11-19 23:00:00.000000+00:00'" in expire  # one hour kept
    assert "retain_last => 5" in expire
    assert "'min-input-files', '4'" in steps[0].sql


@pytest.mark.stack
@pytest.mark.spark
@pytest.mark.heavy(seconds=170)
def test_a_round_compacts_small_commits_and_expires_their_snapshots(
    make_run: Any, tools: Any, build: Any
) -> None:
    run = make_run(  # the history query alone: the others would only load the cores
        PIPELINE_LIVE__ENABLED="false",
        PIPELINE_CEP__ENABLED="false",
        PIPELINE_MARKETS__ENABLED="false",
        PIPELINE_GAPS__ENABLED="false",
        PIPELINE_UPKEEP__INTERVAL_S="3",
        PIPELINE_UPKEEP__SNAPSHOT_RETAIN_S="0",
        PIPELINE_UPKEEP__RETAIN_LAST_SNAPSHOTS="1",
        PIPELINE_UPKEEP__MIN_INPUT_FILES="2",
    )
    sub = tools.Subscriber(run.pub_endpoint)
    run.start()
    try:
        run.wait_ready()
        kafka = tools.Kafka(run.endpoints.kafka_bootstrap)
        candles = []
        for n in range(6):  # six requests, six commits of ten candles each: small files
            rows = [build.candle(10 * n + i) for i in range(10)]
            candles += rows
            meta = build.metadata(f"up-{n}", start=build.T0, end=build.T0 + 60 * build.MINUTE)
            kafka.send(run.batches_topic, build.request_records(f"up-{n}", rows, meta=meta))
            sub.wait_for(tools.is_notification(f"up-{n}"))
        lake = tools.Lake(run.endpoints, run.namespace)
        deadline = time.monotonic() + 120
        while True:
            table = lake.table("ohlc")
            files = len(table.inspect.files())
            snapshots = len(table.inspect.snapshots())
            if files == 1 and snapshots <= 2:
                break
            assert time.monotonic() < deadline, f"{files} files, {snapshots} snapshots"
            time.sleep(1)
        stored = sorted(
            (int(r["open_time"].timestamp() * 1000), r["close"]) for r in lake.rows("ohlc")
        )
        assert stored == [(c.open_time_ms, c.close) for c in candles]  # same rows, fewer files
    finally:
        sub.close()
        run.stop()
