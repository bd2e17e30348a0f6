"""Prometheus metrics of the streaming queries, fed by Spark's own progress events.

The pipeline's query listener (`progress.ProgressLogger`) hands every micro-batch's
progress (rows, duration, Kafka lag) to `QueryMetrics` on Spark's listener thread;
it only updates metric objects, so the queries never wait on an HTTP scrape. Query
liveness and the PUB process are read at scrape time; app.py counts the restarts of
failed queries. Served by mdproto.runtime.metrics_http, as on the relay and the
ingestor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from mdproto.messages import TradeGap
from mdproto.runtime.metrics_http import Health
from pipeline.progress import kafka_lag
from pipeline.upkeep import StepResult
from pipeline.write_paths import WritePath

# Micro-batch durations span a tick batch (tens of ms) to a year of candles (tens of s).
_BATCH_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class QueryMetrics:
    """Per-query batches, rows, batch durations and Kafka lag, from progress events."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.batches = Counter(
            "pipeline_batches", "Micro-batches run, by query", ["query"], registry=registry
        )
        self.rows = Counter(
            "pipeline_input_rows",
            "Rows read by micro-batches, by query",
            ["query"],
            registry=registry,
        )
        self.duration = Histogram(
            "pipeline_batch_duration_seconds",
            "Micro-batch duration (trigger execution), by query",
            ["query"],
            buckets=_BATCH_BUCKETS,
            registry=registry,
        )
        self.lag = Gauge(
            "pipeline_kafka_lag_offsets",
            "Offsets behind the latest, over the query's Kafka sources (last batch)",
            ["query"],
            registry=registry,
        )

    def observe(self, p: Any) -> None:
        """One micro-batch's ``StreamingQueryProgress``."""
        name = str(p.name)
        self.batches.labels(name).inc()
        self.rows.labels(name).inc(int(p.numInputRows))
        self.duration.labels(name).observe(int(p.durationMs.get("triggerExecution", 0)) / 1000)
        lag = kafka_lag(p)
        if lag is not None:
            self.lag.labels(name).set(lag)


class UpkeepMetrics:
    """Table upkeep steps (pipeline/upkeep.py) by table, action and outcome."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.steps = Counter(
            "pipeline_upkeep_steps",
            "Table upkeep procedure calls, by table, action and outcome (ok, failed)",
            ["table", "action", "outcome"],
            registry=registry,
        )
        self.seconds = Histogram(
            "pipeline_upkeep_duration_seconds",
            "Duration of one upkeep procedure call, by action",
            ["action"],
            buckets=_BATCH_BUCKETS,
            registry=registry,
        )

    def __call__(self, result: StepResult) -> None:
        step = result.step
        self.steps.labels(step.table, step.action, "ok" if result.ok else "failed").inc()
        self.seconds.labels(step.action).observe(result.seconds)


class GapMetrics:
    """The gaps table by status and the candle rebuilds of REPAIRED gaps
    (pipeline/gap_rebuilds.py)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._gaps = Gauge(
            "pipeline_gaps",
            "Rows of the gaps table by status (recounted after each gaps batch)",
            ["status"],
            registry=registry,
        )
        self._rebuilds = Counter(
            "pipeline_gap_rebuilds",
            "REPAIRED gaps whose live candles were rebuilt (done) or given up (gave_up)",
            ["outcome"],
            registry=registry,
        )
        self._deferred = Counter(
            "pipeline_gap_rebuilds_deferred",
            "Rebuild attempts put off: the ticks table did not hold the gap's trades yet",
            registry=registry,
        )
        self._candles = Counter(
            "pipeline_gap_rebuilt_candles",
            "Live candles written by gap rebuilds",
            registry=registry,
        )
        self._pending = Gauge(
            "pipeline_gap_rebuilds_pending",
            "REPAIRED gaps whose rebuild is not finished",
            registry=registry,
        )
        for outcome in ("done", "gave_up"):
            self._rebuilds.labels(outcome)  # exported as 0 until the first
        self._statuses = {name for name, value in TradeGap.State.items() if value}

    def statuses(self, counts: Mapping[str, int]) -> None:
        """The table's counts: a status no row has any more reads 0."""
        self._statuses |= set(counts)
        for status in self._statuses:
            self._gaps.labels(status).set(counts.get(status, 0))

    def rebuilt(self, outcome: str) -> None:
        self._rebuilds.labels(outcome).inc()

    def deferred(self) -> None:
        self._deferred.inc()

    def candles(self, n: int) -> None:
        self._candles.inc(n)

    def pending(self, n: int) -> None:
        self._pending.set(n)


def query_restarts(registry: CollectorRegistry) -> Counter:
    """`pipeline_query_restarts_total{query}`: failed queries started again (app.py `wait`)."""
    return Counter(
        "pipeline_query_restarts",
        "Streaming queries restarted from their checkpoint after a failure, by query",
        ["query"],
        registry=registry,
    )


class IcebergWrites:
    """`pipeline_iceberg_writes_total{table, path}`: which way each Iceberg write ran
    (`write_paths.WritePath`: driver-append, spark-append, executor-append, driver-merge,
    spark-merge, append-then-merge)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._writes = Counter(
            "pipeline_iceberg_writes",
            "Iceberg writes by table and the way they ran (pipeline/write_paths.py)",
            ["table", "path"],
            registry=registry,
        )

    def __call__(self, table: str, path: WritePath) -> None:
        self._writes.labels(table, path).inc()


class LivenessCollector(Collector):
    """`pipeline_query_active{query}` and `pipeline_pub_server_up`, read at scrape time."""

    def __init__(self, queries: Callable[[], Mapping[str, bool]], pub_alive: Callable[[], bool]):
        self._queries = queries
        self._pub_alive = pub_alive

    def collect(self) -> Iterator[Metric]:
        active = GaugeMetricFamily(
            "pipeline_query_active", "1 while the streaming query runs", labels=["query"]
        )
        for name, running in self._queries().items():
            active.add_metric([name], 1 if running else 0)
        yield active
        yield GaugeMetricFamily(
            "pipeline_pub_server_up", "1 while the PUB process runs", value=int(self._pub_alive())
        )


def health(queries: Mapping[str, bool], pub_alive: bool) -> Health:
    """Healthy while every streaming query and the PUB process run."""
    stopped = sorted(name for name, running in queries.items() if not running)
    return Health(
        bool(queries) and not stopped and pub_alive,
        {"queries": sorted(queries), "stopped_queries": stopped, "pub_server_up": pub_alive},
    )
