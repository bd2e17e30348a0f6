"""Sequence numbers and last values of the pipeline's published topics (pure, no sockets).

Every message published on a topic carries ``sequence`` (1, 2, 3, ... per topic)
and ``publisher_epoch`` (one value per PUB server process start), so a
subscriber sees a gap (a drop at a high-water mark, a slow consumer) and tells a
restarted publisher from a replay (docs/protocol.md "Sequence numbers").
`LastValues` keeps the frames last sent on each market-data topic: the PUB
server re-sends them to a new subscription (zguide "last value cache"), and the
unchanged sequence lets existing subscribers drop the copy as a duplicate.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from google.protobuf.message import Message

from mdproto import topics

#: Topics whose last value is re-sent on subscription: market data only. A
#: notification or a trigger event re-sent to a late subscriber would be news.
_SNAPSHOT_SUFFIXES = (f"|{topics.TICK}", f"|{topics.OHLC}:")


def new_epoch() -> int:
    """The epoch of a publisher process: its start time in microseconds (unique
    per start, and later starts compare greater; clients only test equality)."""
    return time.time_ns() // 1000


def is_snapshot_topic(topic: str) -> bool:
    return topic.endswith(_SNAPSHOT_SUFFIXES[0]) or _SNAPSHOT_SUFFIXES[1] in topic


class Sequencer:
    """Per-topic counters of one publisher epoch. Not thread-safe: the caller holds
    the lock it sends under, so numbers follow the order on the wire."""

    __slots__ = ("counters", "epoch")

    def __init__(self, epoch: int | None = None) -> None:
        self.epoch = new_epoch() if epoch is None else epoch
        #: topic -> the next number (public for the tick loop, which inlines `stamp`).
        self.counters: dict[str, int] = {}

    def stamp(self, topic: str, message: Message) -> None:
        """Set the message's ``sequence`` and ``publisher_epoch`` (it must have both)."""
        n = self.counters.get(topic, 1)
        self.counters[topic] = n + 1
        message.sequence = n  # type: ignore[attr-defined]
        message.publisher_epoch = self.epoch  # type: ignore[attr-defined]

    def last(self, topic: str) -> int:
        """The last number given on `topic` (0: none yet)."""
        return self.counters.get(topic, 1) - 1


def sequenced(message: Message) -> bool:
    """Whether this message type carries sequence fields (Tick, OHLC, notifications, events)."""
    return "publisher_epoch" in message.DESCRIPTOR.fields_by_name


class LastValues:
    """The frames last published on each market-data topic."""

    __slots__ = ("frames",)

    def __init__(self) -> None:
        #: topic -> frames (public for the tick loop, which inlines `put`).
        self.frames: dict[str, list[bytes]] = {}

    def put(self, topic: str, frames: list[bytes]) -> None:
        if is_snapshot_topic(topic):
            self.frames[topic] = frames

    def matching(self, prefix: str) -> Iterator[list[bytes]]:
        """What a new subscription to `prefix` (a ZeroMQ prefix match) should receive."""
        exact = self.frames.get(prefix)
        if exact is not None:
            yield exact
        for topic, frames in list(self.frames.items()):
            if topic != prefix and topic.startswith(prefix):
                yield frames

    def __len__(self) -> int:
        return len(self.frames)
