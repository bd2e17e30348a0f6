"""The shared L2 book: what every service applies must give the same book."""

from __future__ import annotations

import random

from mdproto.book import OrderBook, book_from_levels, diff_side, levels_message
from mdproto.envelope import decode, encode
from mdproto.messages import BookDelta, BookReset, BookSnapshot
from mdproto.topics import book_topic, parse_market_topic

TICKER = "BINANCE:BTC/USDT"


def test_sides_are_best_first_and_zero_removes() -> None:
    book = book_from_levels(TICKER, [(99.0, 1.0), (100.0, 2.0)], [(102.0, 1.0), (101.0, 3.0)])
    assert book.best_bid() == (100.0, 2.0)
    assert book.best_ask() == (101.0, 3.0)
    assert book.spread() == 1.0
    book.apply(BookDelta(ticker=TICKER, bids=levels_message([(100.0, 0.0), (98.0, 5.0)])))
    assert book.bids.top() == [(99.0, 1.0), (98.0, 5.0)]
    assert not book.crossed()


def test_a_snapshot_replaces_everything_and_keeps_its_sequence() -> None:
    book = book_from_levels(TICKER, [(1.0, 1.0)], [(2.0, 1.0)])
    book.replace(
        BookSnapshot(
            ticker=TICKER,
            bids=levels_message([(10.0, 1.0)]),
            asks=levels_message([(11.0, 2.0)]),
            exchange_sequence=42,
            depth=20,
        )
    )
    assert (book.bids.top(), book.asks.top()) == ([(10.0, 1.0)], [(11.0, 2.0)])
    assert (book.exchange_sequence, book.depth) == (42, 20)


def test_follows_checks_the_exchange_ids_only_where_both_are_known() -> None:
    book = OrderBook(TICKER)
    assert book.follows(BookDelta(exchange_prev_sequence=7))  # no sequence yet
    book.apply(BookDelta(exchange_sequence=10))
    assert book.follows(BookDelta(exchange_prev_sequence=10, exchange_sequence=12))
    assert not book.follows(BookDelta(exchange_prev_sequence=11, exchange_sequence=12))
    assert book.follows(BookDelta(exchange_sequence=12))  # the exchange gives no previous id


def test_diffs_of_top_n_views_keep_a_consumer_equal_to_the_source() -> None:
    """Random exchange books, viewed to depth 5: deltas from `diff_side` rebuild each view."""
    rng = random.Random(7)
    source = OrderBook(TICKER)
    consumer = OrderBook(TICKER)
    depth = 5
    previous_bids: dict[float, float] = {}
    previous_asks: dict[float, float] = {}
    for _ in range(500):
        side = source.bids if rng.random() < 0.5 else source.asks
        base = 100.0 if side is source.bids else 101.0
        offset = rng.randint(0, 12) * (-0.5 if side is source.bids else 0.5)
        side.set(base + offset, rng.choice([0.0, 0.5, 1.0, 2.0]))
        bids = dict(source.bids.top(depth))
        asks = dict(source.asks.top(depth))
        delta = BookDelta(
            ticker=TICKER,
            bids=levels_message(diff_side(previous_bids, bids)),
            asks=levels_message(diff_side(previous_asks, asks)),
        )
        consumer.apply(decode(encode(delta), BookDelta))
        previous_bids, previous_asks = bids, asks
        assert consumer.bids.top() == source.bids.top(depth)
        assert consumer.asks.top() == source.asks.top(depth)


def test_a_snapshot_of_the_book_rebuilds_an_equal_book() -> None:
    book = book_from_levels(TICKER, [(100.0, 1.0), (99.5, 2.0)], [(100.5, 3.0)])
    book.exchange_sequence = 9
    copy = OrderBook(TICKER)
    copy.replace(book.snapshot(reset=BookReset.BOOK_RESET_CHECKSUM, reason="crc"))
    assert copy == book
    assert copy.exchange_sequence == 9
    assert book.snapshot(depth=1).bids[0].price == 100.0
    assert len(book.snapshot(depth=1).bids) == 1


def test_book_topic_parses_as_a_market_topic() -> None:
    topic = parse_market_topic(book_topic(TICKER))
    assert topic is not None
    assert (topic.ticker, topic.kind) == (TICKER, "book")
    assert parse_market_topic(f"{TICKER}|books") is None
