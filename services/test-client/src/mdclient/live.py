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
from collections.abc import Callable

from google.protobuf.message import Message

from mdclient.streams import QueueStream
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


class LiveStream(QueueStream[LiveMessage]):
    """`for message in stream:` yields Tick and OHLC messages until `close()`."""

    def __init__(
        self,
        topic_list: list[str],
        closer: Callable[[LiveStream], None],
        *,
        maxsize: int = 10_000,
        callback: LiveCallback | None = None,
    ) -> None:
        super().__init__(topic_list, closer, maxsize)
        self._callback = callback
        self.dropped = 0

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
