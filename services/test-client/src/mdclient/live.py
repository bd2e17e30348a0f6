"""Live ticks and candles: an iterator, or a callback, per subscription.

Messages are handed over by the subscriber thread. The iterator's queue is
bounded: when the consumer falls behind, the OLDEST message is dropped (live
data is about now) and counted in `dropped`, so the receiving thread never
blocks and other subscriptions keep flowing. Callbacks run on the
subscriber thread: keep them short; an exception in one is logged and the
stream goes on.

Every stream also watches `{ticker}|status` (FeedStatus, docs/protocol.md).
Each change of the feed's state goes to the `on_status` callback, or to the
log (WARNING for LOST, FAILED, REFUSED; INFO otherwise). FAILED, or REFUSED for
a period the stream asked for, ends the stream: iteration raises
`FeedUnavailable` (`FeedRefused`) after the queued messages, and `error` holds it.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable

from google.protobuf.message import Message

from mdclient.errors import FeedRefused, FeedUnavailable
from mdclient.streams import QueueStream
from mdproto import topics
from mdproto.messages import OHLC, FeedStatus, Tick

log = logging.getLogger(__name__)

LiveMessage = Tick | OHLC
LiveCallback = Callable[[LiveMessage], None]
StatusCallback = Callable[[FeedStatus], None]
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


def live_topics(ticker: str, *, ticks: bool, ohlc_periods: tuple[int, ...]) -> list[str]:
    """Exact topics for a ticker's ticks and/or candles of the given periods."""
    result = [topics.tick_topic(ticker)] if ticks else []
    result += [topics.ohlc_topic(ticker, period) for period in ohlc_periods]
    if not result:
        raise ValueError("ask for ticks and/or at least one OHLC period")
    return result


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
    ) -> None:
        super().__init__(topic_list, closer, maxsize)
        self._callback = callback
        self._periods = periods
        self._on_status = on_status
        self.status: FeedStatus | None = None  # the latest one that concerns this stream
        self.dropped = 0

    def deliver(self, message: Message) -> None:
        """Sink for the dispatcher (subscriber thread)."""
        if isinstance(message, FeedStatus):
            self._feed_status(message)
            return
        if not isinstance(message, Tick | OHLC) or self._closed.is_set():
            return
        self.received += 1
        if self._callback is not None:
            try:
                self._callback(message)
            except Exception:
                log.exception("live callback failed for %s", message.ticker)
            return
        while True:
            try:
                self._queue.put_nowait(message)
                return
            except queue.Full:
                try:
                    self._queue.get_nowait()
                    self.dropped += 1
                except queue.Empty:
                    pass

    def _feed_status(self, status: FeedStatus) -> None:
        """Surface each change once (the relay repeats bad states); fail on FAILED/REFUSED."""
        if self._closed.is_set() or not concerns(status, self._periods):
            return
        last = self.status
        self.status = status
        key = (status.state, status.error_code, status.period_seconds)
        if last is not None and key == (last.state, last.error_code, last.period_seconds):
            return
        if self._on_status is not None:
            try:
                self._on_status(status)
            except Exception:
                log.exception("status callback failed for %s", status.ticker)
        else:
            level = logging.INFO if status.state in _QUIET else logging.WARNING
            log.log(level, "live feed %s", describe_status(status))
        error = feed_error(status)
        if error is not None:
            self.fail(error)
