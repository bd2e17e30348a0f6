"""Pure candle planning: timeframes, pagination, page filtering, gap counting.

No I/O here; `history.py` drives these with an exchange adapter.

Pagination is our own loop (`since = last_open + period`), never ccxt's
`paginate` option, which silently stops after 10 calls.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from ingestor.model import Candle

_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_TIMEFRAME = re.compile(r"^(\d+)([smhdwMy])$")


class UnsupportedPeriodError(ValueError):
    """The exchange offers no candles of the requested period."""

    def __init__(self, period_seconds: int, offered: Sequence[int]) -> None:
        listed = ", ".join(str(p) for p in offered) or "none"
        super().__init__(
            f"period {period_seconds} s is not offered by the exchange (offered: {listed})"
        )
        self.period_seconds = period_seconds


def timeframe_seconds(timeframe: str) -> int | None:
    """`15m` -> 900. None for calendar units (months, years), whose length varies."""
    match = _TIMEFRAME.match(timeframe)
    if match is None:
        return None
    count, unit = int(match.group(1)), match.group(2)
    if unit not in _UNIT_SECONDS or count <= 0:
        return None
    return count * _UNIT_SECONDS[unit]


def timeframe_map(offered: Iterable[str]) -> dict[int, str]:
    """Period seconds -> the exchange's timeframe string, fixed-length ones only."""
    result: dict[int, str] = {}
    for timeframe in offered:
        seconds = timeframe_seconds(timeframe)
        if seconds is not None and (seconds not in result or len(timeframe) < len(result[seconds])):
            result[seconds] = timeframe
    return result


def timeframe_for(period_seconds: int, offered: Iterable[str]) -> str:
    """The timeframe for `period_seconds`, or UnsupportedPeriodError."""
    mapping = timeframe_map(offered)
    try:
        return mapping[period_seconds]
    except KeyError:
        raise UnsupportedPeriodError(period_seconds, sorted(mapping)) from None


@dataclass(frozen=True, slots=True)
class FetchPlan:
    """What to fetch: candle open times in [start_ms, end_ms), closed candles only.

    `end_ms` is the requested end clamped so that every candle opening before it
    has closed at planning time (open + period <= now): the still-open candle is
    never written, and no page is requested past it.
    """

    start_ms: int
    end_ms: int
    period_ms: int
    timeframe: str
    page_limit: int
    bounded: bool = False  # each page asks for at most page_limit periods (Coinbase needs it)

    @property
    def empty(self) -> bool:
        return self.start_ms >= self.end_ms

    @property
    def until_ms(self) -> int:
        """Inclusive upper bound for the exchange's endTime/until parameter."""
        return self.end_ms - 1

    def page_until(self, since_ms: int) -> int:
        """`until` for the page starting at `since_ms`.

        Unbounded (Binance): the range's end; the exchange returns the first
        `limit` candles from `since`, skipping empty stretches in one call.
        Bounded: at most `page_limit` periods, for exchanges that reject a
        window holding more candles than the limit.
        """
        if not self.bounded:
            return self.until_ms
        return min(self.until_ms, since_ms + self.page_limit * self.period_ms - 1)


def plan_fetch(
    start_ms: int,
    end_ms: int,
    period_seconds: int,
    timeframe: str,
    now_ms: int,
    page_limit: int,
    bounded: bool = False,
) -> FetchPlan:
    if period_seconds <= 0:
        raise ValueError(f"period must be positive, got {period_seconds}")
    if page_limit <= 0:
        raise ValueError(f"page limit must be positive, got {page_limit}")
    if start_ms < 0 or end_ms <= start_ms:
        raise ValueError(f"range [{start_ms}, {end_ms}) is empty or negative")
    period_ms = period_seconds * 1000
    closed_end = now_ms - period_ms + 1  # open < closed_end  <=>  open + period <= now
    end = min(end_ms, closed_end)
    return FetchPlan(start_ms, end, period_ms, timeframe, page_limit, bounded)


def split_plan(plan: FetchPlan) -> list[FetchPlan]:
    """`plan` cut into consecutive windows of `page_limit` periods, each pageable alone.

    Every open time in [start, end) lies in exactly one window, whatever the
    candles' phase, so windows fetched independently (and concurrently) yield
    each candle once; a window is normally one exchange call.
    """
    if plan.empty:
        return [plan]
    width = plan.page_limit * plan.period_ms
    return [
        replace(plan, start_ms=start, end_ms=min(plan.end_ms, start + width))
        for start in range(plan.start_ms, plan.end_ms, width)
    ]


def accept_page(plan: FetchPlan, page: Sequence[Candle], after_ms: int | None) -> list[Candle]:
    """The page's candles that belong to the request, ascending and unique.

    Drops candles outside [start, end) (including the still-open one), those
    at or before `after_ms` (the last open time already accepted), so pages that
    overlap never produce duplicate rows, and those the exchange itself marks
    not final (OKX `confirm=0`, after Kraken's `last`) even if the local clock
    says they closed: a still-forming candle is never written.
    """
    floor = plan.start_ms if after_ms is None else max(plan.start_ms, after_ms + 1)
    accepted: list[Candle] = []
    last = -1
    for candle in sorted(page, key=lambda c: c.open_time_ms):
        t = candle.open_time_ms
        if floor <= t < plan.end_ms and t != last and candle.final is not False:
            accepted.append(candle)
            last = t
    return accepted


class PagingStalledError(ValueError):
    """A page made no progress: continuing would loop, stopping would lose candles."""


def next_since(plan: FetchPlan, page: Sequence[Candle], since_ms: int) -> int | None:
    """Where the next page starts (last open + period), or None when done.

    Done when the page is empty (the exchange has nothing at or after `since`;
    with bounded pages: nothing in the window, so go on after it) or when the
    next page would start at or past the end. A page whose candles all open
    before `since` (an exchange ignoring the parameter) is a PagingStalledError:
    stopping there would report the rest of the range as gaps.
    """
    if not page:
        if plan.bounded:
            following = plan.page_until(since_ms) + 1
            return following if following < plan.end_ms else None
        return None
    last = max(c.open_time_ms for c in page)
    following = last + plan.period_ms
    if following <= since_ms:
        raise PagingStalledError(
            f"the exchange answered a page from {since_ms} with candles up to {last} only"
        )
    return following if following < plan.end_ms else None


def count_slots(start_ms: int, end_ms: int, period_ms: int, phase_ms: int = 0) -> int:
    """How many open times t = phase (mod period) lie in [start, end)."""
    if end_ms <= start_ms:
        return 0
    first = start_ms + ((phase_ms - start_ms) % period_ms)
    if first >= end_ms:
        return 0
    return (end_ms - 1 - first) // period_ms + 1


def candle_slots(plan: FetchPlan, first_open_ms: int | None) -> int:
    """Closed candle slots in the planned range: what a complete answer holds at most.

    The grid's phase is taken from the first candle (weekly candles open on
    Mondays, not on the epoch's Thursday).
    """
    phase = 0 if first_open_ms is None else first_open_ms % plan.period_ms
    return count_slots(plan.start_ms, plan.end_ms, plan.period_ms, phase)


def expected_gaps(plans: Sequence[FetchPlan], total_rows: int, first_open_ms: int | None) -> int:
    """Closed periods in the fetched ranges for which the exchange has no candle.

    Exchanges emit no candle for a period without trades; these are counted,
    not treated as errors.
    """
    return max(0, sum(candle_slots(plan, first_open_ms) for plan in plans) - total_rows)
