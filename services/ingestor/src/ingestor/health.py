"""Exchange health as this ingestor sees it: the input of the relay's breaker.

Every exchange call that goes through `history.call_with_retry` (candle pages of
history and legacy requests, market loading) and every health probe is
recorded. A transient fault (rate_limited, exchange_unavailable, timeout,
network_error: the error_codes that a retry might cure) counts one failure; any
answer from the exchange, a permanent fault such as bad_symbol included, resets
the count. After `threshold` failures in a row the exchange is unhealthy, with
the last error, until a call succeeds again. Calls are counted, not requests:
with the default retry policy one request takes about a minute to give up, and
the breaker should open within seconds of an outage, not minutes.

Pure: `IngestorStatus` is built from plain state, time passed in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ingestor.model import ExchangeCallError
from mdproto.messages import ExchangeHealth, IngestorStatus

_MAX_REASON = 300  # ccxt reasons carry the URL and the response body; the relay quotes this


@dataclass(slots=True)
class _State:
    failures: int = 0
    error_code: str = ""
    reason: str = ""
    healthy: bool = True
    quiet_until: float = 0.0  # no probe before: the exchange asked to wait (Retry-After, ban)


class HealthBook:
    """Consecutive failed calls per exchange prefix (`BINANCE`)."""

    def __init__(self, exchanges: Iterable[str], threshold: int) -> None:
        self._threshold = threshold
        self._states = {exchange: _State() for exchange in exchanges}

    def record(self, exchange: str, fault: ExchangeCallError | None, now: float = 0.0) -> bool:
        """One call's outcome (None: it succeeded) at `now` (monotonic seconds); True
        when `healthy` flipped."""
        state = self._states.setdefault(exchange, _State())
        was = state.healthy
        if fault is None or not fault.kind.transient:
            state.failures, state.healthy, state.quiet_until = 0, True, 0.0
        else:
            state.failures += 1
            state.error_code, state.reason = fault.kind.value, fault.reason[:_MAX_REASON]
            if fault.retry_after_s is not None:
                state.quiet_until = max(state.quiet_until, now + fault.retry_after_s)
            if state.failures >= self._threshold:
                state.healthy = False
        return state.healthy is not was

    def healthy(self, exchange: str) -> bool:
        return self._states[exchange].healthy

    def to_probe(self, now: float) -> list[str]:
        """Unhealthy exchanges to probe now: they get no client traffic while the relay
        refuses it. Not before a wait the exchange asked for: calls during a rate-limit
        ban make Binance lengthen it."""
        return [e for e, s in self._states.items() if not s.healthy and s.quiet_until <= now]

    def describe(self, exchange: str) -> str:
        s = self._states[exchange]
        return f"{s.failures} failed calls in a row, last {s.error_code}: {s.reason}"

    def status(self, ingestor_id: str, sent_at_ms: int, interval_ms: int) -> IngestorStatus:
        return IngestorStatus(
            ingestor_id=ingestor_id,
            exchanges=[
                ExchangeHealth(
                    exchange=exchange,
                    healthy=s.healthy,
                    consecutive_failures=s.failures,
                    error_code=s.error_code if s.failures else "",
                    reason=s.reason if s.failures else "",
                )
                for exchange, s in sorted(self._states.items())
            ],
            sent_at_ms=sent_at_ms,
            interval_ms=interval_ms,
        )
