"""The PUB server process and the driver's Publisher, against a real SUB on a free port."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest
import zmq
from google.protobuf.message import Message

from mdproto import envelope
from mdproto.messages import OHLC, HistoryReadyNotification, Tick
from pipeline.config import Settings
from pipeline.pub_server import Outlet, Publisher, PubServer, Sequencer


def _settings(endpoint: str = "tcp://127.0.0.1:*") -> Settings:
    return Settings.model_validate(
        {"pub_endpoint": endpoint, "live": {"enabled": False}, "cep": {"enabled": False}}
    )


@pytest.fixture
def server() -> Iterator[tuple[PubServer, Publisher]]:
    pub_server = PubServer(_settings())
    endpoint = pub_server.start()
    publisher = Publisher(pub_server.pull_endpoint, endpoint)
    yield pub_server, publisher
    publisher.close()
    pub_server.stop()


def _subscriber(publisher: Publisher, topic: bytes = b"") -> zmq.Socket[bytes]:
    """A SUB whose subscription has provably reached the PUB (probe until one arrives)."""
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, topic)
    sub.setsockopt(zmq.SUBSCRIBE, b"probe")
    sub.setsockopt(zmq.RCVTIMEO, 100)
    sub.connect(publisher.endpoint)
    for _ in range(100):
        publisher.publish("probe", Tick(trade_id="probe"))
        try:
            sub.recv_multipart()
            break
        except zmq.Again:
            continue
    else:
        raise AssertionError("subscription never reached the PUB")
    sub.setsockopt(zmq.UNSUBSCRIBE, b"probe")
    sub.setsockopt(zmq.RCVTIMEO, 5000)
    while True:  # drain probes still in flight
        try:
            sub.recv_multipart(flags=zmq.NOBLOCK)
        except zmq.Again:
            return sub


def test_binds_a_free_port_and_reports_it(server: tuple[PubServer, Publisher]) -> None:
    pub_server, publisher = server
    assert pub_server.alive
    assert publisher.endpoint.startswith("tcp://127.0.0.1:")
    assert not publisher.endpoint.endswith(":*")


def test_messages_arrive_as_mdproto_envelopes(server: tuple[PubServer, Publisher]) -> None:
    _, publisher = server
    sub = _subscriber(publisher, b"RESPONSE:")
    n = HistoryReadyNotification(request_id="r1", row_count=3)

    publisher.publish("RESPONSE:c1", n)

    topic, message = envelope.decode_sub(sub.recv_multipart())
    assert isinstance(message, HistoryReadyNotification)
    assert message.sequence == 1 and message.publisher_epoch > 0  # stamped by the server
    n.sequence, n.publisher_epoch = 1, message.publisher_epoch
    assert (topic, message) == ("RESPONSE:c1", n)
    sub.close(0)


def test_a_late_subscriber_gets_the_last_value_and_early_ones_a_duplicate(
    server: tuple[PubServer, Publisher],
) -> None:
    _, publisher = server
    topic = "BINANCE:BTC/USDT|ohlc:60"
    early = _subscriber(publisher, b"BINANCE:BTC/USDT|ohlc:")
    publisher.publish_many((topic, OHLC(open_time_ms=0, close=float(i))) for i in range(3))
    publisher.publish("BINANCE:BTC/USDT|ohlc:300", OHLC(close=9.0))
    # The server may answer the early subscription after the first publishes reached
    # it (a last value then exists): a duplicate, dropped by sequence as a client does.
    seen: list[tuple[str, Message]] = []
    while len(seen) < 4:
        topic_and_message = envelope.decode_sub(early.recv_multipart())
        if topic_and_message not in seen:
            seen.append(topic_and_message)
    assert [(t, m.sequence, m.close) for t, m in seen] == [  # type: ignore[attr-defined]
        (topic, 1, 0.0),
        (topic, 2, 1.0),
        (topic, 3, 2.0),
        ("BINANCE:BTC/USDT|ohlc:300", 1, 9.0),
    ]

    late = zmq.Context.instance().socket(zmq.SUB)
    late.setsockopt(zmq.RCVTIMEO, 5000)
    late.setsockopt(zmq.SUBSCRIBE, topic.encode())  # nothing more is published
    late.connect(publisher.endpoint)
    got_topic, last = envelope.decode_sub(late.recv_multipart())
    assert (got_topic, last) == seen[2]  # same sequence: a duplicate for everyone else
    # Re-sent to all (dropped by sequence); only duplicates reach the early subscriber.
    while (again := envelope.decode_sub(early.recv_multipart())) != seen[2]:
        assert again in seen
    late.close(0)
    early.close(0)


def test_concurrent_publishers_never_interleave_frames(server: tuple[PubServer, Publisher]) -> None:
    _, publisher = server
    sub = _subscriber(publisher, b"T")

    def burst(k: int) -> None:
        publisher.publish_many((f"T{k}", Tick(trade_id=f"{k}-{i}")) for i in range(500))

    threads = [threading.Thread(target=burst, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    seen = []
    for _ in range(2000):
        topic, message = envelope.decode_sub(sub.recv_multipart())
        assert isinstance(message, Tick) and message.trade_id.startswith(topic[1:] + "-")
        seen.append(message.trade_id)
    assert len(set(seen)) == 2000
    sub.close(0)


def test_a_taken_port_is_a_clear_error(server: tuple[PubServer, Publisher]) -> None:
    _, publisher = server
    second = PubServer(_settings(publisher.endpoint))
    with pytest.raises(RuntimeError, match=f"cannot bind the pipeline PUB on {publisher.endpoint}"):
        second.start()
    second.stop()


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_the_server_dies_with_a_killed_driver_and_frees_the_port() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    driver = textwrap.dedent(
        f"""
        import os, signal
        from pipeline.config import Settings
        from pipeline.pub_server import PubServer
        settings = Settings.model_validate(
            {{
                "pub_endpoint": "tcp://127.0.0.1:{port}",
                "live": {{"enabled": False}},
                "cep": {{"enabled": False}},
            }}
        )
        PubServer(settings).start()
        print("bound", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", driver], capture_output=True, text=True, timeout=60, check=False
    )
    assert "bound" in proc.stdout, proc.stderr
    assert proc.returncode == -9
    deadline = time.monotonic() + 10
    while not _port_free(port):
        assert time.monotonic() < deadline, f"port {port} still bound after the driver died"
        time.sleep(0.1)


def test_the_tick_path_numbers_each_topic_and_keeps_its_last_tick() -> None:
    ctx = zmq.Context.instance()
    xpub = ctx.socket(zmq.XPUB)
    xpub.bind("tcp://127.0.0.1:*")
    outlet = Outlet(xpub, Sequencer(epoch=99))
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"BINANCE:")
    sub.setsockopt(zmq.RCVTIMEO, 5000)
    sub.connect(xpub.getsockopt(zmq.LAST_ENDPOINT).decode())  # type: ignore[union-attr]
    assert xpub.poll(5000)  # the subscription arrived: nothing sent is lost
    outlet.answer_subscriptions()
    tickers = ["BINANCE:BTC/USDT", "BINANCE:ETH/USDT", "BINANCE:BTC/USDT"]
    sent = outlet.send_many(
        (f"{t}|tick", Tick(ticker=t, trade_id=str(i))) for i, t in enumerate(tickers)
    )

    got = [envelope.decode_sub(sub.recv_multipart()) for _ in range(3)]
    assert sent == 3
    assert [(m.ticker, m.sequence, m.publisher_epoch) for _, m in got] == [  # type: ignore[attr-defined]
        ("BINANCE:BTC/USDT", 1, 99),
        ("BINANCE:ETH/USDT", 1, 99),
        ("BINANCE:BTC/USDT", 2, 99),
    ]
    assert outlet.last.frames["BINANCE:BTC/USDT|tick"] == envelope.encode_pub(
        "BINANCE:BTC/USDT|tick", got[2][1]
    )
    sub.close(0)
    xpub.close(0)


def test_a_moved_tickers_last_values_are_forgotten_and_its_numbering_goes_on() -> None:
    """After a revoke (ADR 0014) the engine no longer answers subscriptions for the moved
    ticker (its new owner does); if the ticker comes back, its sequence goes on."""
    ctx = zmq.Context.instance()
    xpub = ctx.socket(zmq.XPUB)
    xpub.bind("tcp://127.0.0.1:*")
    outlet = Outlet(xpub, Sequencer(epoch=7))
    btc, eth = "BINANCE:BTC/USDT", "BINANCE:ETH/USDT"
    outlet.send_many([(f"{t}|tick", Tick(ticker=t, trade_id="1")) for t in (btc, eth)])
    outlet.forget([btc])
    assert set(outlet.last.frames) == {f"{eth}|tick"}
    assert [list(outlet.last.matching(f"{btc}|"))] == [[]]
    outlet.send_many([(f"{btc}|tick", Tick(ticker=btc, trade_id="2"))])
    assert outlet.sequencer.last(f"{btc}|tick") == 2
    xpub.close(0)
