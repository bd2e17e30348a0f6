"""Order books in the PUB process: LiveBooks (pure) and the outlet's book path (a fake XPUB)."""

from __future__ import annotations

from typing import Any

import pytest
import zmq

from mdproto import envelope
from mdproto.book import OrderBook, levels_message
from mdproto.messages import BookDelta, BookReset, BookSnapshot
from pipeline import pub_server
from pipeline.live_books import LiveBooks
from pipeline.live_engine import decode_book_records
from pipeline.pub_server import Outlet, Sequencer

BTC = "BINANCE:BTC/USDT"
ETH = "BINANCE:ETH/USDT"


def snapshot(ticker: str = BTC, seq: int = 100, reset: int = BookReset.BOOK_RESET_START) -> Any:
    return BookSnapshot(
        ticker=ticker,
        bids=levels_message([(100.0, 1.0), (99.0, 2.0)]),
        asks=levels_message([(101.0, 1.5), (102.0, 3.0)]),
        depth=2,
        exchange_sequence=seq,
        reset=reset,  # type: ignore[arg-type]
        ingested_at_ms=1_000,
    )


def delta(
    ticker: str = BTC,
    *,
    bids: list[tuple[float, float]] = (),  # type: ignore[assignment]
    asks: list[tuple[float, float]] = (),  # type: ignore[assignment]
    seq: int = 101,
    prev: int = 100,
) -> BookDelta:
    return BookDelta(
        ticker=ticker,
        bids=levels_message(bids),
        asks=levels_message(asks),
        exchange_sequence=seq,
        exchange_prev_sequence=prev,
        ingested_at_ms=2_000,
    )


def levels(s: BookSnapshot) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    return [(x.price, x.amount) for x in s.bids], [(x.price, x.amount) for x in s.asks]


def test_deltas_are_held_back_until_the_first_snapshot() -> None:
    books = LiveBooks()
    assert not books.apply(delta())
    assert books.held_back == 1
    assert books.snapshot(BTC) is None
    assert books.apply(snapshot())
    assert books.apply(delta(bids=[(100.0, 0.0), (99.5, 4.0)]))
    current = books.snapshot(BTC)
    assert current is not None
    assert levels(current) == ([(99.5, 4.0), (99.0, 2.0)], [(101.0, 1.5), (102.0, 3.0)])
    assert (current.reset, current.exchange_sequence, current.depth) == (0, 101, 2)
    assert current.ingested_at_ms == 2_000


def test_only_books_changed_since_their_last_snapshot_are_snapshotted() -> None:
    books = LiveBooks()
    books.apply(snapshot(BTC))
    books.apply(snapshot(ETH))
    assert books.take_changed() == []  # a snapshot just went out for both
    books.apply(delta(BTC, asks=[(101.0, 0.5)]))
    [due] = books.take_changed()
    assert due.ticker == BTC and due.reset == BookReset.BOOK_RESET_NONE
    assert levels(due)[1] == [(101.0, 0.5), (102.0, 3.0)]
    assert books.take_changed() == []
    books.apply(delta(ETH, bids=[(98.0, 1.0)]))
    books.apply(snapshot(ETH, seq=200, reset=BookReset.BOOK_RESET_NONE))
    assert books.take_changed() == []  # the ingestor's own snapshot covered the change


def test_a_delta_that_does_not_follow_unserves_the_book_until_a_snapshot() -> None:
    books = LiveBooks()
    books.apply(snapshot(seq=100))
    assert books.apply(delta(seq=105, prev=104))  # published: subscribers judge it too
    assert books.mismatched == 1
    assert books.snapshot(BTC) is None
    assert not books.apply(delta(seq=106, prev=105))
    assert books.apply(snapshot(seq=106))
    assert books.snapshot(BTC) is not None


def test_book_records_are_decoded_and_anything_else_dropped() -> None:
    from mdproto.messages import Tick

    values = [
        envelope.encode_record(snapshot()),
        b"garbage",
        None,
        envelope.encode_record(Tick(ticker=BTC, trade_id="1")),
        envelope.encode_record(BookDelta(bids=levels_message([(1.0, 1.0)]))),  # no ticker
        envelope.encode_record(delta()),
    ]
    decoded = decode_book_records(values)
    assert [type(r).__name__ for r in decoded] == ["BookSnapshot", "BookDelta"]


class FakeXpub:
    """What the outlet uses of its XPUB: sends recorded, subscription events queued."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []
        self.events: list[bytes] = []

    def send_multipart(self, frames: list[bytes]) -> None:
        self.sent.append(envelope.decode_sub(frames))

    def recv(self, flags: int = 0) -> bytes:
        if not self.events:
            raise zmq.Again()
        return self.events.pop(0)

    def subscribe(self, prefix: str) -> None:
        self.events.append(b"\x01" + prefix.encode())


@pytest.fixture
def outlet(monkeypatch: pytest.MonkeyPatch) -> tuple[Outlet, FakeXpub]:
    xpub = FakeXpub()
    # The outlet sends with pyzmq's compiled send, which takes real sockets only.
    monkeypatch.setattr(pub_server, "send_frames", lambda sock, frames: sock.send_multipart(frames))
    return Outlet(xpub, Sequencer(epoch=7)), xpub  # type: ignore[arg-type]


def test_book_records_are_numbered_on_their_topic(outlet: tuple[Outlet, FakeXpub]) -> None:
    out, xpub = outlet
    sent = out.send_books([delta(), snapshot(), delta(), snapshot(ETH)])
    assert sent == 3  # the delta before the first snapshot is held back
    assert [(t, type(m).__name__, m.sequence, m.publisher_epoch) for t, m in xpub.sent] == [
        (f"{BTC}|book", "BookSnapshot", 1, 7),
        (f"{BTC}|book", "BookDelta", 2, 7),
        (f"{ETH}|book", "BookSnapshot", 1, 7),
    ]


def test_a_new_subscription_gets_the_current_book_with_the_topics_last_sequence(
    outlet: tuple[Outlet, FakeXpub],
) -> None:
    out, xpub = outlet
    out.send_books(
        [snapshot(), delta(bids=[(100.0, 5.0)]), delta(asks=[(101.0, 0.0)], seq=102, prev=101)]
    )
    xpub.sent.clear()
    xpub.subscribe(f"{BTC}|book")
    xpub.subscribe("BINANCE:ETH")  # no book there: nothing
    assert out.answer_subscriptions() == 1
    [(topic, last)] = xpub.sent
    assert topic == f"{BTC}|book"
    assert isinstance(last, BookSnapshot)
    assert (last.sequence, last.publisher_epoch, last.reset) == (3, 7, 0)
    assert last.exchange_sequence == 102
    expected = OrderBook(BTC)
    expected.replace(snapshot())
    expected.apply(delta(bids=[(100.0, 5.0)]))
    expected.apply(delta(asks=[(101.0, 0.0)], seq=102, prev=101))
    got = OrderBook(BTC)
    got.replace(last)
    assert got == expected
    # The copy is not a message of the topic: the next one is number 4.
    out.send_books([delta(bids=[(98.0, 1.0)], seq=103, prev=102)])
    assert xpub.sent[-1][1].sequence == 4


def test_periodic_snapshots_go_out_for_changed_books_only(outlet: tuple[Outlet, FakeXpub]) -> None:
    out, xpub = outlet
    out.send_books([snapshot(BTC), snapshot(ETH), delta(BTC, bids=[(99.0, 0.0)])])
    xpub.sent.clear()
    assert out.send_book_snapshots() == 1
    [(topic, periodic)] = xpub.sent
    assert topic == f"{BTC}|book"
    assert (periodic.sequence, periodic.reset) == (3, BookReset.BOOK_RESET_NONE)
    assert levels(periodic)[0] == [(100.0, 1.0)]
    assert out.send_book_snapshots() == 0
