"""Pipeline liveness: history submits and trigger registrations are refused
`pipeline_unavailable` while no heartbeat comes from upstream.

The pure rule (relay.pipeline_status.PipelineWatch) with a hand-driven clock, then a
running relay on real sockets whose fake pipeline publishes PipelineStatus.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from mdproto import envelope, topics
from mdproto.error_codes import PIPELINE_UNAVAILABLE
from mdproto.messages import (
    CEPCondition,
    CEPTriggerAck,
    CEPTriggerRequest,
    DataRequest,
    PipelineStatus,
    Status,
    SubmitHistoricalRequest,
    SubmitResponse,
)
from relay.metrics import PIPELINE_SERVING, RelayMetrics
from relay.pipeline_status import Part, PipelineHeartbeats, PipelineWatch
from relay.triggers import Stored

if TYPE_CHECKING:
    from conftest import FakePipeline, RelayFactory, RunningRelay

HOUR = 3_600_000
SERVING = PipelineStatus(interval_ms=1000, history=True, triggers=True)


def beat(**fields: object) -> PipelineStatus:
    status = PipelineStatus()
    status.CopyFrom(SERVING)
    for name, value in fields.items():
        setattr(status, name, value)
    return status


# --- the rule, pure ---------------------------------------------------------------


def test_nothing_is_accepted_before_the_first_heartbeat() -> None:
    watch = PipelineWatch(timeout_s=5, now=100.0)
    refused = watch.refusal(Part.HISTORY, now=112.0)
    assert refused is not None and refused.error_code == PIPELINE_UNAVAILABLE
    assert "no heartbeat from the pipeline since the relay started 12 s ago" in refused.reason
    assert watch.refusal(Part.TRIGGERS, now=112.0) == refused
    watch.beat(SERVING, now=112.5)
    assert watch.serving(now=113.0) == {Part.HISTORY: True, Part.TRIGGERS: True}


def test_a_silent_pipeline_is_refused_once_the_timeout_passes() -> None:
    watch = PipelineWatch(timeout_s=5, now=0.0)
    watch.beat(SERVING, now=10.0)
    assert watch.refusal(Part.HISTORY, now=15.0) is None  # the bound itself still serves
    late = watch.refusal(Part.HISTORY, now=15.01)
    assert late is not None and late.error_code == PIPELINE_UNAVAILABLE
    assert "last heartbeat came 5.0 s ago" in late.reason and "hung" in late.reason
    watch.beat(SERVING, now=20.0)  # it came back
    assert watch.refusal(Part.HISTORY, now=20.0) is None


def test_a_slow_heartbeat_gets_three_of_its_own_intervals() -> None:
    watch = PipelineWatch(timeout_s=5, now=0.0)
    watch.beat(beat(interval_ms=4000), now=0.0)
    assert watch.fresh(now=12.0) and not watch.fresh(now=12.01)


def test_a_part_the_pipeline_does_not_run_is_refused_with_its_reason() -> None:
    watch = PipelineWatch(timeout_s=5, now=0.0)
    watch.beat(beat(triggers=False, reason="CEP is disabled in this pipeline"), now=1.0)
    assert watch.refusal(Part.HISTORY, now=1.0) is None
    refused = watch.refusal(Part.TRIGGERS, now=1.0)
    assert refused is not None and refused.error_code == PIPELINE_UNAVAILABLE
    assert refused.reason == "the pipeline cannot serve triggers: CEP is disabled in this pipeline"


def test_a_timeout_of_zero_never_refuses() -> None:
    watch = PipelineWatch(timeout_s=0, now=0.0)
    assert not watch.enabled
    assert watch.refusal(Part.HISTORY, now=1e6) is None


def test_the_relay_reports_an_overdue_heartbeat_in_the_pipelines_stead() -> None:
    watch = PipelineWatch(timeout_s=5, now=0.0)
    assert watch.down_report(now=60.0, wall_ms=1, interval_ms=1000) is None  # never heard
    watch.beat(SERVING, now=10.0)
    assert watch.down_report(now=15.0, wall_ms=1, interval_ms=1000) is None  # still fresh
    report = watch.down_report(now=15.5, wall_ms=77, interval_ms=1000)
    assert report is not None
    assert (report.history, report.triggers, report.sent_at_ms, report.interval_ms) == (
        False,
        False,
        77,
        1000,
    )
    assert report.reason.startswith("relay: the pipeline's last heartbeat came 5.5 s ago")
    watch.beat(SERVING, now=16.0)  # back: the relay falls silent again
    assert watch.down_report(now=16.0, wall_ms=1, interval_ms=1000) is None


def test_a_pipeline_that_says_it_does_not_serve_speaks_for_itself() -> None:
    watch = PipelineWatch(timeout_s=5, now=0.0)
    watch.beat(beat(history=False, reason="starting"), now=1.0)
    assert watch.refusal(Part.HISTORY, now=2.0) is not None
    assert watch.down_report(now=2.0, wall_ms=1, interval_ms=1000) is None
    assert PipelineWatch(timeout_s=0, now=0.0).down_report(1e6, 1, 1000) is None


def test_each_refresh_publishes_one_down_report_while_the_heartbeat_is_overdue() -> None:
    sent: list[list[bytes]] = []
    metrics = RelayMetrics()

    def publish(frames: list[bytes]) -> bool:
        sent.append(frames)
        return True

    beats = PipelineHeartbeats(5, metrics, 0.0, publish=publish, wall_ms=lambda: 5)
    beats.refresh(30.0)
    assert sent == []  # never heard: nothing to report
    beats.on_frames(envelope.encode_pub(topics.PIPELINE_STATUS, SERVING), 31.0)
    beats.refresh(36.0)
    assert sent == []
    beats.refresh(36.5)
    beats.refresh(37.5)
    assert len(sent) == 2
    topic, report = envelope.decode_sub(sent[0])
    assert topic == topics.PIPELINE_STATUS and isinstance(report, PipelineStatus)
    assert not report.history and "hung" in report.reason
    assert metrics.registry.get_sample_value("relay_pipeline_down_reports_total") == 2


# --- a running relay ------------------------------------------------------------------


def submit(request_id: str) -> SubmitHistoricalRequest:
    return SubmitHistoricalRequest(
        request_id=request_id,
        client_id="c1",
        ticker="BINANCE:BTC/USDT",
        period_seconds=60,
        start_time_ms=1_700_000_000_000,
        end_time_ms=1_700_000_000_000 + HOUR,
    )


def register(trigger_id: str) -> CEPTriggerRequest:
    return CEPTriggerRequest(
        trigger_id=trigger_id,
        client_id="c1",
        action=CEPTriggerRequest.REGISTER,
        ticker="BINANCE:BTC/USDT",
        conditions=[CEPCondition(kind=CEPCondition.PRICE_ABOVE, threshold=50_000.0)],
    )


class StoringSink:
    """A trigger store that has every request at once."""

    def submit(self, request: CEPTriggerRequest, stored: Stored) -> None:
        stored(None)

    def list(self, client_id: str, now_ms: int) -> list[CEPTriggerRequest]:
        return []

    def tickers(self) -> set[str]:
        return set()

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass


def heartbeat_reaches_relay(relay: RunningRelay, pipeline: FakePipeline, **fields: object) -> None:
    """Publish until the relay has counted one (its SUB may still be connecting)."""
    seen = relay.sample("relay_pipeline_heartbeats_total")
    pipeline.wait_subscribed(topics.PIPELINE_STATUS)

    def arrived() -> bool:
        pipeline.publish(topics.PIPELINE_STATUS, beat(interval_ms=100, **fields))
        return relay.sample("relay_pipeline_heartbeats_total") > seen

    relay.wait_until(arrived, what="the relay to count a heartbeat")


def test_submits_and_triggers_follow_the_heartbeat(
    make_relay: RelayFactory, pipeline: FakePipeline
) -> None:
    relay = make_relay(sink=StoringSink(), pipeline_heartbeat_timeout_s=0.5)
    ingestor = relay.ingestor()
    client = relay.client()

    # No heartbeat yet: refused at once, with the reason, and no work goes out.
    reply = relay.request(client, submit("r0"), SubmitResponse)
    assert (reply.status, reply.error_code) == (Status.REJECTED, PIPELINE_UNAVAILABLE)
    assert "no heartbeat from the pipeline" in reply.reason

    heartbeat_reaches_relay(relay, pipeline)
    assert relay.request(client, submit("r1"), SubmitResponse).status == Status.OK
    _, work = ingestor.next_work(DataRequest.HISTORICAL)
    assert work.request_id == "r1"
    assert relay.request(client, register("t1"), CEPTriggerAck).status == Status.OK
    assert relay.sample(PIPELINE_SERVING, work="history") == 1

    # Silence: refused within the timeout (plus a loop turn), with how long it lasted.
    silent_from = time.monotonic()
    relay.wait_until(
        lambda: relay.sample(PIPELINE_SERVING, work="history") == 0,
        what="the relay to notice the silence",
    )
    assert time.monotonic() - silent_from < 0.5 + 1.5  # stats_interval_s refreshes the gauge
    reply = relay.request(client, submit("r2"), SubmitResponse)
    assert (reply.status, reply.error_code) == (Status.REJECTED, PIPELINE_UNAVAILABLE)
    assert "last heartbeat came" in reply.reason
    ack = relay.request(client, register("t2"), CEPTriggerAck)
    assert (ack.status, ack.error_code) == (Status.REJECTED, PIPELINE_UNAVAILABLE)
    cancel = CEPTriggerRequest(trigger_id="t1", action=CEPTriggerRequest.CANCEL)
    assert relay.request(client, cancel, CEPTriggerAck).status == Status.OK  # needs no pipeline
    assert relay.sample("relay_rejections_total", type="submit", error_code=PIPELINE_UNAVAILABLE)
    assert relay.relay.health().details["pipeline_serving"] == {
        "history": False,
        "triggers": False,
    }

    # A client waiting on a request accepted before the silence hears it too.
    waiting = relay.subscriber(topics.PIPELINE_STATUS)
    topic, report = envelope.decode_sub(relay.recv(waiting))
    assert topic == topics.PIPELINE_STATUS and isinstance(report, PipelineStatus)
    assert not report.history and "last heartbeat came" in report.reason
    assert relay.sample("relay_pipeline_down_reports_total") >= 1

    # A heartbeat that says CEP is off: history is back, triggers are refused with why.
    heartbeat_reaches_relay(relay, pipeline, triggers=False, reason="CEP is disabled")
    assert relay.request(client, submit("r3"), SubmitResponse).status == Status.OK
    ack = relay.request(client, register("t3"), CEPTriggerAck)
    assert (ack.status, ack.reason) == (
        Status.REJECTED,
        "the pipeline cannot serve triggers: CEP is disabled",
    )


def test_a_heartbeat_topic_carrying_something_else_is_a_bad_frame(
    make_relay: RelayFactory, pipeline: FakePipeline
) -> None:
    relay = make_relay(pipeline_heartbeat_timeout_s=0.5)
    pipeline.wait_subscribed(topics.PIPELINE_STATUS)
    pipeline.publish(topics.PIPELINE_STATUS, submit("not a heartbeat"))
    relay.wait_until(
        lambda: (
            relay.sample("relay_bad_frames_total", socket="pipeline", error_code="unexpected_type")
            == 1
        ),
        what="the bad frame to be counted",
    )
    assert relay.sample(PIPELINE_SERVING, work="history") == 0
