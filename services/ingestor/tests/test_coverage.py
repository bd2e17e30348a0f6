"""Planning from storage: which spans stored requests prove complete, and what is left."""

from __future__ import annotations

from typing import Any

from ingestor.coverage import Span, merge, missing, stored_span

MIN = 60_000


def row(start: int, end: int, expected: int, **kw: Any) -> dict[str, Any]:
    base = {
        "status": "OK", "period_seconds": 60, "start_time_ms": start, "end_time_ms": end,
        "expected_candles": expected, "missing_candles": 0,
    }  # fmt: skip
    return base | kw


def test_a_complete_request_covers_its_range() -> None:
    assert stored_span(row(0, 100 * MIN, 100)) == Span(0, 100 * MIN)


def test_the_part_still_open_at_fetch_time_is_not_covered() -> None:
    # Asked until 100 minutes, but only 90 candles were closed when it was fetched.
    assert stored_span(row(0, 100 * MIN, 90)) == Span(0, 90 * MIN)


def test_incomplete_failed_unknown_or_weekly_requests_cover_nothing() -> None:
    assert stored_span(row(0, 100 * MIN, 100, missing_candles=3)) is None
    assert stored_span(row(0, 100 * MIN, 100, status="ERROR")) is None
    assert stored_span(row(0, 100 * MIN, 0)) is None  # predates the integrity report
    assert stored_span(row(0, 100 * MIN, 100, expected_candles=None)) is None
    assert stored_span(row(0, 10 * 604_800_000, 10, period_seconds=604_800)) is None


def test_merge_joins_touching_and_overlapping_spans() -> None:
    assert merge([Span(50, 60), Span(0, 10), Span(10, 20), Span(15, 30)]) == [
        Span(0, 30),
        Span(50, 60),
    ]


def test_missing_is_what_no_stored_span_holds() -> None:
    covered = [Span(10 * MIN, 20 * MIN), Span(30 * MIN, 40 * MIN)]
    assert missing(0, 50 * MIN, covered, MIN) == [
        Span(0, 10 * MIN),
        Span(20 * MIN, 30 * MIN),
        Span(40 * MIN, 50 * MIN),
    ]
    assert missing(12 * MIN, 18 * MIN, covered, MIN) == []  # fully stored
    assert missing(0, 50 * MIN, [], MIN) == [Span(0, 50 * MIN)]


def test_pieces_are_widened_to_whole_candles_so_an_edge_candle_is_fetched() -> None:
    # A stored request that started mid-candle does not hold the candle opening before it.
    covered = [Span(10 * MIN + 30_000, 20 * MIN)]
    assert missing(0, 20 * MIN, covered, MIN) == [Span(0, 11 * MIN)]
    assert missing(10 * MIN, 20 * MIN, covered, MIN) == [Span(10 * MIN, 11 * MIN)]
