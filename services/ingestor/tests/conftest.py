"""Shared test helpers: fakes for the pure/async unit tests, and the integration harness.

The integration helpers (fake relay, Kafka read-back, simulator) live in
`harness.py`-style functions below so every test module can use them without
being a package (pytest runs with --import-mode=importlib).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import zmq
import zmq.asyncio

from ingestor.model import Candle, ExchangeCallError, Trade
from mdproto import envelope
from mdproto.messages import OHLCBatch

MIN = 60_000


def make_candles(opens: Iterable[int]) -> list[Candle]:
    return [
        Candle(t, 100.0 + i, 101.0 + i, 99.0 + i, 100.5 + i, 1.0 + i) for i, t in enumerate(opens)
    ]


class FakeExchange:
    """A CandleSource/TradeSource that serves a fixed list, with scripted faults."""

    prefix = "BINANCE"
    supports_websocket = True
    consecutive_trade_ids = True

    def __init__(
        self,
        candles: Sequence[Candle] = (),
        *,
        timeframes: Sequence[str] = ("1m", "5m", "1h", "1d"),
        faults: Sequence[ExchangeCallError] = (),
        page_cap: int | None = None,
        trade_batches: Sequence[list[Trade] | ExchangeCallError] = (),
    ) -> None:
        self.candles = sorted(candles, key=lambda c: c.open_time_ms)
        self._timeframes = list(timeframes)
        self.faults = list(faults)
        self.page_cap = page_cap
        self.calls: list[tuple[int, int, int]] = []
        self.trade_batches = list(trade_batches)
        self.unwatched: list[str] = []
        self.trades_exhausted = asyncio.Event()

    def timeframes(self) -> list[str]:
        return self._timeframes

    async def fetch_candles(
        self, symbol: str, timeframe: str, since_ms: int, until_ms: int, limit: int
    ) -> list[Candle]:
        self.calls.append((since_ms, until_ms, limit))
        if self.faults:
            raise self.faults.pop(0)
        cap = min(limit, self.page_cap or limit)
        return [c for c in self.candles if since_ms <= c.open_time_ms <= until_ms][:cap]

    async def watch_trades(self, symbol: str) -> list[Trade]:
        await asyncio.sleep(0)
        if not self.trade_batches:
            self.trades_exhausted.set()
            await asyncio.Event().wait()  # like a quiet stream: wait forever
        item = self.trade_batches.pop(0)
        if isinstance(item, ExchangeCallError):
            raise item
        return item

    async def unwatch_trades(self, symbol: str) -> None:
        self.unwatched.append(symbol)


@dataclass
class FakeSink:
    """Records what would go to Kafka; deliveries of chosen sequences fail."""

    fail_sequences: set[int] = field(default_factory=set)
    fail_finals: int = 0  # how many final markers fail before one succeeds
    batches: list[tuple[str, OHLCBatch]] = field(default_factory=list)
    ticks: list[tuple[str, object]] = field(default_factory=list)

    async def send_batch(self, key: str, record: OHLCBatch) -> asyncio.Future[int]:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        copy = OHLCBatch()
        copy.CopyFrom(record)
        if record.is_final and self.fail_finals > 0:
            self.fail_finals -= 1
            future.set_exception(RuntimeError("broker down"))
        elif not record.is_final and record.sequence in self.fail_sequences:
            future.set_exception(RuntimeError("broker down"))
        else:
            self.batches.append((key, copy))
            future.set_result(len(self.batches))
        return future

    async def send_tick(self, key: str, record: object) -> None:
        self.ticks.append((key, record))

    async def send_tick_tracked(self, key: str, record: object) -> asyncio.Future[int]:
        self.ticks.append((key, record))
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        future.set_result(len(self.ticks))
        return future


class Fakes:
    """What the `fakes` fixture hands out (tests cannot import conftest directly)."""

    MIN = MIN
    FakeExchange = FakeExchange
    FakeSink = FakeSink
    make_candles = staticmethod(make_candles)


@pytest.fixture
def fakes() -> type[Fakes]:
    return Fakes


# --------------------------------------------------------------------------
# Integration harness: simulator, fake relay, Kafka read-back.
# --------------------------------------------------------------------------


class FakeRelay:
    """The relay's ingestor-facing sockets on free loopback ports.

    Work and control are XPUBs so a test can wait until the ingestors'
    subscriptions arrived (no slow-joiner sleep); responses is a ROUTER.
    """

    def __init__(self) -> None:
        self.ctx = zmq.asyncio.Context()
        self.work = self.ctx.socket(zmq.XPUB)
        self.control = self.ctx.socket(zmq.XPUB)
        self.responses = self.ctx.socket(zmq.ROUTER)
        for xpub in (self.work, self.control):
            xpub.setsockopt(zmq.XPUB_VERBOSE, 1)  # report every subscriber, not only the first
        for sock in (self.work, self.control, self.responses):
            sock.setsockopt(zmq.LINGER, 0)
            sock.bind("tcp://127.0.0.1:*")
        self.work_subscriptions: list[bytes] = []
        self.control_subscriptions: list[bytes] = []
        self.statuses: list[Any] = []  # IngestorStatus heartbeats seen by recv_response

    def endpoint(self, sock: zmq.asyncio.Socket) -> str:
        return str(sock.getsockopt_string(zmq.LAST_ENDPOINT))

    @property
    def endpoints(self) -> dict[str, str]:
        return {
            "relay_work_endpoint": self.endpoint(self.work),
            "relay_control_endpoint": self.endpoint(self.control),
            "relay_response_endpoint": self.endpoint(self.responses),
        }

    async def wait_subscribed(self, ingestors: int = 1, timeout_s: float = 15.0) -> None:
        """Until `ingestors` SUBs subscribed to work and control."""
        async with asyncio.timeout(timeout_s):
            while len([s for s in self.work_subscriptions if s[:1] == b"\x01"]) < ingestors:
                self.work_subscriptions.append(await self.work.recv())
            while len([s for s in self.control_subscriptions if s[:1] == b"\x01"]) < ingestors:
                self.control_subscriptions.append(await self.control.recv())

    async def publish(self, request: Any, topic: str | None = None) -> None:
        prefix = topic if topic is not None else request.ticker.split(":")[0] + ":"
        await self.work.send_multipart(envelope.encode_pub(prefix, request))

    async def publish_raw(self, frames: list[bytes]) -> None:
        await self.work.send_multipart(frames)

    async def send_control(self, control: Any, topic: str = "") -> None:
        await self.control.send_multipart(envelope.encode_pub(topic, control))

    async def recv_response(self, timeout_s: float = 30.0) -> tuple[bytes, Any]:
        """The next DataResponse; IngestorStatus heartbeats on the way are kept in `statuses`."""
        from mdproto.messages import DataResponse, IngestorStatus

        async with asyncio.timeout(timeout_s):
            while True:
                frames = await self.responses.recv_multipart()
                route, body = envelope.split_routed(frames)
                message = envelope.decode(body)
                if isinstance(message, IngestorStatus):
                    self.statuses.append(message)
                    continue
                assert isinstance(message, DataResponse), message
                return route[0], message

    def close(self) -> None:
        for sock in (self.work, self.control, self.responses):
            sock.close(0)
        self.ctx.term()


def read_topic(
    bootstrap: str,
    topic: str,
    done: Callable[[list[tuple[bytes | None, bytes]]], bool],
    timeout_s: float = 60.0,
) -> list[tuple[bytes | None, bytes]]:
    """(key, value) of every record of `topic` from the beginning until `done(records)`."""
    from confluent_kafka import Consumer, KafkaError

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"ingestor-test-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    records: list[tuple[bytes | None, bytes]] = []
    deadline = time.monotonic() + timeout_s
    try:
        while not done(records):
            if time.monotonic() > deadline:
                raise AssertionError(f"{topic}: condition not met after {len(records)} records")
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() in (KafkaError._PARTITION_EOF, KafkaError.UNKNOWN_TOPIC_OR_PART):
                    continue
                raise AssertionError(str(err))
            records.append((msg.key(), msg.value() or b""))
    finally:
        consumer.close()
    return records


class Harness:
    """What the `harness` fixture hands out."""

    FakeRelay = FakeRelay
    read_topic = staticmethod(read_topic)

    def __init__(self, bootstrap: str, sim: Any) -> None:
        self.bootstrap = bootstrap
        self.sim = sim

    def settings(self, relay: FakeRelay, suffix: str | None = None, **overrides: Any) -> Any:
        """Settings wired to the stack, the simulator and `relay`, on test-private topics."""
        from ingestor.config import Settings

        tag = suffix or uuid.uuid4().hex[:8]
        exchange = {
            "prefix": "BINANCE",
            "api_base_url": self.sim.base_url,
            "enable_rate_limit": False,
            "timeout_ms": 3000,
        }
        exchange.update(overrides.pop("exchange", {}))
        values: dict[str, Any] = {
            "ingestor_id": f"ing-{uuid.uuid4().hex[:6]}",
            **relay.endpoints,
            "zmq_heartbeat_ivl_ms": 1000,
            "exchanges": {"binance": exchange},
            "kafka": {
                "bootstrap_servers": self.bootstrap,
                "topic_ohlc_batches": f"t{tag}.ohlc",
                "topic_ticks": f"t{tag}.ticks",
                "topic_markets": f"t{tag}.markets",
                "topic_claims": f"t{tag}.claims",
                "topic_partitions": 2,
                **overrides.pop("kafka", {}),
            },
            "retry": {"base_delay_s": 0.1, "max_delay_s": 2.0, **overrides.pop("retry", {})},
            "market_metadata": {"refresh_s": 0},
        }
        values.update(overrides)
        return Settings(**values)

    def batches_until_final(
        self, settings: Any, request_id: str, timeout_s: float = 60.0
    ) -> list[Any]:
        """The request's OHLCBatch records, read back from Kafka up to its final marker."""
        from mdproto.messages import OHLCBatch

        def decoded(records: list[tuple[bytes | None, bytes]]) -> list[OHLCBatch]:
            out = [envelope.decode_record(v, OHLCBatch) for _, v in records]
            return [b for b in out if b.request_id == request_id]

        def done(records: list[tuple[bytes | None, bytes]]) -> bool:
            return any(b.is_final for b in decoded(records[-5:])) or any(
                b.is_final for b in decoded(records)
            )

        records = read_topic(self.bootstrap, settings.kafka.topic_ohlc_batches, done, timeout_s)
        return decoded(records)


@pytest.fixture(scope="session")
def simulator() -> Iterator[Any]:
    from infra.exchange_sim import run_in_thread

    with run_in_thread() as sim:
        yield sim


@pytest.fixture
def harness(local_stack: Any, simulator: Any) -> Iterator[Harness]:
    simulator.reset()
    yield Harness(local_stack.endpoints.kafka_bootstrap, simulator)
    simulator.clear_faults()


async def start_ingestor(ingestor: Any, timeout_s: float = 30.0) -> asyncio.Task[None]:
    """Run an Ingestor in a task and wait until it is ready (or failed)."""
    task = asyncio.create_task(ingestor.run())
    ready = asyncio.create_task(ingestor.wait_ready())
    await asyncio.wait({task, ready}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()  # raises the start-up error
    assert ready.done(), "ingestor not ready in time"
    return task


@pytest.fixture
def run_ingestor() -> Callable[..., Any]:
    return start_ingestor
