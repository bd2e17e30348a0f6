"""Order books from the simulator's exchanges into real Kafka, through a dropped delta and a
bad checksum: each heals with a reset snapshot, after which the book read back from
`market.book` equals the exchange's, level by level (docs/protocol.md "Order books")."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ingestor.app import Ingestor
from mdproto import envelope
from mdproto.book import OrderBook
from mdproto.messages import BookDelta, BookReset, BookSnapshot, DataRequest, IngestorControl

pytestmark = pytest.mark.stack

Records = list[tuple[bytes | None, bytes]]


def decoded(records: Records) -> list[BookSnapshot | BookDelta]:
    return [envelope.decode_record(v) for _, v in records]  # type: ignore[misc]


def settled_after(reset: int, deltas: int) -> Any:
    """Done when a snapshot with `reset` is followed by `deltas` deltas."""

    def done(records: Records) -> bool:
        messages = decoded(records)
        starts = [
            i for i, m in enumerate(messages) if isinstance(m, BookSnapshot) and m.reset == reset
        ]
        return (
            bool(starts) and sum(isinstance(m, BookDelta) for m in messages[starts[-1] :]) >= deltas
        )

    return done


def rebuild(ticker: str, messages: list[BookSnapshot | BookDelta]) -> OrderBook:
    """The subscriber's side: snapshots replace, deltas apply, ids must follow."""
    book = OrderBook(ticker)
    for message in messages:
        if isinstance(message, BookSnapshot):
            book.replace(message)
        else:
            assert book.follows(message), "a delta after a gap without a reset snapshot"
            book.apply(message)
    return book


def as_levels(levels: Any) -> list[tuple[float, float]]:
    return [(float(p), float(a)) for p, a in levels]


@pytest.mark.parametrize(
    ("exchange_id", "prefix", "symbol", "faults"),
    [
        ("binance", "BINANCE", "BTC/USDT", [("book_drop", BookReset.BOOK_RESET_SEQUENCE_GAP)]),
        (
            "okx",
            "OKX",
            "ETH/USDT",
            [
                ("book_drop", BookReset.BOOK_RESET_SEQUENCE_GAP),
                ("book_checksum", BookReset.BOOK_RESET_CHECKSUM),
            ],
        ),
    ],
)
def test_book_reaches_kafka_and_heals_after_exchange_faults(
    harness: Any,
    run_ingestor: Any,
    exchange_id: str,
    prefix: str,
    symbol: str,
    faults: list[tuple[str, int]],
) -> None:
    sim = harness.sim
    ticker = f"{prefix}:{symbol}"

    async def scenario() -> list[BookSnapshot | BookDelta]:
        relay = harness.FakeRelay()
        settings = harness.settings(
            relay,
            exchanges={exchange_id: {"prefix": prefix, "api_base_url": sim.base_url}},
            kafka={"topic_book": f"t{exchange_id}-{id(relay)}.book"},
            book={"depth": 100, "store_interval_s": 3600},
        )
        ingestor = Ingestor(settings)
        task = await run_ingestor(ingestor)
        topic, read = settings.kafka.topic_book, harness.read_topic
        try:
            await relay.wait_subscribed()
            request = DataRequest(request_id="book-1", kind=DataRequest.BOOK, ticker=ticker)
            await relay.publish(request, f"{prefix}:")
            start = settled_after(BookReset.BOOK_RESET_START, 3)
            await asyncio.to_thread(read, harness.bootstrap, topic, start)
            for kind, reset in faults:
                await asyncio.to_thread(sim.add_fault, kind, symbol=symbol, exchange=exchange_id)
                healed = settled_after(reset, 3)
                records = await asyncio.to_thread(read, harness.bootstrap, topic, healed)
            control = IngestorControl(action=IngestorControl.CANCEL_BOOK, ticker=ticker)
            await relay.send_control(control, f"{prefix}:")
            async with asyncio.timeout(10):  # the cancel runs as a task: poll its outcome
                while ingestor.books is not None and ingestor.books.active():  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            return decoded(records)
        finally:
            await ingestor.stop()
            await task
            relay.close()

    messages = asyncio.run(scenario())
    resets = [m.reset for m in messages if isinstance(m, BookSnapshot)]
    assert resets == [BookReset.BOOK_RESET_START] + [reset for _, reset in faults]
    assert all(m.reason for m in messages if isinstance(m, BookSnapshot))
    book = rebuild(ticker, messages)
    exchange = sim.book(symbol, book.exchange_sequence)
    assert book.bids.top() == as_levels(exchange.bids)
    assert book.asks.top() == as_levels(exchange.asks)
