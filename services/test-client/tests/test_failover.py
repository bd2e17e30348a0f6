"""Several relays (active/active, docs/protocol.md "Failover and chaining"): the SDK side.

Two fake relays stand in for two real ones (services/ingestor/tests/test_stack_failover.py
runs real relay processes): the client subscribes on both, drops the second copy
of every message by its sequence number, and resends a request that one relay
leaves unanswered to the other, unchanged (same request_id).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf.message import Message

from mdclient import Client
from mdclient.config import ClientSettings
from mdclient.dispatch import SequenceEvent
from mdproto import envelope, topics
from mdproto.messages import Status, SubmitHistoricalRequest, SubmitResponse, Tick

TICKER = "BINANCE:BTC/USDT"
START = 1_795_132_800_000
END = START + 3_600_000


def two_relays(a: Any, b: Any, **overrides: Any) -> ClientSettings:
    values: dict[str, Any] = {
        "request_endpoint": f"{a.request_endpoint},{b.request_endpoint}",
        "market_data_endpoint": f"{a.market_data_endpoint},{b.market_data_endpoint}",
        "connect_timeout_s": 5.0,
        "submit_timeout_s": 5.0,
        "history_timeout_s": 5.0,
        "failover_timeout_s": 0.3,
        "attempts": 1,
    }
    values.update(overrides)
    return ClientSettings(**values)


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _submits(relay: Any) -> list[SubmitHistoricalRequest]:
    return [m for m in relay.requests if isinstance(m, SubmitHistoricalRequest)]


def test_settings_list_several_relays() -> None:
    s = ClientSettings(relay_host="relay-a, relay-b")
    assert s.request_addresses == ["tcp://relay-a:5559", "tcp://relay-b:5559"]
    assert s.market_data_addresses == ["tcp://relay-a:5558", "tcp://relay-b:5558"]
    s = ClientSettings(request_endpoint="tcp://x:1,tcp://y:2", relay_host="ignored")
    assert s.request_addresses == ["tcp://x:1", "tcp://y:2"]


def test_unanswered_submit_is_resent_unchanged_to_the_other_relay(
    kit: Any, fake_reader: Any
) -> None:
    a, b = kit.FakeRelay(), kit.FakeRelay()
    try:
        a.handler = lambda message: kit.Action(None)  # takes the request, never answers

        def accept_on_b(message: Message) -> Any:
            """B acks; the pipeline's notification reaches the client through both relays."""
            assert isinstance(message, SubmitHistoricalRequest)
            topic = kit.topic_for(message)
            note = kit.notification_for(message, topic)
            note.sequence, note.publisher_epoch = len(_submits(b)), 9
            a.publish(topic, note)
            ack = SubmitResponse(
                request_id=message.request_id, status=Status.OK, notification_topic=topic
            )
            return kit.Action(ack, [(topic, note)])

        b.handler = accept_on_b
        with Client(settings=two_relays(a, b, client_id="ff"), reader=fake_reader) as c:
            response = topics.response_topic("ff")
            for relay in (a, b):  # subscribed on both relays at connect
                relay.wait_for(lambda ev: ("sub", response) in ev)
            wait_until(lambda: c.relays_connected == 2, "the client to see both links")
            began = time.monotonic()
            first = c.history(TICKER, "1m", START, END)
            took = time.monotonic() - began
            second = c.history(TICKER, "1m", START, END)  # straight to B now: it answered
            wait_until(lambda: c.dispatch_stats.get("duplicate", 0) == 2, "A's copies dropped")
            assert c.request_failovers == 1
        assert [s.request_id for s in _submits(a)] == [first.request_id]
        assert [s.request_id for s in _submits(b)] == [first.request_id, second.request_id]
        assert _submits(a)[0] == _submits(b)[0]  # the same request, not a new attempt
        assert took >= 0.3  # resent after failover_timeout_s of silence, not before
        assert first.status == second.status == "OK"
    finally:
        a.close()
        b.close()


def test_a_relay_that_refuses_connections_is_left_at_once(kit: Any, fake_reader: Any) -> None:
    """A dead relay (port closed) costs no failover_timeout_s: the REQ's monitor sees it."""
    from infra.testing import free_port

    b = kit.FakeRelay()
    dead = f"tcp://127.0.0.1:{free_port()}"
    try:
        settings = two_relays(b, b, failover_timeout_s=3.0).model_copy(
            update={
                "request_endpoint": f"{dead},{b.request_endpoint}",
                "market_data_endpoint": f"{dead},{b.market_data_endpoint}",
            }
        )
        request = SubmitHistoricalRequest(
            request_id="r-dead", client_id="x", ticker=TICKER, period_seconds=60,
            start_time_ms=START, end_time_ms=END,
        )  # fmt: skip
        with Client(settings=settings, reader=fake_reader) as c:
            wait_until(lambda: c.relays_connected == 1, "the client to see B's link")
            began = time.monotonic()
            reply = c.request(envelope.encode(request), 10.0)
            took = time.monotonic() - began
            assert c.request_failovers == 1
        assert envelope.decode(reply, SubmitResponse).request_id == "r-dead"
        assert _submits(b) == [request]
        assert took < 1.5  # not the 3 s a silent relay would cost
    finally:
        b.close()


def test_live_stream_through_two_relays_delivers_each_message_once(kit: Any) -> None:
    a, b = kit.FakeRelay(), kit.FakeRelay()
    got: list[int] = []
    events: list[SequenceEvent] = []
    try:
        with Client(settings=two_relays(a, b)) as c:
            stream = c.live(
                TICKER, callback=lambda t: got.append(t.sequence), on_sequence=events.append
            )
            topic = f"{TICKER}|tick"
            for relay in (a, b):
                relay.wait_for(lambda ev: ("sub", topic) in ev)

            def tick(seq: int) -> Tick:
                return Tick(ticker=TICKER, trade_id=str(seq), sequence=seq, publisher_epoch=3)

            for seq in range(1, 301):
                a.publish(topic, tick(seq))
                b.publish(topic, tick(seq))
            # Both copies of 1..300 must be in before one relay dies: closing a relay
            # drops what it has not sent yet, and then b's copy would be the first.
            wait_until(lambda: stream.duplicates == 300, "both relays' copies of 1..300")
            a.close()  # one relay dies; the other goes on
            for seq in range(301, 601):
                b.publish(topic, tick(seq))
            wait_until(lambda: got[-1:] == [600], "the last tick")
            assert got == list(range(1, 601))
            assert stream.duplicates == 300
            assert events == []  # no gap, no restart
            wait_until(lambda: c.relays_connected == 1, "A's connection to drop")
    finally:
        a.close()
        b.close()


class _RealRelay:
    """A real relay (package `relay`) serving from a thread, on fixed loopback ports."""

    def __init__(self, upstream: str, ports: dict[str, int]) -> None:
        import threading

        import zmq

        from relay import Relay, RelaySettings

        settings = RelaySettings.loopback(upstream, **ports)
        deadline = time.monotonic() + 10
        while True:  # a restarted relay's ports: the old listener closes asynchronously
            self.relay = Relay(settings)
            try:
                self.endpoints = self.relay.start()
                break
            except zmq.ZMQError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self._thread = threading.Thread(target=self.relay.run, daemon=True)
        self._thread.start()

    def topics(self) -> float:
        return self.relay.metrics.sample("relay_subscribed_topics")

    def stop(self) -> None:
        self.relay.stop()
        self._thread.join(10)
        self.relay.close()


def test_2000_subscriptions_come_back_on_a_restarted_relay() -> None:
    """Both relays hold every subscription; a relay that restarts gets all of them again
    from the client's SUB (libzmq resends at most the SUB's SNDHWM: the SDK lifts it)."""
    import zmq

    from infra.testing import free_port

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pipeline = ctx.socket(zmq.XPUB)
    pipeline.linger = 0
    upstream = f"tcp://127.0.0.1:{pipeline.bind_to_random_port('tcp://127.0.0.1')}"
    ports = [
        {"client_request_port": free_port(), "market_data_pub_port": free_port()} for _ in range(2)
    ]
    a, b = (_RealRelay(upstream, p) for p in ports)
    topics_wanted = [f"RESPONSE:client-{i:05d}" for i in range(2000)]
    try:
        settings = ClientSettings(
            request_endpoint=f"{a.endpoints.client_request},{b.endpoints.client_request}",
            market_data_endpoint=f"{a.endpoints.market_data},{b.endpoints.market_data}",
            subscribe_settle_ms=0,
        )
        with Client(settings=settings) as c:
            for topic in topics_wanted:
                c.subscribe(topic)
            total = len(topics_wanted) + 1  # and the client's own RESPONSE:{client_id}
            wait_until(lambda: a.topics() == b.topics() == total, "both relays to hold all", 30)
            a.stop()
            wait_until(lambda: c.relays_connected == 1, "the client to see A go")
            assert b.topics() == total  # the survivor never lost one
            a = _RealRelay(upstream, ports[0])
            wait_until(lambda: a.topics() == total, "the restarted relay to get all back", 30)
            wait_until(lambda: c.relays_connected == 2, "the client to reconnect")
    finally:
        a.stop()
        b.stop()
        ctx.destroy(linger=0)


_ECHO = """
import sys, zmq
rep = zmq.Context().socket(zmq.REP)
port = rep.bind_to_random_port("tcp://127.0.0.1")
print(port, flush=True)
while True:
    rep.send(rep.recv())
"""


def test_a_request_to_a_frozen_relay_ends_when_its_connection_does() -> None:
    """One relay that stops (SIGSTOP: the process, its ZMTP pings too) while a request
    waits: the REQ's heartbeats drop the connection, and the call ends with
    relay_unreachable instead of waiting out its whole timeout."""
    import signal
    import subprocess
    import sys

    import zmq

    from mdclient.errors import RelayUnavailable
    from mdclient.transport import RequestChannel

    relay = subprocess.Popen([sys.executable, "-c", _ECHO], stdout=subprocess.PIPE, text=True)
    context = zmq.Context()
    try:
        assert relay.stdout is not None
        channel = RequestChannel(context, f"tcp://127.0.0.1:{relay.stdout.readline().strip()}")
        assert channel.request([b"ping"], 60.0) == [b"ping"]  # connected, answered
        relay.send_signal(signal.SIGSTOP)
        with pytest.raises(RelayUnavailable) as lost:
            channel.request([b"lost"], 600.0)
        assert lost.value.error_code == "relay_unreachable"
        assert "lost with the connection" in str(lost.value)
        relay.send_signal(signal.SIGCONT)
        assert channel.request([b"again"], 60.0) == [b"again"]  # a new socket, answered
        channel.close()
    finally:
        relay.kill()
        relay.wait()
        context.destroy(linger=0)
