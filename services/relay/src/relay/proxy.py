"""Market-data fan-out: XSUB <-> XPUB forwarded by libzmq's proxy on its own thread.

Data (pipeline -> clients) and subscriptions (clients -> pipeline) never pass
through Python. The relay still has to see subscriptions (live data starts on
a ticker's first subscriber), so the proxy gets a *capture* socket: an inproc
PUB that libzmq copies every forwarded frame to. Its only reader is a SUB
subscribed to b"\\x00" and b"\\x01", the first bytes of unsubscribe/subscribe
messages; data frames start with a topic ("BINANCE:...", "RESPONSE:...") and
are dropped by the capture PUB's own filter, inside libzmq. Python therefore
wakes up for subscription events only.

A steerable proxy also answers STATISTICS (frames and bytes each way, the
relay's forwarding metrics) and TERMINATE (clean shutdown) on its control
socket.
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
        if len(frames) != 8 or any(len(f) != 8 for f in frames):
            return None
        values = [struct.unpack("=Q", f)[0] for f in frames]
        # frontend (XSUB): msg in, bytes in, msg out, bytes out; then backend (XPUB).
        return cls(values[0], values[1], values[4], values[5])


def parse_subscription(frames: list[bytes]) -> tuple[bool, str] | None:
    """(subscribe?, topic) of a captured subscription event, else None.

    Subscription events are single frames; a multi-frame capture is data whose
    topic happens to start with 0x00/0x01 and is ignored.
    """
    if len(frames) != 1 or not frames[0]:
        return None
    frame = frames[0]
    if frame[:1] not in (SUBSCRIBE, UNSUBSCRIBE):
        return None
    return frame[:1] == SUBSCRIBE, frame[1:].decode("utf-8", errors="replace")


class MarketDataProxy:
    def __init__(self, ctx: Context, xsub: Socket, xpub: Socket) -> None:
        self._xsub = xsub
        self._xpub = xpub
        n = next(_ids)
        self._capture = ctx.socket(zmq.PUB)
        self._capture.linger = 0
        self._capture.sndhwm = 0  # never drop a subscription event: data is filtered out
        self._capture.bind(f"inproc://relay-capture-{n}")
        self.events: Socket = ctx.socket(zmq.SUB)
        self.events.linger = 0
        self.events.rcvhwm = 0
        self.events.connect(f"inproc://relay-capture-{n}")
        self.events.subscribe(SUBSCRIBE)
        self.events.subscribe(UNSUBSCRIBE)
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

    def _run(self) -> None:
        # Signals belong to the main thread, whose poll they must interrupt.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            zmq.proxy_steerable(self._xsub, self._xpub, self._capture, self._steer)
        except zmq.ContextTerminated:
            pass
        except Exception as exc:  # the loop reports it through health and logs
            self.error = exc
            log.exception("market-data proxy stopped")

    def request_stats(self) -> None:
        self.control.send(b"STATISTICS")

    def stop(self, timeout: float = 5.0) -> None:
        if self.alive:
            self.control.send(b"TERMINATE")
            self._thread.join(timeout)
        if self.alive:
            log.error("market-data proxy did not stop within %.1f s", timeout)

    def close(self) -> None:
        """Close the proxy's sockets (after stop: the thread must be gone)."""
        for sock in (self._capture, self.events, self._steer, self.control):
            sock.close()
