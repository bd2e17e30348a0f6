"""The one query listener: a batch's progress reaches both the log and the metrics."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from pipeline.metrics import QueryMetrics
from pipeline.progress import ProgressLogger


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
    assert lines == ["history batch 7: 10 rows in 250 ms (40 rows/s), kafka lag 3"]
