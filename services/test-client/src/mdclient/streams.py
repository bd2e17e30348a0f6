"""One base for the SDK's subscription streams (live data, trigger events).

The subscriber thread `put`s into a queue; the caller iterates or `get`s with a
timeout, and a `close()` from any thread ends a blocked `get` within one poll
step (0.25 s), so no stream needs its own wake-up socket. A stream that `fail`s
(the subscriber thread learnt it cannot be served) ends the same way, once the
queued messages are read: iteration then raises the error, `get` returns None
and `error` says why.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any, Self, TypeVar

T = TypeVar("T")
_STEP_S = 0.25
log = logging.getLogger(__name__)


class Closeable:
    """`with` support for anything with a `close()`."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class QueueStream(Closeable, Iterator[T]):
    """Messages of some topics, queued by the subscriber thread, until `close()`."""

    def __init__(
        self, topic_list: Iterable[str], closer: Callable[[Self], None], maxsize: int = 0
    ) -> None:
        self.topics = tuple(dict.fromkeys(topic_list))
        self.subscribed: list[str] = []  # filled by the client as subscriptions go live
        self._closer: Callable[[Any], None] = closer
        # 0: unbounded. None wakes a waiting `get` (after `fail`), it is never a message.
        self._queue: queue.Queue[T | None] = queue.Queue(maxsize)
        self._closed = threading.Event()
        self._close_lock = threading.Lock()
        self.received = 0
        self.dropped = 0  # queued messages dropped to make room (`_make_room`)
        self.error: Exception | None = None  # set by `fail`

    def _hand_over(self, message: T, callback: Callable[[T], None] | None) -> None:
        """To `callback` (an exception in it is logged), else into the queue, making room
        while it is full: the subscriber thread never blocks."""
        if callback is not None:
            try:
                callback(message)
            except Exception:
                log.exception("stream callback failed on %s", self.topics)
            return
        while True:
            try:
                self._queue.put_nowait(message)
                return
            except queue.Full:
                self._make_room()

    def _make_room(self) -> None:
        """Drop the oldest queued message (subclasses choose otherwise)."""
        with contextlib.suppress(queue.Empty):
            self._queue.get_nowait()
            self.dropped += 1

    def fail(self, error: Exception) -> None:
        """End the stream with `error` (any thread); the first error wins."""
        if self.error is None:
            self.error = error
            with contextlib.suppress(queue.Full):  # full: the reader is busy, its next step sees it
                self._queue.put_nowait(None)

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def get(self, timeout_s: float | None = None) -> T | None:
        """Next message, or None after `timeout_s` (or once closed and drained)."""
        step = _STEP_S if timeout_s is None else min(timeout_s, _STEP_S)
        waited = 0.0
        while True:
            try:
                message = self._queue.get(timeout=step)
                if message is not None:
                    return message
                if self.error is not None:
                    return None
            except queue.Empty:
                if self._closed.is_set() or self.error is not None:
                    return None
                waited += step
                if timeout_s is not None and waited >= timeout_s:
                    return None

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> T:
        message = self.get()
        if message is None:
            if self.error is not None:
                self.close()
                raise self.error
            raise StopIteration
        return message

    def close(self) -> None:
        """Unsubscribe (once); what is already queued can still be read."""
        with self._close_lock:
            if self._closed.is_set():
                return
            self._closed.set()
        self._closer(self)
