"""The PUB adapter against a real SUB on a free port."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import zmq

from mdproto import envelope
from mdproto.messages import HistoryReadyNotification, Tick
from pipeline.notify import Publisher


@pytest.fixture
def publisher() -> Iterator[Publisher]:
    pub = Publisher("tcp://127.0.0.1:*", sndhwm=10_000)
    yield pub
    pub.close()


def _subscriber(endpoint: str, publisher: Publisher, topic: bytes = b"") -> zmq.Socket[bytes]:
    """A SUB whose subscription has provably reached the publisher (probe until one arrives)."""
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, topic)
    sub.setsockopt(zmq.SUBSCRIBE, b"probe")
    sub.setsockopt(zmq.RCVTIMEO, 100)
    sub.connect(endpoint)
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


def test_binds_a_free_port_and_reports_it(publisher: Publisher) -> None:
    assert publisher.endpoint.startswith("tcp://127.0.0.1:")
    assert not publisher.endpoint.endswith(":*")


def test_messages_arrive_as_mdproto_envelopes(publisher: Publisher) -> None:
    sub = _subscriber(publisher.endpoint, publisher, b"RESPONSE:")
    n = HistoryReadyNotification(request_id="r1", row_count=3)

    publisher.publish("RESPONSE:c1", n)

    topic, message = envelope.decode_sub(sub.recv_multipart())
    assert (topic, message) == ("RESPONSE:c1", n)
    sub.close(0)


def test_concurrent_publishers_never_interleave_frames(publisher: Publisher) -> None:
    sub = _subscriber(publisher.endpoint, publisher, b"T")

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


def test_a_taken_port_is_a_clear_error(publisher: Publisher) -> None:
    with pytest.raises(RuntimeError, match=f"cannot bind the pipeline PUB on {publisher.endpoint}"):
        Publisher(publisher.endpoint)
