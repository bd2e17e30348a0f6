"""`Client.book` on the pipeline's real PUB server and live engine, fed through real Kafka
(local_stack): the client's book equals the records' book level by level, through a
lost stretch of messages and an exchange-side mismatch, each healed by a snapshot."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from mdclient import Client
from mdclient.book import BookEvent, BookStream
from mdclient.config import ClientSettings
from mdproto import contracts, envelope, topics
from mdproto.book import OrderBook, levels_message
from mdproto.messages import BookDelta, BookReset, BookSnapshot
from mdproto.runtime.kafka import ensure_topics, spec
from pipeline.config import Settings as PipelineSettings
from pipeline.pub_server import PubServer

pytestmark = pytest.mark.stack

T = "OKX:BOOK/USDT"
PROBE = "OKX:PROBE/USDT"
WAIT_S = 30.0


@pytest.fixture
def book_feed(local_stack: Any, tmp_path: Path) -> Iterator[tuple[str, Callable[..., None]]]:
    """A PUB server whose live engine reads private topics; yields (endpoint, send)."""
    from confluent_kafka import Producer

    bootstrap = local_stack.endpoints.kafka_bootstrap
    tag = uuid.uuid4().hex[:8]
    ticks, book = f"bk-{tag}.ticks", f"bk-{tag}.book"
    ensure_topics(
        bootstrap,
        [spec(contracts.KAFKA_TICKS, ticks), spec(contracts.KAFKA_BOOK, book)],
        partitions=1,
        replication=1,
        timeout_s=30,
    )
    settings = PipelineSettings.model_validate(
        {
            "pub_endpoint": "tcp://127.0.0.1:*",
            "checkpoint_dir": str(tmp_path / "checkpoints"),
            "kafka": {
                "bootstrap_servers": bootstrap,
                "topic_ticks": ticks,
                "topic_book": book,
                "topic_live_candles": f"bk-{tag}.live-candles",
            },
            "cep": {"enabled": False},
            "live": {"book_snapshot_s": 0.5, "state_location": str(tmp_path / "live-state")},
        }
    )
    server = PubServer(settings)
    endpoint = server.start()
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})

    def send(*records: BookSnapshot | BookDelta) -> None:
        for record in records:
            producer.produce(book, envelope.encode_record(record), key=T.encode())
        assert producer.flush(30) == 0

    try:
        yield endpoint, send
    finally:
        server.stop()


def _snapshot(seq: int, bids: Any, asks: Any, reset: int = BookReset.BOOK_RESET_NONE) -> Any:
    return BookSnapshot(
        ticker=T,
        bids=levels_message(bids),
        asks=levels_message(asks),
        depth=400,
        exchange_sequence=seq,
        reset=reset,  # type: ignore[arg-type]
        reason="" if reset == BookReset.BOOK_RESET_NONE else "test",
    )


def _delta(seq: int, bids: Any = (), asks: Any = (), prev: int | None = None) -> BookDelta:
    return BookDelta(
        ticker=T,
        bids=levels_message(bids),
        asks=levels_message(asks),
        exchange_sequence=seq,
        exchange_prev_sequence=seq - 1 if prev is None else prev,
    )


def _wait(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)  # poll: the book is updated on the client's subscriber thread


def _last_value(endpoint: str) -> Any:
    """What a fresh SUB of the book topic gets at once: the PUB's current book."""
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.RCVTIMEO, 5000)
    sub.setsockopt(zmq.SUBSCRIBE, topics.book_topic(T).encode())
    sub.connect(endpoint)
    try:
        return envelope.decode_sub(sub.recv_multipart())[1]
    finally:
        sub.close(0)


def kinds(events: list[BookEvent]) -> list[str]:
    """The events' kinds, without the START reset the client sees if it subscribed before
    the pipeline had the book (else its first message is the last value: no event)."""
    got = [e.kind for e in events]
    return got[1:] if got[:1] == ["reset"] else got


def _equal(stream: BookStream, expected: OrderBook) -> Callable[[], bool]:
    return lambda: stream.in_sync and stream.snapshot() == expected


def test_the_client_book_follows_and_heals(
    book_feed: tuple[str, Callable[..., None]], fake_relay: Any
) -> None:
    endpoint, send = book_feed
    settings = ClientSettings(
        request_endpoint=fake_relay.request_endpoint, market_data_endpoint=endpoint
    )
    start = _snapshot(100, [(10.0, 1.0), (9.0, 2.0)], [(11.0, 1.0), (12.0, 2.0)], 1)
    expected = OrderBook(T)
    expected.replace(start)
    send(start)
    events: list[BookEvent] = []
    with Client(settings=settings) as client, client.book(T, on_event=events.append) as stream:
        # Joined after the snapshot: the pipeline's last value is the book.
        _wait(_equal(stream, expected), "the last value")
        changes = [_delta(101, bids=[(10.0, 0.0), (9.5, 3.0)]), _delta(102, asks=[(11.5, 4.0)])]
        send(*changes)
        for d in changes:
            expected.apply(d)
        _wait(_equal(stream, expected), "the deltas")
        assert stream.best_bid() == (9.5, 3.0) and stream.best_ask() == (11.0, 1.0)

        # Lost messages: the subscription is withdrawn while three deltas go out; back,
        # the last value (the current book, numbered as the topic's last message)
        # reveals the gap and resyncs at once.
        book_topic = topics.book_topic(T)
        client.unsubscribe(book_topic)
        with client.book(PROBE) as probe:  # answered: the withdrawal reached the XPUB
            deadline = time.monotonic() + WAIT_S
            while not probe.wait_synced(0.5):
                assert time.monotonic() < deadline, "the probe"
                send(BookSnapshot(ticker=PROBE, bids=levels_message([(1.0, 1.0)])))
        lost = [_delta(103, bids=[(8.0, 1.0)]), _delta(104, asks=[(12.0, 0.0)]), _delta(105)]
        send(*lost)
        for d in lost:
            expected.apply(d)
        _wait(lambda: _last_value(endpoint).exchange_sequence == 105, "the PUB took them")
        client.subscribe(book_topic)
        _wait(lambda: kinds(events) == ["gap", "resynced"], str(events))
        _wait(_equal(stream, expected), "the book after the gap")
        assert events[-2].missed > 0

        # The exchange's ids do not follow (a dropped delta upstream): out of sync until
        # the feed's reset snapshot.
        send(_delta(110, bids=[(7.0, 1.0)], prev=108))
        _wait(lambda: not stream.in_sync, "the mismatch")
        rebuilt = _snapshot(120, [(20.0, 1.0)], [(21.0, 1.0)], BookReset.BOOK_RESET_CHECKSUM)
        send(rebuilt)
        expected.replace(rebuilt)
        _wait(_equal(stream, expected), "the reset")
    assert kinds(events) == ["gap", "resynced", "gap", "reset", "resynced"], events
    assert "delta after 108, book at 105" in events[-3].reason
    assert events[-2].reason == "CHECKSUM: test"
