"""The pipeline's ZeroMQ PUB (port 5557): the only module that imports zmq.

Several streaming queries call `publish` from their own foreachBatch threads on
the driver; a ZeroMQ socket is not thread-safe, so sends are serialised by a lock
(a send is a memcpy into the socket's queue, so the lock is held for microseconds).
A PUB never blocks: past the high-water mark ZeroMQ drops silently, hence a
large ``sndhwm`` (live ticks at 10k/s must not be dropped during a relay hiccup).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

import zmq
from google.protobuf.message import Message

from mdproto import envelope

log = logging.getLogger(__name__)


class Publisher:
    """A bound PUB socket; frames come only from `mdproto.envelope.encode_pub`."""

    def __init__(self, endpoint: str, *, sndhwm: int = 100_000) -> None:
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._socket = self._ctx.socket(zmq.PUB)
        self._socket.setsockopt(zmq.SNDHWM, sndhwm)
        self._socket.setsockopt(zmq.LINGER, 1000)
        # Notice vanished peers (no FIN) so their queues are freed.
        self._socket.setsockopt(zmq.HEARTBEAT_IVL, 5000)
        self._socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, 15000)
        try:
            self._socket.bind(endpoint)
        except zmq.ZMQError as exc:
            self._socket.close(0)
            raise RuntimeError(f"cannot bind the pipeline PUB on {endpoint}: {exc}") from None
        last = self._socket.getsockopt(zmq.LAST_ENDPOINT)
        self.endpoint: str = last.decode() if isinstance(last, bytes) else str(last)
        self._lock = threading.Lock()
        self.sent = 0

    def publish(self, topic: str, message: Message) -> None:
        frames = envelope.encode_pub(topic, message)
        with self._lock:
            self._socket.send_multipart(frames)
            self.sent += 1

    def publish_many(self, items: Iterable[tuple[str, Message]]) -> int:
        """Encode outside the lock, then send the whole batch under it; returns the count."""
        frames = [envelope.encode_pub(topic, message) for topic, message in items]
        with self._lock:
            for f in frames:
                self._socket.send_multipart(f)
            self.sent += len(frames)
        return len(frames)

    def close(self) -> None:
        with self._lock:
            self._socket.close()
        log.info("PUB %s closed after %d messages", self.endpoint, self.sent)
