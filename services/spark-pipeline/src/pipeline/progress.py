"""Per-micro-batch progress lines: rows, duration, latency, Kafka lag (the query listener)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pyspark.sql.streaming.listener import StreamingQueryListener

log = logging.getLogger(__name__)


def kafka_lag(progress: Any) -> int | None:
    """Largest offsets-behind-latest over the query's Kafka sources (Spark's own metric)."""
    lags = []
    for source in progress.sources:
        metrics = getattr(source, "metrics", None) or {}
        value = metrics.get("maxOffsetsBehindLatest")
        if value is not None:
            lags.append(int(value))
    return max(lags) if lags else None


class ProgressLogger(StreamingQueryListener):
    """The pipeline's one query listener: logs each batch that read rows and hands every
    progress to ``observe`` (the metrics). One, because PySpark turns each event into
    Python objects once per listener, field by field over py4j, on the listener thread
    all queries share."""

    def __init__(self, observe: Callable[[Any], None] | None = None) -> None:
        self._observe = observe

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802 (Spark API)
        log.info("query %s started (id %s)", event.name, event.id)

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802 (Spark API)
        p = event.progress
        if self._observe is not None:
            self._observe(p)
        rows = int(p.numInputRows)
        if rows:
            log.info(
                "%s batch %d: %d rows in %d ms (%.0f rows/s), kafka lag %s",
                p.name,
                p.batchId,
                rows,
                int(p.durationMs.get("triggerExecution", 0)),
                p.processedRowsPerSecond or 0.0,
                kafka_lag(p),
            )

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802 (Spark API)
        pass

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802 (Spark API)
        if event.exception:
            log.error("query %s failed: %s", event.id, event.exception)
        else:
            log.info("query %s stopped", event.id)
