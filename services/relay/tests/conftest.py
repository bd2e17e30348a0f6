"""Test helpers: a relay on ephemeral loopback ports plus fake peers built from mdproto.

- `FakePipeline`: an XPUB bound where the relay's XSUB connects. Being an XPUB,
  it *reads* the subscriptions the relay forwards, which is how tests know a
  client's subscription has travelled all the way up before they publish.
- `FakeIngestor`: SUB on the work and control sockets plus a DEALER on :5556.
  Tests wait for the relay to report the ingestor's subscription
  (relay_ingestor_subscriptions) before they send work its way.

Nothing here sleeps to synchronise: every wait polls a socket or a condition.
Test modules import names from here only under TYPE_CHECKING (pytest's
importlib mode makes conftest unimportable); at run time they reach the helpers
through the fixtures.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
import zmq
from google.protobuf.message import Message

from infra.testing import free_port
from mdproto import envelope
from mdproto.messages import (
    DataRequest,
    ExchangeHealth,
    IngestorControl,
    IngestorStatus,
)
from relay import Relay, RelaySettings
from relay.metrics import INGESTOR_SUBSCRIPTIONS
from relay.sockets import Context, Endpoints, Socket
from relay.triggers import TriggerSink

M = TypeVar("M", bound=Message)
TIMEOUT = 5.0


def wait_until(condition: Callable[[], bool], timeout: float = TIMEOUT, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        time.sleep(0.005)


def recv(sock: Socket, timeout: float = TIMEOUT) -> list[bytes]:
    if not sock.poll(int(timeout * 1000)):
        raise AssertionError(f"nothing received within {timeout} s")
    return sock.recv_multipart()


def request(sock: Socket, message: Message, expected: type[M], timeout: float = TIMEOUT) -> M:
    """One round trip on a REQ socket."""
    sock.send_multipart(envelope.encode(message))
    return envelope.decode(recv(sock, timeout), expected)


def _try_bind(sock: Socket, port: int) -> bool:
    try:
        sock.bind(f"tcp://127.0.0.1:{port}")
    except zmq.ZMQError as exc:
        if exc.errno != zmq.EADDRINUSE:
            raise
        return False
    return True


class FakePipeline:
    def __init__(self, ctx: Context, port: int = 0) -> None:
        self.ctx = ctx
        self.sock: Socket = ctx.socket(zmq.XPUB)
        self.sock.linger = 0
        self.sock.sndhwm = 0
        self.sock.setsockopt(zmq.XPUB_VERBOSE, 1)
        if port:
            # The old socket's listener closes asynchronously (libzmq I/O thread).
            wait_until(lambda: _try_bind(self.sock, port), what=f"port {port} to be free")
            self.port = port
        else:
            self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.subscriptions: set[str] = set()

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def poll_subscriptions(self, timeout: float = 0.0, quiet: float = 0.0) -> None:
        """Wait up to `timeout` for the first one, then read until none comes for `quiet` s."""
        while self.sock.poll(int(timeout * 1000)):
            frame = self.sock.recv()
            topic = frame[1:].decode()
            if frame[:1] == b"\x01":
                self.subscriptions.add(topic)
            elif frame[:1] == b"\x00":
                self.subscriptions.discard(topic)
            timeout = quiet

    def wait_subscribed(self, *topics: str, timeout: float = TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while not set(topics) <= self.subscriptions:
            if time.monotonic() > deadline:
                missing = len(set(topics) - self.subscriptions)
                raise AssertionError(f"{missing} subscription(s) never reached the pipeline")
            self.poll_subscriptions(0.05)

    def publish(self, topic: str, message: Message) -> None:
        self.sock.send_multipart(envelope.encode_pub(topic, message))

    def restart(self) -> FakePipeline:
        """Die, and come back as a new process would: a fresh socket on the same port."""
        self.close()
        return FakePipeline(self.ctx, self.port)

    def close(self) -> None:
        self.sock.close(linger=0)


class FakeIngestor:
    def __init__(self, ctx: Context, endpoints: Endpoints, prefix: str = "BINANCE:") -> None:
        self.work: Socket = ctx.socket(zmq.SUB)
        self.control: Socket = ctx.socket(zmq.SUB)
        self.dealer: Socket = ctx.socket(zmq.DEALER)
        for sock in (self.work, self.control, self.dealer):
            sock.linger = 0
        self.work.connect(endpoints.ingestor_work)
        self.control.connect(endpoints.ingestor_control)
        self.dealer.connect(endpoints.ingestor_response)
        self.work.subscribe(prefix.encode())
        self.control.subscribe(prefix.encode())

    def recv_work(self, timeout: float = TIMEOUT) -> tuple[str, DataRequest]:
        topic, message = envelope.decode_sub(recv(self.work, timeout))
        assert isinstance(message, DataRequest)
        return topic, message

    def next_work(self, kind: int, timeout: float = TIMEOUT) -> tuple[str, DataRequest]:
        """The next work item of one kind (REALTIME refreshes may interleave)."""
        deadline = time.monotonic() + timeout
        while True:
            topic, message = self.recv_work(max(0.0, deadline - time.monotonic()))
            if message.kind == kind:
                return topic, message

    def recv_control(self, timeout: float = TIMEOUT) -> tuple[str, IngestorControl]:
        topic, message = envelope.decode_sub(recv(self.control, timeout))
        assert isinstance(message, IngestorControl)
        return topic, message

    def respond(self, response: Message) -> None:
        """A DataResponse, FeedStatus... to the relay's ROUTER :5556."""
        self.dealer.send_multipart(envelope.encode(response))

    def report(self, ingestor_id: str, *health: ExchangeHealth, interval_ms: int = 200) -> None:
        """One IngestorStatus heartbeat (default: BINANCE healthy)."""
        status = IngestorStatus(
            ingestor_id=ingestor_id,
            exchanges=health or [ExchangeHealth(exchange="BINANCE", healthy=True)],
            sent_at_ms=time.time_ns() // 1_000_000,
            interval_ms=interval_ms,
        )
        self.dealer.send_multipart(envelope.encode(status))


@dataclass
class RunningRelay:
    """A relay serving from a background thread, plus helpers to talk to it.

    (Test modules cannot import this file under --import-mode=importlib, so the
    helpers they need at run time hang off this fixture object.)
    """

    relay: Relay
    settings: RelaySettings
    endpoints: Endpoints
    ctx: Context
    thread: threading.Thread
    sockets: list[Socket] = field(default_factory=list)

    recv = staticmethod(recv)
    request = staticmethod(request)
    wait_until = staticmethod(wait_until)

    def socket(self, kind: int, endpoint: str | None = None) -> Socket:
        sock: Socket = self.ctx.socket(kind)
        sock.linger = 0
        sock.connect(endpoint or self.endpoints.client_request)
        self.sockets.append(sock)
        return sock

    def client(self) -> Socket:
        return self.socket(zmq.REQ)

    def subscriber(self, *topics: str) -> Socket:
        sock = self.socket(zmq.SUB, self.endpoints.market_data)
        for topic in topics:
            sock.subscribe(topic.encode())
        return sock

    def ingestor(self, prefix: str = "BINANCE:") -> FakeIngestor:
        """A fake ingestor whose subscriptions the relay has already seen."""
        before = self.sample(INGESTOR_SUBSCRIPTIONS, socket="work")
        ingestor = FakeIngestor(self.ctx, self.endpoints, prefix)
        self.sockets += [ingestor.work, ingestor.control, ingestor.dealer]
        if before == 0:
            wait_until(
                lambda: (
                    self.sample(INGESTOR_SUBSCRIPTIONS, socket="work") >= 1
                    and self.sample(INGESTOR_SUBSCRIPTIONS, socket="control") >= 1
                ),
                what="the relay to see the ingestor subscribe",
            )
        return ingestor

    def sample(self, name: str, **labels: str) -> float:
        return self.relay.metrics.sample(name, labels)

    def stop(self) -> None:
        for sock in self.sockets:
            sock.close(linger=0)
        self.relay.stop()
        self.thread.join(10)
        assert not self.thread.is_alive(), "relay loop did not stop"
        self.relay.close()


def relay_settings(upstream: str, **overrides: Any) -> RelaySettings:
    return RelaySettings.loopback(upstream, **overrides)


class FakeClock:
    """Monotonic seconds that pass only when a test says so (read by the relay's thread)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def start_relay(
    ctx: Context,
    settings: RelaySettings,
    sink: TriggerSink | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> RunningRelay:
    relay = Relay(settings, trigger_sink=sink, clock=clock)
    endpoints = relay.start()
    thread = threading.Thread(target=relay.run, name="relay-loop", daemon=True)
    thread.start()
    return RunningRelay(relay, settings, endpoints, ctx, thread)


@pytest.fixture
def ctx() -> Iterator[Context]:
    context: Context = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def pipeline(ctx: Context) -> Iterator[FakePipeline]:
    fake = FakePipeline(ctx)
    yield fake
    fake.close()


RelayFactory = Callable[..., RunningRelay]


@pytest.fixture
def make_relay(ctx: Context, pipeline: FakePipeline) -> Iterator[RelayFactory]:
    """Start relays (settings overrides as keyword arguments); all stopped afterwards."""
    running: list[RunningRelay] = []

    def make(
        sink: TriggerSink | None = None,
        clock: Callable[[], float] = time.monotonic,
        **overrides: Any,
    ) -> RunningRelay:
        r = start_relay(ctx, relay_settings(pipeline.endpoint, **overrides), sink, clock)
        running.append(r)
        return r

    yield make
    for r in running:
        r.stop()


@pytest.fixture
def relay(make_relay: RelayFactory) -> RunningRelay:
    return make_relay()


@pytest.fixture
def clock() -> FakeClock:
    """A clock to start a relay with (`make_relay(clock=clock)`), moved by hand."""
    return FakeClock()


@pytest.fixture
def free_tcp_port() -> int:
    """A loopback port that was free a moment ago (for servers that need a number)."""
    return free_port()
