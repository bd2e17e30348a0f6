"""The history query's checkpoint on ``s3a://`` (SeaweedFS) and its commit failing for real
after the batch notified: the S3 store is stopped while the batch is held right after its
publish (``PIPELINE_HOLD_AT``), so Spark's commit-log write fails, the query restarts
in-process once the store is back and replays the batch, which finds its request recorded
and sent and stays silent: notified once, recorded once, no row twice (docs/adr/0022).

The commit fails once S3A gives up on the refused connections: 3.7 s after the release with
the pipeline's few S3A retries (``session.S3A_RETRY_LIMIT``), 137 s with Hadoop's defaults.
The other crash points (a kill anywhere in the batch) are in test_stack_recovery_history.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from infra.testing import poll_until
from mdproto.messages import HistoryReadyNotification, Status

pytestmark = [pytest.mark.stack, pytest.mark.spark, pytest.mark.heavy(seconds=90)]


def writer_when_held(fifo: Path, run: Any) -> int | None:
    """The pipe's write end, once the held batch has opened its read end (else None)."""
    assert run.process.poll() is None, f"the pipeline exited:\n{run.tail()}"
    try:
        return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # no reader yet: the batch is not at its point
            return None
        raise


#: The history query alone (and the stored-answers thread beside it).
HISTORY_ALONE = {
    f"PIPELINE_{part}__ENABLED": "false" for part in ("LIVE", "CEP", "MARKETS", "GAPS")
}


def on_s3_held_after_publish(run: Any) -> Path:
    """Checkpoints under the run's own prefix of the stack's bucket; the first history
    batch held after its publish on a named pipe (returned)."""
    hold = run.workdir / "hold"
    os.mkfifo(hold)
    run.extra_env |= {
        "PIPELINE_CHECKPOINT_DIR": f"s3a://{run.endpoints.s3_bucket}/tests/{run.namespace}/ckpt",
        "PIPELINE_HOLD_AT": "history-after-publish",
        "PIPELINE_HOLD_FIFO": str(hold),
    }
    return hold


def test_a_history_batch_whose_s3_checkpoint_commit_fails_after_its_publish_notifies_once(
    local_stack: Any, make_run: Any, tools: Any, build: Any
) -> None:
    run = make_run(**HISTORY_ALONE)
    hold = on_s3_held_after_publish(run)
    e = run.endpoints
    sub = tools.Subscriber(run.pub_endpoint)
    kafka, lake = tools.Kafka(e.kafka_bootstrap), tools.Lake(e, run.namespace)
    t0, n = build.T0, 500
    meta = build.metadata("ckpt-1", client_id="ckpt-client", start=t0, end=t0 + n * build.MINUTE)
    is_ours = tools.is_notification("ckpt-1")

    run.start()
    run.wait_ready()
    kafka.send(
        run.batches_topic,
        build.request_records("ckpt-1", [build.candle(i) for i in range(n)], meta=meta),
    )
    # 1. The batch holds right after its publish: recorded and notified, not committed.
    writer = poll_until(
        "the history batch at its hold point", lambda: writer_when_held(hold, run), tools.WAIT_S
    )
    try:
        [recorded] = lake.rows("requests")
        assert (recorded["request_id"], recorded["row_count"]) == ("ckpt-1", n)
        sub.wait_for(is_ours)
        # 2. The S3 store goes; released, the batch returns and Spark's commit-log write
        #    on s3a:// fails: the query dies and the process restarts it (app.py).
        local_stack.stop("seaweedfs")
    finally:
        os.close(writer)
    try:
        poll_until(
            "the history query's failure",
            lambda: "query history failed" in run.log_text(),
            tools.WAIT_S,
            interval_s=0.5,
        )
    finally:
        local_stack.up()  # the session's stack, whole again whatever happened
    # 3. Restarted on the store again, the query replays the batch: it finds its request
    #    recorded by this batch and sent by this process, and publishes nothing.
    poll_until(
        "the replay of the held batch",
        lambda: "request ckpt-1 was notified before this batch failed" in run.log_text(),
        tools.WAIT_S,
        interval_s=0.5,
    )
    kafka.send(
        run.batches_topic, build.request_records("ckpt-sentinel", [build.candle(0, t0=t0 - 10**9)])
    )
    sub.wait_for(tools.is_notification("ckpt-sentinel"))

    [got] = sub.matching(is_ours)
    assert isinstance(got.message, HistoryReadyNotification)
    assert (got.message.status, got.message.row_count) == (Status.OK, n)
    assert got.message.snapshot_id == recorded["snapshot_id"]
    assert sorted(r["request_id"] for r in lake.rows("requests")) == ["ckpt-1", "ckpt-sentinel"]
    rows = lake.rows("ohlc")
    assert len({(r["ticker"], r["period_seconds"], r["open_time"]) for r in rows}) == len(rows)
    assert len(rows) == n + 1
    log = run.log_text()
    assert "hold point history-after-publish released" in log
    failure = next(line for line in log.splitlines() if "query history failed" in line)
    assert "/history/commits/" in failure, failure  # it was the checkpoint commit that failed
    assert run.process.poll() is None, f"the pipeline exited:\n{run.tail()}"
    run.stop()
    assert run.process.returncode == 0
    sub.close()
