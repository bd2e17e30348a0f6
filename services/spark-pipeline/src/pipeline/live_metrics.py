"""Prometheus metrics of one live engine (ADR 0014): is it keeping up with its partitions?

Every engine process owns a registry of its own, its series labelled ``engine``
(host and process id), so K engines stay apart when their sums are taken. The
engine's thread updates them once per consumed batch, never per record: a batch
is up to 10,000 records and the hot loop must not slow down. Kafka lag per
partition comes from librdkafka's statistics (``statistics.interval.ms``,
delivered to ``stats_cb`` inside ``consume()``, on the engine's own thread), not
from watermark requests in the loop.

Served by ``python -m pipeline.engine`` on ``live.metrics_port``; the pipeline's own
engine (in its PUB process) on a loopback port of its own, which the pipeline's
``/metrics`` reads at scrape time (`EngineScrape`), so one scrape of the pipeline
shows its engine.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from mdproto.runtime.metrics_http import Health, MetricsServer
from pipeline.config import Settings

log = logging.getLogger(__name__)

Position = tuple[str, int]  # (topic, partition)
#: librdkafka's statistics period: the lag gauges are this fresh (compose scrapes every 5 s).
STATS_INTERVAL_MS = 5000
#: A batch's records from Kafka to publication: a few ms at rest, seconds when behind.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
#: Loading the states of newly owned partitions from the S3 store, and seeking.
_RESTORE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
#: How long the pipeline's scrape waits for its PUB process's engine metrics.
SCRAPE_TIMEOUT_S = 2.0


def engine_name() -> str:
    """This process's ``engine`` label: unique among the engines of one group."""
    return f"{socket.gethostname()}-{os.getpid()}"


class EngineMetrics:
    """The engine thread's metric updates. `wall_ms` (Kafka timestamps are wall clock
    ms) and `monotonic` are injectable so tests need no sleeps."""

    def __init__(
        self,
        ticks_topic: str,
        book_topic: str,
        *,
        engine: str | None = None,
        registry: CollectorRegistry | None = None,
        wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.engine = engine or engine_name()
        self.ticks_topic, self.book_topic = ticks_topic, book_topic
        self.wall_ms, self.monotonic = wall_ms, monotonic
        r, e = self.registry, self.engine
        records = Counter(
            "pipeline_live_records",
            "Kafka records the live engine consumed, by topic",
            ["engine", "topic"],
            registry=r,
        )
        self._ticks = records.labels(e, ticks_topic)
        self._book = records.labels(e, book_topic)
        self._latency = Histogram(
            "pipeline_live_publish_latency_seconds",
            "Kafka timestamp of each batch's first live tick to the batch's publication "
            "(one observation per batch)",
            ["engine"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        ).labels(e)
        self._lag = Gauge(
            "pipeline_live_kafka_lag_offsets",
            "Records of an owned partition not consumed yet (librdkafka statistics)",
            ["engine", "topic", "partition"],
            registry=r,
        )
        self._owned = Gauge(
            "pipeline_live_partitions_owned",
            "Partitions the consumer group gave this engine, by topic",
            ["engine", "topic"],
            registry=r,
        )
        self._state = Gauge(
            "pipeline_live_state_bytes",
            "Size of the last state object saved for an owned ticks partition",
            ["engine", "partition"],
            registry=r,
        )
        self._restore = Histogram(
            "pipeline_live_restore_seconds",
            "An assignment's restore: the newly owned partitions' states loaded and sought",
            ["engine"],
            buckets=_RESTORE_BUCKETS,
            registry=r,
        ).labels(e)
        self._restored = Counter(
            "pipeline_live_restored_partitions",
            "Ticks partitions whose state this engine restored after a rebalance",
            ["engine"],
            registry=r,
        ).labels(e)
        self._lag_keys: set[Position] = set()
        self._state_keys: set[int] = set()
        self._mine: set[Position] = set()
        self.owned(())

    @classmethod
    def for_settings(cls, s: Settings, **kwargs: Any) -> EngineMetrics:
        return cls(s.kafka.topic_ticks, s.kafka.topic_book, **kwargs)

    def consumer_config(self) -> dict[str, Any]:
        """The group consumer's statistics: lag per partition every STATS_INTERVAL_MS."""
        return {"statistics.interval.ms": STATS_INTERVAL_MS, "stats_cb": self.on_stats}

    # -- per batch -------------------------------------------------------------------

    def batch(self, ticks: int, books: int, first_live_ms: int | None) -> None:
        """One consumed batch: its record counts, and the Kafka time of its first tick
        published live (None: none was), observed against the clock now."""
        if ticks:
            self._ticks.inc(ticks)
        if books:
            self._book.inc(books)
        if first_live_ms is not None and first_live_ms > 0:  # 0, -1: no Kafka time
            self._latency.observe(max(0, self.wall_ms() - first_live_ms) / 1000)

    # -- per rebalance and save ------------------------------------------------------

    def owned(self, keys: Iterable[Position]) -> None:
        """The partitions owned now; series of the others (lag, state size) removed."""
        mine = set(keys)
        self._mine = mine
        for topic in (self.ticks_topic, self.book_topic):
            self._owned.labels(self.engine, topic).set(sum(1 for t, _ in mine if t == topic))
        for key in self._lag_keys - mine:
            self._lag.remove(self.engine, key[0], str(key[1]))
        self._lag_keys &= mine
        ticks = {p for t, p in mine if t == self.ticks_topic}
        for p in self._state_keys - ticks:
            self._state.remove(self.engine, str(p))
        self._state_keys &= ticks

    def restored(self, started: float, partitions: int) -> None:
        """An assignment that began at `started` (`monotonic`) and restored `partitions`
        newly owned ticks partitions (none: nothing moved here, not observed)."""
        if partitions:
            self._restore.observe(self.monotonic() - started)
            self._restored.inc(partitions)

    def state_saved(self, partition: int, size: int) -> None:
        self._state.labels(self.engine, str(partition)).set(size)
        self._state_keys.add(partition)

    # -- librdkafka statistics -------------------------------------------------------

    def on_stats(self, stats: str) -> None:
        """``stats_cb``: the lag of each owned partition (STATISTICS.md ``partitions``)."""
        try:
            topics = json.loads(stats).get("topics", {})
        except ValueError as exc:
            log.warning("live engine: unreadable librdkafka statistics: %s", exc)
            return
        for topic, body in topics.items():
            for p, part in body.get("partitions", {}).items():
                key = (topic, int(p))
                if key not in self._mine:
                    continue  # -1 (unassigned messages) or a partition of another engine
                lag = partition_lag(part)
                if lag is not None:
                    self._lag.labels(self.engine, topic, p).set(lag)
                    self._lag_keys.add(key)


def partition_lag(part: dict[str, Any]) -> int | None:
    """Records behind the partition's end. ``consumer_lag`` counts from the committed
    offset, which the engines never commit: ``consumer_lag_stored`` (from the last
    record handed to the engine) instead, else the end less the application's or the
    fetch position (nothing consumed since the assignment), else unknown."""
    stored = int(part.get("consumer_lag_stored", -1))
    if stored >= 0:
        return stored
    high = int(part.get("hi_offset", -1))
    if high < 0:
        return None
    for name in ("app_offset", "next_offset"):
        position = int(part.get(name, -1))
        if position >= 0:
            return max(0, high - position)
    return None


class EngineScrape(Collector):
    """The pipeline's ``/metrics`` side: its PUB process's engine metrics, fetched from
    that process's loopback port at scrape time (nothing when it does not answer:
    ``pipeline_pub_server_up`` says why)."""

    def __init__(self, url: Callable[[], str | None]) -> None:
        self._url = url

    def collect(self) -> Iterator[Metric]:
        url = self._url()
        if not url:
            return
        try:
            with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as answer:
                text = answer.read().decode()
        except (urllib.error.URLError, OSError) as exc:
            log.warning("live engine metrics unavailable at %s: %s", url, exc)
            return
        yield from text_string_to_metric_families(text)


def serve(metrics: EngineMetrics, alive: Callable[[], bool], host: str, port: int) -> MetricsServer:
    """``/metrics`` of one engine process and a ``/healthz`` that fails once its
    thread ended (its supervisor's liveness probe); port 0: any free one."""
    server = MetricsServer(
        host,
        port,
        metrics.registry,
        lambda: Health(alive(), {"engine": metrics.engine}),
        name="live-engine-metrics",
    )
    server.start()
    return server
