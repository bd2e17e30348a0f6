"""Bars from recorded trades, the pure parts: the slot plan, the aggregation's SQL, the
integrity report, and how a from-trades final marker becomes its notification."""

from __future__ import annotations

import re

import pytest

from mdproto import rules
from mdproto.messages import BatchMetadata, HistorySource, Status
from mdproto.tables import Ohlc
from pipeline import history_notices
from pipeline.lake import merge_trade_bars
from pipeline.records import FinalMarker
from pipeline.trade_bars import (
    BarCounts,
    BarReport,
    GapSpan,
    Recording,
    answer,
    bars_sql,
    check,
    gaps_sql,
    plan,
    recording_sql,
    report,
)

TICKER = "BINANCE:BTC/USDT"
S = 1000
P = 5  # seconds
B = 1_700_000_040_000  # a minute boundary, so 5-second aligned


def test_slots_are_epoch_aligned_open_times_inside_the_range() -> None:
    rec = Recording(B - 3600 * S, B + 3600 * S)
    bars = plan(TICKER, P, B + 1 * S, B + 21 * S, rec, [])  # 05, 10, 15, 20 (00 opens before)
    assert (bars.first_slot * 5000, bars.slots) == (B + 5 * S, 4)
    assert bars.known == (bars.first_slot, bars.first_slot + 3)
    assert bars.trades_ms == (B + 5 * S, B + 25 * S)  # whole windows, [lo, hi)
    odd = plan(TICKER, 420, B, B + 3600 * S, rec, [])  # 7-minute bars: 0 mod 420 s
    assert odd.first_slot * 420_000 % 420_000 == 0 and odd.first_slot * 420_000 >= B


def test_known_slots_stop_at_the_recording_and_the_last_closed_window() -> None:
    # First trade at +12 s: its window (+10) is the first recorded; the newest at +31 s:
    # the window +30 may still fill, so +25 is the last closed one.
    rec = Recording(B + 12 * S, B + 31 * S)
    bars = plan(TICKER, P, B, B + 60 * S, rec, [])
    assert bars.slots == 12
    assert bars.trades_ms == (B + 10 * S, B + 30 * S)
    assert bars.known_slots == 4
    # A trade exactly at a window's end closes that window.
    assert plan(TICKER, P, B, B + 60 * S, Recording(B, B + 30 * S), []).trades_ms == (B, B + 30 * S)


@pytest.mark.parametrize(
    "rec",
    [
        Recording(None, None),  # nothing of the ticker stored
        Recording(B + 100 * S, B + 200 * S),  # recording began after the range
        Recording(B - 100 * S, B - 50 * S),  # stopped before it
        Recording(B + 1 * S, B + 4 * S),  # inside, but no window closed yet
    ],
)
def test_a_range_the_recording_does_not_cover_has_no_known_slot(rec: Recording) -> None:
    bars = plan(TICKER, P, B, B + 60 * S, rec, [])
    assert bars.known is None and bars.trades_ms is None
    with pytest.raises(ValueError, match="nothing to aggregate"):
        bars_sql("lake.market.ticks", bars, "r-1")
    result = report(bars, rec, BarCounts(0, 0))
    assert (result.status, result.error_code) == (Status.NOT_FOUND, "not_recorded")
    assert (result.expected_candles, result.exchange_gaps, result.missing_candles) == (12, 0, 12)
    assert TICKER in result.reason


def test_unrepaired_gaps_make_doubtful_slots_and_repaired_ones_do_not() -> None:
    rec = Recording(B - 3600 * S, B + 3600 * S)
    gaps = [
        GapSpan("OPEN", B + 7 * S, B + 11 * S),  # windows +5, +10
        GapSpan("UNREPAIRABLE", B + 10 * S, B + 10 * S),  # +10 again: merged
        GapSpan("REPAIRED", B + 30 * S, B + 40 * S),  # complete: not doubtful
        GapSpan(None, B + 50 * S, None),  # status unknown, open end: to the range's end
        GapSpan("REPAIRING", None, B - 1),  # before the range: clipped away
    ]
    bars = plan(TICKER, P, B, B + 60 * S, rec, gaps)
    k = bars.first_slot
    assert bars.doubtful == ((k + 1, k + 2), (k + 10, k + 11))
    sql = bars_sql("lake.market.ticks", bars, "r-1")
    p_us = 5_000_000
    assert f"(open_us BETWEEN {(k + 1) * p_us} AND {(k + 2) * p_us})" in sql
    assert f"(open_us BETWEEN {(k + 10) * p_us} AND {(k + 11) * p_us})" in sql


def test_the_report_counts_empty_and_missing_slots() -> None:
    rec = Recording(B + 12 * S, B + 61 * S)  # known: +10 .. +55 (10 slots)
    bars = plan(TICKER, P, B, B + 60 * S, rec, [GapSpan("OPEN", B + 20 * S, B + 24 * S)])
    assert (bars.slots, bars.known_slots, bars.doubtful_slots) == (12, 10, 1)
    # 7 bars, one of them over the open gap: 9 undoubted known slots, 6 with a bar.
    result = report(bars, rec, BarCounts(7, 1))
    assert result == BarReport(
        Status.OK,
        result.reason,
        "",
        row_count=7,
        expected_candles=12,
        exchange_gaps=3,  # known, undoubted, no trades
        missing_candles=2,  # +0 and +5: not recorded
    )
    assert result.reason.startswith("7 bars from recorded trades")
    assert "not recorded before" in result.reason and "1 bars marked incomplete" in result.reason
    # The doubtful slot without a bar is missing, not empty.
    assert report(bars, rec, BarCounts(6, 0)).missing_candles == 3


def test_a_recorded_range_without_trades_is_not_found_never_an_empty_ok() -> None:
    rec = Recording(B - 3600 * S, B + 3600 * S)
    bars = plan(TICKER, P, B, B + 60 * S, rec, [])
    result = report(bars, rec, BarCounts(0, 0))
    assert (result.status, result.error_code, result.row_count) == (Status.NOT_FOUND, "", 0)
    assert result.reason == "no trades recorded in the range"
    assert (result.exchange_gaps, result.missing_candles) == (12, 0)


def test_the_aggregation_sql_groups_by_window_and_orders_by_trade_order() -> None:
    bars = plan(TICKER, 7, B, B + 70 * S, Recording(B - S, B + 3600 * S), [])
    sql = bars_sql("lake.market.ticks", bars, "req-7")
    assert "GROUP BY open_us" in sql
    assert "unix_micros(trade_time) - pmod(unix_micros(trade_time), 7000000) AS open_us" in sql
    order = "struct(unix_micros(trade_time), length(trade_id), trade_id)"
    assert f"min_by(price, {order}) AS open" in sql and f"max_by(price, {order}) AS close" in sql
    assert f"WHERE ticker = '{TICKER}'" in sql
    lo, hi = bars.trades_ms or (0, 0)
    assert f"trade_time >= timestamp_micros({lo * 1000})" in sql
    assert f"trade_time < timestamp_micros({hi * 1000})" in sql
    assert "'trades' AS source" in sql and "'req-7' AS request_id" in sql
    assert "CAST(7 AS INT) AS period_seconds" in sql
    assert "false AS incomplete" in sql  # no gap
    # Every ohlc column, by name (MERGE's INSERT * matches by name).
    named = re.findall(r" AS (\w+),?\n", sql)
    assert set(Ohlc.SCHEMA.names) <= set(named)


def test_sql_takes_only_validated_literals() -> None:
    rec = Recording(B - S, B + 3600 * S)
    with pytest.raises(rules.RuleViolation):
        plan(TICKER, 0, B, B + 60 * S, rec, [])
    with pytest.raises(rules.RuleViolation):
        plan(TICKER, P, B + 60 * S, B, rec, [])
    with pytest.raises(Exception, match="ticker"):
        plan("BINANCE:BTC/USDT' OR 1=1 --", P, B, B + 60 * S, rec, [])
    with pytest.raises(ValueError, match="not a valid id"):
        bars_sql("t", plan(TICKER, P, B, B + 60 * S, rec, []), "x'; DROP")
    with pytest.raises(Exception, match="ticker"):
        recording_sql("t", "nope")
    with pytest.raises(Exception, match="ticker"):
        gaps_sql("t", "nope")
    assert "status <> 'REPAIRED'" in gaps_sql("g", TICKER)


def test_the_merge_never_touches_an_exchange_candle() -> None:
    sql = merge_trade_bars("lake.market.ohlc", "v", B, B + 60 * S)
    assert "WHEN MATCHED AND t.source IN ('trades', 'live')" in sql
    assert "NOT (t.incomplete <=> s.incomplete)" in sql
    assert "WHEN NOT MATCHED THEN INSERT *" in sql


def _trades_marker(request_id: str = "r-bars") -> FinalMarker:
    meta = BatchMetadata(
        request_id=request_id,
        client_id="c",
        ticker=TICKER,
        period_seconds=P,
        start_time_ms=B,
        end_time_ms=B + 60 * S,
        status=Status.OK,
        source=HistorySource.SOURCE_TRADES,
    )
    return FinalMarker(request_id, meta, partition=0, offset=9)


def test_a_from_trades_marker_is_ok_until_its_bars_say_otherwise() -> None:
    marker = _trades_marker()
    assert history_notices.from_trades([marker]) == [marker]
    assert history_notices.outcome(marker.metadata)[0] == Status.OK  # no rows: not NOT_FOUND
    assert history_notices.known_counts([marker], history_notices.AcceptedRows()) == {}
    plan_ = history_notices.plan(
        [marker],
        {},
        iceberg_table="market.ohlc",
        snapshot_id=42,
        completed_at_ms=1,
        query_id="q",
        batch_id=3,
    )
    bars = BarReport(Status.OK, "7 bars from recorded trades", "", 7, 12, 3, 2)
    fixed = history_notices.apply_bars(plan_, {marker.request_id: bars})
    (done,) = fixed.record
    assert fixed.publish == [done]
    note = done.notification()
    assert (note.status, note.row_count, note.snapshot_id) == (Status.OK, 7, 42)
    assert (note.expected_candles, note.exchange_gaps, note.missing_candles) == (12, 3, 2)
    assert note.source == HistorySource.SOURCE_TRADES and note.reason == bars.reason
    empty = BarReport(Status.NOT_FOUND, "no trade of X is recorded", "not_recorded", 0, 12, 0, 12)
    (gone,) = history_notices.apply_bars(plan_, {marker.request_id: empty}).record
    assert (gone.status, gone.error_code, gone.snapshot_id) == (Status.NOT_FOUND, "not_recorded", 0)


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("ticker", "nope", "ticker"),
        ("period_seconds", 0, "period_seconds"),
        ("period_seconds", 2**31, "exceeds"),
        ("end_time_ms", B - S, "start_time_ms"),
        ("end_time_ms", 10**15, "9999"),
    ],
)
def test_a_marker_no_bar_can_be_built_for_is_refused_not_raised(
    field: str, value: object, says: str
) -> None:
    """A record from elsewhere must not fail the micro-batch again and again."""
    meta = _trades_marker().metadata
    assert meta is not None and check(meta, "r-1") == ""
    setattr(meta, field, value)
    assert says in check(meta, "r-1")
    assert "not a valid id" in check(_trades_marker().metadata, "bad id")  # type: ignore[arg-type]


class _NoLake:
    """A lake that must not be asked."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"the lake was asked for {name}")


def test_answer_refuses_a_bad_marker_before_any_spark_job() -> None:
    meta = _trades_marker().metadata
    assert meta is not None
    meta.period_seconds = 0
    result = answer(_NoLake(), None, meta, "r-1")  # type: ignore[arg-type]
    assert (result.status, result.error_code, result.row_count) == (
        Status.ERROR,
        "invalid_request",
        0,
    )
