"""Retry policy: pure decisions from fault kind and attempt."""

from __future__ import annotations

import pytest

from ingestor.model import FaultKind
from ingestor.retry import GiveUp, Retry, RetryPolicy, backoff_delay, decide, retry_after_from

POLICY = RetryPolicy(max_attempts=5, base_delay_s=0.5, max_delay_s=4.0, max_retry_after_s=60)


def test_backoff_doubles_and_caps() -> None:
    assert [backoff_delay(a, POLICY) for a in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_backoff_jitter_stays_within_bounds() -> None:
    policy = RetryPolicy(base_delay_s=1.0, max_delay_s=100, jitter=0.2)
    assert backoff_delay(1, policy, 0.0) == pytest.approx(0.8)
    assert backoff_delay(1, policy, 0.999999) == pytest.approx(1.2, rel=1e-5)


def test_huge_attempt_numbers_do_not_overflow() -> None:
    assert backoff_delay(10_000, POLICY) == 4.0


@pytest.mark.parametrize(
    "kind",
    [FaultKind.RATE_LIMITED, FaultKind.UNAVAILABLE, FaultKind.TIMEOUT, FaultKind.NETWORK],
)
def test_transient_faults_are_retried_until_the_attempt_budget(kind: FaultKind) -> None:
    assert decide(kind, 1, POLICY) == Retry(0.5)
    assert decide(kind, 4, POLICY) == Retry(4.0)
    assert isinstance(decide(kind, 5, POLICY), GiveUp)


@pytest.mark.parametrize(
    "kind",
    [
        FaultKind.BAD_SYMBOL,
        FaultKind.BAD_REQUEST,
        FaultKind.NOT_SUPPORTED,
        FaultKind.EXCHANGE_ERROR,
    ],
)
def test_permanent_faults_fail_fast(kind: FaultKind) -> None:
    decision = decide(kind, 1, POLICY)
    assert isinstance(decision, GiveUp)
    assert "permanent" in decision.reason


def test_retry_after_is_honoured_when_longer_than_backoff() -> None:
    assert decide(FaultKind.RATE_LIMITED, 1, POLICY, retry_after_s=7.0) == Retry(7.0)
    assert decide(FaultKind.RATE_LIMITED, 4, POLICY, retry_after_s=1.0) == Retry(4.0)


def test_a_ban_longer_than_the_limit_gives_up() -> None:
    decision = decide(FaultKind.RATE_LIMITED, 1, POLICY, retry_after_s=3600)
    assert isinstance(decision, GiveUp)
    assert "3600" in decision.reason


def test_retry_after_header_seconds_and_date() -> None:
    now = 1_700_000_000_000
    assert retry_after_from({"Retry-After": "3"}, None, now) == 3.0
    assert retry_after_from({"retry-after": "Tue, 14 Nov 2023 22:13:30 GMT"}, None, now) == 10.0
    assert retry_after_from({"Retry-After": "soon"}, None, now) is None
    assert retry_after_from({}, "", now) is None


def test_binance_ban_message_gives_the_wait() -> None:
    now = 1_700_000_000_000
    body = f'{{"code":-1003,"msg":"Way too many requests; IP banned until {now + 42_000}."}}'
    assert retry_after_from(None, body, now) == 42.0
    assert retry_after_from({"Retry-After": "60"}, body, now) == 60.0  # the longer one wins
