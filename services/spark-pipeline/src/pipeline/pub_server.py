"""The pipeline's ZeroMQ XPUB (port 5557), in a process of its own: the only zmq module.

Driver threads PUSH over ipc to this process; its forwarding thread stamps each
message with its topic's sequence number and sends it on the XPUB. The live
engine thread (ticks, live candles) stamps and sends its messages itself, under
the same lock, without a hop. A process, so live publication never waits for the driver's GIL
(docs/adr/0002). An XPUB rather than a PUB so a new subscription is answered
with the topic's last value (zguide "last value cache"; checked every
`SUBSCRIPTION_CHECK_MS`). The XPUB drops past its HWM, hence a large ``sndhwm``
(subscribers see the gap in the sequence); the driver's PUSH blocks instead (up
to 10 s, then raises): a notification is never dropped on our side.

`Sequencer` (``sequence`` per topic, ``publisher_epoch`` per server start, so a
subscriber sees gaps and restarts: docs/protocol.md), `LastValues` and
`LiveBooks` (order books: their last value is the current book, not the last
message) are plain classes without sockets, driven by the `Outlet` under its
send lock.
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
import time
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zmq
from google.protobuf.message import Message

from mdproto import ProtocolError, envelope, topics
from mdproto.runtime.zmq_frames import send_frames
from pipeline import live_metrics
from pipeline.config import Settings
from pipeline.live_books import BookRecord, LiveBooks

if TYPE_CHECKING:
    from pipeline.live_engine import LiveEngine

log = logging.getLogger(__name__)

SEND_TIMEOUT_MS = 10_000
#: How often the forwarding thread answers new subscriptions with last values.
SUBSCRIPTION_CHECK_MS = 20
_SUBSCRIBE = 1
_PR_SET_PDEATHSIG = 1
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class ServerConfig:
    """What the server process needs (pickled to it)."""

    pub_endpoint: str
    pull_endpoint: str
    sndhwm: int
    niceness: int
    parent_pid: int
    #: None: no live engine (live path and CEP off).
    engine_settings: Settings | None
    #: ``publisher_epoch`` of every message this server publishes.
    epoch: int


class PubServer:
    """The process that owns the PUB. `start` returns once it is bound (and, with a live
    engine, once the engine has its Kafka partitions)."""

    def __init__(self, settings: Settings) -> None:
        engine = settings.live.enabled or settings.cep.enabled
        self._dir = Path(tempfile.mkdtemp(prefix="pipeline-pub-"))
        self._config = ServerConfig(
            pub_endpoint=settings.pub_endpoint,
            pull_endpoint=f"ipc://{self._dir / 'pull.sock'}",
            sndhwm=settings.pub_sndhwm,
            niceness=settings.live.relay_niceness if engine else 0,
            engine_settings=settings if engine else None,
            parent_pid=os.getpid(),
            epoch=new_epoch(),
        )
        self._conn: Connection | None = None
        self._process: Any = None
        self._started = False
        self.endpoint = ""
        #: The live engine's own /metrics in the process (None: no engine, not started).
        self.engine_metrics_url: str | None = None

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
        if self._config.engine_settings is not None:
            assigned = self._receive(timeout_s)
            if "error" in assigned:
                raise RuntimeError(assigned["error"])
            port = assigned["metrics_port"]
            self.engine_metrics_url = f"http://{LOOPBACK}:{port}/metrics"
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
                    send_frames(self._socket, f)
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
    bind the PULL, forward PULL -> PUB, start the live engine (report once it
    has its partitions), wait for the driver's stop, shut down.
    """
    _prepare_process(config)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pub = xpub_socket(ctx, config.sndhwm)
    try:
        pub.bind(config.pub_endpoint)
    except zmq.ZMQError as exc:
        conn.send({"error": f"cannot bind the pipeline PUB on {config.pub_endpoint}: {exc}"})
        return
    pull = _bind_pull(ctx, config.pull_endpoint)
    conn.send({"endpoint": _last_endpoint(pub)})
    outlet = Outlet(pub, Sequencer(config.epoch))
    stop = threading.Event()
    forwarder = _start_forwarder(pull, outlet, stop)
    engine = None
    engine_metrics = None
    if config.engine_settings is not None:
        engine = _start_live_engine(config.engine_settings, outlet)
        # Loopback, any port: the driver's /metrics reads it (live_metrics.EngineScrape).
        engine_metrics = live_metrics.serve(engine.metrics, lambda: engine.alive, LOOPBACK, 0)
        conn.send({**_assignment(engine), "metrics_port": engine_metrics.port})
    _wait_for_stop(conn, engine)
    _shut_down(ctx, forwarder, stop, engine)
    if engine_metrics is not None:
        engine_metrics.close()


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


def xpub_socket(ctx: zmq.Context[zmq.Socket[bytes]], sndhwm: int) -> zmq.Socket[bytes]:
    """XPUB_VERBOSE: every subscribe reaches us (the relay's, or a second direct SUB's),
    so each one is answered with the last values; unread ones never block sending."""
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.XPUB_VERBOSE, 1)
    pub.setsockopt(zmq.SNDHWM, sndhwm)
    pub.setsockopt(zmq.RCVHWM, 0)
    pub.setsockopt(zmq.LINGER, 1000)
    # Notice vanished peers (no FIN) so their queues are freed.
    pub.setsockopt(zmq.HEARTBEAT_IVL, 5000)
    pub.setsockopt(zmq.HEARTBEAT_TIMEOUT, 15000)
    return pub


def _bind_pull(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> zmq.Socket[bytes]:
    """The driver's ipc endpoint, unbounded."""
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.RCVHWM, 0)
    pull.bind(endpoint)
    return pull


def _last_endpoint(socket: zmq.Socket[bytes]) -> str:
    """The bound address (a ``*`` port resolved)."""
    last = socket.getsockopt(zmq.LAST_ENDPOINT)
    return last.decode() if isinstance(last, bytes) else str(last)


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


class Outlet:
    """The XPUB and all that sends on it, under one lock: sequence numbers follow the
    order on the wire, and the last value of each market-data topic is kept."""

    def __init__(self, xpub: zmq.Socket[bytes], sequencer: Sequencer) -> None:
        self._xpub = xpub
        self._lock = threading.Lock()
        self.sequencer = sequencer
        self.last = LastValues()
        self.books = LiveBooks()
        self.snapshots_sent = 0

    def send_books(self, records: Iterable[BookRecord]) -> int:
        """The live engine's ``market.book`` records: each applied to its book and sent
        in one step under the lock, so the book is the one after the topic's last
        message whenever a subscription is answered. Returns the count sent."""
        count = 0
        with self._lock:
            for record in records:
                if self.books.apply(record):
                    self._send_stamped(topics.book_topic(record.ticker), record)
                    count += 1
        return count

    def send_book_snapshots(self) -> int:
        """A BookSnapshot (reset NONE) of every book changed since its last snapshot."""
        with self._lock:
            snapshots = self.books.take_changed()
            for snapshot in snapshots:
                self._send_stamped(topics.book_topic(snapshot.ticker), snapshot)
        return len(snapshots)

    def forget(self, tickers: Collection[str]) -> None:
        """Their partitions moved to another engine: their last values and books are no
        longer ours to answer subscriptions with (stale ones, in our epoch, would make a
        client flip between owners). Sequence counters stay: a ticker that comes back
        goes on in our epoch, which the client sees change."""
        prefixes = tuple(f"{t}|" for t in tickers)
        if not prefixes:
            return
        with self._lock:
            for topic in [t for t in self.last.frames if t.startswith(prefixes)]:
                del self.last.frames[topic]
            self.books.forget(tickers)

    def _send_stamped(self, topic: str, message: Message) -> None:
        self.sequencer.stamp(topic, message)
        send_frames(self._xpub, envelope.encode_pub(topic, message))

    def _book_values(self, prefix: str) -> Iterator[list[bytes]]:
        """The current book of each book topic matching `prefix`, stamped with the
        topic's last sequence (a subscriber that has it drops it as a duplicate)."""
        for ticker in self.books.tickers():
            topic = topics.book_topic(ticker)
            if not topic.startswith(prefix):
                continue
            snapshot = self.books.snapshot(ticker)
            if snapshot is None:
                continue
            snapshot.sequence = self.sequencer.last(topic)
            snapshot.publisher_epoch = self.sequencer.epoch
            yield envelope.encode_pub(topic, snapshot)

    def send_many(self, items: Iterable[tuple[str, Message]]) -> int:
        """The live engine's batch (``SendMany``): stamp, encode, send; the count.

        `Sequencer.stamp` and `LastValues.put` inlined (tick topics always keep a
        last value): this loop runs 10,000 times a second."""
        counters, epoch, last = self.sequencer.counters, self.sequencer.epoch, self.last.frames
        xpub, encode = self._xpub, envelope.encode_pub
        count = 0
        with self._lock:
            for topic, message in items:
                n = counters.get(topic, 1)
                counters[topic] = n + 1
                message.sequence = n  # type: ignore[attr-defined]
                message.publisher_epoch = epoch  # type: ignore[attr-defined]
                frames = encode(topic, message)
                send_frames(xpub, frames)
                last[topic] = frames
                count += 1
        return count

    def forward(self, frames: list[bytes]) -> None:
        """A message from the driver: stamped if its type carries sequence fields."""
        try:
            topic, message = envelope.decode_sub(frames)
        except ProtocolError as exc:
            log.error("PUB server: undecodable message from the driver not published: %s", exc)
            return
        with self._lock:
            if sequenced(message):
                self.sequencer.stamp(topic, message)
                frames = envelope.encode_pub(topic, message)
            send_frames(self._xpub, frames)
            self.last.put(topic, frames)

    def answer_subscriptions(self) -> int:
        """Send the last values matching each new subscription; how many were sent."""
        sent = 0
        with self._lock:
            while True:
                try:
                    event = self._xpub.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if event[:1] != bytes([_SUBSCRIBE]):
                    continue  # an unsubscription
                prefix = event[1:].decode("utf-8", errors="replace")
                for frames in (*self.last.matching(prefix), *self._book_values(prefix)):
                    send_frames(self._xpub, frames)
                    sent += 1
        self.snapshots_sent += sent
        return sent


def _start_forwarder(
    pull: zmq.Socket[bytes], outlet: Outlet, stop: threading.Event
) -> threading.Thread:
    forwarder = threading.Thread(
        target=_forward, args=(pull, outlet, stop), name="pub-forward", daemon=True
    )
    forwarder.start()
    return forwarder


def _start_live_engine(settings: Settings, outlet: Outlet) -> LiveEngine:
    """Kafka ticks -> the outlet (imported here: Kafka only when used)."""
    from pipeline.live_engine import LiveEngine

    engine = LiveEngine(settings, outlet.send_many, books=outlet)
    engine.start()
    return engine


def _assignment(engine: LiveEngine) -> dict[str, Any]:
    """The second report to the driver: the live engine has its partitions, or why not."""
    try:
        engine.wait_assigned()
    except RuntimeError as exc:
        return {"error": str(exc)}
    return {"assigned": True}


def _wait_for_stop(conn: Connection, engine: LiveEngine | None) -> None:
    """Until the driver says stop or goes away, or the live engine dies."""
    try:
        while True:
            if conn.poll(1.0):
                conn.recv()
                return
            if engine is not None and not engine.alive:
                log.error("live engine stopped: %s", engine.error)
                return
    except (EOFError, OSError):
        pass  # the driver is gone


def _shut_down(
    ctx: zmq.Context[zmq.Socket[bytes]],
    forwarder: threading.Thread,
    stop: threading.Event,
    engine: LiveEngine | None,
) -> None:
    """Live engine first, then the forwarding thread, then the sockets."""
    if engine is not None:
        engine.stop()
    stop.set()
    forwarder.join(5)
    ctx.destroy(linger=1000)


def _forward(pull: zmq.Socket[bytes], outlet: Outlet, stop: threading.Event) -> None:
    """PULL -> outlet, and last values for new subscriptions, until `stop`; then what
    the driver had already handed over (its `close` flushes before the stop)."""
    poller = zmq.Poller()
    poller.register(pull, zmq.POLLIN)
    try:
        while not stop.is_set():
            if poller.poll(SUBSCRIPTION_CHECK_MS):
                _forward_waiting(pull, outlet, 1000)  # bounded: subscriptions are answered
            outlet.answer_subscriptions()
        _forward_waiting(pull, outlet, None)
    except zmq.ContextTerminated:
        pass


def _forward_waiting(pull: zmq.Socket[bytes], outlet: Outlet, limit: int | None) -> None:
    count = 0
    while limit is None or count < limit:
        try:
            frames = pull.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        outlet.forward(frames)
        count += 1


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when the driver dies, even by kill -9 (Linux), so a
    restarted driver finds port 5557 free."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the driver died before prctl took effect
        os._exit(1)
