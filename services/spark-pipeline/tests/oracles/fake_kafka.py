"""A scripted stand-in for the live engine's group consumer and producer: the engine's
loop (`live_engine._Run`) runs against it with no broker, rebalances included."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from confluent_kafka import TopicPartition

from mdproto import envelope
from mdproto.messages import OHLC, Tick


class Message:
    def __init__(self, topic: str, partition: int, offset: int, value: bytes, at_ms: int) -> None:
        self._topic, self._partition, self._offset = topic, partition, offset
        self._value, self._at_ms = value, at_ms

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return None

    def value(self) -> bytes:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return (1, self._at_ms)


@dataclass
class Assign:
    partitions: Sequence[int]


@dataclass
class Revoke:
    partitions: Sequence[int]


@dataclass
class Ticks:
    partition: int
    ticks: Sequence[Tick]


Step = Assign | Revoke | Ticks


@dataclass
class GroupConsumer:
    """Plays `script` one step per poll(), then sets `stop`. `log` holds the Kafka
    log of every partition (shared by consumers of one group), `seeks` each assignment
    with its offsets."""

    topic: str
    script: list[Step]
    stop: threading.Event
    log: dict[int, list[bytes]] = field(default_factory=dict)
    at_ms: int = 0
    seeks: list[list[tuple[int, int]]] = field(default_factory=list)
    positions: dict[int, int] = field(default_factory=dict)
    callbacks: dict[str, Any] = field(default_factory=dict)
    #: How many partitions the topic has (its metadata).
    partitions: int = 2

    #: Inside poll(): a rebalance callback runs.
    in_poll: bool = False
    #: The records of the step poll() played that it did not return.
    pending: list[Message] = field(default_factory=list)
    #: Each poll() and consume() as (call, timeout): how long the engine let Kafka wait.
    waits: list[tuple[str, float]] = field(default_factory=list)

    def list_topics(self, topic: str, timeout: float) -> Any:
        # confluent-kafka: list_topics() from a callback of poll() on the same handle
        # ends its call state, and the next callback aborts the process.
        assert not self.in_poll, "list_topics() called inside poll()"
        meta = SimpleNamespace(error=None, partitions=dict.fromkeys(range(self.partitions)))
        return SimpleNamespace(topics={topic: meta})

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        self.callbacks = callbacks

    def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
        return (0, len(self.log.get(tp.partition, [])))

    def assign(self, partitions: list[Any]) -> None:
        self.seeks.append([(tp.partition, tp.offset) for tp in partitions])
        for tp in partitions:
            self.positions[tp.partition] = tp.offset

    def poll(self, timeout: float) -> Message | None:
        """One step played; its first record, the rest kept for the consume() after."""
        self.waits.append(("poll", timeout))
        self.in_poll = True
        try:
            self.pending = self._consume()
        finally:
            self.in_poll = False
        return self.pending.pop(0) if self.pending else None

    def consume(self, n: int, timeout: float) -> list[Message]:
        """What the last step's poll() left (the engine polls, then consumes the rest)."""
        self.waits.append(("consume", timeout))
        taken, self.pending = self.pending[:n], self.pending[n:]
        return taken

    def _consume(self) -> list[Message]:
        if not self.script:
            self.stop.set()
            return []
        step = self.script.pop(0)
        if isinstance(step, Assign):
            tps = [TopicPartition(self.topic, p) for p in step.partitions]
            self.callbacks["on_assign"](self, tps)
            return []
        if isinstance(step, Revoke):
            self.callbacks["on_revoke"](
                self, [TopicPartition(self.topic, p) for p in step.partitions]
            )
            for p in step.partitions:
                self.positions.pop(p, None)
            return []
        log = self.log.setdefault(step.partition, [])
        log.extend(envelope.encode_record(t) for t in step.ticks)
        start = self.positions[step.partition]
        out = [
            Message(self.topic, step.partition, o, log[o], self.at_ms)
            for o in range(start, len(log))
        ]
        self.positions[step.partition] = len(log)
        return out


class Producer:
    """Acknowledges what it was given at every poll and flush, as Kafka would, unless
    `holding` (Kafka away): then flush reports them pending."""

    def __init__(self) -> None:
        self.produced: list[OHLC] = []
        self.holding = False
        self._unacknowledged: list[Any] = []

    def produce(self, topic: str, value: bytes, key: bytes, on_delivery: Any) -> None:
        self.produced.append(envelope.decode_record(value, OHLC))
        self._unacknowledged.append(on_delivery)

    def poll(self, timeout: float) -> int:
        if self.holding:
            return 0
        callbacks, self._unacknowledged = self._unacknowledged, []
        for callback in callbacks:
            callback(None, None)
        return len(callbacks)

    def flush(self, timeout: float) -> int:
        self.poll(timeout)
        return len(self._unacknowledged)
