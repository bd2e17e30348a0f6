"""Exchange health, the input of the relay's circuit breaker (docs/protocol.md,
"Ingestor liveness").

`HealthBook` (pure, time passed in) counts each exchange's failed calls in a
row; `HealthMonitor` feeds it from every exchange call (`observe`, through
`exchange_calls.FetchEnv`), sends it to the relay as `IngestorStatus` every
interval and at once on a change, and probes what is unhealthy: the relay
refuses an unhealthy exchange's requests, so no client traffic would show that
it recovered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import Protocol

from ingestor.clock import wall_clock_ms
from ingestor.model import ExchangeCallError
from mdproto.messages import ExchangeHealth, IngestorStatus

log = logging.getLogger(__name__)

_MAX_REASON = 300  # ccxt reasons carry the URL and the response body; the relay quotes this


@dataclass(slots=True)
class _State:
    failures: int = 0
    error_code: str = ""
    reason: str = ""
    healthy: bool = True
    quiet_until: float = 0.0  # no probe before: the exchange asked to wait (Retry-After, ban)


class HealthBook:
    """Exchange health as this ingestor sees it: failed calls in a row per prefix (`BINANCE`).

    Every exchange call that goes through `call_with_retry` (candle pages of
    history and legacy requests, market loading) and every health probe is
    recorded. A transient fault (rate_limited, exchange_unavailable, timeout,
    network_error: the error_codes that a retry might cure) counts one failure; any
    answer from the exchange, a permanent fault such as bad_symbol included, resets
    the count. After `threshold` failures in a row the exchange is unhealthy, with
    the last error, until a call succeeds again. Calls are counted, not requests:
    with the default retry policy one request takes about a minute to give up, and
    the breaker should open within seconds of an outage, not minutes.
    """

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

    def status(
        self, ingestor_id: str, sent_at_ms: int, interval_ms: int, kafka_error: str = ""
    ) -> IngestorStatus:
        return IngestorStatus(
            kafka_error=kafka_error,
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


class Probed(Protocol):
    """An exchange (`exchanges.ExchangeAdapter`) or Kafka (`kafka_sink.KafkaSink`):
    one cheap call that shows whether it answers."""

    async def probe(self) -> None: ...


class KafkaState(Probed, Protocol):
    @property
    def problem(self) -> str | None:
        """Why Kafka takes no records, None while it does."""
        ...


class StatusSender(Protocol):
    """The DEALER to the relays (`work.LegacyResponder`)."""

    async def send(self, message: IngestorStatus, timeout_s: float = ...) -> bool: ...


class HealthMonitor:
    """Keeps `book` current, tells the relay, and probes what is unhealthy.

    `exchanges` maps a prefix (`BINANCE`) to what probes it.
    """

    def __init__(
        self,
        book: HealthBook,
        exchanges: Mapping[str, Probed],
        *,
        ingestor_id: str,
        status_interval_ms: int,
        probe_interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.book = book
        self._exchanges = exchanges
        self._ingestor_id = ingestor_id
        self._interval_ms = status_interval_ms
        self._probe_interval_s = probe_interval_s
        self._clock = clock
        self._changed = asyncio.Event()

    def changed(self) -> None:
        """Health changed (an exchange's, or Kafka's): the relay hears it now, not at the
        next interval."""
        self._changed.set()

    def observe(self, exchange: str, fault: ExchangeCallError | None) -> None:
        """One exchange call's outcome (None: it succeeded)."""
        if not self.book.record(exchange, fault, self._clock()):
            return
        if self.book.healthy(exchange):
            log.info("exchange %s answers again: healthy", exchange)
        else:
            log.warning("exchange %s unhealthy: %s", exchange, self.book.describe(exchange))
        self.changed()

    async def report(self, relay: StatusSender, kafka: KafkaState) -> None:
        """IngestorStatus every `status_interval_ms`, and at once when health changes."""
        interval_ms = self._interval_ms
        while True:
            self._changed.clear()
            status = self.book.status(
                self._ingestor_id, wall_clock_ms(), interval_ms, kafka_error=kafka.problem or ""
            )
            await relay.send(status, timeout_s=interval_ms / 1000)
            with suppress(TimeoutError):
                async with asyncio.timeout(interval_ms / 1000):
                    await self._changed.wait()

    async def probe_unhealthy(self, kafka: KafkaState) -> None:
        """Probe unhealthy exchanges, and Kafka when it took no record."""
        while True:
            await asyncio.sleep(self._probe_interval_s)
            probes = [self._probe(e) for e in self.book.to_probe(self._clock())]
            if kafka.problem is not None:
                probes.append(kafka.probe())
            await asyncio.gather(*probes)

    async def _probe(self, exchange: str) -> None:
        try:
            await self._exchanges[exchange].probe()
        except ExchangeCallError as fault:
            log.info("probe of %s failed: %s", exchange, fault)
            self.observe(exchange, fault)
        else:
            self.observe(exchange, None)
