"""Every REST call to an exchange goes through `call_with_retry`: transient faults
are retried per `retry.decide`, and each attempt's outcome is handed to
`FetchEnv.observe`, which feeds the exchange's health (health.py, the input of
the relay's breaker). Candle pages (pages.py) and market loads (markets.py) use it.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from ingestor.clock import wall_clock_ms
from ingestor.errors import RequestFailedError
from ingestor.model import ExchangeCallError
from ingestor.retry import GiveUp, RetryPolicy, decide
from ingestor.venues import GENERIC, Venue

log = logging.getLogger(__name__)
T = TypeVar("T")


def _unobserved(fault: ExchangeCallError | None) -> None:
    return None


@dataclass(frozen=True)
class FetchEnv:
    """How to call and page one exchange, and the clock, sleep and randomness used.

    `page_limit` and `bounded_pages` are the adapter's effective values (the
    venue's paging unless configured otherwise); `venue` supplies the rest of
    the exchange's limits (its history window). `page_concurrency` pages of
    one request are requested at once (ccxt's throttle still spaces the calls
    by the exchange's rate limit). `observe` sees every exchange call's
    outcome (None: success), for the `HealthBook`.
    """

    policy: RetryPolicy = field(default_factory=RetryPolicy)
    page_limit: int = 1000
    bounded_pages: bool = False
    page_concurrency: int = 1
    venue: Venue = GENERIC
    now_ms: Callable[[], int] = wall_clock_ms
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    rand: Callable[[], float] = random.random
    observe: Callable[[ExchangeCallError | None], None] = _unobserved


async def call_with_retry(call: Callable[[], Awaitable[T]], env: FetchEnv, what: str) -> T:
    """Run `call`, retrying transient faults per the policy; RequestFailedError otherwise."""
    attempt = 0
    while True:
        try:
            result = await call()
        except ExchangeCallError as fault:
            env.observe(fault)
            attempt += 1
            decision = decide(fault.kind, attempt, env.policy, fault.retry_after_s, env.rand())
            if isinstance(decision, GiveUp):
                raise RequestFailedError(fault.kind.value, fault.reason) from fault
            log.warning(
                "%s failed (%s, attempt %d); retrying in %.2f s",
                what,
                fault,
                attempt,
                decision.delay_s,
            )
            await env.sleep(decision.delay_s)
        else:
            env.observe(None)
            return result
