"""Per-micro-batch progress lines: rows, duration, latency, Kafka lag (the query listener)."""

from __future__ import annotations

import logging
import time
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
    """The pipeline's one query listener: logs each batch that read rows (queries in
    ``summarise`` get one line per interval) and hands every progress to ``observe``
    (the metrics). One, because PySpark turns each event into Python objects once per
    listener, field by field over py4j, on the listener thread all queries share."""

    def __init__(
        self,
        summarise: dict[str, float] | None = None,
        observe: Callable[[Any], None] | None = None,
    ) -> None:
        self._summarise = summarise or {}
        self._observe = observe
        self._acc: dict[str, tuple[float, int, int, int]] = {}

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802 (Spark API)
        log.info("query %s started (id %s)", event.name, event.id)

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802 (Spark API)
        p = event.progress
        if self._observe is not None:
            self._observe(p)
        rows = int(p.numInputRows)
        duration = int(p.durationMs.get("triggerExecution", 0))
        lag = kafka_lag(p)
        interval = self._summarise.get(p.name)
        if interval is None:
            if rows:
                log.info(
                    "%s batch %d: %d rows in %d ms (%.0f rows/s), kafka lag %s",
                    p.name,
                    p.batchId,
                    rows,
                    duration,
                    p.processedRowsPerSecond or 0.0,
                    lag,
                )
            return
        since, acc_rows, batches, worst = self._acc.get(p.name, (time.monotonic(), 0, 0, 0))
        acc_rows, batches, worst = acc_rows + rows, batches + 1, max(worst, duration)
        if time.monotonic() - since >= interval:
            if acc_rows:
                log.info(
                    "%s: %d rows in %d batches over %.0f s, slowest batch %d ms, kafka lag %s",
                    p.name,
                    acc_rows,
                    batches,
                    time.monotonic() - since,
                    worst,
                    lag,
                )
            self._acc[p.name] = (time.monotonic(), 0, 0, 0)
        else:
            self._acc[p.name] = (since, acc_rows, batches, worst)

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802 (Spark API)
        pass

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802 (Spark API)
        if event.exception:
            log.error("query %s failed: %s", event.id, event.exception)
        else:
            log.info("query %s stopped", event.id)
