"""Fan-out rules of the hub, on an event loop with a scripted upstream (no sockets):
order (`subscribed` first), last value, slow clients, failures, upstream lifetime."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

from gateway.hub import Hub, Session
from gateway.messages import Topic, parse_topic

TICK = parse_topic("BINANCE:BTC/USDT|tick")


class Handle:
    def __init__(self) -> None:
        self.closed = threading.Event()

    def close(self) -> None:
        self.closed.set()


class ScriptedUpstream:
    """Opens in a worker thread like the SDK; `during_open` runs before it returns."""

    def __init__(self) -> None:
        self.opened: list[str] = []
        self.handles: list[Handle] = []
        self.deliver: Callable[[str], None] = lambda text: None
        self.fail: Callable[[str, str], None] = lambda code, reason: None
        self.during_open: Callable[[], None] = lambda: None

    def open(
        self, topic: Topic, deliver: Callable[[str], None], fail: Callable[[str, str], None]
    ) -> Handle:
        self.opened.append(topic.name)
        self.deliver, self.fail = deliver, fail
        self.during_open()
        self.handles.append(Handle())
        return self.handles[-1]


class Sink:
    def __init__(self, delay_s: float = 0.0) -> None:
        self.frames: list[dict[str, Any]] = []
        self.delay_s = delay_s

    async def send(self, text: str) -> None:
        await asyncio.sleep(self.delay_s)
        self.frames.append(json.loads(text))


async def settle(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not condition():  # noqa: ASYNC110 (effects of other tasks and threads)
            await asyncio.sleep(0.01)


def test_subscribed_comes_first_then_messages_and_a_late_joiner_gets_the_last_value() -> None:
    async def scenario() -> tuple[Sink, Sink, ScriptedUpstream]:
        upstream = ScriptedUpstream()
        upstream.during_open = lambda: upstream.deliver('{"type":"message","n":1}')
        hub = Hub(upstream)
        first, late = Sink(), Sink()
        a, b = Session(first.send, 10), Session(late.send, 10)
        await hub.subscribe(a, TICK)
        upstream.deliver('{"type":"message","n":2}')
        await settle(lambda: len(first.frames) == 3)
        await hub.subscribe(b, TICK)  # already open: no second upstream subscription
        await settle(lambda: len(late.frames) == 2)
        await hub.unsubscribe(a, TICK.name)
        await hub.leave(b)
        await settle(lambda: bool(upstream.handles) and upstream.handles[0].closed.is_set())
        return first, late, upstream

    first, late, upstream = asyncio.run(scenario())
    kinds = [f["type"] for f in first.frames]
    assert kinds == ["subscribed", "message", "message", "unsubscribed"]
    assert [f.get("n") for f in first.frames[1:3]] == [1, 2]
    assert late.frames == [{"type": "subscribed", "topic": TICK.name}, {"type": "message", "n": 2}]
    assert upstream.opened == [TICK.name]


def test_a_slow_client_loses_its_oldest_messages_and_is_told() -> None:
    async def scenario() -> Sink:
        upstream = ScriptedUpstream()
        hub = Hub(upstream)
        slow = Sink(delay_s=0.05)
        session = Session(slow.send, 3)
        await hub.subscribe(session, TICK)
        for n in range(10):
            upstream.deliver(json.dumps({"type": "message", "n": n}))
        await settle(lambda: any(f.get("n") == 9 for f in slow.frames))
        await hub.leave(session)
        return slow

    frames = asyncio.run(scenario()).frames
    dropped = [f["count"] for f in frames if f["type"] == "dropped"]
    numbers = [f["n"] for f in frames if f["type"] == "message"]
    assert sum(dropped) + len(numbers) == 10 and sum(dropped) > 0
    assert numbers == sorted(numbers) and numbers[-1] == 9  # the newest survive


def test_a_failed_upstream_ends_every_subscription_with_its_reason() -> None:
    async def scenario() -> tuple[Sink, ScriptedUpstream]:
        upstream = ScriptedUpstream()
        hub = Hub(upstream)
        sink = Sink()
        session = Session(sink.send, 10)
        await hub.subscribe(session, TICK)
        upstream.fail("bad_symbol", "no such market")
        await settle(lambda: upstream.handles[0].closed.is_set() and len(sink.frames) == 2)
        assert session.topics == set() and hub.topic_count == 0
        await hub.subscribe(session, TICK)  # a fresh upstream subscription, not the dead one
        await settle(lambda: len(sink.frames) == 3)
        return sink, upstream

    sink, upstream = asyncio.run(scenario())
    assert sink.frames[1] == {
        "type": "error",
        "topic": TICK.name,
        "error_code": "bad_symbol",
        "reason": "no such market",
    }
    assert sink.frames[2]["type"] == "subscribed" and len(upstream.opened) == 2
