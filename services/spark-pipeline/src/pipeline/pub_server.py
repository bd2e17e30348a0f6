"""The pipeline's ZeroMQ PUB (port 5557), in a process of its own: the only zmq module.

Driver threads PUSH over ipc to this process, whose C proxy forwards to the PUB;
the tick publisher thread PUSHes over inproc. A process, so tick publication
never waits for the driver's GIL (docs/adr/0002). The PUB drops past its HWM,
hence a large ``sndhwm``; the driver's PUSH blocks instead (up to 10 s, then
raises): a notification is never dropped on our side.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing as mp
import os
import signal
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zmq
from google.protobuf.message import Message

from mdproto import envelope
from pipeline.config import Settings

if TYPE_CHECKING:
    from pipeline.tick_publisher import TickPublisher

log = logging.getLogger(__name__)

SEND_TIMEOUT_MS = 10_000
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ServerConfig:
    """What the server process needs (pickled to it)."""

    pub_endpoint: str
    pull_endpoint: str
    sndhwm: int
    niceness: int
    parent_pid: int
    #: None: no tick relay (live path off, or ``live.publisher: spark``).
    relay_settings: Settings | None


class PubServer:
    """The process that owns the PUB. `start` returns once it is bound (and, with a tick
    relay, once the relay has its Kafka partitions)."""

    def __init__(self, settings: Settings) -> None:
        relay = settings.live.enabled and settings.live.publisher == "kafka"
        self._dir = Path(tempfile.mkdtemp(prefix="pipeline-pub-"))
        self._config = ServerConfig(
            pub_endpoint=settings.pub_endpoint,
            pull_endpoint=f"ipc://{self._dir / 'pull.sock'}",
            sndhwm=settings.pub_sndhwm,
            niceness=settings.live.relay_niceness if settings.live.enabled else 0,
            relay_settings=settings if relay else None,
            parent_pid=os.getpid(),
        )
        self._conn: Connection | None = None
        self._process: Any = None
        self._started = False
        self.endpoint = ""

    @property
    def pull_endpoint(self) -> str:
        return self._config.pull_endpoint

    def start(self, timeout_s: float = 90.0) -> str:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self._process = ctx.Process(
            target=_serve, args=(self._config, child), name="pipeline-pub", daemon=True
        )
        self._process.start()
        self._started = True
        child.close()
        self._conn = parent
        bound = self._receive(timeout_s)
        if "error" in bound:
            raise RuntimeError(bound["error"])
        self.endpoint = str(bound["endpoint"])
        if self._config.relay_settings is not None:
            assigned = self._receive(timeout_s)
            if "error" in assigned:
                raise RuntimeError(assigned["error"])
        return self.endpoint

    def _receive(self, timeout_s: float) -> dict[str, Any]:
        assert self._conn is not None
        if not self._conn.poll(timeout_s):
            self.stop()
            raise RuntimeError(f"the PUB server did not report within {timeout_s} s")
        message: dict[str, Any] = self._conn.recv()
        return message

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    @property
    def exitcode(self) -> int | None:
        return None if self._process is None else self._process.exitcode

    def stop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.send("stop")
        if self._process is not None and self._started:
            self._process.join(15)
            if self._process.is_alive():
                self._process.kill()
                self._process.join(5)
        with contextlib.suppress(OSError):
            (self._dir / "pull.sock").unlink(missing_ok=True)
            self._dir.rmdir()


class Publisher:
    """The driver's side: encodes with `mdproto.envelope` and hands frames to the server.

    Called from several foreachBatch threads: sends are serialised by a lock (a
    ZeroMQ socket is not thread-safe; a send is a memcpy into its queue).
    """

    def __init__(self, pull_endpoint: str, public_endpoint: str) -> None:
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._socket = self._ctx.socket(zmq.PUSH)
        self._socket.setsockopt(zmq.SNDHWM, 100_000)
        self._socket.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
        self._socket.setsockopt(zmq.LINGER, 2000)
        self._socket.connect(pull_endpoint)
        #: Where subscribers connect (the server's bound PUB).
        self.endpoint = public_endpoint
        self._lock = threading.Lock()
        self.sent = 0

    def publish(self, topic: str, message: Message) -> None:
        self.publish_many([(topic, message)])

    def publish_many(self, items: Iterable[tuple[str, Message]]) -> int:
        """Encode outside the lock, then send the whole batch under it; returns the count."""
        frames = [envelope.encode_pub(topic, message) for topic, message in items]
        with self._lock:
            for f in frames:
                try:
                    self._socket.send_multipart(f)
                except zmq.Again:
                    raise RuntimeError(
                        f"the PUB server took no message for {SEND_TIMEOUT_MS} ms"
                    ) from None
            self.sent += len(frames)
        return len(frames)

    def close(self) -> None:
        with self._lock:
            self._socket.close()
            self._ctx.term()
        log.info("publisher closed after %d messages (PUB %s)", self.sent, self.endpoint)


# -- the server process ----------------------------------------------------------------


def _serve(config: ServerConfig, conn: Connection) -> None:
    """Entry point of the PUB server process (spawned: imports are fresh).

    Prepare the process, bind the PUB (report its endpoint, or the error and end),
    bind the PULL, forward PULL -> PUB, start the tick publisher (report once it
    has its partitions), wait for the driver's stop, shut down.
    """
    _prepare_process(config)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pub = _pub_socket(ctx, config.sndhwm)
    try:
        pub.bind(config.pub_endpoint)
    except zmq.ZMQError as exc:
        conn.send({"error": f"cannot bind the pipeline PUB on {config.pub_endpoint}: {exc}"})
        return
    pull = _bind_pull(ctx, config.pull_endpoint)
    conn.send({"endpoint": _last_endpoint(pub)})
    forwarder = _start_forwarder(ctx, pull, pub)
    ticks = None
    if config.relay_settings is not None:
        ticks = _start_tick_publisher(ctx, config.relay_settings)
        conn.send(_assignment(ticks))
    _wait_for_stop(conn, ticks)
    _shut_down(ctx, forwarder, ticks)


def _prepare_process(config: ServerConfig) -> None:
    """Logging, death with the driver, SIGINT ignored (the driver decides), niceness."""
    logging.basicConfig(
        level=os.environ.get("LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    _die_with_parent(config.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver decides when we stop
    if config.niceness:
        # Before any thread exists: ZeroMQ's and librdkafka's threads inherit it.
        try:
            os.setpriority(os.PRIO_PROCESS, 0, config.niceness)
        except OSError as exc:
            log.warning("PUB server keeps normal priority (nice %d: %s)", config.niceness, exc)


def _pub_socket(ctx: zmq.Context[zmq.Socket[bytes]], sndhwm: int) -> zmq.Socket[bytes]:
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, sndhwm)
    pub.setsockopt(zmq.LINGER, 1000)
    # Notice vanished peers (no FIN) so their queues are freed.
    pub.setsockopt(zmq.HEARTBEAT_IVL, 5000)
    pub.setsockopt(zmq.HEARTBEAT_TIMEOUT, 15000)
    return pub


def _bind_pull(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> zmq.Socket[bytes]:
    """The driver's ipc endpoint and the tick publisher's inproc one, both unbounded."""
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.RCVHWM, 0)
    pull.bind(endpoint)
    pull.bind("inproc://ticks")
    return pull


def _last_endpoint(socket: zmq.Socket[bytes]) -> str:
    """The bound address (a ``*`` port resolved)."""
    last = socket.getsockopt(zmq.LAST_ENDPOINT)
    return last.decode() if isinstance(last, bytes) else str(last)


def _start_forwarder(
    ctx: zmq.Context[zmq.Socket[bytes]], pull: zmq.Socket[bytes], pub: zmq.Socket[bytes]
) -> threading.Thread:
    forwarder = threading.Thread(
        target=_forward, args=(ctx, pull, pub), name="pub-forward", daemon=True
    )
    forwarder.start()
    return forwarder


def _start_tick_publisher(ctx: zmq.Context[zmq.Socket[bytes]], settings: Settings) -> TickPublisher:
    """Kafka ticks -> inproc PUSH -> the forwarder (imported here: Kafka only when used)."""
    from pipeline.tick_publisher import TickPublisher

    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, 0)
    push.connect("inproc://ticks")
    ticks = TickPublisher(settings, _sender(push))
    ticks.start()
    return ticks


def _assignment(ticks: TickPublisher) -> dict[str, Any]:
    """The second report to the driver: the tick publisher has its partitions, or why not."""
    try:
        ticks.wait_assigned()
    except RuntimeError as exc:
        return {"error": str(exc)}
    return {"assigned": True}


def _wait_for_stop(conn: Connection, ticks: TickPublisher | None) -> None:
    """Until the driver says stop or goes away, or the tick publisher dies."""
    try:
        while True:
            if conn.poll(1.0):
                conn.recv()
                return
            if ticks is not None and not ticks.alive:
                log.error("tick relay stopped: %s", ticks.error)
                return
    except (EOFError, OSError):
        pass  # the driver is gone


def _shut_down(
    ctx: zmq.Context[zmq.Socket[bytes]], forwarder: threading.Thread, ticks: TickPublisher | None
) -> None:
    """Tick publisher first, then TERMINATE to the forwarder's proxy, then the sockets."""
    if ticks is not None:
        ticks.stop()
    control = ctx.socket(zmq.PAIR)
    control.connect("inproc://steer")
    control.send(b"TERMINATE")
    forwarder.join(5)
    ctx.destroy(linger=1000)


def _forward(
    ctx: zmq.Context[zmq.Socket[bytes]], pull: zmq.Socket[bytes], pub: zmq.Socket[bytes]
) -> None:
    """PULL -> PUB in C until TERMINATE arrives on the steering socket."""
    steer = ctx.socket(zmq.PAIR)
    steer.bind("inproc://steer")
    with contextlib.suppress(zmq.ContextTerminated):
        zmq.proxy_steerable(pull, pub, None, steer)
    steer.close(0)


def _sender(push: zmq.Socket[bytes]) -> Any:
    """``publish_many`` for the relay thread (it alone uses this socket)."""

    def send_many(items: Iterable[tuple[str, Message]]) -> int:
        count = 0
        for topic, message in items:
            push.send_multipart(envelope.encode_pub(topic, message))
            count += 1
        return count

    return send_many


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when the driver dies, even by kill -9 (Linux), so a
    restarted driver finds port 5557 free."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the driver died before prctl took effect
        os._exit(1)
