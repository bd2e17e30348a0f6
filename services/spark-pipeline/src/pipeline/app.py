"""Wiring, in the order of the README's flow diagram.

preflight (Kafka, catalog, S3 reachable?)  ->  bind PUB :5557
-> SparkSession (jars, Iceberg REST catalog)  ->  create namespace/tables
-> history query:  market.ohlc.batches -> MERGE ohlc -> requests -> PUB notification
-> live queries:   market.ticks -> PUB tick
                                -> MERGE ticks
                                -> candles (update) -> PUB OHLC closed=false
                                -> candles (append) -> MERGE ohlc -> PUB OHLC closed=true
-> run until SIGTERM/SIGINT or a query fails
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline import faults, history, live, preflight, session
from pipeline.config import Settings
from pipeline.lake import Lake
from pipeline.notify import Publisher
from pipeline.progress import ProgressLogger
from pipeline.tables import TableNames

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger(__name__)


class Pipeline:
    """The running application: PUB socket, Spark session, streaming queries."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        c = settings.catalog
        self.names = TableNames(c.name, c.namespace, c.ohlc_table, c.ticks_table, c.requests_table)
        self.publisher: Publisher | None = None
        self.spark: SparkSession | None = None
        self.lake: Lake | None = None
        self.queries: dict[str, StreamingQuery] = {}

    def start(self) -> None:
        settings = self.settings
        preflight.check_all(settings)
        self.publisher = Publisher(settings.pub_endpoint, sndhwm=settings.pub_sndhwm)
        log.info("PUB bound on %s", self.publisher.endpoint)
        self.spark = session.build_session(settings)
        faults.set_jvm_pid(session.jvm_pid(self.spark))
        self.spark.streams.addListener(ProgressLogger(summarise={"ticks-publish": 10.0}))
        self.lake = Lake(self.spark, self.names)
        self.lake.ensure_tables()
        if settings.history.enabled:
            q = history.start(self.spark, settings, self.lake, self.publisher)
            self.queries[history.QUERY_NAME] = q
        if settings.live.enabled:
            for q in live.start(self.spark, settings, self.lake, self.publisher):
                self.queries[str(q.name)] = q
        self._write_ready_file()
        log.info("pipeline running: %s", ", ".join(self.queries))

    def wait(self, stop: threading.Event) -> int:
        """Block until ``stop`` is set (0) or a query dies (1)."""
        assert self.spark is not None
        while not stop.is_set():
            for name, query in self.queries.items():
                if not query.isActive:
                    error = query.exception()
                    log.error("query %s terminated: %s", name, error)
                    return 1
            stop.wait(1.0)
        return 0

    def stop(self) -> None:
        for name, query in self.queries.items():
            try:
                query.stop()
            except Exception as exc:  # keep stopping the others
                log.warning("stopping query %s: %s", name, exc)
        self.queries.clear()
        if self.publisher is not None:
            self.publisher.close()
            self.publisher = None
        if self.spark is not None:
            self.spark.stop()
            self.spark = None

    def _write_ready_file(self) -> None:
        if not self.settings.ready_file or self.publisher is None:
            return
        path = Path(self.settings.ready_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "pid": os.getpid(),
            "jvm_pid": faults.get_jvm_pid(),
            "pub_endpoint": self.publisher.endpoint,
            "queries": {name: str(q.id) for name, q in self.queries.items()},
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
