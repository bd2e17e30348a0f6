"""Client-side trigger helpers: condition syntax, request checks, acks, event streams."""

from __future__ import annotations

import threading

import pytest

from mdclient.errors import InvalidRequest, ProtocolMismatch
from mdclient.triggers import (
    TriggerEvents,
    TriggerRejected,
    build_register,
    check_ack,
    describe_condition,
    describe_trigger,
    event_line,
    event_topic,
    parse_condition,
)
from mdproto import envelope
from mdproto.messages import (
    CEPCondition,
    CEPTriggerAck,
    CEPTriggerEvent,
    NotifyPattern,
    Response,
    Status,
    SubmitResponse,
)

TICKER = "BINANCE:BTC/USDT"


@pytest.mark.parametrize(
    ("text", "kind", "threshold", "window"),
    [
        ("above:100", CEPCondition.PRICE_ABOVE, 100.0, 0),
        ("BELOW:95.5", CEPCondition.PRICE_BELOW, 95.5, 0),
        ("pct:5@60s", CEPCondition.PCT_MOVE, 5.0, 60),
        ("volume:1000@5m", CEPCondition.VOLUME_OVER, 1000.0, 300),
    ],
)
def test_condition_syntax(text: str, kind: int, threshold: float, window: int) -> None:
    condition = parse_condition(text)
    assert (condition.kind, condition.threshold, condition.window_seconds) == (
        kind,
        threshold,
        window,
    )
    assert parse_condition(describe_condition(condition)) == condition


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("over:5", "KIND:THRESHOLD"),
        ("above", "KIND:THRESHOLD"),
        ("above:x", "not a number"),
        ("above:-1", "positive"),
        ("above:1@60s", "no window"),
        ("pct:5", "needs a window"),
        ("volume:5@soon", "volume:5@soon"),
    ],
)
def test_bad_conditions_say_what_is_wrong(text: str, needle: str) -> None:
    with pytest.raises(InvalidRequest, match=needle):
        parse_condition(text)


def test_register_request_and_its_event_topic() -> None:
    conditions = [parse_condition("below:95"), parse_condition("above:100")]
    request = build_register(
        trigger_id="t1",
        client_id="alice",
        ticker=TICKER,
        conditions=conditions,
        within_seconds=60,
        repeating=True,
    )
    assert request.notify == NotifyPattern.NOTIFY_PER_CLIENT
    assert event_topic(request) == "RESPONSE:alice"
    per_trigger = build_register(
        trigger_id="t1", client_id="alice", ticker=TICKER, conditions=conditions[:1],
        per_client=False,
    )  # fmt: skip
    assert event_topic(per_trigger) == "CEP:t1"
    assert describe_trigger(request) == (
        "t1 BINANCE:BTC/USDT ticks below:95 then above:100 within 60s, repeating"
    )


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"ticker": "BTC/USDT"}, "EXCHANGE:BASE/QUOTE"),
        ({"trigger_id": "a b"}, "trigger_id"),
        ({"conditions": []}, "one condition"),
        ({"within_seconds": 0}, "time bound"),
    ],
)
def test_register_checks_before_sending(changes: dict[str, object], needle: str) -> None:
    fields: dict[str, object] = {
        "trigger_id": "t1",
        "client_id": "alice",
        "ticker": TICKER,
        "conditions": [parse_condition("below:95"), parse_condition("above:100")],
        "within_seconds": 60,
    }
    fields.update(changes)
    with pytest.raises(InvalidRequest, match=needle):
        build_register(**fields)  # type: ignore[arg-type]


def test_acks() -> None:
    ok = CEPTriggerAck(trigger_id="t1", status=Status.OK, event_topic="CEP:t1")
    assert check_ack(envelope.encode(ok), "t1").event_topic == "CEP:t1"
    rejected = CEPTriggerAck(
        trigger_id="t1", status=Status.REJECTED, reason="bad", error_code="bad_condition"
    )
    with pytest.raises(TriggerRejected) as info:
        check_ack(envelope.encode(rejected), "t1")
    assert info.value.error_code == "bad_condition"
    with pytest.raises(TriggerRejected, match="busy"):
        check_ack(envelope.encode(Response(status=Status.ERROR, reason="busy")), "t1")
    with pytest.raises(ProtocolMismatch):
        check_ack(envelope.encode(SubmitResponse(status=Status.OK)), "t1")
    with pytest.raises(ProtocolMismatch):
        check_ack([b"\x09", b"junk"], "t1")
    with pytest.raises(ProtocolMismatch, match="not t1"):
        check_ack(envelope.encode(CEPTriggerAck(trigger_id="t2", status=Status.OK)), "t1")


def event(
    trigger_id: str, kind: int = CEPTriggerEvent.FIRED, final: bool = False
) -> CEPTriggerEvent:
    return CEPTriggerEvent(
        trigger_id=trigger_id,
        ticker=TICKER,
        kind=kind,  # type: ignore[arg-type]
        final=final,
        fire_count=1,
        event_time_ms=1_700_000_000_000,
        values={"price": 101.5},
    )


def test_event_stream_filters_by_exact_topic_and_trigger_and_ends_when_final() -> None:
    closed: list[TriggerEvents] = []
    stream = TriggerEvents(["RESPONSE:alice"], ["t1"], closed.append, until_final=True)
    stream.deliver("RESPONSE:alice2", event("t1"))  # prefix match of someone else's topic
    stream.deliver("RESPONSE:alice", event("t2"))  # another trigger of the same client
    stream.deliver("RESPONSE:alice", event("t1", CEPTriggerEvent.ARMED))
    stream.deliver("RESPONSE:alice", event("t1", final=True))
    got = list(stream)
    assert [(e.kind, e.final) for e in got] == [(CEPTriggerEvent.ARMED, False), (0, True)]
    stream.close()
    stream.close()
    assert closed == [stream]


def test_wait_for_skips_to_the_wanted_kind_and_times_out() -> None:
    stream = TriggerEvents(["CEP:t1"], None, lambda s: None)
    threading.Timer(0.05, stream.deliver, ("CEP:t1", event("t1", CEPTriggerEvent.ARMED))).start()
    armed = stream.wait_for(CEPTriggerEvent.ARMED, timeout_s=5)
    assert armed is not None and armed.trigger_id == "t1"
    assert stream.wait_for(CEPTriggerEvent.FIRED, timeout_s=0.3) is None


def test_event_line() -> None:
    line = event_line(event("t1", final=True))
    assert "FIRED #1 final" in line and "t1" in line and "price=101.5" in line
    expired = CEPTriggerEvent(
        trigger_id="t1", kind=CEPTriggerEvent.EXPIRED, final=True, description="expired"
    )
    assert event_line(expired).startswith("-  EXPIRED final  t1")
