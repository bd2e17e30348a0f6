"""Shared test helpers: a fake relay built from mdproto on free loopback ports.

`FakeRelay` binds a ROUTER (the relay's :5559) and an XPUB (the relay's
:5558) on tcp://127.0.0.1:* and serves both from one thread. It records every
subscription change and every request in one ordered event log, so tests can
assert that a subscription reached the XPUB before the request reached the
ROUTER. What it answers is decided by `handler(message) -> Action`.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import zmq
from google.protobuf.message import Message

from mdclient.config import ClientSettings
from mdproto import envelope
from mdproto.messages import (
    OHLC,
    HistoryReadyNotification,
    OHLCRequest,
    RequestStatusQuery,
    RequestStatusReply,
    Response,
    Status,
    SubmitHistoricalRequest,
    SubmitResponse,
)


@dataclass
class Action:
    """What the fake does with one request: reply (None = drop it) then publish."""

    reply: Message | None
    publish: list[tuple[str, Message]] = field(default_factory=list)


Handler = Callable[[Message], Action]


def notification_for(
    request: SubmitHistoricalRequest,
    topic: str,
    *,
    status: int = Status.OK,
    reason: str = "",
    error_code: str = "",
    row_count: int = 3,
    snapshot_id: int = 42,
) -> HistoryReadyNotification:
    return HistoryReadyNotification(
        request_id=request.request_id,
        client_id=request.client_id,
        status=status,  # type: ignore[arg-type]
        reason=reason,
        error_code=error_code,
        ticker=request.ticker,
        period_seconds=request.period_seconds,
        start_time_ms=request.start_time_ms,
        end_time_ms=request.end_time_ms,
        row_count=row_count,
        iceberg_table="market.trade_bars" if request.bars else "market.ohlc",
        snapshot_id=snapshot_id,
        completed_at_ms=int(time.time() * 1000),
        bars=request.bars,
    )


def topic_for(request: SubmitHistoricalRequest) -> str:
    """The topic a well-behaved relay/pipeline uses (mdproto decides, not the test)."""
    from mdproto import topics

    return topics.notification_topic(request.notify, request.request_id, request.client_id)


def accept_and_notify(**notification_args: Any) -> Handler:
    """Handler: SubmitResponse OK, then the notification on the request's topic."""

    def handle(message: Message) -> Action:
        assert isinstance(message, SubmitHistoricalRequest)
        topic = topic_for(message)
        ack = SubmitResponse(
            request_id=message.request_id, status=Status.OK, notification_topic=topic
        )
        return Action(ack, [(topic, notification_for(message, topic, **notification_args))])

    return handle


def ack_only() -> Handler:
    """Handler: SubmitResponse OK and nothing more, as for a request still running."""
    notify = accept_and_notify()

    def handle(message: Message) -> Action:
        return Action(notify(message).reply)

    return handle


def candle(ticker: str, period: int, open_time_ms: int, price: float) -> OHLC:
    return OHLC(
        ticker=ticker,
        period_seconds=period,
        open_time_ms=open_time_ms,
        open=price,
        high=price + 2,
        low=price - 1,
        close=price + 1,
        volume=10.0,
        trade_count=5,
        closed=True,
    )


def legacy_ok(message: Message) -> Action:
    assert isinstance(message, OHLCRequest)
    rows = [
        candle(message.ticker, message.period_seconds, message.start_time_ms + i * 60_000, 100 + i)
        for i in (2, 0, 1)  # out of order on purpose: the client sorts
    ]
    return Action(Response(request_id=message.request_id, status=Status.OK, candles=rows))


class FakeRelay:
    def __init__(self) -> None:
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._router = self._context.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        self._router.bind("tcp://127.0.0.1:*")
        self._xpub = self._context.socket(zmq.XPUB)
        self._xpub.setsockopt(zmq.LINGER, 0)
        self._xpub.setsockopt(zmq.XPUB_VERBOSE, 1)  # see every subscribe, duplicates too
        self._xpub.bind("tcp://127.0.0.1:*")
        self.request_endpoint = self._router.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.market_data_endpoint = self._xpub.getsockopt(zmq.LAST_ENDPOINT).decode()
        self._pipe_in = self._context.socket(zmq.PAIR)
        self._pipe_in.bind(f"inproc://fake-relay-{id(self)}")
        self._pipe_lock = threading.Lock()
        self._outbox: queue.SimpleQueue[tuple[str, Message]] = queue.SimpleQueue()
        self.events: list[tuple[str, Any]] = []  # ("sub"|"unsub", topic) or ("req", message)
        self._changed = threading.Condition()
        self.handler: Handler = accept_and_notify()
        #: request_id -> the OK SubmitResponse sent: what RequestStatusQuery answers from.
        self.accepted: dict[str, SubmitResponse] = {}
        self._stop = threading.Event()
        self.crashed: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="fake-relay", daemon=True)
        self._thread.start()

    # --- test side ---

    @property
    def requests(self) -> list[Message]:
        with self._changed:
            return [item for kind, item in self.events if kind == "req"]

    def subscriptions(self) -> list[str]:
        with self._changed:
            return [item for kind, item in self.events if kind == "sub"]

    def index_of(self, kind: str, predicate: Callable[[Any], bool]) -> int:
        with self._changed:
            for i, (k, item) in enumerate(self.events):
                if k == kind and predicate(item):
                    return i
        raise AssertionError(f"no {kind} event matched; events: {self.events}")

    def wait_for(self, predicate: Callable[[list[tuple[str, Any]]], bool], timeout: float = 5.0):
        with self._changed:
            if not self._changed.wait_for(lambda: predicate(self.events), timeout):
                raise AssertionError(f"condition not met within {timeout}s; events: {self.events}")

    def publish(self, topic: str, message: Message) -> None:
        self._outbox.put((topic, message))
        with self._pipe_lock:
            self._pipe_in.send(b"!")

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        # Wake the thread. NOBLOCK: having seen _stop after a poll timeout, the
        # thread may already be gone, and a blocking send to a PAIR without a
        # peer would wait forever.
        with self._pipe_lock, contextlib.suppress(zmq.Again):
            self._pipe_in.send(b"!", zmq.NOBLOCK)
        self._thread.join(10)
        self._pipe_in.close(linger=0)
        if self._thread.is_alive():
            import sys
            import traceback

            frame = sys._current_frames().get(self._thread.ident or 0)
            stack = "".join(traceback.format_stack(frame)) if frame else "?"
            raise AssertionError(f"fake relay thread did not stop:\n{stack}")
        self._context.term()
        if self.crashed is not None:
            raise AssertionError(f"fake relay thread crashed: {self.crashed!r}")

    # --- relay thread ---

    def _record(self, kind: str, item: Any) -> None:
        with self._changed:
            self.events.append((kind, item))
            self._changed.notify_all()

    def _run(self) -> None:
        pipe = self._context.socket(zmq.PAIR)
        pipe.connect(f"inproc://fake-relay-{id(self)}")
        poller = zmq.Poller()
        for sock in (self._router, self._xpub, pipe):
            poller.register(sock, zmq.POLLIN)
        try:
            self._loop(pipe, poller)
        except BaseException as exc:
            self.crashed = exc
            raise
        finally:
            pipe.close(linger=0)
            self._router.close(linger=0)
            self._xpub.close(linger=0)

    def _loop(self, pipe: zmq.Socket[bytes], poller: zmq.Poller) -> None:
        while not self._stop.is_set():
            ready = dict(poller.poll(1000))
            if self._xpub in ready:
                while self._xpub.poll(0):
                    frame = self._xpub.recv()
                    if frame[:1] in (b"\x00", b"\x01"):
                        kind = "sub" if frame[0] == 1 else "unsub"
                        self._record(kind, frame[1:].decode())
            if self._router in ready:
                while self._router.poll(0):
                    self._serve(self._router.recv_multipart())
            if pipe in ready:
                while pipe.poll(0):
                    pipe.recv()
                while not self._outbox.empty():
                    topic, message = self._outbox.get()
                    self._xpub.send_multipart(envelope.encode_pub(topic, message))

    def _serve(self, frames: list[bytes]) -> None:
        route, body = envelope.split_routed(frames)
        message = envelope.decode(body)
        self._record("req", message)
        if isinstance(message, RequestStatusQuery):  # as the relay: from the acks it sent
            reply = self.accepted.get(message.request_id)
            answer = RequestStatusReply(
                request_id=message.request_id,
                status=Status.NOT_FOUND if reply is None else Status.OK,
                notification_topic="" if reply is None else reply.notification_topic,
                accepted_at_ms=0 if reply is None else 1_795_132_800_000,
                remembered_s=86_400,
            )
            self._router.send_multipart(envelope.encode_routed(route, answer))
            return
        action = self.handler(message)
        if isinstance(action.reply, SubmitResponse) and action.reply.status == Status.OK:
            self.accepted[action.reply.request_id] = action.reply
        if action.reply is not None:
            self._router.send_multipart(envelope.encode_routed(route, action.reply))
        for topic, note in action.publish:
            self._xpub.send_multipart(envelope.encode_pub(topic, note))


@pytest.fixture
def fake_relay() -> Iterator[FakeRelay]:
    relay = FakeRelay()
    yield relay
    relay.close()


def client_settings(relay: FakeRelay, **overrides: Any) -> ClientSettings:
    values: dict[str, Any] = {
        "request_endpoint": relay.request_endpoint,
        "market_data_endpoint": relay.market_data_endpoint,
        "connect_timeout_s": 5.0,
        "submit_timeout_s": 2.0,
        "history_timeout_s": 2.0,
        "attempts": 2,
        "legacy_timeout_s": 2.0,
        "progress_interval_s": 0.05,
    }
    values.update(overrides)
    return ClientSettings(**values)


@pytest.fixture
def settings_for() -> Callable[..., ClientSettings]:
    return client_settings


class FakeReader:
    """Stands in for IcebergReader in relay-only tests; records what was asked."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.requests: dict[str, dict[str, Any]] = {}  # market.requests rows by request_id
        self.expired: set[int] = set()  # snapshot ids table upkeep removed

    def read_request(self, table_name: str, request_id: str) -> dict[str, Any] | None:
        self.calls.append({"table": table_name, "request_id": request_id})
        return self.requests.get(request_id)

    def read_ohlc(
        self,
        table_name: str,
        ticker: str,
        period_seconds: int,
        start_ms: int,
        end_ms: int,
        *,
        snapshot_id: int | None = None,
    ) -> Any:
        from mdclient.frames import candles_from_ohlc

        self.calls.append(
            {
                "table": table_name,
                "ticker": ticker,
                "period": period_seconds,
                "start": start_ms,
                "end": end_ms,
                "snapshot_id": snapshot_id,
            }
        )
        if snapshot_id in self.expired:
            from mdclient.errors import StorageError

            raise StorageError(f"snapshot {snapshot_id} is gone", error_code="snapshot_gone")
        return candles_from_ohlc([candle(ticker, period_seconds, start_ms, 100.0)])

    def read_trade_bars(
        self,
        table_name: str,
        ticker: str,
        bars: str,
        start_ms: int,
        end_ms: int,
        *,
        snapshot_id: int | None = None,
    ) -> Any:
        import pyarrow as pa

        call = {"table": table_name, "ticker": ticker, "bars": bars, "start": start_ms}
        self.calls.append({**call, "end": end_ms, "snapshot_id": snapshot_id})
        return pa.table({"seq": [0, 1], "close": [100.0, 101.0]})


@pytest.fixture
def fake_reader() -> FakeReader:
    return FakeReader()


@pytest.fixture
def kit() -> Any:
    """The helpers above, for test modules (conftest is not importable by name)."""
    from types import SimpleNamespace

    return SimpleNamespace(
        Action=Action,
        accept_and_notify=accept_and_notify,
        ack_only=ack_only,
        notification_for=notification_for,
        topic_for=topic_for,
        candle=candle,
        legacy_ok=legacy_ok,
        FakeRelay=FakeRelay,  # tests that need several relays
    )
