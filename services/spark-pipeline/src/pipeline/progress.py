"""Per-micro-batch progress lines: rows, duration, latency, Kafka lag (the query listener)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from pyspark.sql.streaming.listener import (
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
    StreamingQueryListener,
    StreamingQueryProgress,
)

log = logging.getLogger(__name__)

#: The JVM interface PySpark's listeners implement over py4j.
JVM_LISTENER = "org.apache.spark.sql.streaming.PythonStreamingQueryListener"


def kafka_lag(progress: Any) -> int | None:
    """Largest offsets-behind-latest over the query's Kafka sources (Spark's own metric)."""
    lags = []
    for source in progress.sources:
        metrics = getattr(source, "metrics", None) or {}
        value = metrics.get("maxOffsetsBehindLatest")
        if value is not None:
            lags.append(int(value))
    return max(lags) if lags else None


#: Spark's phases of a micro-batch (`durationMs`), in the order they run, as the log names
#: them: the batch itself (`addBatch`, the query's own work) and Spark's around it.
PHASES = (
    ("latestOffset", "offsets"),
    ("walCommit", "WAL"),
    ("queryPlanning", "planning"),
    ("addBatch", "batch"),
    ("commitOffsets", "commit"),
)


def phases(duration_ms: dict[str, Any]) -> str:
    """`durationMs` -> "offsets 10, WAL 49, planning 21, batch 887, commit 80 ms" (the
    phases Spark reported): where a micro-batch's time went beside the query's work."""
    parts = [f"{name} {int(duration_ms[key])}" for key, name in PHASES if key in duration_ms]
    return f"{', '.join(parts)} ms" if parts else "no phases reported"


def progress_of(progress_json: str) -> StreamingQueryProgress:
    """A micro-batch's progress from the JSON the JVM makes of it (its `json()`)."""
    return StreamingQueryProgress.fromJson(json.loads(progress_json))


class JsonEvents:
    """The JVM side of a listener (what PySpark's own adapter implements), taking each
    progress as one JSON string.

    PySpark's adapter builds the progress field by field over py4j, and each Java map it
    iterates ends in a NoSuchElementException that its error converter answers with class
    lookups through every jar: two orders of magnitude dearer per event, on the thread
    every query's events share (docs/pipeline-benchmarks.md (q))."""

    def __init__(self, listener: StreamingQueryListener) -> None:
        self._listener = listener

    def onQueryStarted(self, jevent: Any) -> None:  # noqa: N802 (the JVM's interface)
        self._listener.onQueryStarted(QueryStartedEvent.fromJObject(jevent))

    def onQueryProgress(self, jevent: Any) -> None:  # noqa: N802
        self._listener.onQueryProgress(QueryProgressEvent(progress_of(jevent.progress().json())))

    def onQueryIdle(self, jevent: Any) -> None:  # noqa: N802
        pass  # nothing to log or count: an idle trigger reads no rows

    def onQueryTerminated(self, jevent: Any) -> None:  # noqa: N802
        self._listener.onQueryTerminated(QueryTerminatedEvent.fromJObject(jevent))

    class Java:
        implements = [JVM_LISTENER]


class ProgressLogger(StreamingQueryListener):
    """The pipeline's one query listener: logs each batch that read rows and hands every
    progress to ``observe`` (the metrics). One, because every query's events reach Python
    on the one listener thread they share; its events arrive through `JsonEvents`."""

    def __init__(self, observe: Callable[[Any], None] | None = None) -> None:
        self._observe = observe

    @property
    def _jlistener(self) -> Any:
        """What `spark.streams.addListener` registers: the JVM's wrapper around `JsonEvents`
        instead of PySpark's field-by-field adapter (pyspark is pinned; test_stack_pipeline
        checks the events arrive, Kafka lag included)."""
        from pyspark import SparkContext

        if not hasattr(self, "_jlistenerobj"):
            jvm = SparkContext._jvm
            assert jvm is not None, "no SparkContext"
            self._jlistenerobj: Any = jvm.PythonStreamingQueryListenerWrapper(JsonEvents(self))
        return self._jlistenerobj

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802 (Spark API)
        log.info("query %s started (id %s)", event.name, event.id)

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802 (Spark API)
        p = event.progress
        if self._observe is not None:
            self._observe(p)
        rows = int(p.numInputRows)
        if rows:
            log.info(
                "%s batch %d: %d rows in %d ms (%.0f rows/s), kafka lag %s; %s",
                p.name,
                p.batchId,
                rows,
                int(p.durationMs.get("triggerExecution", 0)),
                p.processedRowsPerSecond or 0.0,
                kafka_lag(p),
                phases(p.durationMs),
            )

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802 (Spark API)
        pass

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802 (Spark API)
        if event.exception:
            log.error("query %s failed: %s", event.id, event.exception)
        else:
            log.info("query %s stopped", event.id)
