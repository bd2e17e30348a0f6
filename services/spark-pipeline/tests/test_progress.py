"""The one query listener: a batch's progress reaches both the log and the metrics."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from pipeline.metrics import QueryMetrics
from pipeline.progress import JsonEvents, ProgressLogger


def progress_event(name: str, rows: int, lag: int | None) -> SimpleNamespace:
    metrics = {} if lag is None else {"maxOffsetsBehindLatest": str(lag)}
    progress = SimpleNamespace(
        name=name,
        batchId=7,
        numInputRows=rows,
        durationMs={"triggerExecution": 250},
        processedRowsPerSecond=40.0,
        sources=[SimpleNamespace(metrics=metrics)],
    )
    return SimpleNamespace(progress=progress)


def test_every_progress_is_logged_and_counted_once(caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    listener = ProgressLogger(observe=QueryMetrics(registry).observe)
    with caplog.at_level(logging.INFO, logger="pipeline.progress"):
        listener.onQueryProgress(progress_event("history", 10, lag=3))
        listener.onQueryProgress(progress_event("history", 0, lag=None))

    def sample(name: str) -> float | None:
        return registry.get_sample_value(name, {"query": "history"})

    assert sample("pipeline_batches_total") == 2
    assert sample("pipeline_input_rows_total") == 10
    assert sample("pipeline_batch_duration_seconds_count") == 2
    assert sample("pipeline_kafka_lag_offsets") == 3  # a batch without the metric keeps it
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "history batch 7: 10 rows in 250 ms (40 rows/s), kafka lag 3; no phases reported"
    ]


class JvmEvent:
    """A JVM QueryProgressEvent as py4j shows it: only ``progress().json()`` is asked."""

    def __init__(self, progress_json: str) -> None:
        self._json = progress_json

    def progress(self) -> JvmEvent:
        return self

    def json(self) -> str:
        return self._json


def test_a_progress_the_jvm_sends_as_json_is_logged_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Spark 4.0's JSON of a Kafka query's progress (recorded; name, ids and lag edited).
    recorded = (Path(__file__).parent / "fixtures" / "kafka_progress.json").read_text()
    registry = CollectorRegistry()
    events = JsonEvents(ProgressLogger(observe=QueryMetrics(registry).observe))
    with caplog.at_level(logging.INFO, logger="pipeline.progress"):
        events.onQueryProgress(JvmEvent(recorded))
        events.onQueryIdle(object())  # nothing asked of an idle event

    assert registry.get_sample_value("pipeline_kafka_lag_offsets", {"query": "history"}) == 3
    assert registry.get_sample_value("pipeline_input_rows_total", {"query": "history"}) == 10
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "history batch 7: 10 rows in 1051 ms (1 rows/s), kafka lag 3; "
        "offsets 10, WAL 49, planning 21, batch 887, commit 80 ms"
    ]
