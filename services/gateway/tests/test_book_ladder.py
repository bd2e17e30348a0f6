"""A `{ticker}|book` topic through the gateway's platform side: the SDK's real
BookStream fed messages by hand (no sockets), the frames a WebSocket client gets:
a ladder after each applied message, depth-limited, resets named, a gap marked
stale until a snapshot heals it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from gateway.messages import Topic, parse_topic
from gateway.platform import SdkUpstream
from mdclient.book import BookStream
from mdproto.book import levels_message
from mdproto.markets import Precision
from mdproto.messages import BookDelta, BookReset, BookSnapshot, FeedStatus

T = "BINANCE:BTC/USDT"
TOPIC: Topic = parse_topic(f"{T}|book")
EPOCH = 7
BIDS = [(100.0, 1.0), (99.0, 2.0), (98.0, 3.0)]
ASKS = [(101.0, 1.5), (102.0, 2.5), (103.0, 3.5)]


def snapshot(seq: int, xseq: int, reset: int = BookReset.BOOK_RESET_NONE, reason: str = "") -> Any:
    return BookSnapshot(
        ticker=T,
        bids=levels_message(BIDS),
        asks=levels_message(ASKS),
        exchange_sequence=xseq,
        exchange_time_ms=1_000 + xseq,
        reset=reset,  # type: ignore[arg-type]
        reason=reason,
        sequence=seq,
        publisher_epoch=EPOCH,
    )


def delta(seq: int, xseq: int, bids: list[tuple[float, float]]) -> BookDelta:
    return BookDelta(
        ticker=T,
        bids=levels_message(bids),
        exchange_sequence=xseq,
        exchange_prev_sequence=xseq - 1,
        exchange_time_ms=1_000 + xseq,
        sequence=seq,
        publisher_epoch=EPOCH,
    )


class FakeClient:
    """`mdclient.Client.book` without sockets: the real stream, fed by the test.
    `early` messages arrive before `book` returns, as a last value may."""

    def __init__(self, early: list[Any] | None = None, precision: Precision | None = None) -> None:
        self.stream: BookStream | None = None
        self.early = early or []
        self.steps = precision or Precision()
        self.precision_reads = 0

    def precision(self, ticker: str) -> Precision:
        """`Client.precision`: the market's tick and lot size (Iceberg market.markets)."""
        self.precision_reads += 1
        return self.steps

    def book(self, ticker: str, **callbacks: Any) -> BookStream:
        """`callback`, `on_event`, `on_status`: what the gateway passes the SDK."""
        self.stream = BookStream(ticker, lambda stream: None, clock_ms=lambda: 5_000, **callbacks)
        for message in self.early:
            self.stream.deliver(message)
        return self.stream


def open_book(
    levels: int = 2, early: list[Any] | None = None
) -> tuple[Callable[[Any], None], list[dict[str, Any]], list[tuple[str, str]]]:
    """(feed a message, frames delivered, failures)."""
    client = FakeClient(early)
    frames: list[dict[str, Any]] = []
    failures: list[tuple[str, str]] = []
    upstream = SdkUpstream(client, book_levels=levels)  # type: ignore[arg-type]
    upstream.open(
        TOPIC, lambda text: frames.append(json.loads(text)), lambda c, r: failures.append((c, r))
    )
    stream = client.stream
    assert stream is not None
    return stream.deliver, frames, failures


def test_each_applied_message_is_a_ladder_of_the_best_levels() -> None:
    feed, frames, _ = open_book(levels=2)
    feed(snapshot(1, 10))
    feed(delta(2, 11, [(100.5, 4.0)]))  # a new best bid
    feed(delta(3, 12, [(100.5, 0.0)]))  # removed again
    ladders = [f for f in frames if f["type"] == "book"]
    assert len(ladders) == 3
    first, better, back = ladders
    assert first["bids"] == [[100.0, 1.0], [99.0, 2.0]]  # depth-limited to 2 a side
    assert first["asks"] == [[101.0, 1.5], [102.0, 2.5]]
    assert better["best_bid"] == [100.5, 4.0] and better["spread"] == 0.5
    assert better["exchange_sequence"] == "11" and better["exchange_time_ms"] == "1011"
    assert back["bids"] == first["bids"] and back["spread"] == 1.0
    assert all(f["in_sync"] and f["topic"] == TOPIC.name for f in ladders)


def test_a_feed_reset_is_named_before_its_ladder() -> None:
    feed, frames, _ = open_book()
    feed(snapshot(1, 10, BookReset.BOOK_RESET_START))
    feed(snapshot(2, 20, BookReset.BOOK_RESET_CHECKSUM, reason="crc 123 != 456"))
    assert [(f["type"], f.get("reset")) for f in frames] == [
        ("book_event", "BOOK_RESET_START"),
        ("book", None),
        ("book_event", "BOOK_RESET_CHECKSUM"),
        ("book", None),
    ]
    assert frames[2]["reason"] == "crc 123 != 456" and frames[3]["exchange_sequence"] == "20"


def test_a_gap_leaves_a_stale_ladder_until_a_snapshot_resyncs_it() -> None:
    feed, frames, _ = open_book()
    feed(snapshot(1, 10))
    feed(delta(4, 11, [(100.0, 9.0)]))  # sequences 2 and 3 lost: not applied
    gap_event, stale = frames[-2:]
    assert (gap_event["type"], gap_event["kind"], gap_event["missed"]) == ("book_event", "gap", "2")
    assert stale["type"] == "book" and not stale["in_sync"]
    assert stale["bids"][0] == [100.0, 1.0]  # the delta was not applied
    feed(delta(5, 12, [(100.0, 8.0)]))  # still out of sync: dropped, nothing sent
    assert frames[-1] is stale
    feed(snapshot(6, 12))  # the periodic snapshot heals it
    resynced, whole = frames[-2:]
    assert resynced["kind"] == "resynced" and resynced["reset"] is None
    assert whole["in_sync"] and whole["exchange_sequence"] == "12"


def test_a_book_applied_before_the_stream_is_returned_is_still_sent() -> None:
    _, frames, _ = open_book(early=[snapshot(1, 10)])
    assert [f["type"] for f in frames] == ["book"]
    assert frames[0]["bids"][0] == [100.0, 1.0] and frames[0]["exchange_sequence"] == "10"


def test_a_failed_book_feed_ends_the_subscription_with_its_code() -> None:
    feed, frames, failures = open_book()
    feed(FeedStatus(ticker=T, state=FeedStatus.FAILED, error_code="bad_symbol", reason="no book"))
    assert frames[-1]["type"] == "feed_status" and frames[-1]["data"]["state"] == "FAILED"
    assert [(code, "no book" in reason) for code, reason in failures] == [("bad_symbol", True)]


def test_ladders_carry_the_markets_tick_and_lot_size_read_once() -> None:
    """Issue 47: the page printed prices with as many decimals as each double had."""
    client = FakeClient(precision=Precision.of(0.01, 0.001))
    upstream = SdkUpstream(client, book_levels=2)  # type: ignore[arg-type]
    frames: list[dict[str, Any]] = []
    for _ in range(2):  # a second subscription to the topic: the steps are not read again
        upstream.open(TOPIC, lambda text: frames.append(json.loads(text)), lambda c, r: None)
        assert client.stream is not None
        client.stream.deliver(snapshot(1, 10))
    ladders = [f for f in frames if f["type"] == "book"]
    assert [(f["price_decimals"], f["amount_decimals"]) for f in ladders] == [(2, 3), (2, 3)]
    assert client.precision_reads == 1
    unknown = FakeClient()
    blind = SdkUpstream(unknown, book_levels=2)  # type: ignore[arg-type]
    for _ in range(2):
        blind.open(TOPIC, lambda text: frames.append(json.loads(text)), lambda c, r: None)
    assert unknown.precision_reads == 2  # unknown is asked again: the row may come
    assert unknown.stream is not None
    unknown.stream.deliver(snapshot(1, 10))
    assert (frames[-1]["price_decimals"], frames[-1]["amount_decimals"]) == (None, None)
