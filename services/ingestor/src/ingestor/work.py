"""ZeroMQ edges: the only module that imports zmq.

- `WorkIntake`: SUB to the relay's work PUB (:5555), one subscription per
  served exchange prefix (`BINANCE:`), and SUB to its control PUB (:5560).
  Frames are decoded with `mdproto.envelope.decode_sub`; anything malformed is
  logged and counted, never fatal.
- `LegacyResponder`: DEALER to the relay's ROUTER (:5556) for `DataResponse`s,
  and `send`/`post` for any other message to the relay (IngestorStatus, FeedStatus).

Several relays (active/active, docs/protocol.md "Failover and chaining"): the
SUBs connect to all of them (a request published by both arrives twice; the app
drops a repeated request_id), and every message to the relays goes to each one
over a DEALER of its own (one DEALER would round-robin between them).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import zmq
import zmq.asyncio
from google.protobuf.message import Message

from mdproto import ProtocolError, envelope
from mdproto.error_codes import UNEXPECTED_TYPE
from mdproto.messages import DataRequest, IngestorControl

log = logging.getLogger(__name__)
M = TypeVar("M", DataRequest, IngestorControl)


@dataclass
class IntakeStats:
    requests: int = 0
    controls: int = 0
    malformed: int = 0


def _tune(sock: zmq.asyncio.Socket, heartbeat_ivl_ms: int) -> None:
    """Heartbeats let a SUB notice a relay that vanished without FIN, and reconnect."""
    sock.setsockopt(zmq.LINGER, 0)
    if heartbeat_ivl_ms > 0:
        sock.setsockopt(zmq.HEARTBEAT_IVL, heartbeat_ivl_ms)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, heartbeat_ivl_ms * 3)
        sock.setsockopt(zmq.HEARTBEAT_TTL, heartbeat_ivl_ms * 3)
    sock.setsockopt(zmq.RECONNECT_IVL, 200)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 5000)


class WorkIntake:
    def __init__(
        self,
        context: zmq.asyncio.Context,
        work_endpoint: str | Sequence[str],
        control_endpoint: str | Sequence[str],
        prefixes: Sequence[str],
        *,
        max_payload: int,
        heartbeat_ivl_ms: int,
    ) -> None:
        self._prefixes = tuple(prefixes)
        self._max_payload = max_payload
        self.stats = IntakeStats()
        self._work = context.socket(zmq.SUB)
        self._control = context.socket(zmq.SUB)
        for sock in (self._work, self._control):
            _tune(sock, heartbeat_ivl_ms)
        for endpoint in _listed(work_endpoint):
            self._work.connect(endpoint)
        for prefix in self._prefixes:
            self._work.setsockopt(zmq.SUBSCRIBE, prefix.encode())
        for endpoint in _listed(control_endpoint):
            self._control.connect(endpoint)
        # Control topics are an exchange prefix or empty; a prefix subscription
        # cannot express "exactly empty", so take all and filter below.
        self._control.setsockopt(zmq.SUBSCRIBE, b"")

    async def run(
        self,
        on_request: Callable[[DataRequest], None],
        on_control: Callable[[IngestorControl], None],
    ) -> None:
        """Dispatch work until cancelled. Handlers must not block (they start tasks)."""
        poller = zmq.asyncio.Poller()
        poller.register(self._work, zmq.POLLIN)
        poller.register(self._control, zmq.POLLIN)
        while True:
            for sock, _ in await poller.poll():
                frames = await sock.recv_multipart()
                if sock is self._work:
                    self._on_work(frames, on_request)
                else:
                    self._on_control(frames, on_control)

    def _on_work(self, frames: list[bytes], handler: Callable[[DataRequest], None]) -> None:
        try:
            topic, message = envelope.decode_sub(frames, max_payload=self._max_payload)
            if not isinstance(message, DataRequest):
                raise ProtocolError(
                    UNEXPECTED_TYPE,
                    f"work channel carries DataRequest, got {type(message).__name__}",
                )
        except ProtocolError as exc:
            self.stats.malformed += 1
            log.warning("malformed work ignored (%s): %s", exc.code, exc.reason)
            return
        self.stats.requests += 1
        self._dispatch(handler, message, topic)

    def _on_control(self, frames: list[bytes], handler: Callable[[IngestorControl], None]) -> None:
        try:
            topic, message = envelope.decode_sub(frames, max_payload=self._max_payload)
            if not isinstance(message, IngestorControl):
                got = type(message).__name__
                raise ProtocolError(
                    UNEXPECTED_TYPE, f"control channel carries IngestorControl, got {got}"
                )
        except ProtocolError as exc:
            self.stats.malformed += 1
            log.warning("malformed control message ignored (%s): %s", exc.code, exc.reason)
            return
        if topic and not topic.startswith(self._prefixes):
            return  # another exchange's control message
        self.stats.controls += 1
        self._dispatch(handler, message, topic)

    def _dispatch(self, handler: Callable[[M], None], message: M, topic: str) -> None:
        try:
            handler(message)
        except Exception:
            log.exception("handling a message on topic %r failed", topic)

    def close(self) -> None:
        self._work.close(0)
        self._control.close(0)


def _listed(endpoint: str | Sequence[str]) -> list[str]:
    return [endpoint] if isinstance(endpoint, str) else list(endpoint)


class LegacyResponder:
    """DEALER -> relay ROUTER :5556, one per relay. Sends the bare envelope (no delimiter).

    With several relays a message goes to every relay that can take it at once
    (ZMQ_IMMEDIATE: nothing queues for a relay that is down); only when none can
    does `send` wait, for the first ones that can, up to its timeout.
    """

    def __init__(
        self,
        context: zmq.asyncio.Context,
        endpoint: str | Sequence[str],
        identity: str,
        heartbeat_ivl_ms: int,
    ) -> None:
        endpoints = _listed(endpoint)
        self._sockets: list[zmq.asyncio.Socket] = []
        for address in endpoints:
            sock = context.socket(zmq.DEALER)
            _tune(sock, heartbeat_ivl_ms)
            sock.setsockopt(zmq.ROUTING_ID, identity.encode()[:255] or b"ingestor")
            sock.setsockopt(zmq.SNDHWM, 1000)
            if len(endpoints) > 1:
                sock.setsockopt(zmq.IMMEDIATE, 1)
            sock.connect(address)
            self._sockets.append(sock)
        self._lock = asyncio.Lock()
        # Same sockets, used synchronously: `post` never waits (one event-loop thread).
        self._now: list[zmq.Socket[bytes]] = [
            zmq.Socket.shadow(s.underlying) for s in self._sockets
        ]

    async def send(self, message: Message, timeout_s: float = 10.0) -> bool:
        """Send one message; False if no relay could take it in time."""
        frames = envelope.encode(message)
        async with self._lock:
            if self._post(frames):
                return True
            sends = [asyncio.ensure_future(s.send_multipart(frames)) for s in self._sockets]
            try:
                done, _ = await asyncio.wait(
                    sends, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                for send in sends:  # a late send would reach a relay out of order
                    send.cancel()
        if not any(send.exception() is None for send in done):
            what = getattr(message, "request_id", "") or ""
            log.error("%s %s not sent: relay unreachable", type(message).__name__, what)
            return False
        return True

    def post(self, message: Message) -> bool:
        """Queue one message for the relays without waiting; False (logged) if none took it."""
        if self._post(envelope.encode(message)):
            return True
        log.warning("%s to the relay dropped: queue full", message.DESCRIPTOR.name)
        return False

    def _post(self, frames: list[bytes]) -> bool:
        taken = False
        for sock in self._now:
            try:
                sock.send_multipart(frames, zmq.NOBLOCK)
                taken = True
            except zmq.Again:
                continue
        return taken

    def close(self) -> None:
        for sock in self._sockets:
            sock.close(0)


def new_context() -> zmq.asyncio.Context:
    return zmq.asyncio.Context()
