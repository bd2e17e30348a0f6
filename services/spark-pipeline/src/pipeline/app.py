"""Wiring, in the order of the README's flow diagram.

preflight (Kafka, catalog, S3 reachable?)  ->  PUB server process: bind :5557, live engine
-> heartbeat thread: PipelineStatus on PIPELINE:status every second (relays refuse without it)
-> SparkSession (jars, Iceberg REST catalog)  ->  create namespace/tables
-> warm-up: one synthetic candle written to a scratch table (the first answer finds warm code)
-> history query: market.ohlc.batches -> write ohlc -> record requests -> PUB notification
   stored answers: market.ohlc.batches -> a stored-only final marker -> count -> PUB notification
                   (ahead of the history query, which records it)
-> live: market.ticks -> live engine (in the PUB process) -> PUB Tick, OHLC closed=false/true
                                                          -> Kafka market.ohlc.live
                      -> ticks-persist query  -> MERGE ticks
         market.ohlc.live -> candles-store query -> MERGE ohlc (source live)
   market.book -> live engine -> PUB BookSnapshot, BookDelta ({ticker}|book)
               -> book-store query -> new book_snapshots, then book_deltas (ADR 0021 if large)
   cep.triggers + market.ticks -> live engine: CEP (docs/cep.md) -> PUB CEPTriggerEvent
                                                                 -> tombstones -> cep.triggers
-> markets query: market.markets -> MERGE markets (one row per ticker; slow trigger)
-> gaps query: market.recording TradeGaps -> MERGE gaps (one row per gap_id)
   gap-rebuilds thread: a REPAIRED gap's live candles rebuilt from ticks -> ohlc
                        -> corrections -> Kafka market.ohlc.corrections -> every live
                           engine -> PUB OHLC correction (the ticker's owner, its epoch)
-> table upkeep thread: compact small and delete files, expire old snapshots (every 15 min)
-> run until SIGTERM/SIGINT; a failed query restarts from its checkpoint (backoff), and
   the process exits 1 only when one keeps failing or the PUB process dies
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter
from py4j.protocol import Py4JError  # type: ignore[import-untyped]
from pyspark.errors import PySparkException

from mdproto.runtime.metrics_http import MetricsServer
from pipeline import (
    faults,
    gaps,
    history,
    live,
    live_metrics,
    markets,
    metrics,
    preflight,
    session,
    upkeep,
)
from pipeline.arrow_appends import ArrowAppends
from pipeline.config import Settings
from pipeline.corrections import CorrectionsProducer
from pipeline.gap_rebuilds import GapRebuilds
from pipeline.heartbeat import Heartbeat, QueryState
from pipeline.lake import Lake, TableNames
from pipeline.notifier import HistoryNotifier
from pipeline.progress import ProgressLogger
from pipeline.pub_server import Publisher, PubServer
from pipeline.restarts import Restarts, failure_cause
from pipeline.stored_answers import StoredAnswers
from pipeline.streams import QueryStarter
from pipeline.write_paths import WriteRule

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger(__name__)
#: How long the start waits for the stored-answers path before it says ready anyway.
READY_WAIT_S = 30.0


class Pipeline:
    """The running application: PUB socket, Spark session, streaming queries."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        c = settings.catalog
        self.names = TableNames(
            c.name,
            c.namespace,
            c.ohlc_table,
            c.ticks_table,
            c.requests_table,
            c.markets_table,
            c.book_snapshots_table,
            c.gaps_table,
            c.book_deltas_table,
        )
        self.publisher: Publisher | None = None
        self.spark: SparkSession | None = None
        self.lake: Lake | None = None
        self.queries: dict[str, StreamingQuery] = {}
        self.starters: dict[str, QueryStarter] = {}
        self.pub_server: PubServer | None = None
        self.metrics_server: MetricsServer | None = None
        self.registry: CollectorRegistry | None = None
        self.restarts_total: Counter | None = None
        self.upkeep: upkeep.Upkeep | None = None
        self.heartbeat: Heartbeat | None = None
        self.stored_answers: StoredAnswers | None = None
        self.gap_rebuilds: GapRebuilds | None = None
        self.corrections: CorrectionsProducer | None = None

    def start(self) -> None:
        settings = self.settings
        preflight.check_all(settings)
        # The PUB (and the tick relay) live in their own process: up before Spark.
        self.pub_server = PubServer(settings)
        endpoint = self.pub_server.start()
        publisher = self.publisher = Publisher(self.pub_server.pull_endpoint, endpoint)
        log.info("PUB bound on %s", endpoint)
        self.heartbeat = Heartbeat(
            publisher.publish,
            self._history_state,
            cep_enabled=settings.cep.enabled,
            interval_s=settings.heartbeat_s,
        )
        self.heartbeat.start()
        spark = self.spark = session.build_session(settings)
        crash = faults.armed(session.jvm_pid(spark))  # None in production: a test hook
        query_metrics = self._serve_metrics()
        observe = query_metrics.observe if query_metrics is not None else None
        spark.streams.addListener(ProgressLogger(observe=observe))
        lake = self.lake = _lake(spark, settings, self.names, self.registry)
        lake.ensure_tables()
        if settings.history.enabled:
            if settings.history.warm_up:
                history.warm_up(lake)
            notifier = HistoryNotifier(publisher)
            self._launch(
                history.QUERY_NAME,
                lambda: history.start(spark, settings, lake, notifier, crash),
            )
            if settings.history.stored_answers_early:
                self.stored_answers = StoredAnswers(settings, spark, lake, notifier, crash)
                self.stored_answers.start()
        if settings.live.enabled:
            for name, starter in live.starters(spark, settings, lake, crash).items():
                self._launch(name, starter)
        if settings.markets.enabled:
            self._launch(markets.QUERY_NAME, lambda: markets.start(spark, settings, lake))
        if settings.gaps.enabled:
            if settings.live.enabled:  # the live topics' publisher is the ticker's engine
                self.corrections = CorrectionsProducer(settings)
            rebuilds = self.gap_rebuilds = GapRebuilds(
                settings,
                spark,
                lake,
                publish=self.corrections.send if self.corrections is not None else None,
                report=metrics.GapMetrics(self.registry) if self.registry else None,
                rebuild=settings.live.enabled,  # live candles and stored trades are live's
            )
            rebuilds.start()
            self._launch(gaps.QUERY_NAME, lambda: gaps.start(spark, settings, lake, rebuilds))
        if settings.upkeep.enabled:
            report = metrics.UpkeepMetrics(self.registry) if self.registry else None
            self.upkeep = upkeep.Upkeep(spark, self.names, settings.upkeep, report)
            self.upkeep.start()
        answers = self.stored_answers
        ahead = answers is None or answers.wait_ready(READY_WAIT_S)
        self._write_ready_file(stored_answers=ahead)
        if not ahead:
            log.warning("stored answers not ready in %g s: the history query answers", READY_WAIT_S)
            threading.Thread(
                target=self._ready_when_stored_answers, name="ready-file", daemon=True
            ).start()
        log.info("pipeline running: %s", ", ".join(self.queries))

    def _launch(self, name: str, starter: QueryStarter) -> None:
        """Start a query and keep its starter: `wait` restarts it with that if it fails."""
        self.starters[name] = starter
        self.queries[name] = starter()
        if self.restarts_total is not None:
            self.restarts_total.labels(name)  # exported as 0 until a restart

    def _serve_metrics(self) -> metrics.QueryMetrics | None:
        """/metrics and /healthz: liveness at scrape; returns what the query listener
        feeds batch progress to (None: no metrics port)."""
        s = self.settings
        if not s.metrics_port or self.spark is None:
            return None
        registry = self.registry = CollectorRegistry()
        query_metrics = metrics.QueryMetrics(registry)
        registry.register(metrics.LivenessCollector(self._queries_active, self._pub_alive))
        registry.register(live_metrics.EngineScrape(self._engine_metrics_url))
        self.restarts_total = metrics.query_restarts(registry)
        self.metrics_server = MetricsServer(
            s.metrics_host,
            s.metrics_port,
            registry,
            lambda: metrics.health(self._queries_active(), self._pub_alive()),
            name="pipeline-metrics",
        )
        self.metrics_server.start()
        return query_metrics

    def _history_state(self) -> QueryState:
        """Asks the JVM (heartbeat thread): a hung JVM blocks the call, and so the beat."""
        if not self.settings.history.enabled:
            return QueryState.DISABLED
        query = self.queries.get(history.QUERY_NAME)
        if query is None:
            return QueryState.STARTING
        return QueryState.RUNNING if query.isActive else QueryState.RESTARTING

    def _queries_active(self) -> dict[str, bool]:
        return {name: bool(q.isActive) for name, q in dict(self.queries).items()}

    def _engine_metrics_url(self) -> str | None:
        """The PUB process's live engine's own /metrics (None: no engine)."""
        return None if self.pub_server is None else self.pub_server.engine_metrics_url

    def _pub_alive(self) -> bool:
        return self.pub_server is not None and self.pub_server.alive

    def wait(self, stop: threading.Event) -> int:
        """Block until ``stop`` is set (0), a query keeps failing or the PUB process dies (1).

        A failed query is restarted from its checkpoint after a backoff, the others
        running on (`restarts.Restarts` decides; every writer survives the replay).
        """
        restarts = Restarts(self.settings.restart)
        while not stop.is_set():
            for name, query in list(self.queries.items()):
                if query.isActive or restarts.pending(name):
                    continue
                if not self._failed(name, failure_cause(query.exception()), restarts):
                    return 1
            for name in restarts.due():
                try:
                    self._restart(name)
                except Exception as exc:  # e.g. Kafka unreachable: a failure like the first
                    if not self._failed(name, failure_cause(exc), restarts):
                        return 1
            if self.pub_server is not None and not self.pub_server.alive:
                log.error("the PUB server process exited (%s)", self.pub_server.exitcode)
                return 1
            stop.wait(restarts.next_in(1.0))
        return 0

    def _failed(self, name: str, cause: str, restarts: Restarts) -> bool:
        """Log a query's failure and schedule its restart; False when it failed too often."""
        delay = restarts.failed(name)
        window = self.settings.restart.window_s
        if delay is None:
            log.error(
                "query %s failed: %s; %d failures within %.0f s: giving up",
                name,
                cause,
                restarts.recent(name),
                window,
            )
            return False
        log.error(
            "query %s failed: %s; restarting it from its checkpoint in %.1f s "
            "(failure %d within %.0f s)",
            name,
            cause,
            delay,
            restarts.recent(name),
            window,
        )
        return True

    def _restart(self, name: str) -> None:
        old = self.queries[name]
        old.stop()  # joins its thread: Spark has let go of the query id and checkpoint
        self.queries[name] = self.starters[name]()
        if self.restarts_total is not None:
            self.restarts_total.labels(name).inc()
        log.info("query %s restarted from its checkpoint", name)

    def stop(self) -> None:
        if self.heartbeat is not None:  # relays refuse new work from here on
            self.heartbeat.stop()
            self.heartbeat = None
        if self.stored_answers is not None:  # before Spark: it counts on the JVM
            self.stored_answers.stop()
            self.stored_answers = None
        if self.upkeep is not None:
            self.upkeep.stop()  # lets a running procedure call finish
            self.upkeep = None
        if self.gap_rebuilds is not None:
            self.gap_rebuilds.stop()  # lets a running rebuild finish
            self.gap_rebuilds = None
        if self.corrections is not None:
            self.corrections.close()
            self.corrections = None
        if self.metrics_server is not None:
            self.metrics_server.close()
            self.metrics_server = None
        jvm_gone = self._stop_queries()
        if self.publisher is not None:
            self.publisher.close()
            self.publisher = None
        if self.pub_server is not None:
            self.pub_server.stop()
            self.pub_server = None
        if self.spark is not None and not jvm_gone:
            try:
                self.spark.stop()
            except (Py4JError, ConnectionError) as exc:  # its shutdown hook came first
                log.info("Spark's JVM stopped on its own (%s)", exc)
        self.spark = None

    def _stop_queries(self) -> bool:
        """Stop every query; True if Spark's JVM was gone already. A SIGTERM to the
        whole process group (`make stop`, systemd's default) reaches the JVM too, whose
        shutdown hook stops the session beside us: nothing is left to stop there, and a
        batch it cut short is replayed from the checkpoint at the next start."""
        try:
            for name, query in self.queries.items():
                try:
                    query.stop()
                except session.JVM_GONE as exc:
                    log.info("Spark's JVM stopped on its own (%s): its queries with it", exc)
                    return True
                except (Py4JError, PySparkException) as exc:  # Spark's refusal: stop the rest
                    log.warning("stopping query %s: %s", name, exc)
            return False
        finally:
            self.queries.clear()

    def _ready_when_stored_answers(self) -> None:
        """A late stored-answers path (a loaded machine) says so in the ready file."""
        while self.stored_answers is not None and self.spark is not None:
            if self.stored_answers.wait_ready(READY_WAIT_S):
                self._write_ready_file(stored_answers=True)
                log.info("stored answers ready: answered ahead of the history query from now on")
                return

    def _write_ready_file(self, *, stored_answers: bool) -> None:
        """The file the platform waits on; ``stored_answers`` says whether a stored
        answer written from now on goes out ahead of the history query."""
        if not self.settings.ready_file or self.publisher is None or self.spark is None:
            return
        path = Path(self.settings.ready_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "pid": os.getpid(),
            "jvm_pid": session.jvm_pid(self.spark),
            "pub_endpoint": self.publisher.endpoint,
            "queries": {name: str(q.id) for name, q in self.queries.items()},
            "stored_answers": stored_answers,
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(payload))
        tmp.replace(path)


def run(settings: Settings, stop: threading.Event) -> int:
    """Start, run until ``stop`` or a failure, then shut everything down."""
    pipeline = Pipeline(settings)
    try:
        pipeline.start()
        return pipeline.wait(stop)
    finally:
        pipeline.stop()


def _lake(
    spark: SparkSession, settings: Settings, names: TableNames, registry: CollectorRegistry | None
) -> Lake:
    """The tables, with pyiceberg's client of the catalog Spark writes to (the reads before
    a write, the driver's appends), the write rule and its metric."""
    c = settings.catalog
    return Lake(
        spark,
        names,
        ArrowAppends(c.name, c.pyiceberg_properties()),
        rule=WriteRule(
            driver_append_max_rows=c.driver_append_max_rows,
            executor_append_min_records=c.executor_append_min_records,
        ),
        report=metrics.IcebergWrites(registry) if registry else None,
    )
