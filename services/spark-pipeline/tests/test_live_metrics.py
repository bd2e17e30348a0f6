"""The live engine's Prometheus series (pipeline/live_metrics.py): per-batch updates,
lag from librdkafka's statistics, series of moved partitions removed, and the
pipeline's /metrics reading its PUB process's engine. Fake clocks, no sleeps."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from pipeline.live_metrics import EngineMetrics, EngineScrape, partition_lag, serve

TICKS, BOOK = "market.ticks", "market.book"


def metrics(**kwargs: Any) -> EngineMetrics:
    return EngineMetrics(TICKS, BOOK, engine="e1", **kwargs)


def value(m: EngineMetrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, {"engine": "e1", **labels})


def stats(partitions: dict[str, dict[str, dict[str, int]]]) -> str:
    """librdkafka's statistics JSON, the parts the engine reads (STATISTICS.md)."""
    return json.dumps(
        {
            "name": "rdkafka#consumer-1",
            "topics": {t: {"partitions": p} for t, p in partitions.items()},
        }
    )


def test_a_batch_counts_records_by_topic_and_observes_its_first_live_tick() -> None:
    m = metrics(wall_ms=lambda: 10_500)
    m.batch(ticks=7, books=3, first_live_ms=10_000)
    m.batch(ticks=2, books=0, first_live_ms=None)  # a backlog batch: nothing published live
    m.batch(ticks=1, books=0, first_live_ms=-1)  # a record without a Kafka time
    assert value(m, "pipeline_live_records_total", topic=TICKS) == 10
    assert value(m, "pipeline_live_records_total", topic=BOOK) == 3
    assert value(m, "pipeline_live_publish_latency_seconds_count") == 1
    assert value(m, "pipeline_live_publish_latency_seconds_sum") == 0.5
    assert value(m, "pipeline_live_publish_latency_seconds_bucket", le="0.5") == 1
    assert value(m, "pipeline_live_publish_latency_seconds_bucket", le="0.25") == 0


def test_partitions_owned_and_the_lag_of_each_from_librdkafka_statistics() -> None:
    m = metrics()
    assert value(m, "pipeline_live_partitions_owned", topic=TICKS) == 0  # exported at once
    m.owned([(TICKS, 0), (TICKS, 2), (BOOK, 0)])
    assert value(m, "pipeline_live_partitions_owned", topic=TICKS) == 2
    assert value(m, "pipeline_live_partitions_owned", topic=BOOK) == 1
    m.on_stats(
        stats(
            {
                TICKS: {
                    "-1": {"consumer_lag_stored": 5},  # librdkafka's unassigned queue
                    "0": {"consumer_lag": -1, "consumer_lag_stored": 120, "hi_offset": 900},
                    "1": {"consumer_lag_stored": 40},  # another engine's
                    "2": {"consumer_lag_stored": -1, "hi_offset": 50, "app_offset": 45},
                },
                BOOK: {"0": {"consumer_lag_stored": -1, "hi_offset": 8, "next_offset": 8}},
            }
        )
    )
    assert value(m, "pipeline_live_kafka_lag_offsets", topic=TICKS, partition="0") == 120
    assert value(m, "pipeline_live_kafka_lag_offsets", topic=TICKS, partition="1") is None
    assert value(m, "pipeline_live_kafka_lag_offsets", topic=TICKS, partition="2") == 5
    assert value(m, "pipeline_live_kafka_lag_offsets", topic=BOOK, partition="0") == 0
    assert value(m, "pipeline_live_kafka_lag_offsets", topic=TICKS, partition="-1") is None

    m.state_saved(0, 4096)
    m.state_saved(2, 100)
    m.owned([(TICKS, 0)])  # a rebalance moved partition 2 and the book away
    assert value(m, "pipeline_live_kafka_lag_offsets", topic=TICKS, partition="2") is None
    assert value(m, "pipeline_live_kafka_lag_offsets", topic=BOOK, partition="0") is None
    assert value(m, "pipeline_live_kafka_lag_offsets", topic=TICKS, partition="0") == 120
    assert value(m, "pipeline_live_state_bytes", partition="2") is None
    assert value(m, "pipeline_live_state_bytes", partition="0") == 4096
    assert value(m, "pipeline_live_partitions_owned", topic=BOOK) == 0


def test_unknown_lag_leaves_the_gauge_and_bad_statistics_are_ignored() -> None:
    assert partition_lag({"consumer_lag_stored": -1, "hi_offset": -1, "app_offset": 3}) is None
    assert partition_lag({"consumer_lag_stored": -1, "hi_offset": 10}) is None
    assert partition_lag({"hi_offset": 10, "app_offset": -1001, "next_offset": 7}) == 3
    m = metrics()
    m.owned([(TICKS, 0)])
    m.on_stats(stats({TICKS: {"0": {"consumer_lag_stored": 9}}}))
    m.on_stats(stats({TICKS: {"0": {"consumer_lag_stored": -1}}}))
    m.on_stats("{not json")
    assert value(m, "pipeline_live_kafka_lag_offsets", topic=TICKS, partition="0") == 9


def test_a_restore_is_observed_only_when_a_state_moved_here() -> None:
    now = [50.0]
    m = metrics(monotonic=lambda: now[0])
    m.restored(m.monotonic(), 0)  # an assignment that restored nothing
    started = m.monotonic()
    now[0] += 1.5
    m.restored(started, 2)
    assert value(m, "pipeline_live_restore_seconds_count") == 1
    assert value(m, "pipeline_live_restore_seconds_sum") == 1.5
    assert value(m, "pipeline_live_restored_partitions_total") == 2


def test_the_consumer_config_asks_for_statistics_into_the_metrics() -> None:
    m = metrics()
    config = m.consumer_config()
    assert config["statistics.interval.ms"] > 0
    m.owned([(TICKS, 1)])
    config["stats_cb"](stats({TICKS: {"1": {"consumer_lag_stored": 3}}}))
    assert value(m, "pipeline_live_kafka_lag_offsets", topic=TICKS, partition="1") == 3


def test_the_pipelines_metrics_carry_its_engine_and_its_health() -> None:
    """The PUB process's engine serves on a loopback port; the pipeline's registry reads
    it at scrape time, and shows nothing (no error) once it does not answer."""
    m = metrics()
    m.owned([(TICKS, 0), (TICKS, 1)])
    alive = [True]
    server = serve(m, lambda: alive[0], "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.port}/metrics"
    pipeline = CollectorRegistry()
    pipeline.register(EngineScrape(lambda: url))
    try:
        sample = {"engine": "e1", "topic": TICKS}
        assert pipeline.get_sample_value("pipeline_live_partitions_owned", sample) == 2
        assert b'pipeline_live_records_total{engine="e1",topic="market.ticks"} 0.0' in (
            generate_latest(pipeline)
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz") as answer:
            assert json.loads(answer.read())["engine"] == "e1"
        alive[0] = False
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz")
        except urllib.error.HTTPError as exc:
            assert exc.code == 503
        else:
            raise AssertionError("a dead engine answered healthy")
    finally:
        server.close()
    assert generate_latest(pipeline) == b""
    none = CollectorRegistry()
    none.register(EngineScrape(lambda: None))  # no engine in the PUB process
    assert generate_latest(none) == b""
