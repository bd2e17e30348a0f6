"""The request rules where the relay, client and pipeline copies used to disagree."""

from __future__ import annotations

import pytest

from mdproto import rules
from mdproto.messages import CEPCondition, CEPTriggerRequest, NotifyPattern

ABOVE, PCT = CEPCondition.PRICE_ABOVE, CEPCondition.PCT_MOVE


def register(**fields: object) -> CEPTriggerRequest:
    values: dict[str, object] = {
        "trigger_id": "t1",
        "client_id": "c1",
        "action": CEPTriggerRequest.REGISTER,
        "ticker": "BINANCE:BTC/USDT",
        "conditions": [CEPCondition(kind=ABOVE, threshold=100.0)],
    }
    values.update(fields)
    return CEPTriggerRequest(**values)  # type: ignore[arg-type]


def test_a_valid_register_gives_its_event_topic() -> None:
    assert rules.register(register()) == "RESPONSE:c1"
    assert rules.register(register(notify=NotifyPattern.NOTIFY_PER_REQUEST)) == "CEP:t1"


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"conditions": [CEPCondition(kind=ABOVE, threshold=1)] * 2}, rules.BAD_CONDITION),
        (
            {"conditions": [CEPCondition(kind=ABOVE, threshold=1, window_seconds=60)]},
            "bad_condition",
        ),
        ({"conditions": [CEPCondition(kind=PCT, threshold=1)]}, rules.BAD_CONDITION),
        ({"expires_at_ms": -1}, rules.EXPIRED),
        ({"notify": 9}, rules.BAD_NOTIFY),
    ],
)
def test_the_strict_rule_holds(fields: dict[str, object], code: str) -> None:
    with pytest.raises(rules.RuleViolation) as info:
        rules.register(register(**fields))
    assert info.value.error_code == code and info.value.reason


def test_expiry_against_the_clock_only_when_given_one() -> None:
    request = register(expires_at_ms=1_000)
    assert rules.register(request) == "RESPONSE:c1"
    with pytest.raises(rules.RuleViolation, match="in the past"):
        rules.register(request, now_ms=1_000)


@pytest.mark.parametrize(
    ("period", "start", "end", "code"),
    [(0, 0, 1, rules.BAD_PERIOD), (-60, 0, 1, rules.BAD_PERIOD), (60, -1, 1, rules.BAD_TIME_RANGE),
     (60, 5, 5, rules.BAD_TIME_RANGE)],
)  # fmt: skip
def test_history_ranges(period: int, start: int, end: int, code: str) -> None:
    with pytest.raises(rules.RuleViolation) as info:
        rules.history_range(period, start, end)
    assert info.value.error_code == code
    rules.history_range(60, 0, 60_000)
