"""CEP triggers at the relay: clear rejections, LIST, and live data for triggered tickers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from mdproto import rules
from mdproto.messages import (
    CEPCondition,
    CEPTriggerAck,
    CEPTriggerRequest,
    DataRequest,
    IngestorControl,
    NotifyPattern,
    Status,
)
from relay import client_requests as v
from relay.config import RelaySettings
from relay.trigger_kafka import TriggerDirectory
from relay.triggers import NoTriggerStore, Stored, TriggerSinkError

if TYPE_CHECKING:
    from conftest import RelayFactory

NOW = 1_700_000_000_000
POLICY = v.Policy.of(["BINANCE"], 10_000_000, 86_400_000)
TICKER = "BINANCE:BTC/USDT"
ABOVE, PCT = CEPCondition.PRICE_ABOVE, CEPCondition.PCT_MOVE


def trigger(**fields: Any) -> CEPTriggerRequest:
    values: dict[str, Any] = {
        "trigger_id": "t1",
        "client_id": "c1",
        "action": CEPTriggerRequest.REGISTER,
        "ticker": TICKER,
        "conditions": [CEPCondition(kind=ABOVE, threshold=50_000.0)],
    }
    values.update(fields)
    return CEPTriggerRequest(**values)


# --- validation: every invalid trigger gets a reason that names the problem -------------


@pytest.mark.parametrize(
    ("fields", "code", "needle"),
    [
        ({"trigger_id": ""}, rules.MISSING_ID, "trigger_id"),
        ({"trigger_id": "no spaces"}, rules.BAD_ID, "trigger_id"),
        ({"ticker": "BTCUSDT"}, rules.BAD_TICKER, "EXCHANGE:BASE/QUOTE"),
        ({"ticker": "KRAKEN:BTC/USD"}, rules.UNKNOWN_EXCHANGE, "KRAKEN"),
        ({"conditions": []}, rules.BAD_CONDITION, "got 0"),
        ({"conditions": [CEPCondition(kind=ABOVE, threshold=1)] * 3}, rules.BAD_CONDITION, "got 3"),
        ({"conditions": [CEPCondition(kind=0, threshold=1)]}, rules.BAD_CONDITION, "unknown kind"),
        ({"conditions": [CEPCondition(kind=ABOVE, threshold=-1)]}, rules.BAD_CONDITION, "> 0"),
        ({"conditions": [CEPCondition(kind=PCT, threshold=5)]}, rules.BAD_CONDITION, "window"),
        (
            {"conditions": [CEPCondition(kind=ABOVE, threshold=1)] * 2},
            rules.BAD_CONDITION,
            "within_seconds",
        ),
        ({"expires_at_ms": NOW - 1}, rules.EXPIRED, "in the past"),
        ({"notify": 7}, rules.BAD_NOTIFY, "notify"),
        (
            {"notify": NotifyPattern.NOTIFY_PER_CLIENT, "client_id": ""},
            rules.BAD_NOTIFY,
            "client_id",
        ),
        (
            {"action": CEPTriggerRequest.ACTION_UNSPECIFIED},
            rules.BAD_ACTION,
            "REGISTER, CANCEL or LIST",
        ),
    ],
)
def test_invalid_triggers_are_rejected_with_a_clear_reason(
    fields: dict[str, Any], code: str, needle: str
) -> None:
    outcome = v.check_trigger(trigger(**fields), POLICY, NOW)
    assert not outcome.accepted
    assert (outcome.reply.status, outcome.reply.error_code) == (Status.REJECTED, code)
    assert needle in outcome.reply.reason


def test_list_needs_only_a_valid_client_id() -> None:
    listing = CEPTriggerRequest(action=CEPTriggerRequest.LIST, client_id="c1")
    assert v.check_trigger(listing, POLICY, NOW).accepted
    for client_id, code in (("", rules.MISSING_ID), ("bad id", rules.BAD_ID)):
        listing.client_id = client_id
        outcome = v.check_trigger(listing, POLICY, NOW)
        assert (outcome.accepted, outcome.reply.error_code) == (False, code)


def test_without_a_store_nothing_is_taken() -> None:
    for call in (
        lambda: NoTriggerStore().list("c1", NOW),
        lambda: NoTriggerStore().submit(trigger(), lambda error: None),
    ):
        with pytest.raises(TriggerSinkError, match="no trigger store") as info:
            call()
        assert info.value.code == "no_trigger_store"
    assert NoTriggerStore().tickers() == set()


def test_trigger_store_settings_default_to_no_store() -> None:
    settings = RelaySettings()
    assert settings.kafka.bootstrap_servers == ""
    assert settings.kafka.topic_cep_triggers == "cep.triggers"


# --- the relay with a directory-backed sink ---------------------------------------------


class DirectorySink:
    """What KafkaTriggerSink does minus Kafka: the directory of what was submitted."""

    def __init__(self) -> None:
        self.directory = TriggerDirectory()

    def submit(self, request: CEPTriggerRequest, stored: Stored) -> None:
        self.directory.apply(request.trigger_id, request)
        stored(None)

    def list(self, client_id: str, now_ms: int) -> list[CEPTriggerRequest]:
        return self.directory.for_client(client_id, now_ms)

    def tickers(self) -> set[str]:
        return self.directory.tickers()

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_list_answers_the_clients_triggers(make_relay: RelayFactory) -> None:
    relay = make_relay(sink=DirectorySink())
    client = relay.client()
    for trigger_id, client_id in (("a", "c1"), ("b", "c1"), ("x", "c2")):
        ack = relay.request(
            client, trigger(trigger_id=trigger_id, client_id=client_id), CEPTriggerAck
        )
        assert ack.status == Status.OK
    cancel = CEPTriggerRequest(trigger_id="a", action=CEPTriggerRequest.CANCEL)
    assert relay.request(client, cancel, CEPTriggerAck).status == Status.OK
    listing = CEPTriggerRequest(action=CEPTriggerRequest.LIST, client_id="c1")
    ack = relay.request(client, listing, CEPTriggerAck)
    assert ack.status == Status.OK
    assert [(t.trigger_id, t.ticker) for t in ack.triggers] == [("b", TICKER)]


def test_without_a_store_every_trigger_request_is_refused(make_relay: RelayFactory) -> None:
    relay = make_relay(sink=NoTriggerStore())
    client = relay.client()
    listing = CEPTriggerRequest(action=CEPTriggerRequest.LIST, client_id="c1")
    cancel = CEPTriggerRequest(trigger_id="t1", action=CEPTriggerRequest.CANCEL)
    for request in (trigger(), cancel, listing):
        ack = relay.request(client, request, CEPTriggerAck)
        assert (ack.status, ack.error_code) == (Status.REJECTED, "no_trigger_store")
        assert "kafka.bootstrap_servers is empty" in ack.reason
    assert relay.sample("relay_trigger_sink_errors_total") == 0  # nothing failed to store


def test_a_triggered_ticker_is_live_until_its_last_trigger_goes(make_relay: RelayFactory) -> None:
    relay = make_relay(
        sink=DirectorySink(),
        realtime_grace_s=0.2,
        realtime_refresh_s=600,
        stats_interval_s=0.05,
    )
    ingestor = relay.ingestor()
    client = relay.client()
    relay.request(client, trigger(trigger_id="a"), CEPTriggerAck)
    topic, start = ingestor.next_work(DataRequest.REALTIME)  # no subscriber: the trigger did it
    assert (topic, start.ticker) == ("BINANCE:", TICKER)
    relay.request(client, trigger(trigger_id="b"), CEPTriggerAck)
    relay.request(
        client, CEPTriggerRequest(trigger_id="a", action=CEPTriggerRequest.CANCEL), CEPTriggerAck
    )
    assert not ingestor.control.poll(400)  # "b" still needs the ticker
    relay.request(
        client, CEPTriggerRequest(trigger_id="b", action=CEPTriggerRequest.CANCEL), CEPTriggerAck
    )
    _, cancel = ingestor.recv_control()
    assert (cancel.action, cancel.ticker) == (IngestorControl.CANCEL_REALTIME, TICKER)
    assert cancel.request_id == start.request_id
