"""Tick and volume bars from recorded trades: the plan, report and SQL (no Spark; the
bars themselves are checked against `count_bars_oracle` in test_stack_trade_bars)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from count_bars_oracle import count_bars as oracle

from mdproto import rules
from mdproto.messages import BatchMetadata, Status
from pipeline import count_bars
from pipeline.count_bars import CountPlan, plan, report
from pipeline.trade_bars import BarCounts, GapSpan, Recording

T = "BINANCE:BTC/USDT"
M = 60_000
REC = Recording(10 * M, 50 * M)


def test_trades_counted_are_the_settled_ones_of_the_range() -> None:
    bars = rules.bars("100ticks")
    p = plan(T, bars, 0, 100 * M, REC, [])
    assert p.trades_ms == (10 * M, 50 * M)  # from the first trade; before the newest one
    assert p.start_ms == 0 and p.doubt_from_ms is None
    assert plan(T, bars, 20 * M, 30 * M, REC, []).trades_ms == (20 * M, 30 * M)
    assert plan(T, bars, 60 * M, 70 * M, REC, []).trades_ms is None
    assert plan(T, bars, 0, 10 * M, REC, []).trades_ms is None
    assert plan(T, bars, 0, M, Recording(None, None), []).trades_ms is None


def test_a_gap_not_repaired_makes_everything_after_its_start_doubtful() -> None:
    bars = rules.bars("2.5vol")
    gaps = [
        GapSpan("REPAIRED", 15 * M, 16 * M),  # all trades back: no doubt
        GapSpan("OPEN", 30 * M, 31 * M),
        GapSpan("UNREPAIRABLE", 25 * M, 26 * M),
        GapSpan("OPEN", 5 * M, 6 * M),  # ends before the range: counts are unaffected
    ]
    assert plan(T, bars, 20 * M, 100 * M, REC, gaps).doubt_from_ms == 25 * M
    assert plan(T, bars, 20 * M, 100 * M, REC, [GapSpan(None, None, 40 * M)]).doubt_from_ms == (
        20 * M
    )
    assert plan(T, bars, 20 * M, 24 * M, REC, gaps).doubt_from_ms is None  # after the range


def test_the_report_is_ok_with_bars_and_never_an_empty_ok() -> None:
    p = plan(T, rules.bars("100ticks"), 0, 100 * M, REC, [GapSpan("OPEN", 40 * M, 41 * M)])
    ok = report(p, REC, BarCounts(12, 3), "market.trade_bars", 77)
    assert (ok.status, ok.row_count, ok.expected_candles, ok.missing_candles) == (
        Status.OK,
        12,
        12,
        0,
    )
    assert (ok.iceberg_table, ok.snapshot_id) == ("market.trade_bars", 77)
    assert "12 bars of 100ticks" in ok.reason and "not recorded before" in ok.reason
    assert "recorded and settled until" in ok.reason and "3 bars marked incomplete" in ok.reason
    short = report(p, REC, BarCounts(0, 0))
    assert (short.status, short.error_code) == (Status.NOT_FOUND, "")
    assert "do not fill one bar of 100ticks" in short.reason
    none = report(plan(T, rules.bars("1vol"), 0, M, REC, []), REC, BarCounts(0, 0))
    assert (none.status, none.error_code) == (Status.NOT_FOUND, "not_recorded")
    assert "is recorded from" in none.reason


def test_sql_numbers_trades_in_trade_order_and_keeps_full_bars() -> None:
    ticks = count_bars.bars_sql(
        "cat.market.ticks", plan(T, rules.bars("100ticks"), 0, M * 100, REC, []), "r-1"
    )
    assert "row_number() OVER (PARTITION BY ticker ORDER BY struct(" in ticks
    assert "DIV 100 AS seq" in ticks and "HAVING count(1) = 100" in ticks
    assert "'100ticks' AS bars" in ticks and "timestamp_micros(0) AS anchor_time" in ticks
    volume = count_bars.bars_sql(
        "cat.market.ticks", plan(T, rules.bars("2.50vol"), 0, M * 100, REC, []), "r-1"
    )
    assert "CAST('2.5' AS DECIMAL(38, 18))" in volume  # exact sums, canonical size
    assert "ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW" in volume
    assert "HAVING max(cum) DIV" in volume and "'2.5vol' AS bars" in volume
    doubtful = plan(T, rules.bars("5ticks"), 0, M * 100, REC, [GapSpan("OPEN", 30 * M, None)])
    assert f"max(trade_time) >= timestamp_micros({30 * M * 1000})" in count_bars.bars_sql(
        "t", doubtful, "r"
    )
    with pytest.raises(ValueError, match="not a valid id"):
        count_bars.bars_sql("t", doubtful, "x'; DROP")
    with pytest.raises(ValueError, match="nothing to count"):
        count_bars.bars_sql("t", CountPlan(T, rules.bars("5ticks"), 0, 1, None, None), "r")


def test_the_merge_matches_on_the_bar_key_and_updates_only_changed_bars() -> None:
    sql = count_bars.merge_sql("c.market.trade_bars", "v")
    assert "ON t.ticker = s.ticker AND t.bars = s.bars AND t.anchor_time = s.anchor_time" in sql
    assert "t.seq = s.seq" in sql and "t.incomplete <=> s.incomplete" in sql
    assert "t.request_id <=>" not in sql  # another request's equal bar is not rewritten


@pytest.mark.parametrize(
    ("bars", "period", "problem"),
    [("100ticks", 0, ""), ("0ticks", 0, "is not <N>ticks"), ("5vol", 60, "period_seconds 0")],
)
def test_a_marker_no_bar_can_be_built_for_is_refused(bars: str, period: int, problem: str) -> None:
    meta = BatchMetadata(ticker=T, bars=bars, period_seconds=period, start_time_ms=0, end_time_ms=M)
    found = count_bars.check(meta, "r-1")
    if not problem:
        assert found == ""
        return
    assert problem in found
    answer = count_bars.answer(None, None, meta, "r-1")  # type: ignore[arg-type]  # no Spark job
    assert (answer.status, answer.error_code) == (Status.ERROR, "invalid_request")


def test_the_oracle_counts_as_the_docs_say() -> None:
    """The reference the stack test holds Spark to: trade order, full bars only, a
    volume bar closes at V(seq+1) exactly (decimals), a large trade skips numbers."""
    trades = [(0, "1", 1.0, 0.1), (0, "2", 2.0, 0.1), (1, "10", 3.0, 0.1), (1, "9", 4.0, 0.7)]
    trades += [(2, "11", 5.0, 2.5), (3, "12", 6.0, 0.1)]
    assert [b.trade_ids for b in oracle(trades, rules.bars("2ticks"))] == [
        ("1", "2"),
        ("9", "10"),  # "9" < "10" in trade order
        ("11", "12"),
    ]
    by_volume = oracle(trades, rules.bars("1vol"))
    assert [(b.seq, b.trade_ids) for b in by_volume] == [
        (0, ("1", "2", "9", "10")),  # 0.1 + 0.1 + 0.7 + 0.1 = 1.0 exactly
        (1, ("11",)),  # 2.5: closes bar 1 at 3.5; bar 2 is skipped; bar 3 (0.1) not full
    ]
    assert by_volume[0].volume == Decimal("1.0")
