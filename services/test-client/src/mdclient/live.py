"""Live ticks and candles: an iterator, or a callback, per subscription.

Messages are handed over by the subscriber thread. The iterator's queue is
bounded: when the consumer falls behind, the oldest tick or candle preview is
dropped (a newer one supersedes it) and counted in `dropped`, so the receiving
thread never blocks and other subscriptions keep flowing. A closed candle is
final, so it goes only when the queue holds nothing else: then it is counted
in `dropped_closed` and reported as an `overflow` sequence event, never lost
in silence. Callbacks run on the
subscriber thread: keep them short; an exception in one is logged and the
stream goes on.

Every stream also watches `{ticker}|status` (FeedStatus, docs/protocol.md).
Each change of the feed's state goes to the `on_status` callback, or to the
log (WARNING for LOST, FAILED, REFUSED; INFO otherwise). FAILED, or REFUSED for
a period the stream asked for, ends the stream: iteration raises
`FeedUnavailable` (`FeedRefused`) after the queued messages, and `error` holds it.

Every Tick and OHLC carries a per-topic sequence number (mdclient.dispatch):
duplicates are dropped and counted in `duplicates`; a gap or a publisher
restart goes to `on_sequence` (or the log, WARNING for a gap), and on a candle
topic the closed candles the gap may have swallowed are read from Iceberg on a
recovery thread and delivered (those not delivered yet), followed by a
`recovered` event. The read waits `recovery_delay_s` first: the pipeline stores
a closed candle a few seconds after it publishes it. Callbacks never run
concurrently (the recovery thread delivers under the stream's lock). A new
subscription receives the topic's last value from the pipeline (current
candle, latest tick) at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from google.protobuf.message import Message

from mdclient.dispatch import SequenceEvent, SequenceTracker, Verdict, backfill_start
from mdclient.errors import FeedRefused, FeedUnavailable
from mdclient.streams import QueueStream
from mdproto import topics
from mdproto.messages import OHLC, FeedStatus, Tick

log = logging.getLogger(__name__)

LiveMessage = Tick | OHLC
LiveCallback = Callable[[LiveMessage], None]
StatusCallback = Callable[[FeedStatus], None]
SequenceCallback = Callable[[SequenceEvent], None]
#: (ticker, period_seconds, start_ms, end_ms) -> the closed candles stored for [start, end).
ClosedCandles = Callable[[str, int, int, int], list[OHLC]]
_CLOSED_KEPT = 2048  # closed open times remembered per period (recovery dedup)
_QUIET = (FeedStatus.STARTED, FeedStatus.RECOVERED)


def state_name(status: FeedStatus) -> str:
    known = status.state in FeedStatus.State.values()
    return FeedStatus.State.Name(status.state) if known else f"state {status.state}"


def concerns(status: FeedStatus, periods: tuple[int, ...]) -> bool:
    """Whether a stream of these candle periods cares: REFUSED only for its own periods."""
    return status.state != FeedStatus.REFUSED or status.period_seconds in periods


def feed_error(status: FeedStatus) -> FeedUnavailable | None:
    """The error that ends a stream on this status (FAILED, REFUSED), else None."""
    if status.state not in (FeedStatus.FAILED, FeedStatus.REFUSED):
        return None
    cls = FeedRefused if status.state == FeedStatus.REFUSED else FeedUnavailable
    what = f" ({status.period_seconds} s candles)" if status.period_seconds else ""
    reason = status.reason or "no reason given"
    return cls(
        f"live feed {status.ticker}{what} {state_name(status)}: {reason}",
        error_code=status.error_code,
        state=state_name(status),
        ticker=status.ticker,
        period_seconds=status.period_seconds,
    )


def describe_status(status: FeedStatus) -> str:
    """One line for logs and the CLI: `BINANCE:BTC/USDT LOST network_error: ...`."""
    code = f" {status.error_code}" if status.error_code else ""
    reason = f": {status.reason}" if status.reason else ""
    return f"{status.ticker} {state_name(status)}{code}{reason}"


class FeedWatch:
    """The state of a ticker's feed as a stream sees it (`{ticker}|status`): each change
    surfaced once (the relay repeats bad states), and the error that ends the stream."""

    __slots__ = ("_on_status", "_periods", "status")

    def __init__(self, periods: tuple[int, ...], on_status: StatusCallback | None) -> None:
        self._periods = periods
        self._on_status = on_status
        self.status: FeedStatus | None = None  # the latest one that concerns the stream

    def see(self, status: FeedStatus) -> FeedUnavailable | None:
        """Report `status` if it is news; the error that ends the stream (FAILED, REFUSED)."""
        if not concerns(status, self._periods):
            return None
        last = self.status
        self.status = status
        key = (status.state, status.error_code, status.period_seconds)
        if last is not None and key == (last.state, last.error_code, last.period_seconds):
            return None
        if self._on_status is not None:
            try:
                self._on_status(status)
            except Exception:
                log.exception("status callback failed for %s", status.ticker)
        else:
            level = logging.INFO if status.state in _QUIET else logging.WARNING
            log.log(level, "live feed %s", describe_status(status))
        return feed_error(status)


def live_topics(ticker: str, *, ticks: bool, ohlc_periods: tuple[int, ...]) -> list[str]:
    """Exact topics for a ticker's ticks and/or candles of the given periods."""
    result = [topics.tick_topic(ticker)] if ticks else []
    result += [topics.ohlc_topic(ticker, period) for period in ohlc_periods]
    if not result:
        raise ValueError("ask for ticks and/or at least one OHLC period")
    return result


class _Candles:
    """Per candle period: where the stream started and which closed candles it delivered."""

    __slots__ = ("closed", "first_open_ms")

    def __init__(self, first_open_ms: int) -> None:
        self.first_open_ms = first_open_ms
        self.closed: set[int] = set()

    @property
    def closed_upto_ms(self) -> int | None:
        return max(self.closed) if self.closed else None

    def first_close(self, open_time_ms: int) -> bool:
        """Record a closed candle; False if it was delivered already (live or recovered)."""
        if open_time_ms in self.closed:
            return False
        self.closed.add(open_time_ms)
        if len(self.closed) > _CLOSED_KEPT:
            for old in sorted(self.closed)[: _CLOSED_KEPT // 2]:
                self.closed.discard(old)
        return True


class LiveStream(QueueStream[LiveMessage]):
    """`for message in stream:` yields Tick and OHLC messages until `close()`."""

    def __init__(
        self,
        topic_list: list[str],
        closer: Callable[[LiveStream], None],
        *,
        maxsize: int = 10_000,
        callback: LiveCallback | None = None,
        periods: tuple[int, ...] = (),
        on_status: StatusCallback | None = None,
        on_sequence: SequenceCallback | None = None,
        recover: ClosedCandles | None = None,
        recovery_delay_s: float = 0.0,
    ) -> None:
        super().__init__(topic_list, closer, maxsize)
        self._callback = callback
        self._feed = FeedWatch(periods, on_status)
        self._on_sequence = on_sequence
        self._recover = recover
        self._recovery_delay_s = recovery_delay_s
        self._lock = threading.RLock()
        self._tracker = SequenceTracker()
        self._candles: dict[int, _Candles] = {}
        #: Running recoveries -> where another run must start (None: no rerun).
        self._recovering: dict[tuple[str, int], int | None] = {}
        self.dropped_closed = 0  # closed candles that left the full queue unread
        self.duplicates = 0
        self.gaps = 0
        self.missed = 0  # messages lost in gaps

    def deliver(self, message: Message) -> None:
        """Sink for the dispatcher (subscriber thread)."""
        if isinstance(message, FeedStatus):
            self._feed_status(message)
            return
        if not isinstance(message, Tick | OHLC) or self._closed.is_set():
            return
        key = message.period_seconds if isinstance(message, OHLC) else 0
        with self._lock:
            check = self._tracker.check(key, message.publisher_epoch, message.sequence)
            lost = check.verdict in (Verdict.GAP, Verdict.RESTART)
            # Where the lost closed candles start: decided before this message counts.
            start = self._backfill_start(message) if lost and isinstance(message, OHLC) else None
            fresh = check.deliver and (not isinstance(message, OHLC) or self._first(message))
            if fresh:
                self.received += 1
                self._accept(message)
            else:  # also a closed candle that recovery delivered already
                self.duplicates += 1
        if not lost:
            return
        if check.verdict is Verdict.GAP:
            self.gaps += 1
            self.missed += check.missed
            self._sequence_event(SequenceEvent(_topic(message), "gap", missed=check.missed))
        else:
            self._sequence_event(SequenceEvent(_topic(message), "restart"))
        if start is not None and isinstance(message, OHLC) and self._recover is not None:
            self._start_recovery(message.ticker, message.period_seconds, start)

    def _backfill_start(self, candle: OHLC) -> int:
        state = self._candles.get(candle.period_seconds)
        if state is None:
            return candle.open_time_ms
        return backfill_start(state.closed_upto_ms, state.first_open_ms, candle.period_seconds)

    def _first(self, candle: OHLC) -> bool:
        """Track the period's candles (under the lock); False for a closed one delivered before."""
        state = self._candles.get(candle.period_seconds)
        if state is None:
            state = self._candles[candle.period_seconds] = _Candles(candle.open_time_ms)
        return not candle.closed or state.first_close(candle.open_time_ms)

    def _accept(self, message: LiveMessage) -> None:
        self._hand_over(message, self._callback)

    def _make_room(self) -> None:
        """Drop the oldest supersedable message, else the oldest closed candle (reported).

        queue.Queue has no "remove this item": its deque is edited under its own mutex
        (a scan, on overflow only).
        """
        with self._queue.mutex:
            waiting = self._queue.queue
            for i, queued in enumerate(waiting):
                if queued is not None and not (isinstance(queued, OHLC) and queued.closed):
                    del waiting[i]
                    self.dropped += 1
                    self._queue.not_full.notify()
                    return
            victim = next((m for m in waiting if m is not None), None)
            if victim is None:
                return  # only the end-of-stream mark: the stream is closing
            waiting.remove(victim)
            self._queue.not_full.notify()
        self.dropped_closed += 1
        self._sequence_event(SequenceEvent(_topic(victim), "overflow", missed=1))

    def _sequence_event(self, event: SequenceEvent) -> None:
        if self._on_sequence is not None:
            try:
                self._on_sequence(event)
            except Exception:
                log.exception("sequence callback failed for %s", event.topic)
            return
        quiet = event.kind in ("recovered", "restart")
        log.log(logging.INFO if quiet else logging.WARNING, "live %s", event.describe())

    def _start_recovery(self, ticker: str, period: int, start_ms: int) -> None:
        """One recovery thread per period; a gap during its run makes it run once more."""
        key = (ticker, period)
        with self._lock:
            if key in self._recovering:
                pending = self._recovering[key]
                self._recovering[key] = start_ms if pending is None else min(pending, start_ms)
                return
            self._recovering[key] = None
        threading.Thread(
            target=self._recovery,
            args=(ticker, period, start_ms),
            name="mdclient-recovery",
            daemon=True,
        ).start()

    def _recovery(self, ticker: str, period: int, start_ms: int) -> None:
        key = (ticker, period)
        while True:
            # The newest lost candle reaches the table a few seconds after it was published.
            if not self._closed.wait(self._recovery_delay_s):
                self._recover_once(ticker, period, start_ms)
            with self._lock:  # a gap meanwhile left where to start again
                pending = self._recovering[key]
                if pending is None or self._closed.is_set():
                    del self._recovering[key]
                    return
                self._recovering[key] = None
            start_ms = pending

    def _recover_once(self, ticker: str, period: int, start_ms: int) -> None:
        """Read [start_ms, now) from Iceberg; deliver the closed candles not delivered yet."""
        assert self._recover is not None
        topic = topics.ohlc_topic(ticker, period)
        try:
            candles = self._recover(ticker, period, start_ms, int(time.time() * 1000))
        except Exception as exc:
            self._sequence_event(SequenceEvent(topic, "recovery_failed", reason=str(exc)))
            return
        delivered = 0
        with self._lock:
            state = self._candles[period]
            for candle in sorted(candles, key=lambda c: c.open_time_ms):
                if not self._closed.is_set() and state.first_close(candle.open_time_ms):
                    self._accept(candle)
                    delivered += 1
        self._sequence_event(SequenceEvent(topic, "recovered", candles=delivered))

    @property
    def status(self) -> FeedStatus | None:
        """The latest FeedStatus that concerns this stream."""
        return self._feed.status

    def _feed_status(self, status: FeedStatus) -> None:
        if self._closed.is_set():
            return
        error = self._feed.see(status)
        if error is not None:
            self.fail(error)


def _topic(message: LiveMessage) -> str:
    if isinstance(message, OHLC):
        return topics.ohlc_topic(message.ticker, message.period_seconds)
    return topics.tick_topic(message.ticker)
