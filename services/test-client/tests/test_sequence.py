"""Gap and duplicate detection (pure tracker) and a live stream's recovery, without sockets."""

from __future__ import annotations

import threading
import time

import pytest

from mdclient.dispatch import SequenceEvent, SequenceTracker, Verdict, backfill_start
from mdclient.live import LiveStream
from mdproto.messages import OHLC, Tick

EPOCH = 1_700_000_000_000_000
T = "BINANCE:BTC/USDT"


def test_next_numbers_pass_a_jump_is_a_gap_with_its_size() -> None:
    tracker = SequenceTracker()
    assert tracker.check("t", EPOCH, 5).verdict is Verdict.FIRST  # joined mid-stream
    assert tracker.check("t", EPOCH, 6).verdict is Verdict.NEXT
    gap = tracker.check("t", EPOCH, 10)
    assert (gap.verdict, gap.missed) == (Verdict.GAP, 3)
    assert tracker.check("t", EPOCH, 11).verdict is Verdict.NEXT


def test_old_or_equal_numbers_are_duplicates_and_change_nothing() -> None:
    tracker = SequenceTracker()
    tracker.check("t", EPOCH, 7)
    assert tracker.check("t", EPOCH, 7).verdict is Verdict.DUPLICATE
    assert tracker.check("t", EPOCH, 3).verdict is Verdict.DUPLICATE
    assert not tracker.check("t", EPOCH, 3).deliver
    assert tracker.check("t", EPOCH, 8).verdict is Verdict.NEXT


def test_a_new_epoch_restarts_numbering_without_a_gap_or_replay() -> None:
    tracker = SequenceTracker()
    tracker.check("t", EPOCH, 500)
    restart = tracker.check("t", EPOCH + 1, 1)
    assert (restart.verdict, restart.missed) == (Verdict.RESTART, 0)
    assert tracker.check("t", EPOCH + 1, 2).verdict is Verdict.NEXT  # not a duplicate of 500


def test_topics_are_independent_and_unsequenced_messages_pass() -> None:
    tracker = SequenceTracker()
    tracker.check("a", EPOCH, 1)
    assert tracker.check("b", EPOCH, 9).verdict is Verdict.FIRST
    assert tracker.check("a", EPOCH, 2).verdict is Verdict.NEXT
    assert tracker.check("a", 0, 0).verdict is Verdict.UNSEQUENCED  # an older publisher


def test_backfill_starts_after_the_newest_closed_candle_or_at_the_first_seen() -> None:
    assert backfill_start(None, 120_000, 60) == 120_000
    assert backfill_start(180_000, 120_000, 60) == 240_000


def _candle(seq: int, open_ms: int, *, closed: bool = False, epoch: int = EPOCH) -> OHLC:
    return OHLC(
        ticker=T,
        period_seconds=60,
        open_time_ms=open_ms,
        close=float(seq),
        closed=closed,
        sequence=seq,
        publisher_epoch=epoch,
    )


class _Stored:
    """The Iceberg side of recovery: records what was asked, returns stored closed candles."""

    def __init__(self, candles: list[OHLC]) -> None:
        self.candles = candles
        self.asked: list[tuple[str, int, int, int]] = []

    def __call__(self, ticker: str, period: int, start_ms: int, end_ms: int) -> list[OHLC]:
        self.asked.append((ticker, period, start_ms, end_ms))
        return [c for c in self.candles if start_ms <= c.open_time_ms < end_ms]


def _stream(recover: _Stored | None = None) -> tuple[LiveStream, list[SequenceEvent]]:
    events: list[SequenceEvent] = []
    done = threading.Event()

    def on_sequence(event: SequenceEvent) -> None:
        events.append(event)
        if event.kind in ("recovered", "recovery_failed"):
            done.set()

    stream = LiveStream([f"{T}|ohlc:60"], lambda s: None, on_sequence=on_sequence, recover=recover)
    stream.recovery_done = done  # type: ignore[attr-defined]
    return stream, events


def _drain(stream: LiveStream) -> list[Tick | OHLC]:
    out = []
    while (m := stream.get(0.01)) is not None:
        out.append(m)
    return out


def test_duplicates_are_dropped_silently_and_counted() -> None:
    stream, events = _stream()
    for seq in (1, 2, 2, 1, 3):
        stream.deliver(_candle(seq, 0))
    assert [m.sequence for m in _drain(stream)] == [1, 2, 3]
    assert (stream.duplicates, stream.gaps, events) == (2, 0, [])


def test_a_gap_is_reported_and_the_lost_closed_candles_come_from_iceberg() -> None:
    # Closed 0 seen; the gap swallowed closed 60_000 and 120_000 (both stored).
    stored = _Stored(
        [
            _candle(0, 0, closed=True),
            _candle(0, 60_000, closed=True),
            _candle(0, 120_000, closed=True),
        ]
    )
    stream, events = _stream(stored)
    stream.deliver(_candle(1, 0))
    stream.deliver(_candle(2, 0, closed=True))
    stream.deliver(_candle(9, 180_000))  # reveals the gap
    assert stream.recovery_done.wait(5)  # type: ignore[attr-defined]

    assert [e.kind for e in events] == ["gap", "recovered"]
    assert (events[0].topic, events[0].missed) == (f"{T}|ohlc:60", 6)
    assert events[1].candles == 2
    assert stored.asked[0][:3] == (T, 60, 60_000)  # after the newest closed candle seen
    got = _drain(stream)
    assert [(m.open_time_ms, m.closed) for m in got] == [
        (0, False),
        (0, True),
        (180_000, False),
        (60_000, True),
        (120_000, True),
    ]
    assert (stream.gaps, stream.missed) == (1, 6)


def test_a_closed_candle_recovered_and_then_received_live_is_delivered_once() -> None:
    stored = _Stored([_candle(0, 60_000, closed=True)])
    stream, _ = _stream(stored)
    stream.deliver(_candle(1, 0, closed=True))
    stream.deliver(_candle(5, 60_000))
    assert stream.recovery_done.wait(5)  # type: ignore[attr-defined]
    stream.deliver(_candle(6, 60_000, closed=True))  # published after our Iceberg read
    closed = [m.open_time_ms for m in _drain(stream) if isinstance(m, OHLC) and m.closed]
    assert closed == [0, 60_000]
    assert stream.duplicates == 1


def test_a_failed_recovery_is_reported_with_its_reason() -> None:
    def broken(ticker: str, period: int, start_ms: int, end_ms: int) -> list[OHLC]:
        raise RuntimeError("catalog down")

    events: list[SequenceEvent] = []
    done = threading.Event()
    stream = LiveStream(
        [f"{T}|ohlc:60"],
        lambda s: None,
        on_sequence=lambda e: (events.append(e), e.kind == "recovery_failed" and done.set()),
        recover=broken,
    )
    stream.deliver(_candle(1, 0))
    stream.deliver(_candle(3, 0))
    assert done.wait(5)
    assert [(e.kind, e.reason) for e in events] == [
        ("gap", ""),
        ("recovery_failed", "catalog down"),
    ]


def test_a_publisher_restart_is_reported_not_counted_as_a_gap() -> None:
    stream, events = _stream()
    stream.deliver(_candle(40, 0))
    stream.deliver(_candle(1, 0, epoch=EPOCH + 5))
    stream.deliver(_candle(2, 0, epoch=EPOCH + 5))
    assert [e.kind for e in events] == ["restart"]
    assert (stream.gaps, stream.duplicates, len(_drain(stream))) == (0, 0, 3)


def test_tick_gaps_are_reported_on_the_tick_topic(caplog: pytest.LogCaptureFixture) -> None:
    stream = LiveStream([f"{T}|tick"], lambda s: None)
    for seq in (1, 2, 5):
        stream.deliver(Tick(ticker=T, trade_id=str(seq), sequence=seq, publisher_epoch=EPOCH))
    assert "BINANCE:BTC/USDT|tick: 2 message(s) lost (sequence gap)" in caplog.text
    assert stream.missed == 2


def test_a_gap_revealed_by_an_already_recovered_candle_is_still_reported() -> None:
    stored = _Stored([_candle(0, 0, closed=True)])
    stream, events = _stream(stored)
    stream.deliver(_candle(1, 0))
    stream.deliver(_candle(3, 60_000))
    assert stream.recovery_done.wait(5)  # type: ignore[attr-defined]
    stream.recovery_done.clear()  # type: ignore[attr-defined]
    stream.deliver(_candle(7, 0, closed=True))  # recovered already; 4-6 lost
    assert stream.recovery_done.wait(5)  # type: ignore[attr-defined]
    assert [(e.kind, e.missed) for e in events] == [
        ("gap", 1),
        ("recovered", 0),
        ("gap", 3),
        ("recovered", 0),
    ]
    assert stream.duplicates == 1
    assert [(m.open_time_ms, m.closed) for m in _drain(stream)] == [
        (0, False),
        (60_000, False),
        (0, True),
    ]


def test_the_iceberg_read_waits_for_the_store_delay_and_a_close_cancels_it() -> None:
    """The pipeline stores a closed candle ~2-3 s after publishing it: an immediate read
    would miss the newest lost one."""
    stored = _Stored([_candle(0, 60_000, closed=True)])
    read_at: list[float] = []

    def recover(ticker: str, period: int, start_ms: int, end_ms: int) -> list[OHLC]:
        read_at.append(time.monotonic())
        return stored(ticker, period, start_ms, end_ms)

    done = threading.Event()
    stream = LiveStream(
        [f"{T}|ohlc:60"], lambda s: None, recover=recover, recovery_delay_s=0.3,
        on_sequence=lambda e: done.set() if e.kind == "recovered" else None,
    )  # fmt: skip
    stream.deliver(_candle(1, 0, closed=True))
    seen_at = time.monotonic()
    stream.deliver(_candle(5, 120_000))  # reveals the gap
    assert done.wait(5)
    assert read_at[0] - seen_at >= 0.3
    assert [m.open_time_ms for m in _drain(stream) if m.closed] == [0, 60_000]

    cancelled = LiveStream([f"{T}|ohlc:60"], lambda s: None, recover=recover, recovery_delay_s=5)
    cancelled.deliver(_candle(1, 0, closed=True))
    cancelled.deliver(_candle(5, 120_000))
    cancelled.close()  # during the wait: the recovery thread ends without reading

    def recovering() -> bool:
        return any(t.name == "mdclient-recovery" for t in threading.enumerate())

    deadline = time.monotonic() + 2
    while recovering():
        assert time.monotonic() < deadline, "the recovery thread outlived close()"
        time.sleep(0.01)
    assert len(read_at) == 1
