"""Historical requests: exchange calls (retried, counted for health), pages, Kafka write.

`plan_request` checks and plans a request (candles.py); `run_history_job` skips
what storage holds (coverage.py), pages the rest through `call_with_retry`, whose
every outcome feeds the `HealthBook` (the relay breaker's input, via
`FetchEnv.observe`; market loads and probes feed it too), and writes the records,
the final marker once all are delivered. Exchange and Kafka producer are injected
(`CandleSource`, `RecordSink`: fakes in tests, `exchanges.ExchangeAdapter` and
`kafka_sink.KafkaSink` in production); `HealthBook` is pure, time passed in.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from ingestor.candles import (
    Answer,
    BatchBuilder,
    ExchangeGaps,
    FetchPlan,
    PagingStalledError,
    UnsupportedPeriodError,
    accept_page,
    candle_slots,
    metadata_for,
    next_since,
    plan_fetch,
    split_plan,
    timeframe_for,
)
from ingestor.coverage import NO_COVERAGE, CoverageSource, fetch_plans
from ingestor.model import Candle, ExchangeCallError, FaultKind
from ingestor.retry import GiveUp, RetryPolicy, decide
from ingestor.venues import GENERIC, HistoryUnavailableError, Venue
from mdproto import rules
from mdproto.error_codes import (
    HISTORY_UNAVAILABLE,
    INTERNAL,
    INVALID_REQUEST,
    KAFKA_DELIVERY,
    UNSUPPORTED_PERIOD,
)
from mdproto.messages import DataRequest, ExchangeHealth, IngestorStatus, OHLCBatch, Status

log = logging.getLogger(__name__)
T = TypeVar("T")


class CandleSource(Protocol):
    def timeframes(self) -> list[str]: ...

    async def fetch_candles(
        self, symbol: str, timeframe: str, since_ms: int, until_ms: int, limit: int
    ) -> list[Candle]: ...


class RecordSink(Protocol):
    async def send_batch(self, key: str, record: OHLCBatch) -> Awaitable[object]:
        """Queue a record; the returned awaitable completes on delivery or raises."""
        ...


class ClaimLostError(Exception):
    """Another ingestor's claim won while this one was already planning or fetching."""


class RequestFailedError(Exception):
    """A request that cannot complete; becomes an ERROR marker / response."""

    def __init__(self, error_code: str, reason: str) -> None:
        super().__init__(f"{error_code}: {reason}")
        self.error_code = error_code
        self.reason = reason


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


def _unobserved(fault: ExchangeCallError | None) -> None:
    return None


@dataclass(frozen=True)
class FetchEnv:
    """How to page one exchange, and the clock, sleep and randomness the loop uses.

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


@dataclass(frozen=True, slots=True)
class JobOutcome:
    request_id: str
    status: int
    rows: int
    batches: int
    expected_gaps: int
    error_code: str = ""
    reason: str = ""
    delivered: bool = True  # the final marker reached Kafka
    claimed: bool = True  # False: another ingestor won the claim; nothing was written
    stages: str = ""  # where the time went ("coverage 12 ms, first page 30 ms, ..."), for the log


class StageClock:
    """Milliseconds between the named points of one request, for its log line."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._start = clock()
        self._marks: list[tuple[str, float]] = []

    def mark(self, name: str) -> None:
        self._marks.append((name, self._clock()))

    def __str__(self) -> str:
        return ", ".join(f"{name} {(at - self._start) * 1000:.0f} ms" for name, at in self._marks)


def plan_request(
    request: DataRequest, source: CandleSource, env: FetchEnv
) -> tuple[str, FetchPlan]:
    """(ccxt symbol, plan) for a request, or RequestFailedError for bad parameters."""
    try:
        symbol = rules.ticker(request.ticker).symbol
        rules.history_range(request.period_seconds, request.start_time_ms, request.end_time_ms)
    except rules.RuleViolation as bad:
        raise RequestFailedError(INVALID_REQUEST, bad.reason) from None
    try:
        timeframe = timeframe_for(request.period_seconds, source.timeframes())
    except UnsupportedPeriodError as exc:
        raise RequestFailedError(UNSUPPORTED_PERIOD, str(exc)) from None
    now = env.now_ms()
    try:
        env.venue.check_history(request.start_time_ms, now, request.period_seconds * 1000)
    except HistoryUnavailableError as exc:
        raise RequestFailedError(HISTORY_UNAVAILABLE, str(exc)) from None
    plan = plan_fetch(
        request.start_time_ms,
        request.end_time_ms,
        request.period_seconds,
        timeframe,
        now,
        env.page_limit,
        env.bounded_pages,
    )
    return symbol, plan


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


async def iter_answers(
    source: CandleSource, symbol: str, plan: FetchPlan, env: FetchEnv
) -> AsyncIterator[Answer]:
    """Every page's answer in order, empty ones too (the integrity report weighs them)."""
    since: int | None = None if plan.empty else plan.start_ms
    after: int | None = None
    while since is not None:
        page_since = since

        async def fetch(page_since: int = page_since) -> list[Candle]:
            return await source.fetch_candles(
                symbol, plan.timeframe, page_since, plan.page_until(page_since), plan.page_limit
            )

        page = await call_with_retry(fetch, env, f"{symbol} {plan.timeframe} page at {since}")
        accepted = accept_page(plan, page, after)
        if accepted:
            after = accepted[-1].open_time_ms
        yield Answer(plan, since, page, accepted)
        try:
            since = next_since(plan, page, since)
        except PagingStalledError as exc:
            raise RequestFailedError(FaultKind.EXCHANGE_ERROR.value, str(exc)) from None


async def iter_pages(
    source: CandleSource, symbol: str, plan: FetchPlan, env: FetchEnv
) -> AsyncIterator[list[Candle]]:
    """Accepted candles page by page, ascending, unique, closed, inside the range."""
    async for answer in iter_answers(source, symbol, plan, env):
        if answer.accepted:
            yield answer.accepted


async def _proceed() -> None:
    return None


async def iter_answers_concurrently(
    source: CandleSource,
    symbol: str,
    plan: FetchPlan,
    env: FetchEnv,
    before_more: Callable[[], Awaitable[None]] = _proceed,
) -> AsyncIterator[Answer]:
    """`iter_answers`, with up to `env.page_concurrency` windows of the plan fetched at once.

    Answers still come out in range order (a window's pages are held until the
    windows before it are out), so the records, the first candle and a
    failure's cut-off are those of the one-by-one loop; a failure cancels the
    windows still in flight. ccxt's throttle (`enableRateLimit`) queues the
    calls, so concurrency never exceeds the exchange's rate limit.
    `before_more` is awaited before any window after the first is requested
    (the claim verdict: an ingestor that loses it has asked for one page).
    """
    windows = split_plan(plan)
    if env.page_concurrency <= 1 or len(windows) == 1:
        async for answer in iter_answers(source, symbol, plan, env):
            yield answer
        return
    first = asyncio.create_task(collect_window(source, symbol, windows[0], env))
    try:
        await before_more()
    except BaseException:
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        raise

    left = deque(windows[1:])
    in_flight: deque[asyncio.Task[list[Answer]]] = deque([first])

    def launch() -> None:
        while left and len(in_flight) < env.page_concurrency:
            window = left.popleft()
            in_flight.append(asyncio.create_task(collect_window(source, symbol, window, env)))

    try:
        launch()
        while in_flight:
            answers = await in_flight.popleft()
            launch()
            for answer in answers:
                yield answer
    finally:
        for task in in_flight:
            task.cancel()
        await asyncio.gather(*in_flight, return_exceptions=True)


async def collect_window(
    source: CandleSource, symbol: str, window: FetchPlan, env: FetchEnv
) -> list[Answer]:
    return [answer async for answer in iter_answers(source, symbol, window, env)]


async def _settle(deliveries: list[Awaitable[object]]) -> str | None:
    """Wait for every delivery; the first error message, or None if all arrived."""
    results = await asyncio.gather(*deliveries, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            return str(result) or type(result).__name__
    return None


async def _send_final(sink: RecordSink, key: str, final: OHLCBatch) -> bool:
    try:
        delivery = await sink.send_batch(key, final)
        await delivery
    except Exception as exc:
        meta = final.metadata
        log.error(
            "request %s: final marker (%s) not delivered: %s",
            meta.request_id,
            Status.Name(meta.status),
            exc,
        )
        return False
    return True


async def write_error_marker(
    request: DataRequest, sink: RecordSink, *, ingestor_id: str, error_code: str, reason: str
) -> bool:
    """A lone ERROR final marker for a request that will not be fetched; True if delivered."""
    final = BatchBuilder(metadata_for(request, ingestor_id), 1).fail(reason, error_code)
    return await _send_final(sink, request.ticker, final)


async def run_history_job(
    request: DataRequest,
    source: CandleSource,
    sink: RecordSink,
    *,
    ingestor_id: str,
    batch_size: int,
    env: FetchEnv,
    stored: CoverageSource = NO_COVERAGE,
    claim: Awaitable[bool] | None = None,
) -> JobOutcome:
    """Fetch [start, end) and write the request's OHLCBatch records, ending with a final marker.

    What `stored` holds complete is not fetched again (unless the request says
    `refetch`): the marker says where the answer came from, and the pipeline
    counts the rows in Iceberg.

    `claim` (this ingestor's claim verdict, still being decided) is awaited
    before the first record is written: the coverage read and the first pages
    overlap the claim, and a lost claim writes nothing (`claimed=False`).

    The final marker is only sent once every data record has been delivered;
    a delivery failure turns it into an ERROR marker (code kafka_delivery).
    """
    clock = StageClock()
    builder = BatchBuilder(metadata_for(request, ingestor_id), batch_size)
    key = request.ticker
    deliveries: list[Awaitable[object]] = []

    claim_won = False

    async def admitted() -> None:
        nonlocal claim_won
        if claim is None or claim_won:
            return
        if not await claim:
            raise ClaimLostError
        claim_won = True
        clock.mark("claim won")

    async def send(record: OHLCBatch) -> Awaitable[object]:
        await admitted()
        return await sink.send_batch(key, record)

    final: OHLCBatch
    plan: FetchPlan | None = None
    first_open: int | None = None
    weighed = ExchangeGaps()

    def slots() -> int:  # the integrity report's denominator, also for a failed fetch
        return 0 if plan is None else candle_slots(plan, first_open)

    def gaps(complete: bool = False) -> int:  # what the answers so far say had no trades
        return weighed.count(first_open, complete)

    try:
        symbol, plan = plan_request(request, source, env)
        skip_storage = request.refetch or plan.empty
        held = [] if skip_storage else await stored.stored(request.ticker, request.period_seconds)
        clock.mark("coverage")
        parts, origin = fetch_plans(plan, held)
        builder.set_source(origin)
        for part in parts:  # the whole plan, or the pieces storage does not hold
            async for answer in iter_answers_concurrently(source, symbol, part, env, admitted):
                weighed.add(answer)
                page = answer.accepted
                if not page:
                    continue
                if first_open is None:
                    first_open = page[0].open_time_ms
                    clock.mark("first page")
                for record in builder.add(page):
                    deliveries.append(await send(record))
        for record in builder.flush():
            deliveries.append(await send(record))
        clock.mark("last page")
        failure = await _settle(deliveries)
        clock.mark("rows delivered")
        if failure is None:
            final = builder.final(gaps(complete=True), slots())
        else:
            reason = f"Kafka delivery failed: {failure}"
            final = builder.fail(reason, KAFKA_DELIVERY, gaps(complete=True), slots())
    except ClaimLostError:
        return JobOutcome(request.request_id, Status.ERROR, 0, 0, 0, delivered=False, claimed=False)
    except RequestFailedError as exc:
        await _settle(deliveries)
        final = builder.fail(exc.reason, exc.error_code, gaps(), slots())
    except Exception as exc:
        log.exception("request %s failed unexpectedly", request.request_id)
        await _settle(deliveries)
        reason = f"internal error: {type(exc).__name__}: {exc}"
        final = builder.fail(reason, INTERNAL, gaps(), slots())

    try:
        await admitted()  # nothing written yet without it (no rows, or a failure)
    except ClaimLostError:
        return JobOutcome(request.request_id, Status.ERROR, 0, 0, 0, delivered=False, claimed=False)
    delivered = await _send_final(sink, key, final)
    clock.mark("final delivered")
    if not delivered and final.metadata.status != Status.ERROR:
        # The rows arrived but the marker did not: try to tell the pipeline it failed.
        reason = "Kafka delivery of the final marker failed"
        final = builder.fail(reason, KAFKA_DELIVERY, final.metadata.expected_gaps, slots())
        delivered = await _send_final(sink, key, final)
    meta = final.metadata
    return JobOutcome(
        request_id=request.request_id,
        status=meta.status,
        rows=meta.total_rows,
        batches=meta.total_batches,
        expected_gaps=meta.expected_gaps,
        error_code=meta.error_code,
        reason=meta.reason,
        delivered=delivered,
        stages=str(clock),
    )
