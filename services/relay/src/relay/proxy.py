"""Market-data fan-out: XSUB <-> XPUB forwarded by libzmq's proxy on its own thread.

Data and subscriptions never pass through Python; the relay sees subscription
edges through a *tap*, an inproc XPUB the XSUB also connects to (it receives
every subscription). The relay's own messages to clients (FeedStatus on
`{ticker}|status`) are published on the tap: the XSUB reads them like the
pipeline's data, so they join the proxied stream and the XPUB's subscription
filtering applies, while the proxy thread stays the only user of the XPUB.
A steerable proxy answers STATISTICS and TERMINATE. Why a tap and not a capture
socket: docs/adr/0001.
"""

from __future__ import annotations

import itertools
import logging
import signal
import struct
import threading
from dataclasses import dataclass

import zmq

from relay.sockets import Context, Socket

log = logging.getLogger(__name__)

SUBSCRIBE = b"\x01"
UNSUBSCRIBE = b"\x00"
_ids = itertools.count()


@dataclass(frozen=True, slots=True)
class ProxyStats:
    """Cumulative frame and byte counts from libzmq's proxy (STATISTICS).

    Downstream = pipeline -> clients (received on the XSUB); upstream =
    subscriptions clients -> pipeline (received on the XPUB). A data message
    is three frames (topic, version, type+payload).
    """

    downstream_frames: int = 0
    downstream_bytes: int = 0
    upstream_frames: int = 0
    upstream_bytes: int = 0

    @classmethod
    def parse(cls, frames: list[bytes]) -> ProxyStats | None:
        """None for anything but a STATISTICS reply (PAUSE/RESUME answer b"")."""
        if len(frames) != 8 or any(len(f) != 8 for f in frames):
            return None
        values = [struct.unpack("=Q", f)[0] for f in frames]
        # frontend (XSUB): msg in, bytes in, msg out, bytes out; then backend (XPUB).
        return cls(values[0], values[1], values[4], values[5])


def parse_subscription(frames: list[bytes]) -> tuple[bool, str] | None:
    """(subscribe?, topic) of a subscription message, else None.

    Subscription messages are single frames starting with 0x01 (subscribe) or
    0x00 (unsubscribe); anything else is ignored.
    """
    if len(frames) != 1 or not frames[0]:
        return None
    frame = frames[0]
    if frame[:1] not in (SUBSCRIBE, UNSUBSCRIBE):
        return None
    return frame[:1] == SUBSCRIBE, frame[1:].decode("utf-8", errors="replace")


class MarketDataProxy:
    """Owns the proxy thread; `events` (the tap) and `control` belong to the caller's thread.

    Construct it in the thread that created `xsub` and `xpub`, before either is
    connected to a peer with subscriptions, so the tap sees them all.
    """

    def __init__(self, ctx: Context, xsub: Socket, xpub: Socket) -> None:
        self._xsub = xsub
        self._xpub = xpub
        n = next(_ids)
        self.events: Socket = ctx.socket(zmq.XPUB)
        self.events.linger = 0
        self.events.rcvhwm = 0  # never drop a subscription event
        self.events.bind(f"inproc://relay-subscriptions-{n}")
        xsub.connect(f"inproc://relay-subscriptions-{n}")
        self._steer = ctx.socket(zmq.PAIR)  # proxy side
        self._steer.linger = 0
        self._steer.bind(f"inproc://relay-control-{n}")
        self.control: Socket = ctx.socket(zmq.PAIR)  # our side: STATISTICS replies arrive here
        self.control.linger = 0
        self.control.connect(f"inproc://relay-control-{n}")
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="relay-proxy", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def thread_id(self) -> int | None:
        return self._thread.ident

    def _run(self) -> None:
        # Signals belong to the main thread, whose poll they must interrupt.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            zmq.proxy_steerable(self._xsub, self._xpub, None, self._steer)
        except zmq.ContextTerminated:
            pass
        except Exception as exc:  # the loop reports it through health and logs
            self.error = exc
            log.exception("market-data proxy stopped")

    def publish(self, frames: list[bytes]) -> bool:
        """Send a message into the market-data stream (caller's thread); False if dropped.

        Only topics some client subscribes to pass the tap's filter (the XSUB
        forwards every subscription to it), like data from the pipeline.
        """
        try:
            self.events.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def request_stats(self) -> None:
        self.control.send(b"STATISTICS")

    def stop(self, timeout: float = 5.0) -> None:
        if self.alive:
            self.control.send(b"TERMINATE")
            self._thread.join(timeout)
        if self.alive:
            log.error("market-data proxy did not stop within %.1f s", timeout)
