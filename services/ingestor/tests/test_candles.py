"""Pure candle planning: timeframes, pagination, page filtering, gap counting."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingestor.candles import (
    Answer,
    ExchangeGaps,
    FetchPlan,
    PagingStalledError,
    UnsupportedPeriodError,
    accept_page,
    candle_slots,
    count_slots,
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


# --- exchange gaps: what the exchange's answers say had no trades -------------------------


def fetch_all(
    plan: FetchPlan, opens: list[int], *, split: bool = False, drop: set[int] | None = None,
    keep: dict[int, int] | None = None, unfinished: set[int] | None = None,
) -> tuple[list[Answer], list[Candle]]:  # fmt: skip
    """The paging loop of history.py, against an exchange holding candles at `opens`.

    Answer number i is emptied if i is in `drop`, cut to its first `keep[i]` candles
    (oldest first) if in `keep`; unbounded pages return the oldest `limit` from since,
    bounded ones the newest `limit` of their window (as OKX).
    """
    answers: list[Answer] = []
    rows: list[Candle] = []
    for window in split_plan(plan) if split else [plan]:
        since: int | None = None if window.empty else window.start_ms
        after: int | None = None
        while since is not None:
            held = [t for t in opens if since <= t <= window.page_until(since)]
            held = held[-window.page_limit :] if window.bounded else held[: window.page_limit]
            page = [Candle(t, 1, 2, 0.5, 1.5, 10, final=t not in (unfinished or ())) for t in held]
            if len(answers) in (drop or ()):
                page = []
            page = page[: (keep or {}).get(len(answers), len(page))]
            accepted = accept_page(window, page, after)
            after = accepted[-1].open_time_ms if accepted else after
            answers.append(Answer(window, since, page, accepted))
            rows += accepted
            since = next_since(window, page, since)
    return answers, rows


def report(
    plan: FetchPlan, opens: list[int], *, complete: bool = True, **faults: object
) -> tuple[int, int, int]:
    """(rows, exchange gaps, missing) as the pipeline computes it: expected - rows - gaps."""
    answers, rows = fetch_all(plan, opens, **faults)  # type: ignore[arg-type]
    weighed = ExchangeGaps()
    for answer in answers:
        weighed.add(answer)
    first = rows[0].open_time_ms if rows else None
    gaps = weighed.count(first, complete)
    return len(rows), gaps, candle_slots(plan, first) - len(rows) - gaps


def minutes(start: int, end: int, limit: int, bounded: bool = False) -> FetchPlan:
    return plan_fetch(start * MIN, end * MIN, 60, "1m", 10**12, limit, bounded)


def test_empty_slots_between_candles_of_an_answer_are_exchange_gaps() -> None:
    opens = [t * MIN for t in range(10) if t not in (3, 4, 7)]
    assert report(minutes(0, 10, 1000), opens) == (7, 3, 0)
    assert report(minutes(0, 10, 1000), []) == (0, 10, 0)  # NOT_FOUND: the exchange has none


def test_before_the_first_candle_is_an_exchange_gap_however_the_range_is_paged() -> None:
    """A range starting before the listing: the exchange answers from its first candle
    on (one call) or with empty windows first (split or bounded): both are its word."""
    opens = [t * MIN for t in range(250, 300)]
    for plan, split in [(minutes(0, 300, 1000), False), (minutes(0, 300, 100), True)]:
        assert report(plan, opens, split=split) == (50, 250, 0)
    assert report(minutes(0, 300, 100, bounded=True), opens) == (50, 250, 0)


def test_after_the_last_candle_counts_only_when_its_answer_was_short() -> None:
    """Short: the exchange said it had nothing more (a halted or delisted market).
    Full, then silence: a dropped last page looks like that, so it is missing."""
    halted = [t * MIN for t in range(0, 150)]  # nothing after minute 150
    assert report(minutes(0, 300, 1000), halted) == (150, 150, 0)
    assert report(minutes(0, 300, 100), halted, split=True) == (150, 150, 0)
    assert report(minutes(0, 300, 100, bounded=True), halted) == (150, 150, 0)
    every = [t * MIN for t in range(300)]
    assert report(minutes(0, 300, 100), every, drop={2}) == (200, 0, 100)  # the last page
    assert report(minutes(0, 300, 100), every, drop={1}) == (100, 0, 200)  # paging stopped


def test_an_empty_answer_between_answers_with_candles_is_missing() -> None:
    """Dropped, or a whole window without trades: the answer alone cannot tell."""
    sparse = [t * MIN for t in range(300) if t % 4 == 0]  # 75 candles, 225 quiet minutes
    assert report(minutes(0, 300, 30), sparse, split=False) == (75, 225, 0)
    rows, gaps, missing = report(minutes(0, 300, 100), sparse, split=True, drop={2})
    assert (rows, gaps, missing) == (50, 150, 100)  # window 100..199 dropped: 25 + 75
    rows, gaps, missing = report(minutes(0, 300, 100, bounded=True), sparse, drop={1})
    assert missing > 0 and rows + gaps + missing == 300 and gaps <= 225


def test_a_page_cut_short_of_its_newest_candles_loses_nothing() -> None:
    """The next page asks again from the last candle returned."""
    every = [t * MIN for t in range(300)]
    assert report(minutes(0, 300, 100), every, keep={0: 50, 1: 10}) == (300, 0, 0)
    assert report(minutes(0, 300, 100, bounded=True), every, keep={1: 50}) == (300, 0, 0)


def test_an_unfinished_candle_is_missing_not_a_gap() -> None:
    """The exchange has a candle there (OKX confirm=0): a later fetch can store it."""
    every = [t * MIN for t in range(10)]
    assert report(minutes(0, 10, 1000), every, unfinished={9 * MIN}) == (9, 0, 1)


def test_a_failed_fetch_counts_only_what_its_answers_spoke_for() -> None:
    """Without the edges: windows 0..199 answered empty, window 200..299 with candles."""
    opens = [t * MIN for t in range(250, 300, 2)]
    assert report(minutes(0, 300, 100), opens, split=True) == (25, 275, 0)
    assert report(minutes(0, 300, 100), opens, split=True, complete=False) == (25, 75, 200)


@settings(deadline=None)
@given(
    length=st.integers(1, 400),
    present=st.sets(st.integers(0, 399)),
    limit=st.integers(1, 120),
    paging=st.sampled_from(["one loop", "split", "bounded"]),
)
def test_a_faithful_exchange_is_never_reported_quiet_where_it_has_candles(
    length: int, present: set[int], limit: int, paging: str
) -> None:
    """Every candle is a row and no gap. In one loop (Binance) nothing is missing but
    a quiet tail after a full answer (a dropped last page looks the same); split or
    bounded, a whole window without a candle between candles is missing too."""
    plan = minutes(1000, 1000 + length, limit, bounded=paging == "bounded")
    opens = sorted((1000 + i) * MIN for i in present if i < length)
    split = paging == "split"
    rows, gaps, missing = report(plan, opens, split=split)
    assert rows == len(opens) and rows + gaps + missing == length
    assert gaps <= length - len(opens)
    if paging == "one loop":
        answers, _ = fetch_all(plan, opens)
        with_candles = [a for a in answers if a.candles]
        full_then_quiet = bool(with_candles) and not with_candles[-1].short
        tail = plan.end_ms // MIN - 1 - opens[-1] // MIN if full_then_quiet else 0
        assert missing == tail


@settings(deadline=None)
@given(
    present=st.sets(st.integers(0, 399), min_size=2),
    limit=st.integers(1, 60),
    paging=st.sampled_from(["one loop", "split", "bounded"]),
    dropped=st.integers(0, 50),
)
def test_a_dropped_answer_between_candles_is_never_counted_as_quiet(
    present: set[int], limit: int, paging: str, dropped: int
) -> None:
    plan = minutes(0, 400, limit, bounded=paging == "bounded")
    opens = sorted(t * MIN for t in present)
    split = paging == "split"
    answers, _ = fetch_all(plan, opens, split=split)
    with_candles = [i for i, a in enumerate(answers) if a.candles]
    if not with_candles[0] < dropped < with_candles[-1]:
        return
    rows, gaps, missing = report(plan, opens, split=split, drop={dropped})
    assert gaps <= 400 - len(opens)  # a slot the exchange has a candle for is never a gap
    assert rows + gaps + missing == 400
    if answers[dropped].candles:
        assert missing > 0


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
