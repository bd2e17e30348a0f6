"""Routes what arrives on the SUB socket to whoever waits for it (no sockets here).

ZeroMQ subscriptions are *prefix* matches: a SUB subscribed to
`RESPONSE:alice` also receives `RESPONSE:alice2`, and `...|ohlc:60` also
receives `...|ohlc:600`. So nothing is delivered on the subscription alone:
a notification must arrive on exactly the topic its waiter subscribed to and
carry a request_id that waiter registered; market data must arrive on exactly
the topic a live stream asked for, and so must a FeedStatus (`{ticker}|status`,
the stream then checks the period of a REFUSED); a CEP trigger event on exactly
a topic a trigger stream watches (which then checks the trigger id).

Notifications and trigger events carry sequence numbers per topic too
(docs/protocol.md "Sequence numbers and recovery"): a duplicate is dropped
(`stats["duplicate"]`), a gap is logged at WARNING and counted
(`stats["lost"]`): a history call recovers its notification from the requests
table, a lost trigger event is only reported. Live data is checked per stream.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import Counter
from collections.abc import Callable, Sequence

from google.protobuf.message import Message

from mdclient.sequence import SequenceTracker, Verdict
from mdproto import ProtocolError, envelope, topics
from mdproto.messages import OHLC, CEPTriggerEvent, FeedStatus, HistoryReadyNotification, Tick

log = logging.getLogger(__name__)

MarketSink = Callable[[Message], None]
EventSink = Callable[[str, CEPTriggerEvent], None]
#: Every message on exactly one topic, whatever its type (Client.watch).
TopicSink = Callable[[str, Message], None]


class NotificationWaiter:
    """Notifications for one history call, from any of its attempts."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[HistoryReadyNotification] = queue.SimpleQueue()

    def put(self, notification: HistoryReadyNotification) -> None:
        self._queue.put(notification)

    def wait(self, timeout_s: float) -> HistoryReadyNotification | None:
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
        elif isinstance(message, Tick | OHLC | FeedStatus):  # statuses: `{ticker}|status`
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
