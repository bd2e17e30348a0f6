"""A request's candles from the exchange, page by page: the loop that runs
candles.py's paging decisions, each page a `call_with_retry` (exchange_calls.py).

`plan_request` checks and plans a request; `iter_answers` pages one plan in
order, `iter_answers_concurrently` several windows of it at once. Both flows
use it: history.py writes the pages to Kafka, legacy.py answers them inline.
The exchange is injected (`CandleSource`: fakes in tests,
`exchanges.ExchangeAdapter` in production).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

from ingestor.candles import (
    Answer,
    FetchPlan,
    PagingStalledError,
    UnsupportedPeriodError,
    accept_page,
    next_since,
    plan_fetch,
    split_plan,
    timeframe_for,
)
from ingestor.errors import PeriodNotServedError, RequestFailedError
from ingestor.exchange_calls import FetchEnv, call_with_retry
from ingestor.model import Candle, FaultKind
from ingestor.venues import HistoryUnavailableError
from mdproto import rules
from mdproto.error_codes import HISTORY_UNAVAILABLE, INVALID_REQUEST, UNSUPPORTED_PERIOD
from mdproto.messages import DataRequest


class CandleSource(Protocol):
    def timeframes(self) -> list[str]: ...

    async def fetch_candles(
        self, symbol: str, timeframe: str, since_ms: int, until_ms: int, limit: int
    ) -> list[Candle]: ...


def plan_request(
    request: DataRequest, source: CandleSource | None, env: FetchEnv
) -> tuple[str, FetchPlan]:
    """(ccxt symbol, plan) for a request, or RequestFailedError for bad parameters.

    `source` None: no exchange of this ingestor serves the ticker's prefix.
    """
    try:
        parsed = rules.ticker(request.ticker)
        rules.history_range(request.period_seconds, request.start_time_ms, request.end_time_ms)
    except rules.RuleViolation as bad:
        raise RequestFailedError(INVALID_REQUEST, bad.reason) from None
    if source is None:
        reason = f"this ingestor serves no exchange with the prefix {parsed.exchange}"
        raise RequestFailedError(INVALID_REQUEST, reason)
    try:
        timeframe = timeframe_for(request.period_seconds, source.timeframes())
    except UnsupportedPeriodError as exc:
        raise PeriodNotServedError(UNSUPPORTED_PERIOD, str(exc)) from None
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
    return parsed.symbol, plan


def check_bars_request(request: DataRequest, source: CandleSource | None) -> None:
    """A tick or volume bar request's rules (RequestFailedError): the pipeline builds
    its bars from recorded trades, the exchange is not asked (docs/adr/0015)."""
    try:
        parsed = rules.ticker(request.ticker)
        rules.history_bars(request.bars, request.period_seconds)
        rules.time_range(request.start_time_ms, request.end_time_ms)
    except rules.RuleViolation as bad:
        raise RequestFailedError(INVALID_REQUEST, bad.reason) from None
    if source is None:
        reason = f"this ingestor serves no exchange with the prefix {parsed.exchange}"
        raise RequestFailedError(INVALID_REQUEST, reason)


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
