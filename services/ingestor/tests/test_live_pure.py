"""Live bookkeeping without I/O: leases, Tick records, feed gaps, feed status."""

from __future__ import annotations

from ingestor.live import (
    FeedPhase,
    GapDetector,
    LeaseBook,
    StatusChange,
    tick_record,
)
from ingestor.model import ExchangeCallError, FaultKind, Trade
from mdproto.messages import FeedStatus, TakerSide


def test_lease_refresh_is_idempotent_and_new_only_once() -> None:
    book = LeaseBook(lease_s=10)
    assert book.refresh("BINANCE:BTC/USDT", 0.0)
    assert not book.refresh("BINANCE:BTC/USDT", 5.0)
    assert "BINANCE:BTC/USDT" in book


def test_lease_expires_only_when_not_refreshed() -> None:
    book = LeaseBook(lease_s=10)
    book.refresh("A:X/Y", 0.0)
    book.refresh("B:X/Y", 0.0)
    book.refresh("A:X/Y", 8.0)
    assert book.expired(9.0) == []
    assert book.expired(10.5) == ["B:X/Y"]
    assert book.tickers() == ["A:X/Y"]
    assert book.expired(18.5) == ["A:X/Y"]
    assert book.tickers() == []


def test_cancel_removes_the_lease() -> None:
    book = LeaseBook(lease_s=10)
    book.refresh("A:X/Y", 0.0)
    assert book.cancel("A:X/Y")
    assert not book.cancel("A:X/Y")
    assert book.refresh("A:X/Y", 1.0)  # a later request starts afresh


def test_tick_record_fields() -> None:
    trade = Trade("42", 100.5, 0.25, 1_700_000_000_000, "sell")
    tick = tick_record("BINANCE:BTC/USDT", trade, 1_700_000_000_123)
    assert (tick.ticker, tick.trade_id, tick.price, tick.amount) == (
        "BINANCE:BTC/USDT",
        "42",
        100.5,
        0.25,
    )
    assert (tick.timestamp_ms, tick.ingested_at_ms, tick.side) == (
        1_700_000_000_000,
        1_700_000_000_123,
        TakerSide.SELL,
    )
    assert tick_record("X:A/B", Trade("1", 1, 1, 1, ""), 0).side == TakerSide.SIDE_UNSPECIFIED
    assert not tick.gap_before
    assert tick_record("X:A/B", trade, 0, gap_before=True).gap_before


def test_numbered_trades_show_a_gap_where_ids_are_skipped_and_at_the_feeds_start() -> None:
    gaps = GapDetector()
    seen = [gaps.follows_gap(i) for i in ("7", "8", "11", "9", "12")]
    # 7: the feed's first trade (its window began before the feed); 9..10 skipped
    # before 11; 9 arrives late (no new gap); a reconnect without skipped ids is no gap.
    assert seen == [(True, 0), (False, 0), (True, 2), (False, 0), (False, 0)]
    gaps.reconnected()
    assert gaps.follows_gap("13") == (False, 0)
    assert gaps.follows_gap("15") == (True, 1)


def test_unnumbered_trades_show_a_gap_at_the_start_and_after_every_reconnect() -> None:
    cases = [
        (("a1", "b2", "c3", "d4"), GapDetector()),
        (("100", "200", "300", "301"), GapDetector(consecutive_ids=False)),  # ids jump anyway
    ]
    for ids, gaps in cases:
        assert [gaps.follows_gap(i) for i in ids[:2]] == [(True, 0), (False, 0)]
        gaps.reconnected()
        gaps.reconnected()  # several attempts: one gap
        assert [gaps.follows_gap(i) for i in ids[2:]] == [(True, 0), (False, 0)]


# --- FeedPhase: what a feed reports on {ticker}|status ------------------------------------

DROP = ExchangeCallError(FaultKind.NETWORK, "connection closed")
DOWN = ExchangeCallError(FaultKind.UNAVAILABLE, "503")


def test_phase_started_once_then_lost_and_recovered_once_per_change() -> None:
    phase = FeedPhase(start_attempts=3)
    assert phase.data() == StatusChange(FeedStatus.STARTED)
    assert phase.data() is None
    assert phase.fault(DROP) == StatusChange(
        FeedStatus.LOST, "network_error", "connection closed; reconnecting"
    )
    assert phase.fault(DROP) is None and phase.fault(DOWN) is None  # still LOST: no repeat
    assert phase.data() == StatusChange(FeedStatus.RECOVERED)
    assert phase.data() is None
    assert phase.fault(DROP) is not None and phase.state == FeedStatus.LOST  # flaps again
    assert not phase.failed


def test_phase_fails_at_once_on_a_permanent_fault() -> None:
    phase = FeedPhase(start_attempts=3)
    change = phase.fault(ExchangeCallError(FaultKind.BAD_SYMBOL, "binance has no NOPE/USDT"))
    assert change == StatusChange(FeedStatus.FAILED, "bad_symbol", "binance has no NOPE/USDT")
    assert phase.failed


def test_phase_fails_when_the_exchange_stays_down_before_any_data() -> None:
    phase = FeedPhase(start_attempts=3)
    assert phase.fault(DOWN) is None and phase.fault(DOWN) is None
    change = phase.fault(DOWN)
    assert change is not None and (change.state, change.error_code) == (
        FeedStatus.FAILED,
        "exchange_unavailable",
    )
    assert "after 3 attempts" in change.reason and phase.failed


def test_phase_after_data_transient_faults_never_fail() -> None:
    phase = FeedPhase(start_attempts=1)
    phase.data()
    assert [phase.fault(DOWN) for _ in range(10)].count(None) == 9
    assert phase.state == FeedStatus.LOST
