"""Validation rules, without sockets."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mdproto import rules
from mdproto.messages import (
    CEPCondition,
    CEPTriggerRequest,
    DataRequest,
    NotifyPattern,
    OHLCRequest,
    Status,
    SubmitHistoricalRequest,
)
from relay import client_requests as v

POLICY = v.Policy.of(["BINANCE", "COINBASE"], max_candles=100_000, max_future_ms=60_000)
NOW = 1_700_000_000_000
HOUR = 3_600_000


def new_id() -> str:
    return "generated-1"


def submit(**fields: Any) -> v.SubmitOutcome:
    values: dict[str, Any] = {
        "request_id": "r1",
        "client_id": "c1",
        "ticker": "BINANCE:BTC/USDT",
        "period_seconds": 60,
        "start_time_ms": NOW - HOUR,
        "end_time_ms": NOW,
    }
    values.update(fields)
    return v.check_submit(SubmitHistoricalRequest(**values), POLICY, NOW, new_id)


def test_valid_submit_is_acknowledged_and_becomes_historical_work() -> None:
    outcome = submit()
    assert outcome.reply.status == Status.OK
    assert outcome.reply.request_id == "r1"
    assert outcome.reply.notification_topic == "RESPONSE:c1"
    assert outcome.work is not None
    assert outcome.work.topic == "BINANCE:"
    work = outcome.work.request
    assert work.kind == DataRequest.HISTORICAL
    assert (work.request_id, work.client_id, work.ticker) == ("r1", "c1", "BINANCE:BTC/USDT")
    assert (work.period_seconds, work.start_time_ms, work.end_time_ms) == (60, NOW - HOUR, NOW)
    assert work.notification_topic == "RESPONSE:c1"
    assert work.submitted_at_ms == NOW
    assert not work.legacy_sync and not work.refetch


def test_refetch_reaches_the_ingestor() -> None:
    outcome = submit(refetch=True)
    assert outcome.work is not None and outcome.work.request.refetch


@pytest.mark.parametrize(("bars", "canonical"), [("100ticks", "100ticks"), ("2.50vol", "2.5vol")])
def test_tick_and_volume_bars_reach_the_ingestor_in_canonical_form(
    bars: str, canonical: str
) -> None:
    outcome = submit(period_seconds=0, bars=bars, start_time_ms=0)  # no candle limit for bars
    assert outcome.reply.status == Status.OK
    assert outcome.work is not None
    assert (outcome.work.request.bars, outcome.work.request.period_seconds) == (canonical, 0)


def test_candles_carry_no_bars() -> None:
    outcome = submit()
    assert outcome.work is not None and outcome.work.request.bars == ""


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"bars": "100ticks"}, rules.BAD_BARS),  # with a period: ambiguous
        ({"period_seconds": 0, "bars": "0ticks"}, rules.BAD_BARS),
        ({"period_seconds": 0, "bars": "1.5ticks"}, rules.BAD_BARS),
        ({"period_seconds": 0, "bars": "0vol"}, rules.BAD_BARS),
        ({"period_seconds": 0, "bars": "1e3vol"}, rules.BAD_BARS),
        ({"period_seconds": 0, "bars": "-5vol"}, rules.BAD_BARS),
        ({"period_seconds": 0, "bars": "100 ticks"}, rules.BAD_BARS),
        ({"period_seconds": 0, "bars": "trade_bar_100ticks"}, rules.BAD_BARS),
        ({"period_seconds": 0, "bars": "1000000001ticks"}, rules.BAD_BARS),
        (
            {"period_seconds": 0, "bars": "100ticks", "end_time_ms": NOW - 2 * HOUR},
            "bad_time_range",
        ),
        ({"period_seconds": 0, "bars": "100ticks", "end_time_ms": NOW + HOUR}, "bad_time_range"),
        ({"period_seconds": 0, "bars": ""}, rules.BAD_PERIOD),
    ],
)
def test_bad_bars_are_rejected_at_once(fields: dict[str, Any], code: str) -> None:
    outcome = submit(**fields)
    assert outcome.reply.status == Status.REJECTED
    assert outcome.reply.error_code == code
    assert outcome.work is None


def test_other_exchange_routes_to_its_prefix() -> None:
    outcome = submit(ticker="COINBASE:ETH/USD")
    assert outcome.work is not None and outcome.work.topic == "COINBASE:"


def test_missing_request_id_is_generated_when_client_id_is_set() -> None:
    outcome = submit(request_id="")
    assert outcome.reply.status == Status.OK
    assert outcome.reply.request_id == "generated-1"
    assert outcome.work is not None and outcome.work.request.request_id == "generated-1"


def test_per_request_topic_without_client_id() -> None:
    outcome = submit(client_id="")
    assert outcome.reply.notification_topic == "HISTORY_READY:r1"
    outcome = submit(notify=NotifyPattern.NOTIFY_PER_REQUEST)
    assert outcome.reply.notification_topic == "HISTORY_READY:r1"


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"request_id": "", "client_id": ""}, rules.MISSING_ID),
        ({"request_id": "has space"}, rules.BAD_ID),
        ({"client_id": "x" * 129}, rules.BAD_ID),
        ({"ticker": "BTC/USDT"}, rules.BAD_TICKER),
        ({"ticker": "binance:BTC/USDT"}, rules.BAD_TICKER),
        ({"ticker": "KRAKEN:BTC/USD"}, rules.UNKNOWN_EXCHANGE),
        ({"period_seconds": 0}, rules.BAD_PERIOD),
        ({"end_time_ms": NOW - HOUR}, rules.BAD_TIME_RANGE),
        ({"start_time_ms": -1}, rules.BAD_TIME_RANGE),
        ({"start_time_ms": 0, "end_time_ms": 0}, rules.BAD_TIME_RANGE),
        ({"end_time_ms": NOW + 61_000}, rules.BAD_TIME_RANGE),
        ({"start_time_ms": 0, "period_seconds": 1}, rules.RANGE_TOO_LARGE),
        ({"client_id": "", "notify": NotifyPattern.NOTIFY_PER_CLIENT}, rules.BAD_NOTIFY),
        ({"notify": 7}, rules.BAD_NOTIFY),
    ],
)
def test_invalid_submit_is_rejected_with_a_code(fields: dict[str, Any], code: str) -> None:
    outcome = submit(**fields)
    assert outcome.work is None
    assert outcome.reply.status == Status.REJECTED
    assert outcome.reply.error_code == code
    assert outcome.reply.reason


def test_rejection_echoes_the_request_id() -> None:
    assert submit(period_seconds=0).reply.request_id == "r1"


@given(
    request_id=st.text(max_size=5),
    client_id=st.text(max_size=5),
    ticker=st.sampled_from(["BINANCE:BTC/USDT", "", "X", "KRAKEN:A/B", "BINANCE:ÄÖ/B"]),
    period=st.integers(0, 2**32 - 1),
    start=st.integers(-(2**63), 2**63 - 1),
    end=st.integers(-(2**63), 2**63 - 1),
    notify=st.integers(0, 2**31 - 1),
)
def test_submit_never_raises_and_ok_implies_work(
    request_id: str, client_id: str, ticker: str, period: int, start: int, end: int, notify: int
) -> None:
    req = SubmitHistoricalRequest(
        request_id=request_id,
        client_id=client_id,
        ticker=ticker,
        period_seconds=period,
        start_time_ms=start,
        end_time_ms=end,
        notify=notify,  # type: ignore[arg-type]
    )
    outcome = v.check_submit(req, POLICY, NOW, new_id)
    assert (outcome.reply.status == Status.OK) == (outcome.work is not None)
    if outcome.work is not None:
        assert outcome.work.request.end_time_ms > outcome.work.request.start_time_ms >= 0
        assert outcome.reply.notification_topic == outcome.work.request.notification_topic
    else:
        assert outcome.reply.error_code


def test_legacy_request_becomes_sync_work_with_limit() -> None:
    req = OHLCRequest(
        ticker="BINANCE:BTC/USDT", period_seconds=60, start_time_ms=0, end_time_ms=HOUR, limit=5
    )
    work = v.check_legacy(req, POLICY, NOW, new_id)
    assert isinstance(work, v.Work)
    assert work.topic == "BINANCE:"
    assert work.request.legacy_sync
    assert work.request.limit == 5
    assert work.request.request_id == "generated-1"  # the client waits: any id will do
    assert work.request.notification_topic == ""


def test_invalid_legacy_request_is_a_rejection() -> None:
    req = OHLCRequest(request_id="r", ticker="KRAKEN:BTC/USD", period_seconds=60, end_time_ms=1)
    rejection = v.check_legacy(req, POLICY, NOW, new_id)
    assert isinstance(rejection, v.Rejection)
    assert rejection.error_code == rules.UNKNOWN_EXCHANGE


def trigger(**fields: Any) -> v.TriggerOutcome:
    values: dict[str, Any] = {
        "trigger_id": "t1",
        "client_id": "c1",
        "action": CEPTriggerRequest.REGISTER,
        "ticker": "BINANCE:BTC/USDT",
        "conditions": [CEPCondition(kind=CEPCondition.PRICE_ABOVE, threshold=100.0)],
    }
    values.update(fields)
    return v.check_trigger(CEPTriggerRequest(**values), POLICY, NOW)


def test_valid_trigger_is_acknowledged_with_its_event_topic() -> None:
    outcome = trigger()
    assert outcome.accepted
    assert outcome.reply.status == Status.OK
    assert outcome.reply.trigger_id == "t1"
    assert outcome.reply.event_topic == "RESPONSE:c1"
    assert trigger(client_id="").reply.event_topic == "CEP:t1"
    assert trigger(notify=NotifyPattern.NOTIFY_PER_REQUEST).reply.event_topic == "CEP:t1"


def test_sequence_of_two_windowed_conditions() -> None:
    conditions = [
        CEPCondition(kind=CEPCondition.PCT_MOVE, threshold=2.0, window_seconds=60),
        CEPCondition(kind=CEPCondition.VOLUME_OVER, threshold=10.0, window_seconds=60),
    ]
    assert trigger(conditions=conditions, within_seconds=300).accepted
    assert trigger(conditions=conditions).reply.error_code == rules.BAD_CONDITION


def test_cancel_needs_only_the_trigger_id() -> None:
    outcome = trigger(action=CEPTriggerRequest.CANCEL, ticker="", conditions=[])
    assert outcome.accepted
    assert outcome.reply.event_topic == ""


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"trigger_id": ""}, rules.MISSING_ID),
        ({"trigger_id": "a/b"}, rules.BAD_ID),
        ({"action": CEPTriggerRequest.ACTION_UNSPECIFIED}, rules.BAD_ACTION),
        ({"ticker": "nope"}, rules.BAD_TICKER),
        ({"ticker": "KRAKEN:BTC/USD"}, rules.UNKNOWN_EXCHANGE),
        ({"conditions": []}, rules.BAD_CONDITION),
        ({"conditions": [CEPCondition(kind=CEPCondition.KIND_UNSPECIFIED, threshold=1)]}, None),
        (
            {"conditions": [CEPCondition(kind=CEPCondition.PRICE_BELOW, threshold=float("nan"))]},
            None,
        ),
        ({"conditions": [CEPCondition(kind=CEPCondition.PCT_MOVE, threshold=1.0)]}, None),
        ({"expires_at_ms": NOW - 1}, rules.EXPIRED),
        ({"client_id": "", "notify": NotifyPattern.NOTIFY_PER_CLIENT}, rules.BAD_NOTIFY),
        ({"action": CEPTriggerRequest.CANCEL, "ticker": "KRAKEN:X/Y"}, rules.UNKNOWN_EXCHANGE),
    ],
)
def test_invalid_trigger_is_rejected(fields: dict[str, Any], code: str | None) -> None:
    outcome = trigger(**fields)
    assert not outcome.accepted
    assert outcome.reply.status == Status.REJECTED
    assert outcome.reply.error_code == (code or rules.BAD_CONDITION)
    assert outcome.reply.reason
