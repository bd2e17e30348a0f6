"""Retry policy: a pure function of (fault kind, attempt) -> wait or give up.

Transient faults (rate limits, 503s, timeouts, disconnects) are retried with
capped exponential backoff; a wait the exchange asked for (Retry-After, ban
end) is honoured when it is longer. Permanent faults (bad symbol, bad
request, other exchange errors) are never retried: repeating them only burns
rate-limit weight.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

from ingestor.model import FaultKind


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 8  # attempts in total, the first one included
    base_delay_s: float = 0.5
    max_delay_s: float = 30.0
    max_retry_after_s: float = 300.0  # a longer ban fails the request instead of hanging it
    jitter: float = 0.2  # +/- fraction applied to the backoff delay


@dataclass(frozen=True, slots=True)
class Retry:
    delay_s: float


@dataclass(frozen=True, slots=True)
class GiveUp:
    reason: str


def backoff_delay(attempt: int, policy: RetryPolicy, rand: float = 0.5) -> float:
    """Delay after the `attempt`-th failure (1-based): base * 2^(attempt-1), jittered, capped.

    `rand` in [0, 1) is injected so the function stays pure; 0.5 means no jitter.
    """
    exponent = min(max(attempt - 1, 0), 62)
    raw = policy.base_delay_s * (2.0**exponent)
    jittered = raw * (1.0 + policy.jitter * (2.0 * rand - 1.0))
    return max(0.0, min(policy.max_delay_s, jittered))


def decide(
    kind: FaultKind,
    attempt: int,
    policy: RetryPolicy,
    retry_after_s: float | None = None,
    rand: float = 0.5,
) -> Retry | GiveUp:
    """What to do after the `attempt`-th consecutive failure of one call."""
    if not kind.transient:
        return GiveUp(f"{kind.value} is permanent")
    if attempt >= policy.max_attempts:
        return GiveUp(f"gave up after {attempt} attempts")
    if retry_after_s is not None and retry_after_s > policy.max_retry_after_s:
        limit = policy.max_retry_after_s
        return GiveUp(f"exchange asked to wait {retry_after_s:.0f} s, more than {limit:.0f} s")
    delay = backoff_delay(attempt, policy, rand)
    if retry_after_s is not None:
        delay = max(delay, retry_after_s)
    return Retry(delay)


_BANNED_UNTIL = re.compile(r"banned until (\d{12,})")


def retry_after_from(
    headers: Mapping[str, str] | None, body: str | None, now_ms: int
) -> float | None:
    """Seconds the exchange asked us to wait, from Retry-After or a ban message.

    Retry-After may be delta-seconds or an HTTP date; Binance's 418 body says
    "IP banned until <epoch ms>". None when the exchange said nothing usable.
    """
    candidates: list[float] = []
    value = None
    for name, header in (headers or {}).items():
        if name.lower() == "retry-after":
            value = header.strip()
    if value:
        try:
            candidates.append(max(0.0, float(value)))
        except ValueError:
            try:
                when = parsedate_to_datetime(value)
                candidates.append(max(0.0, when.timestamp() - now_ms / 1000.0))
            except (TypeError, ValueError, IndexError):
                pass
    if body:
        match = _BANNED_UNTIL.search(body)
        if match:
            candidates.append(max(0.0, (int(match.group(1)) - now_ms) / 1000.0))
    return max(candidates) if candidates else None
