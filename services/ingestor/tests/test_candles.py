"""Pure candle planning: timeframes, pagination, page filtering, gap counting."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingestor.candles import (
    FetchPlan,
    PagingStalledError,
    UnsupportedPeriodError,
    accept_page,
    count_slots,
    expected_gaps,
    next_since,
    plan_fetch,
    split_plan,
    timeframe_for,
    timeframe_map,
    timeframe_seconds,
)
from ingestor.model import Candle

BINANCE = ["1s", "1m", "3m", "5m", "15m", "30m", "1h", "2h", "4h", "6h", "8h", "12h", "1d"]
BINANCE += ["3d", "1w", "1M"]
MIN = 60_000


def candle(t: int) -> Candle:
    return Candle(t, 1.0, 2.0, 0.5, 1.5, 10.0)


@pytest.mark.parametrize(
    ("timeframe", "seconds"),
    [("1s", 1), ("1m", 60), ("15m", 900), ("4h", 14400), ("1d", 86400), ("1w", 604800)],
)
def test_timeframe_seconds(timeframe: str, seconds: int) -> None:
    assert timeframe_seconds(timeframe) == seconds


@pytest.mark.parametrize("timeframe", ["1M", "1y", "m", "0m", "5x", ""])
def test_calendar_or_bad_timeframes_have_no_length(timeframe: str) -> None:
    assert timeframe_seconds(timeframe) is None


def test_timeframe_for_maps_seconds_to_the_exchange_string() -> None:
    assert timeframe_for(60, BINANCE) == "1m"
    assert timeframe_for(3600, BINANCE) == "1h"
    assert timeframe_for(604800, BINANCE) == "1w"


def test_timeframe_map_prefers_the_shortest_spelling() -> None:
    assert timeframe_map(["60m", "1h"]) == {3600: "1h"}


@pytest.mark.parametrize("period", [7, 120, 2_592_000, 0])
def test_unoffered_periods_are_rejected_with_the_offered_list(period: int) -> None:
    with pytest.raises(UnsupportedPeriodError, match="not offered") as info:
        timeframe_for(period, BINANCE)
    assert "60" in str(info.value)


def test_plan_clamps_the_end_to_closed_candles() -> None:
    now = 1_000 * MIN + 30_000  # half-way through the candle opening at minute 1000
    plan = plan_fetch(990 * MIN, 2_000 * MIN, 60, "1m", now, 1000)
    assert plan.end_ms == now - MIN + 1
    # the candle at 999 closed at 1000 <= now: kept; the one at 1000 is still open
    assert 999 * MIN < plan.end_ms <= 1000 * MIN
    assert plan.until_ms == plan.end_ms - 1


def test_plan_keeps_a_past_end() -> None:
    plan = plan_fetch(0, 10 * MIN, 60, "1m", 10_000 * MIN, 500)
    assert (plan.start_ms, plan.end_ms, plan.period_ms, plan.page_limit) == (0, 10 * MIN, MIN, 500)
    assert not plan.empty


def test_plan_entirely_in_the_future_is_empty() -> None:
    assert plan_fetch(100 * MIN, 200 * MIN, 60, "1m", 50 * MIN, 1000).empty


@pytest.mark.parametrize(("start", "end"), [(10, 10), (10, 5), (-1, 5)])
def test_plan_rejects_bad_ranges(start: int, end: int) -> None:
    with pytest.raises(ValueError, match="range"):
        plan_fetch(start, end, 60, "1m", 10**12, 1000)


def test_accept_page_filters_range_overlap_and_duplicates() -> None:
    plan = plan_fetch(10 * MIN, 20 * MIN, 60, "1m", 10**12, 1000)
    page = [candle(t * MIN) for t in (9, 12, 11, 11, 13, 20, 21)]
    assert [c.open_time_ms for c in accept_page(plan, page, None)] == [11 * MIN, 12 * MIN, 13 * MIN]
    assert [c.open_time_ms for c in accept_page(plan, page, 12 * MIN)] == [13 * MIN]


def test_next_since_is_last_open_plus_period() -> None:
    plan = plan_fetch(0, 5000 * MIN, 60, "1m", 10**12, 1000)
    page = [candle(t * MIN) for t in range(0, 1000)]
    assert next_since(plan, page, 0) == 1000 * MIN


def test_next_since_stops_on_empty_page_or_end_and_refuses_no_progress() -> None:
    plan = plan_fetch(0, 100 * MIN, 60, "1m", 10**12, 1000)
    assert next_since(plan, [], 0) is None
    assert next_since(plan, [candle(99 * MIN)], 0) is None  # next page would start at the end
    with pytest.raises(PagingStalledError, match="up to 300000 only"):
        next_since(plan, [candle(5 * MIN)], 6 * MIN)  # exchange went backwards: not "done"


def test_pagination_covers_2500_minutes_in_three_pages() -> None:
    plan = plan_fetch(0, 2500 * MIN, 60, "1m", 10**12, 1000)
    since: int | None = plan.start_ms
    pages = 0
    rows: list[Candle] = []
    while since is not None:
        page = [candle(t) for t in range(since, min(since + 1000 * MIN, plan.end_ms), MIN)]
        rows += accept_page(plan, page, rows[-1].open_time_ms if rows else None)
        since = next_since(plan, page, since)
        pages += 1
    assert pages == 3
    assert [c.open_time_ms for c in rows] == list(range(0, 2500 * MIN, MIN))


def test_count_slots_with_phase() -> None:
    week, day = 7 * 86_400_000, 86_400_000
    monday = 4 * day  # 1970-01-05
    assert count_slots(0, 3 * week, week, monday % week) == 3
    assert count_slots(0, monday, week, monday % week) == 0
    assert count_slots(5, 5, 1) == 0


def test_expected_gaps_counts_periods_without_a_candle() -> None:
    plan = plan_fetch(0, 10 * MIN, 60, "1m", 10**12, 1000)
    assert expected_gaps([plan], 7, 0) == 3
    assert expected_gaps([plan], 0, None) == 10
    assert expected_gaps([plan], 10, 0) == 0


@given(
    start=st.integers(0, 10_000),
    length=st.integers(1, 3_000),
    period=st.sampled_from([1, 60, 300, 3600]),
    present=st.sets(st.integers(0, 3_000)),
)
def test_rows_plus_gaps_equal_the_slots_in_range(
    start: int, length: int, period: int, present: set[int]
) -> None:
    p = period * 1000
    plan = plan_fetch(start * p, (start + length) * p, period, "x", 10**15, 1000)
    opens = sorted((start + i) * p for i in present if i < length)
    rows = accept_page(plan, [candle(t) for t in opens], None)
    gaps = expected_gaps([plan], len(rows), rows[0].open_time_ms if rows else None)
    assert len(rows) + gaps == length


def test_bounded_pages_ask_for_one_window_and_skip_empty_ones() -> None:
    plan = plan_fetch(0, 1000 * MIN, 60, "1m", 10**12, 300, bounded=True)
    assert plan.page_until(0) == 300 * MIN - 1
    assert plan.page_until(900 * MIN) == 1000 * MIN - 1  # never past the range
    assert next_since(plan, [], 0) == 300 * MIN  # empty window: go on after it
    assert next_since(plan, [], 900 * MIN) is None
    assert next_since(plan, [candle(100 * MIN)], 0) == 101 * MIN
    unbounded = plan_fetch(0, 1000 * MIN, 60, "1m", 10**12, 300)
    assert unbounded.page_until(0) == 1000 * MIN - 1
    assert next_since(unbounded, [], 0) is None


def test_bounded_pagination_crosses_a_long_gap() -> None:
    plan = plan_fetch(0, 2000 * MIN, 60, "1m", 10**12, 300, bounded=True)
    data = [t * MIN for t in range(2000) if not 100 <= t < 1500]  # 1400 minutes without trades
    since: int | None = 0
    rows: list[Candle] = []
    calls = 0
    while since is not None:
        window = [candle(t) for t in data if since <= t <= plan.page_until(since)][:300]
        rows += accept_page(plan, window, rows[-1].open_time_ms if rows else None)
        since = next_since(plan, window, since)
        calls += 1
    assert [c.open_time_ms for c in rows] == data
    assert calls <= 10


@given(
    st.integers(0, 10_000),
    st.integers(1, 5_000),
    st.sampled_from([60, 3600, 7 * 86400]),
    st.integers(1, 1000),
    st.integers(0, 6),
)
def test_split_plan_puts_every_open_time_in_exactly_one_window(
    start_slot: int, slots: int, period_s: int, limit: int, phase_days: int
) -> None:
    period = period_s * 1000
    phase = phase_days * 86_400_000 % period  # weekly candles open on Mondays, not on the grid
    start = start_slot * period + phase // 2
    plan = FetchPlan(start, start + slots * period, period, "1m", limit)
    windows = split_plan(plan)
    assert windows[0].start_ms == plan.start_ms and windows[-1].end_ms == plan.end_ms
    for before, after in itertools.pairwise(windows):
        assert before.end_ms == after.start_ms  # contiguous: no open time falls between
    assert all(0 < w.end_ms - w.start_ms <= limit * period for w in windows)
    assert len(windows) == -(-slots // limit)  # one window per page of the one-by-one loop
