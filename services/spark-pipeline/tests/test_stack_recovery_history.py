"""kill -9 of the driver at each of the history query's three crash points: every
request notified once, no row duplicated; and right after a stored answer went out
ahead of the query: notified again, never lost, recorded once.

The pipeline restarts four times; the PUB port is fixed per run, so one SUB,
connected once, hears every incarnation (it reconnects long before Spark has
started). The recovery scenarios live in separate modules so that parallel test
workers (docs/development.md) run them side by side.
"""

from __future__ import annotations

import signal
from typing import Any

import pytest

from mdproto import envelope
from mdproto.messages import HistoryReadyNotification, HistorySource, OHLCBatch, Status
from pipeline.notifier import EARLY_BATCH

# Four Spark starts in one test: under CI's parallel workers and image builds that
# has taken over the default 600 s hang guard, so this module's guard is doubled.
pytestmark = [
    pytest.mark.stack,
    pytest.mark.spark,
    pytest.mark.heavy(seconds=440),
    pytest.mark.timeout(1200),
]

KILLED = -signal.SIGKILL


def _unnumbered(message: Any) -> Any:
    copy = type(message)()
    copy.CopyFrom(message)
    copy.ClearField("sequence")
    copy.ClearField("publisher_epoch")
    return copy


def test_history_crash_points_notify_once_and_never_duplicate_rows(
    make_run: Any, tools: Any, build: Any
) -> None:
    run = make_run(
        PIPELINE_LIVE__ENABLED="false",
        PIPELINE_CEP__ENABLED="false",
        PIPELINE_MARKETS__ENABLED="false",
        PIPELINE_GAPS__ENABLED="false",
    )
    sub = tools.Subscriber(run.pub_endpoint)
    kafka = tools.Kafka(run.endpoints.kafka_bootstrap)
    lake = tools.Lake(run.endpoints, run.namespace)
    t0 = build.T0
    n = 3000
    meta = build.metadata("crash-1", client_id="crash-client", start=t0, end=t0 + n * build.MINUTE)
    kafka.send(
        run.batches_topic,
        build.request_records("crash-1", [build.candle(i) for i in range(n)], meta=meta),
    )
    is_ours = tools.is_notification("crash-1")

    # 1. Killed after the candles are committed, before the request is recorded.
    run.start(crash_at="history-after-ohlc-commit")
    assert run.wait_exit() == KILLED
    assert len(lake.rows("ohlc")) == n
    assert lake.rows("requests") == []
    # 2. Replayed: candles MERGEd again (no duplicates), request recorded, killed
    #    before publishing.
    run.start(crash_at="history-after-requests-commit")
    assert run.wait_exit() == KILLED
    [recorded] = lake.rows("requests")
    assert (recorded["request_id"], recorded["status"], recorded["row_count"]) == (
        "crash-1",
        "OK",
        n,
    )
    assert sub.matching(is_ours) == []
    # 3. Replayed: the recorded notification is published, then the driver dies
    #    before Spark commits the batch. The message may or may not have left the
    #    socket before the kill.
    run.start(crash_at="history-after-publish")
    assert run.wait_exit() == KILLED
    before = len(sub.matching(is_ours))
    assert before in (0, 1)
    # 4. A clean run publishes the same notification once more (at-least-once in
    #    that window), then moves on; a sentinel request proves nothing else follows.
    run.start()
    run.wait_ready()
    got = sub.wait_for(is_ours, count=before + 1)
    kafka.send(
        run.batches_topic, build.request_records("crash-sentinel", [build.candle(0, t0=t0 - 10**9)])
    )
    sub.wait_for(tools.is_notification("crash-sentinel"))
    got = sub.matching(is_ours)
    assert len(got) == before + 1
    first = got[0].message
    assert isinstance(first, HistoryReadyNotification)
    # The same notification; numbered by the publisher that sent it (a restart: new epoch).
    assert all(_unnumbered(g.message) == _unnumbered(first) for g in got)
    assert all(g.topic == "RESPONSE:crash-client" for g in got)
    assert (first.status, first.row_count) == (Status.OK, n)
    assert first.snapshot_id == recorded["snapshot_id"]

    rows = lake.rows("ohlc")
    assert len(rows) == n + 1  # + the sentinel's candle
    assert len({(r["ticker"], r["period_seconds"], r["open_time"]) for r in rows}) == n + 1
    assert len(lake.rows("requests")) == 2

    # 5. A stored answer (a marker alone: crash-1's range is stored) goes out ahead of
    #    the history query (stored_answers), whose 60 s trigger keeps it behind; the
    #    driver dies right after the publish, before the query records it.
    stored = build.metadata(
        "crash-st", client_id="crash-client", start=t0, end=t0 + n * build.MINUTE
    )
    stored.status, stored.source, stored.expected_candles = (
        Status.OK, HistorySource.SOURCE_STORAGE, n
    )  # fmt: skip
    marker = OHLCBatch(request_id="crash-st", metadata=stored, is_final=True)
    run.stop()
    run.extra_env["PIPELINE_HISTORY__TRIGGER_S"] = "60"
    run.start(crash_at="stored-answer-after-publish")
    run.wait_ready(stored_answers=True)  # the stored-answers path reads the topic from here on
    kafka.send(run.batches_topic, [envelope.encode_record(marker)])
    assert run.wait_exit() == KILLED
    is_stored = tools.is_notification("crash-st")
    early = len(sub.matching(is_stored))
    assert early in (0, 1)
    assert lake.rows("requests", "request_id = 'crash-st'") == []
    # 6. Restarted, the query finds the marker neither recorded nor claimed: it
    #    notifies it (again: at-least-once in that window, never lost) and records it.
    del run.extra_env["PIPELINE_HISTORY__TRIGGER_S"]
    run.start()
    run.wait_ready()
    [*_, last] = sub.wait_for(is_stored, count=early + 1)
    assert isinstance(last.message, HistoryReadyNotification)
    assert (last.message.status, last.message.row_count) == (Status.OK, n)
    [row] = lake.rows("requests", "request_id = 'crash-st'")
    assert row["batch_id"] != EARLY_BATCH  # the query's own notice, not the lost early one
    sub.close()
