"""Fan-out: one upstream subscription per topic, shared by every WebSocket subscriber.

Runs on the event loop. A platform message is encoded to JSON once (on the SDK's
subscriber thread) and the same text goes to each subscriber's queue, so the
per-message work per client is one append. Each client has a bounded queue drained
by its own writer task: a slow client loses its OLDEST messages (live data is about
now) and is told how many (`dropped`), and never holds up the others.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from gateway.messages import (
    LAST_VALUE_KINDS,
    GatewayError,
    Topic,
    control_frame,
    dumps,
    error_frame,
)
from mdproto.error_codes import INTERNAL

log = logging.getLogger(__name__)

Send = Callable[[str], Awaitable[None]]


class Handle(Protocol):
    def close(self) -> None: ...


class Upstream(Protocol):
    """The platform side (gateway.platform.SdkUpstream). `open` blocks (a subscribe
    waits for the relay); `deliver` and `fail` may be called from any thread."""

    def open(
        self, topic: Topic, deliver: Callable[[str], None], fail: Callable[[str, str], None]
    ) -> Handle: ...


@dataclass(slots=True)
class FanoutStats:
    """Plain counters of the hub and its sessions; gateway.metrics reads them at scrape
    time, so the fan-out path pays one integer add per event."""

    sessions: int = 0  # WebSocket clients connected now
    sessions_total: int = 0
    upstream_messages: int = 0  # from the platform, before fan-out
    sent: int = 0  # frames written to clients
    dropped: int = 0  # frames slow clients lost (their oldest)


class Session:
    """One WebSocket client: its topics and its bounded send queue."""

    def __init__(self, send: Send, queue_size: int, stats: FanoutStats | None = None) -> None:
        self._send = send
        self._stats = stats if stats is not None else FanoutStats()
        self._stats.sessions += 1
        self._stats.sessions_total += 1
        self._queue: collections.deque[str] = collections.deque()
        self._size = queue_size
        self._ready = asyncio.Event()
        self.topics: set[str] = set()
        #: Topics being opened upstream -> what arrived meanwhile: held back so that
        #: `subscribed` comes first.
        self.held: dict[str, list[str]] = {}
        self.dropped = 0  # total, reported to the client as it happens
        self._unreported = 0
        self.sent = 0
        #: Subscribes under way; left to finish after a disconnect, so an upstream
        #: opened meanwhile is closed again rather than leaked.
        self.pending: set[asyncio.Task[None]] = set()
        self._closed = False
        self._task = asyncio.get_running_loop().create_task(self._writer())

    def push(self, text: str) -> None:
        if len(self._queue) >= self._size:
            self._queue.popleft()
            self.dropped += 1
            self._stats.dropped += 1
            self._unreported += 1
        self._queue.append(text)
        self._ready.set()

    async def _writer(self) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._queue:
                if self._unreported:
                    count, self._unreported = self._unreported, 0
                    await self._send(dumps({"type": "dropped", "count": count}))
                await self._send(self._queue.popleft())
                self.sent += 1
                self._stats.sent += 1

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stats.sessions -= 1
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await self._task


class Hub:
    def __init__(self, upstream: Upstream) -> None:
        self._upstream = upstream
        self._loop = asyncio.get_running_loop()
        self._subscribers: dict[str, set[Session]] = {}
        self._handles: dict[str, Handle] = {}
        self._opening: dict[str, asyncio.Future[None]] = {}
        self._last: dict[str, str] = {}
        self.stats = FanoutStats()

    @property
    def topic_count(self) -> int:
        return len(self._handles)

    def session(self, send: Send, queue_size: int) -> Session:
        """A new client, counted in this hub's stats."""
        return Session(send, queue_size, self.stats)

    async def subscribe(self, session: Session, topic: Topic) -> None:
        """Subscribe `session`; its `subscribed` (or `error`) is queued before any message."""
        name = topic.name
        if name in session.topics:
            session.push(control_frame("subscribed", name))
            return
        session.topics.add(name)
        self._subscribers.setdefault(name, set()).add(session)
        held: list[str] = []
        if name not in self._handles:
            session.held[name] = held
            try:
                await self._open(topic)
            except GatewayError as exc:
                session.topics.discard(name)
                self._discard(session, name)
                session.push(error_frame(exc.error_code, exc.reason, name))
                return
            finally:
                session.held.pop(name, None)
        if name not in session.topics:  # unsubscribed (or failed) while opening
            return
        session.push(control_frame("subscribed", name))
        if not held and name in self._last:
            held.append(self._last[name])
        for text in held:
            session.push(text)

    async def _open(self, topic: Topic) -> None:
        name = topic.name
        pending = self._opening.get(name)
        if pending is not None:
            await asyncio.shield(pending)
            return
        future: asyncio.Future[None] = self._loop.create_future()
        self._opening[name] = future
        keep_last = topic.kind in LAST_VALUE_KINDS

        def deliver(text: str) -> None:
            self._loop.call_soon_threadsafe(self._publish, name, text, keep_last)

        def fail(error_code: str, reason: str) -> None:
            self._loop.call_soon_threadsafe(self._fail, name, error_code, reason)

        try:
            handle = await self._loop.run_in_executor(
                None, self._upstream.open, topic, deliver, fail
            )
        except GatewayError as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters re-raise it themselves
            raise
        except Exception as exc:  # the SDK's errors carry a code; anything else is a bug
            error = GatewayError(
                getattr(exc, "error_code", "") or INTERNAL, getattr(exc, "reason", str(exc))
            )
            log.warning("cannot subscribe %s upstream: %s", name, error.reason)
            future.set_exception(error)
            future.exception()
            raise error from exc
        finally:
            del self._opening[name]
        self._handles[name] = handle
        future.set_result(None)
        if not self._subscribers.get(name):  # everyone left while it opened
            await self._close_upstream(name)

    def _publish(self, name: str, text: str, keep_last: bool) -> None:
        if keep_last:
            self._last[name] = text
        self.stats.upstream_messages += 1
        for session in self._subscribers.get(name, ()):
            held = session.held.get(name)
            if held is None:
                session.push(text)
            else:
                held.append(text)

    def _fail(self, name: str, error_code: str, reason: str) -> None:
        """The upstream ended (FAILED or REFUSED feed): tell and drop every subscriber."""
        frame = error_frame(error_code, reason, name)
        for session in self._subscribers.pop(name, set()):
            session.topics.discard(name)
            session.push(frame)
        self._last.pop(name, None)
        handle = self._handles.pop(name, None)  # a new subscriber opens a fresh one
        if handle is not None:
            self._loop.run_in_executor(None, handle.close)

    async def unsubscribe(self, session: Session, name: str) -> None:
        if name in session.topics:
            session.topics.discard(name)
            self._discard(session, name)
        session.push(control_frame("unsubscribed", name))

    def _discard(self, session: Session, name: str) -> None:
        subscribers = self._subscribers.get(name)
        if subscribers is None:
            return
        subscribers.discard(session)
        if not subscribers:
            del self._subscribers[name]
            if name in self._handles:
                self._loop.create_task(self._close_upstream(name))

    async def _close_upstream(self, name: str) -> None:
        if self._subscribers.get(name):
            return  # someone subscribed again meanwhile
        handle = self._handles.pop(name, None)
        self._last.pop(name, None)
        if handle is not None:
            await self._loop.run_in_executor(None, handle.close)

    async def leave(self, session: Session) -> None:
        """The client went away: drop its subscriptions, stop its writer."""
        for name in list(session.topics):
            session.topics.discard(name)
            self._discard(session, name)
        await session.close()

    async def close(self) -> None:
        for name in list(self._handles):
            self._subscribers.pop(name, None)
            await self._close_upstream(name)
