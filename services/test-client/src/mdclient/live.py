"""Live ticks and candles: an iterator, or a callback, per subscription.

Messages are handed over by the subscriber thread. The iterator's queue is
bounded: when the consumer falls behind, the OLDEST message is dropped (live
data is about now) and counted in `dropped`, so the receiving thread never
blocks and other subscriptions keep flowing. Callbacks run on the
subscriber thread: keep them short; an exception in one is logged and the
stream goes on.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from types import TracebackType

from google.protobuf.message import Message

from mdproto import topics
from mdproto.messages import OHLC, Tick

log = logging.getLogger(__name__)

LiveMessage = Tick | OHLC
LiveCallback = Callable[[LiveMessage], None]


def live_topics(ticker: str, *, ticks: bool, ohlc_periods: tuple[int, ...]) -> list[str]:
    """Exact topics for a ticker's ticks and/or candles of the given periods."""
    result = [topics.tick_topic(ticker)] if ticks else []
    result += [topics.ohlc_topic(ticker, period) for period in ohlc_periods]
    if not result:
        raise ValueError("ask for ticks and/or at least one OHLC period")
    return result


class LiveStream(Iterator[LiveMessage]):
    """`for message in stream:` yields Tick and OHLC messages until `close()`."""

    def __init__(
        self,
        topic_list: list[str],
        closer: Callable[[LiveStream], None],
        *,
        maxsize: int = 10_000,
        callback: LiveCallback | None = None,
    ) -> None:
        self.topics = tuple(topic_list)
        self.subscribed: list[str] = []  # filled by the client as subscriptions go live
        self._closer = closer
        self._callback = callback
        self._queue: queue.Queue[LiveMessage] = queue.Queue(maxsize)
        self._closed = threading.Event()
        self._close_lock = threading.Lock()
        self.dropped = 0
        self.received = 0

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def deliver(self, message: Message) -> None:
        """Sink for the dispatcher (subscriber thread)."""
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

    def get(self, timeout_s: float | None = None) -> LiveMessage | None:
        """Next message, or None after `timeout_s` (or once closed and drained)."""
        step = 0.25 if timeout_s is None else min(timeout_s, 0.25)
        waited = 0.0
        while True:
            try:
                return self._queue.get(timeout=step)
            except queue.Empty:
                if self._closed.is_set():
                    return None
                waited += step
                if timeout_s is not None and waited >= timeout_s:
                    return None

    def __iter__(self) -> LiveStream:
        return self

    def __next__(self) -> LiveMessage:
        message = self.get()
        if message is None:
            raise StopIteration
        return message

    def close(self) -> None:
        """Unsubscribe; the iterator ends after what is already queued."""
        with self._close_lock:
            if self._closed.is_set():
                return
            self._closed.set()
        self._closer(self)

    def __enter__(self) -> LiveStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
