"""The relay's ZeroMQ sockets and their options, in one place.

| port (default) | socket | peers |
|---|---|---|
| 5559 | ROUTER bind | clients (REQ or DEALER) |
| 5555 | XPUB bind (verbose subs) | ingestors' SUB: work |
| 5556 | ROUTER bind | ingestors' DEALER: legacy DataResponse |
| 5560 | XPUB bind (verbose subs) | ingestors' SUB: control |
| 5558 | XPUB bind | clients' SUB: market data fan-out |
| 5557 | XSUB connect | pipeline PUB |
| 5557 | SUB connect | pipeline PUB: its heartbeat only |

The client sockets (:5559, :5558) take CURVE server options when the relay has
keys (relay/curve.py); they are set here, before bind and before the XPUB moves
to the proxy thread. The ingestor and pipeline sockets stay NULL (internal).

The work and control sockets are XPUBs rather than plain PUBs (same wire
behaviour for SUB peers) so the relay sees ingestors subscribe: it announces
live tickers to a joining ingestor at once and exposes who is listening.

Market-data fan-out (`MarketDataProxy`, end of module): XSUB <-> XPUB forwarded
by libzmq's proxy on its own thread, so data and subscriptions never pass
through Python. The relay sees subscription edges through a *tap*, an inproc
XPUB the XSUB also connects to (it receives every subscription). The relay's
own messages to clients (FeedStatus on `{ticker}|status`) are published on the
tap: the XSUB reads them like the pipeline's data, so they join the proxied
stream and the XPUB's subscription filtering applies, while the proxy thread
stays the only user of the XPUB. A steerable proxy answers STATISTICS and
TERMINATE. Why a tap and not a capture socket: docs/adr/0001.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import signal
import socket
import struct
import threading
from dataclasses import dataclass

import zmq

from mdproto.runtime.zmq_frames import recv_frames
from relay import curve
from relay.config import RelaySettings

log = logging.getLogger(__name__)

Socket = zmq.Socket[bytes]
Context = zmq.Context[Socket]


@dataclass(frozen=True, slots=True)
class Endpoints:
    """Where the relay actually listens (ports resolved when configured as 0)."""

    client_request: str
    ingestor_work: str
    ingestor_response: str
    ingestor_control: str
    market_data: str
    upstream: str  # what the XSUB connects to: the pipeline PUB and/or parent relays, ", "-joined
    engines: str = ""  # where extra live engines' XPUBs connect to the XSUB ("": not bound)


def _common(sock: Socket, s: RelaySettings) -> None:
    sock.linger = 0
    if s.heartbeat_ivl_ms:
        sock.setsockopt(zmq.HEARTBEAT_IVL, s.heartbeat_ivl_ms)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, s.heartbeat_timeout_ms)
        sock.setsockopt(zmq.HEARTBEAT_TTL, s.heartbeat_ttl_ms)


def bind(sock: Socket, s: RelaySettings, port: int) -> str:
    """Bind and return the resolved endpoint (an ephemeral port read back)."""
    sock.bind(s.endpoint(port))
    endpoint = sock.getsockopt(zmq.LAST_ENDPOINT)
    assert isinstance(endpoint, bytes)
    return endpoint.decode()


def client_router(ctx: Context, s: RelaySettings, keys: curve.ServerKeys | None = None) -> Socket:
    """:5559. ROUTER_MANDATORY turns an unroutable or full reply into an error we count."""
    sock = ctx.socket(zmq.ROUTER)
    _common(sock, s)
    if keys is not None:
        curve.apply_server(sock, keys, curve.REQUESTS)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.MAXMSGSIZE, s.max_message_size)
    sock.sndhwm = s.high_water_mark
    sock.rcvhwm = s.high_water_mark
    return sock


def response_router(ctx: Context, s: RelaySettings) -> Socket:
    """:5556, legacy DataResponses from ingestor DEALERs."""
    sock = ctx.socket(zmq.ROUTER)
    _common(sock, s)
    sock.setsockopt(zmq.MAXMSGSIZE, s.ingestor_max_message_size)
    sock.rcvhwm = s.high_water_mark
    return sock


def ingestor_xpub(ctx: Context, s: RelaySettings) -> Socket:
    """:5555 work / :5560 control. XPUB_VERBOSE: every ingestor's subscribe reaches us."""
    sock = ctx.socket(zmq.XPUB)
    _common(sock, s)
    sock.setsockopt(zmq.XPUB_VERBOSE, 1)
    sock.sndhwm = s.high_water_mark
    return sock


def market_xpub(ctx: Context, s: RelaySettings, keys: curve.ServerKeys | None = None) -> Socket:
    """:5558. Non-verbose on purpose: it passes up topic edges (first sub, last unsub)."""
    sock = ctx.socket(zmq.XPUB)
    _common(sock, s)
    if keys is not None:
        curve.apply_server(sock, keys, curve.MARKET_DATA)
    sock.sndhwm = s.high_water_mark
    sock.rcvhwm = s.high_water_mark
    return sock


def upstream_xsub(ctx: Context, s: RelaySettings) -> Socket:
    """XSUB -> pipeline PUB. Survives upstream restarts with all its subscriptions:
    heartbeats notice a peer that vanished without FIN, reconnect options bound the
    retry delay, and a large SNDHWM lets libzmq resend every subscription on
    reconnect (it drops those beyond SNDHWM, libzmq #2258)."""
    sock = ctx.socket(zmq.XSUB)
    _common(sock, s)
    sock.rcvhwm = s.high_water_mark
    sock.sndhwm = s.upstream_subscription_hwm
    sock.setsockopt(zmq.RECONNECT_IVL, s.upstream_reconnect_ivl_ms)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, s.upstream_reconnect_ivl_max_ms)
    if s.upstream_curve_secret_key_file:  # parent relays with CURVE on their :5558
        curve.apply_client(sock, s.upstream_curve_secret_key_file, s.upstream_curve_server_key_file)
    return sock  # the caller attaches its monitor, then connects


def pipeline_status_sub(ctx: Context, s: RelaySettings, topic: str) -> Socket:
    """SUB -> the same upstreams as the XSUB, for the pipeline's heartbeat alone
    (relay/pipeline_status.py): the proxy thread keeps the data path out of Python."""
    sock = ctx.socket(zmq.SUB)
    _common(sock, s)
    sock.setsockopt(zmq.RECONNECT_IVL, s.upstream_reconnect_ivl_ms)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, s.upstream_reconnect_ivl_max_ms)
    if s.upstream_curve_secret_key_file:
        curve.apply_client(sock, s.upstream_curve_secret_key_file, s.upstream_curve_server_key_file)
    sock.subscribe(topic.encode())
    return sock  # the caller connects it


# Plain ints: pyzmq's enum arithmetic per call costs more than the libzmq call on the
# request path (bench/relay_submit.py); sends and receives: mdproto.runtime.zmq_frames.
_POLLIN = int(zmq.POLLIN)


def recv_batch(sock: Socket, limit: int) -> list[list[bytes]]:
    """The messages waiting on `sock`, at most `limit` (so no socket starves the rest).

    After each one a zero-timeout poll says whether another waits: cheaper than the
    zmq.Again a further recv would raise, and than getsockopt(EVENTS) (pyzmq looks
    every option up in an IntEnum first, a third of the cost of a recv)."""
    batch: list[list[bytes]] = []
    ready = [(sock, _POLLIN)]
    while len(batch) < limit:
        frames = recv_frames(sock)
        if frames is None:
            break
        batch.append(frames)
        if not zmq.zmq_poll(ready, 0):
            break
    return batch


def monitor_event(frames: list[bytes]) -> int | None:
    """The event id of a socket-monitor message, None if it is malformed."""
    if len(frames) != 2 or len(frames[0]) != 6:
        return None
    event_id, _value = struct.unpack("=Hi", frames[0])
    return int(event_id)


class WakeupSocket:
    """A socketpair the loop polls, so other threads (and signal handlers) can wake it."""

    def __init__(self) -> None:
        self._r, self._w = socket.socketpair()
        self._r.setblocking(False)
        self._w.setblocking(False)

    def fileno(self) -> int:
        return self._r.fileno()

    def write_fileno(self) -> int:
        return self._w.fileno()

    def wake(self) -> None:
        # Full (a wakeup is pending anyway) or closed at shutdown: nothing to do.
        with contextlib.suppress(BlockingIOError, OSError):
            self._w.send(b"\x00")

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            while self._r.recv(4096):
                pass

    def close(self) -> None:
        self._r.close()
        self._w.close()


# --- market-data fan-out: the proxy thread and the subscription tap ---------------

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
