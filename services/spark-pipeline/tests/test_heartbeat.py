"""The pipeline's heartbeat: what it tells the relays, and that it keeps beating."""

from __future__ import annotations

import threading

from google.protobuf.message import Message

from mdproto import topics
from mdproto.messages import PipelineStatus
from pipeline.heartbeat import Heartbeat, QueryState, pipeline_status


def test_a_running_pipeline_serves_history_and_triggers() -> None:
    status = pipeline_status(QueryState.RUNNING, True, 1.0, now_ms=123)
    assert (status.history, status.triggers, status.reason) == (True, True, "")
    assert (status.sent_at_ms, status.interval_ms) == (123, 1000)


def test_a_restarting_history_query_still_serves() -> None:
    # It reads the requests written meanwhile from its checkpoint once it is back.
    assert pipeline_status(QueryState.RESTARTING, True, 1.0, 0).history


def test_what_is_not_served_comes_with_a_reason() -> None:
    starting = pipeline_status(QueryState.STARTING, True, 1.0, 0)
    assert not starting.history and starting.triggers
    assert starting.reason == "the pipeline is starting (its history query does not run yet)"
    off = pipeline_status(QueryState.DISABLED, False, 0.5, 0)
    assert (off.history, off.triggers, off.interval_ms) == (False, False, 500)
    assert "history.enabled: false" in off.reason and "cep.enabled: false" in off.reason


def test_the_beat_survives_a_failed_send_and_stops_on_request() -> None:
    sent: list[tuple[str, Message]] = []
    three = threading.Event()

    def publish(topic: str, message: Message) -> None:
        if not sent:
            sent.append(("", message))
            raise RuntimeError("the PUB server took no message for 10000 ms")
        sent.append((topic, message))
        if len(sent) >= 3:
            three.set()

    beat = Heartbeat(publish, lambda: QueryState.RUNNING, cep_enabled=True, interval_s=0.01)
    beat.start()
    assert three.wait(5), "the heartbeat stopped after a failed send"
    beat.stop()
    assert not any(t.name == "pipeline-heartbeat" for t in threading.enumerate())
    topic, message = sent[1]
    assert topic == topics.PIPELINE_STATUS and isinstance(message, PipelineStatus)
    assert message.history and message.triggers
