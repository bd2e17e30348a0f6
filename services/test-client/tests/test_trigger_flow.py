"""Trigger calls against the fake relay: subscribe before register, events, cancel, list, CLI."""

from __future__ import annotations

from typing import Any

import pytest

from mdclient import Client
from mdclient.cli import main
from mdclient.triggers import TriggerRejected
from mdproto import topics
from mdproto.messages import (
    CEPTriggerAck,
    CEPTriggerEvent,
    CEPTriggerRequest,
    NotifyPattern,
    Status,
)

TICKER = "BINANCE:BTC/USDT"


def event(trigger_id: str, kind: int, **fields: Any) -> CEPTriggerEvent:
    return CEPTriggerEvent(trigger_id=trigger_id, ticker=TICKER, kind=kind, **fields)  # type: ignore[arg-type]


def store(kit: Any, *, reject: str = "") -> Any:
    """A relay with a trigger store: REGISTER publishes ARMED (then FIRED), CANCEL CANCELLED."""
    registered: dict[str, CEPTriggerRequest] = {}

    def handle(message: Any) -> Any:
        assert isinstance(message, CEPTriggerRequest)
        if message.action == CEPTriggerRequest.LIST:
            mine = [r for r in registered.values() if r.client_id == message.client_id]
            return kit.Action(CEPTriggerAck(status=Status.OK, triggers=mine))
        if reject:
            ack = CEPTriggerAck(
                trigger_id=message.trigger_id,
                status=Status.REJECTED,
                reason=reject,
                error_code="bad_condition",
            )
            return kit.Action(ack)
        if message.action == CEPTriggerRequest.CANCEL:
            old = registered.pop(message.trigger_id)
            topic = topics.cep_event_topic(old.notify, old.trigger_id, old.client_id)
            done = event(message.trigger_id, CEPTriggerEvent.CANCELLED, final=True)
            return kit.Action(
                CEPTriggerAck(trigger_id=message.trigger_id, status=Status.OK), [(topic, done)]
            )
        registered[message.trigger_id] = message
        topic = topics.cep_event_topic(message.notify, message.trigger_id, message.client_id)
        fire = event(
            message.trigger_id,
            CEPTriggerEvent.FIRED,
            fire_count=1,
            final=not message.repeating,
            values={"price": 101.0},
        )
        ack = CEPTriggerAck(trigger_id=message.trigger_id, status=Status.OK, event_topic=topic)
        # Someone else's event on a prefix-matching topic must not reach us.
        stranger = (topic + "2", event(message.trigger_id, CEPTriggerEvent.FIRED))
        armed = (topic, event(message.trigger_id, CEPTriggerEvent.ARMED))
        return kit.Action(ack, [stranger, armed, (topic, fire)])

    return handle


def test_register_subscribes_first_and_yields_its_events_until_final(
    fake_relay: Any, settings_for: Any, kit: Any
) -> None:
    fake_relay.handler = store(kit)
    with Client(settings=settings_for(fake_relay, client_id="alice")) as c:
        with c.register_trigger(TICKER, ["above:100"], trigger_id="t1") as events:
            got = list(events)
        assert events.ack is not None and events.ack.event_topic == "RESPONSE:alice"
    assert [(e.kind, e.final) for e in got] == [(CEPTriggerEvent.ARMED, False), (0, True)]
    subscribed = fake_relay.index_of("sub", lambda t: t == "RESPONSE:alice")
    registered = fake_relay.index_of("req", lambda m: isinstance(m, CEPTriggerRequest))
    assert subscribed < registered
    [request] = [m for m in fake_relay.requests if isinstance(m, CEPTriggerRequest)]
    assert (request.client_id, request.notify) == ("alice", NotifyPattern.NOTIFY_PER_CLIENT)
    assert request.conditions[0].threshold == 100.0


def test_per_trigger_topic_repeating_cancel_and_list(
    fake_relay: Any, settings_for: Any, kit: Any
) -> None:
    fake_relay.handler = store(kit)
    with Client(settings=settings_for(fake_relay, client_id="bob")) as c:
        events = c.register_trigger(
            TICKER, ["below:95", "above:100"], within="1m", repeating=True, per_trigger=True
        )
        assert events.topics == (f"CEP:{events.trigger_id}",)
        assert events.wait_for(CEPTriggerEvent.FIRED, 5) is not None
        assert [r.trigger_id for r in c.list_triggers()] == [events.trigger_id]
        c.cancel_trigger(events.trigger_id)
        final = events.wait_for(CEPTriggerEvent.CANCELLED, 5)
        assert final is not None and final.final
        assert events.get(timeout_s=0.1) is None and events.finished
        assert c.list_triggers() == []
        events.close()
    [request] = [
        m
        for m in fake_relay.requests
        if isinstance(m, CEPTriggerRequest) and m.action == CEPTriggerRequest.REGISTER
    ]
    assert (request.within_seconds, request.repeating) == (60, True)


def test_a_rejection_raises_and_leaves_no_subscription(
    fake_relay: Any, settings_for: Any, kit: Any
) -> None:
    fake_relay.handler = store(kit, reject="condition 0: window_seconds must be > 0")
    with Client(settings=settings_for(fake_relay, client_id="carol", notify="per_request")) as c:
        with pytest.raises(TriggerRejected, match="window") as info:
            c.register_trigger(TICKER, ["above:100"], trigger_id="t9")
        assert info.value.error_code == "bad_condition"
        fake_relay.wait_for(lambda ev: ("unsub", "CEP:t9") in ev)


def test_cli_add_watch_list_cancel(
    fake_relay: Any, settings_for: Any, kit: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_relay.handler = store(kit)
    endpoints = [
        "--request-endpoint",
        fake_relay.request_endpoint,
        "--market-data-endpoint",
        fake_relay.market_data_endpoint,
        "--client-id",
        "dave",
    ]
    code = main(["trigger", "add", TICKER, "above:100", "--id", "t5", "--watch", *endpoints])
    assert code == 0
    out = capsys.readouterr().out
    assert "ARMED" in out and "FIRED #1 final" in out and "price=101" in out
    assert (
        main(["trigger", "add", TICKER, "pct:5@1m", "--id", "t6", "--repeating", *endpoints]) == 0
    )
    assert capsys.readouterr().out.strip() == "t6"
    assert main(["trigger", "list", *endpoints]) == 0
    listed = capsys.readouterr().out
    assert "t6 BINANCE:BTC/USDT ticks pct:5@1m, repeating" in listed
    assert main(["trigger", "cancel", "t6", *endpoints]) == 0
    assert main(["trigger", "add", TICKER, "pct:5", *endpoints]) == 2  # needs a window
    assert "needs a window" in capsys.readouterr().err


def test_add_trigger_sends_what_register_sends_and_refuses_unknown_options(
    fake_relay: Any, settings_for: Any, kit: Any
) -> None:
    fake_relay.handler = store(kit)
    options: dict[str, Any] = {"within": "1m", "repeating": True, "per_trigger": True}
    with Client(settings=settings_for(fake_relay, client_id="erin")) as c:
        ack = c.add_trigger(TICKER, ["below:95", "above:100"], trigger_id="a1", **options)
        assert ack.status == Status.OK and ack.event_topic == "CEP:a1"
        with c.register_trigger(TICKER, ["below:95", "above:100"], trigger_id="r1", **options):
            pass
        with pytest.raises(TypeError, match="repeat"):
            c.add_trigger(TICKER, ["above:100"], repeat=True)  # type: ignore[call-arg]
    added, registered = [m for m in fake_relay.requests if isinstance(m, CEPTriggerRequest)]
    registered.trigger_id = "a1"
    assert added == registered
