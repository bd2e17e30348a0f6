"""What arrives on the SUB socket: routing to whoever waits, and per-topic sequence checks.

No sockets here: the transport hands frames to `Dispatcher.handle` on its
subscriber thread; the sequence checks (`SequenceTracker`, `backfill_start`)
are pure and also serve each live stream (mdclient.live).

ZeroMQ subscriptions are *prefix* matches: a SUB subscribed to
`RESPONSE:alice` also receives `RESPONSE:alice2`, and `...|ohlc:60` also
receives `...|ohlc:600`. So nothing is delivered on the subscription alone:
a notification must arrive on exactly the topic its waiter subscribed to and
carry a request_id that waiter registered; market data must arrive on exactly
the topic a live stream asked for, and so must a FeedStatus (`{ticker}|status`,
the stream then checks the period of a REFUSED); a CEP trigger event on exactly
a topic a trigger stream watches (which then checks the trigger id).

Every Tick, OHLC, notification and trigger event carries ``sequence`` (1, 2,
3, ... per topic) and ``publisher_epoch`` (one value per publisher start;
docs/protocol.md "Sequence numbers and recovery"). Per topic: the next number
is accepted, an older or equal one is a duplicate (a last value re-sent to a
new subscriber, a copy), a jump is a gap (messages lost on the way), another
epoch a restarted publisher (the numbering starts again: neither a gap nor a
replay). ``sequence`` 0 comes from a publisher that predates numbering and is
passed through unchecked. Here a duplicate notification or trigger event is
dropped (`stats["duplicate"]`), a gap is logged at WARNING and counted
(`stats["lost"]`): a history call recovers its notification from the requests
table, a lost trigger event is only reported. Live data is checked per stream.
"""

from __future__ import annotations

import enum
import logging
import queue
import threading
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Literal

from google.protobuf.message import Message

from mdproto import ProtocolError, envelope, topics
from mdproto.messages import (
    OHLC,
    BookDelta,
    BookSnapshot,
    CEPTriggerEvent,
    ExchangeServing,
    FeedStatus,
    HistoryReadyNotification,
    PipelineStatus,
    Tick,
)

log = logging.getLogger(__name__)

#: What a history call's waiter receives: its notification, or a word on what serves it.
Waited = HistoryReadyNotification | PipelineStatus | ExchangeServing

MarketSink = Callable[[Message], None]
EventSink = Callable[[str, CEPTriggerEvent], None]
#: Every message on exactly one topic, whatever its type (Client.watch).
TopicSink = Callable[[str, Message], None]


# --- sequence checks (pure) ---


class Verdict(enum.Enum):
    FIRST = "first"  # the topic's first message: the baseline
    NEXT = "next"
    DUPLICATE = "duplicate"
    GAP = "gap"
    RESTART = "restart"  # another publisher epoch
    UNSEQUENCED = "unsequenced"


@dataclass(frozen=True, slots=True)
class Check:
    verdict: Verdict
    missed: int = 0  # GAP: how many numbers were skipped

    @property
    def deliver(self) -> bool:
        return self.verdict is not Verdict.DUPLICATE


_FIRST = Check(Verdict.FIRST)
_NEXT = Check(Verdict.NEXT)
_DUPLICATE = Check(Verdict.DUPLICATE)
_RESTART = Check(Verdict.RESTART)
_UNSEQUENCED = Check(Verdict.UNSEQUENCED)


class SequenceTracker:
    """The last (epoch, sequence) seen per topic key."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: dict[Hashable, tuple[int, int]] = {}

    def check(self, key: Hashable, epoch: int, sequence: int) -> Check:
        if sequence == 0:
            return _UNSEQUENCED
        last = self._last.get(key)
        if last is None:
            self._last[key] = (epoch, sequence)
            return _FIRST
        last_epoch, last_sequence = last
        if epoch != last_epoch:
            self._last[key] = (epoch, sequence)
            return _RESTART
        if sequence <= last_sequence:
            return _DUPLICATE
        self._last[key] = (epoch, sequence)
        if sequence == last_sequence + 1:
            return _NEXT
        return Check(Verdict.GAP, sequence - last_sequence - 1)

    def forget(self, key: Hashable) -> None:
        self._last.pop(key, None)


SequenceKind = Literal["gap", "restart", "recovered", "recovery_failed", "overflow"]


@dataclass(frozen=True, slots=True)
class SequenceEvent:
    """What a live stream reports about a topic's sequence (`on_sequence`, or the log).

    gap: `missed` messages were lost (ticks stay lost live: they are in the
    ``ticks`` table); restart: the publisher restarted; recovered: the closed
    candles of the gap were read from Iceberg and delivered (`candles` of them);
    recovery_failed: that read failed (`reason`); overflow: the consumer fell so far
    behind that a closed candle left the full queue unread (`missed`).
    """

    topic: str
    kind: SequenceKind
    missed: int = 0
    candles: int = 0
    reason: str = ""

    def describe(self) -> str:
        if self.kind == "gap":
            return f"{self.topic}: {self.missed} message(s) lost (sequence gap)"
        if self.kind == "restart":
            return f"{self.topic}: the publisher restarted (new epoch)"
        if self.kind == "recovered":
            return f"{self.topic}: recovered, {self.candles} closed candle(s) read from Iceberg"
        if self.kind == "overflow":
            return (
                f"{self.topic}: {self.missed} closed candle(s) dropped unread: the consumer "
                "fell behind a full queue (read them from Iceberg)"
            )
        return f"{self.topic}: recovery failed: {self.reason}"


def backfill_start(closed_upto_ms: int | None, first_open_ms: int, period_seconds: int) -> int:
    """The first open time whose closed candle a gap may have swallowed.

    After the newest closed candle delivered before the gap, or from the first
    candle the stream saw when none closed yet; the read runs to now. A window's
    closed candle is stored ~2-3 s after it is published, so a read that waits for that
    (`live_recovery_delay_s`) finds each lost one.
    """
    return first_open_ms if closed_upto_ms is None else closed_upto_ms + period_seconds * 1000


# --- routing ---


class NotificationWaiter:
    """Notifications for one history call, from any of its attempts, and what
    `PIPELINE:status` and the exchange's `INGESTORS:{exchange}|status` say meanwhile
    (mdclient.history decides what it means)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Waited] = queue.SimpleQueue()

    def put(self, notification: Waited) -> None:
        self._queue.put(notification)

    def wait(self, timeout_s: float) -> Waited | None:
        try:
            return self._queue.get(timeout=max(0.0, timeout_s))
        except queue.Empty:
            return None


class Dispatcher:
    """Thread-safe routing table; `handle` runs on the subscriber thread."""

    def __init__(self, *, max_payload: int = envelope.DEFAULT_MAX_PAYLOAD) -> None:
        self._max_payload = max_payload
        self._lock = threading.Lock()
        self._waiters: dict[str, tuple[str, NotificationWaiter]] = {}
        self._sinks: dict[str, list[MarketSink]] = {}
        self._event_sinks: dict[str, list[EventSink]] = {}
        self._topic_sinks: dict[str, list[TopicSink]] = {}
        #: received, bad_frames, unclaimed_notification, unrouted_market, ignored,
        #: duplicate, lost (notifications and trigger events)
        self.stats: Counter[str] = Counter()
        self._sequences = SequenceTracker()  # subscriber thread only

    def expect(self, request_id: str, topic: str, waiter: NotificationWaiter) -> None:
        """Deliver `request_id`'s notification, if it arrives on `topic`, to `waiter`."""
        with self._lock:
            self._waiters[request_id] = (topic, waiter)

    def forget(self, request_id: str) -> None:
        with self._lock:
            entry = self._waiters.pop(request_id, None)
        if entry is not None and entry[0] == topics.history_ready_topic(request_id):
            self._sequences.forget(entry[0])  # a topic of its own: never used again

    def add_sink(self, topic: str, sink: MarketSink) -> None:
        with self._lock:
            self._sinks.setdefault(topic, []).append(sink)

    def remove_sink(self, topic: str, sink: MarketSink) -> None:
        with self._lock:
            sinks = self._sinks.get(topic, [])
            if sink in sinks:
                sinks.remove(sink)
            if not sinks:
                self._sinks.pop(topic, None)

    def add_event_sink(self, topic: str, sink: EventSink) -> None:
        """CEPTriggerEvents arriving on exactly `topic` go to `sink` (which filters ids)."""
        with self._lock:
            self._event_sinks.setdefault(topic, []).append(sink)

    def remove_event_sink(self, topic: str, sink: EventSink) -> None:
        with self._lock:
            sinks = self._event_sinks.get(topic, [])
            if sink in sinks:
                sinks.remove(sink)
            if not sinks:
                self._event_sinks.pop(topic, None)

    def add_topic_sink(self, topic: str, sink: TopicSink) -> None:
        """Every message arriving on exactly `topic` also goes to `sink` (any type)."""
        with self._lock:
            self._topic_sinks.setdefault(topic, []).append(sink)

    def remove_topic_sink(self, topic: str, sink: TopicSink) -> None:
        with self._lock:
            sinks = self._topic_sinks.get(topic, [])
            if sink in sinks:
                sinks.remove(sink)
            if not sinks:
                self._topic_sinks.pop(topic, None)

    def handle(self, frames: Sequence[bytes]) -> None:
        self.stats["received"] += 1
        try:
            topic, message = envelope.decode_sub(frames, max_payload=self._max_payload)
        except ProtocolError as exc:
            self.stats["bad_frames"] += 1
            log.warning("dropped undecodable message: %s", exc)
            return
        if isinstance(message, HistoryReadyNotification | CEPTriggerEvent) and not self._fresh(
            topic, message
        ):
            return
        watched = topic in self._topic_sinks
        if watched:
            with self._lock:
                topic_sinks = list(self._topic_sinks.get(topic, ()))
            for topic_sink in topic_sinks:
                topic_sink(topic, message)
        if isinstance(message, HistoryReadyNotification):
            self._notify(topic, message)
        elif isinstance(message, Tick | OHLC | BookSnapshot | BookDelta | FeedStatus):
            with self._lock:
                sinks = list(self._sinks.get(topic, ()))
            if not sinks and not watched:
                self.stats["unrouted_market"] += 1
            for sink in sinks:
                sink(message)
        elif isinstance(message, CEPTriggerEvent) and topic in self._event_sinks:
            with self._lock:
                event_sinks = list(self._event_sinks.get(topic, ()))
            for event_sink in event_sinks:
                event_sink(topic, message)
        elif not watched:
            self.stats["ignored"] += 1
            log.debug("ignored %s on %s", message.DESCRIPTOR.name, topic)

    def _fresh(self, topic: str, message: HistoryReadyNotification | CEPTriggerEvent) -> bool:
        check = self._sequences.check(topic, message.publisher_epoch, message.sequence)
        if check.verdict is Verdict.DUPLICATE:
            self.stats["duplicate"] += 1
            return False
        if check.verdict is Verdict.GAP:
            self.stats["lost"] += check.missed
            log.warning(
                "%d message(s) lost on %s before this %s (sequence gap)",
                check.missed,
                topic,
                message.DESCRIPTOR.name,
            )
        return True

    def _notify(self, topic: str, notification: HistoryReadyNotification) -> None:
        with self._lock:
            entry = self._waiters.get(notification.request_id)
        if entry is None or entry[0] != topic:
            # Late (call already finished) or someone else's (prefix-matched topic).
            self.stats["unclaimed_notification"] += 1
            log.debug("unclaimed notification %s on %s", notification.request_id, topic)
            return
        entry[1].put(notification)
