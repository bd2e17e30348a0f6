"""Order-book feeds: diffing, resets, the feed loop (fake exchange), OKX's checksum, and the
adapter against the simulator's books (Binance through real ccxt.pro, OKX on its own
channel)."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from google.protobuf.message import Message

from infra.exchange_sim import ThreadedSimulator, run_in_thread
from ingestor.books import START, BookStats, delta_record, reset_of, run_book_feed
from ingestor.config import ExchangeSettings
from ingestor.exchanges import ExchangeAdapter
from ingestor.model import (
    BookIntegrity,
    BookIntegrityError,
    BookView,
    ExchangeCallError,
    FaultKind,
)
from ingestor.retry import RetryPolicy
from ingestor.venues.okx import OkxBookChecksum, book_checksum
from mdproto.book import OrderBook
from mdproto.messages import BookDelta, BookReset, BookSnapshot, FeedStatus


def view(bids: dict[float, float], asks: dict[float, float], nonce: int) -> BookView:
    return BookView(bids=bids, asks=asks, nonce=nonce, timestamp_ms=nonce * 10)


def test_delta_turns_one_top_view_into_the_next() -> None:
    before = view({100.0: 1.0, 99.0: 2.0}, {101.0: 1.0, 102.0: 3.0}, 7)
    after = view({100.0: 1.5, 98.0: 1.0}, {101.0: 1.0, 102.0: 3.0}, 9)
    delta = delta_record("BINANCE:BTC/USDT", before, after, 123)
    assert delta is not None
    assert {(lv.price, lv.amount) for lv in delta.bids} == {(100.0, 1.5), (98.0, 1.0), (99.0, 0.0)}
    assert list(delta.asks) == []
    assert (delta.exchange_sequence, delta.exchange_prev_sequence) == (9, 7)
    assert delta_record("T", after, after, 1) is None


def test_reset_reasons() -> None:
    gap = BookIntegrityError(BookIntegrity.SEQUENCE_GAP, "ids 5..7 skipped")
    assert reset_of(gap).kind == BookReset.BOOK_RESET_SEQUENCE_GAP
    assert reset_of(gap).reason == "ids 5..7 skipped"
    bad = BookIntegrityError(BookIntegrity.CHECKSUM, "crc")
    assert reset_of(bad).kind == BookReset.BOOK_RESET_CHECKSUM
    drop = ExchangeCallError(FaultKind.NETWORK, "closed 1006")
    assert reset_of(drop).kind == BookReset.BOOK_RESET_RECONNECT
    assert START.kind == BookReset.BOOK_RESET_START


class FakeSource:
    prefix = "BINANCE"
    supports_books = True

    def __init__(self, script: list[BookView | Exception]) -> None:
        self.script = script
        self.drained = asyncio.Event()  # every scripted answer was given

    async def watch_order_book(self, symbol: str, depth: int) -> BookView:
        if not self.script:
            self.drained.set()
            await asyncio.Event().wait()  # the exchange goes quiet
        item = self.script.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    async def unwatch_order_book(self, symbol: str) -> None:
        return None


class Sink:
    def __init__(self) -> None:
        self.records: list[Message] = []

    async def send_book(self, key: str, record: Message) -> None:
        self.records.append(record)


def test_feed_sends_start_deltas_resets_and_periodic_snapshots() -> None:
    clock = [0.0]
    v1 = view({100.0: 1.0}, {101.0: 1.0}, 1)
    v2 = view({100.0: 2.0}, {101.0: 1.0}, 2)
    v3 = view({100.0: 2.0}, {101.0: 4.0}, 3)
    v5 = view({99.0: 1.0}, {101.0: 4.0}, 5)
    v6 = view({99.0: 1.0}, {102.0: 1.0}, 6)
    v7 = view({99.0: 1.0, 98.0: 2.0}, {102.0: 1.0}, 7)
    v8 = view({98.0: 2.0}, {102.0: 1.0}, 8)
    script: list[BookView | Exception] = [
        v1,
        v2,
        BookIntegrityError(BookIntegrity.SEQUENCE_GAP, "skipped"),
        v3,
        BookIntegrityError(BookIntegrity.CHECKSUM, "crc"),
        ExchangeCallError(FaultKind.NETWORK, "dropped"),
        v5,
        v6,
        v7,
        v8,
    ]
    source, sink = FakeSource(script), Sink()
    stats = BookStats()
    changes: list[int] = []

    def monotonic() -> float:
        clock[0] += 4.0  # 4 s per call: the store interval (10 s) passes now and then
        return clock[0]

    async def no_sleep(_: float) -> None:
        return None

    async def run() -> None:
        task = asyncio.create_task(
            run_book_feed(
                "BINANCE:BTC/USDT",
                source,
                sink,
                stats,
                depth=10,
                store_interval_s=10.0,
                reconnect=RetryPolicy(),
                report=lambda c: changes.append(c.state),
                monotonic=monotonic,
                sleep=no_sleep,
                now_ms=lambda: 42,
            )
        )
        await source.drained.wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(run())
    kinds = [
        (type(r).__name__, r.reset if isinstance(r, BookSnapshot) else None) for r in sink.records
    ]
    assert kinds == [
        ("BookSnapshot", BookReset.BOOK_RESET_START),
        ("BookDelta", None),
        ("BookSnapshot", BookReset.BOOK_RESET_SEQUENCE_GAP),
        # a bad checksum, then a drop before any book: the snapshot reports the checksum
        ("BookSnapshot", BookReset.BOOK_RESET_CHECKSUM),
        ("BookDelta", None),
        ("BookDelta", None),
        ("BookDelta", None),
        ("BookSnapshot", BookReset.BOOK_RESET_NONE),  # store_interval_s passed
    ]
    # Applied in order, the records rebuild the exchange's last book exactly.
    book = OrderBook("BINANCE:BTC/USDT")
    for record in sink.records:
        if isinstance(record, BookSnapshot):
            book.replace(record)
        else:
            assert isinstance(record, BookDelta) and book.follows(record)
            book.apply(record)
    assert book.bids.as_dict() == v8.bids and book.asks.as_dict() == v8.asks
    assert book.exchange_sequence == 8
    assert changes == [FeedStatus.STARTED, FeedStatus.LOST, FeedStatus.RECOVERED]
    assert (stats.resets, stats.reconnects, stats.deltas, stats.snapshots) == (2, 1, 4, 4)


def test_okx_checksum_of_the_documented_example_and_its_verifier() -> None:
    bids = [["3366.1", "7"], ["3366", "6"]]
    asks = [["3366.8", "9"], ["3368", "8"]]
    crc = zlib.crc32(b"3366.1:7:3366.8:9:3366:6:3368:8")
    assert book_checksum(bids, asks) == (crc - (1 << 32) if crc >= 1 << 31 else crc)
    checker = OkxBookChecksum()
    snapshot = {
        "bids": [[*b, "0", "1"] for b in bids],
        "asks": [[*a, "0", "1"] for a in asks],
        "checksum": book_checksum(bids, asks),
    }
    assert checker.apply(snapshot, snapshot=True)
    removed = {"bids": [["3366", "0", "0", "0"]], "asks": [], "checksum": 0}
    removed["checksum"] = book_checksum([["3366.1", "7"]], asks)
    assert checker.apply(removed, snapshot=False)
    wrong = {"bids": [], "asks": [["3368", "1", "0", "1"]], "checksum": removed["checksum"]}
    assert not checker.apply(wrong, snapshot=False)


@pytest.fixture(scope="module")
def sim() -> Iterator[ThreadedSimulator]:
    with run_in_thread() as server:
        yield server


@pytest.mark.parametrize(
    ("exchange_id", "fault", "kind"),
    [
        ("binance", "book_drop", BookIntegrity.SEQUENCE_GAP),
        ("okx", "book_drop", BookIntegrity.SEQUENCE_GAP),
        ("okx", "book_checksum", BookIntegrity.CHECKSUM),
    ],
)
def test_adapter_reports_the_exchanges_integrity_faults(
    sim: ThreadedSimulator, exchange_id: str, fault: str, kind: BookIntegrity
) -> None:
    """The adapter on the simulator (Binance: ccxt.pro; OKX: its own channel): views equal
    the exchange's book at their id; a dropped event or a bad checksum is a
    BookIntegrityError; the next watch rebuilds."""
    settings = ExchangeSettings(api_base_url=sim.base_url)

    async def run() -> Any:
        adapter = ExchangeAdapter(exchange_id, settings)
        try:
            await adapter.load_markets()
            first = await adapter.watch_order_book("BTC/USDT", 100)
            book = sim.book("BTC/USDT", first.nonce)
            assert first.bids == {float(p): float(a) for p, a in book.bids}
            sim.add_fault(fault, symbol="BTC/USDT", exchange=exchange_id)
            with pytest.raises(BookIntegrityError) as raised:
                for _ in range(100):
                    await adapter.watch_order_book("BTC/USDT", 100)
            again = await adapter.watch_order_book("BTC/USDT", 100)
            book = sim.book("BTC/USDT", again.nonce)
            assert again.asks == {float(p): float(a) for p, a in book.asks}
            return raised.value.kind
        finally:
            await adapter.close()

    assert asyncio.run(run()) == kind
