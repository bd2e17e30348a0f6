"""An order book through the whole platform equals the exchange's, through a lost delta.

Simulator (Binance depth stream) -> ingestor (ccxt.pro book, deltas) -> Kafka
`market.book` -> pipeline live engine -> relay -> `Client.book`: the client's book
equals the exchange's at the same update id, level by level; a delta the exchange
drops is healed by a reset snapshot (SEQUENCE_GAP) that the client reports, after
which the book is equal again (docs/protocol.md "Order books"). The checksum path
(OKX) is proven from the exchange to Kafka in services/ingestor/tests/test_stack_books.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from infra.exchange_sim.control import SimulatorControl
from infra.testing import poll_until
from mdclient import Client, ClientSettings
from mdclient.book import BookEvent, BookStream

pytestmark = [pytest.mark.e2e, pytest.mark.stack]

SYMBOL = "ADA/USDT"
TICKER = f"BINANCE:{SYMBOL}"


def levels(side: list[list[str]]) -> list[tuple[float, float]]:
    return [(float(price), float(amount)) for price, amount in side]


def equal_to_the_exchange(book: BookStream, sim: SimulatorControl) -> Callable[[], bool]:
    """A check for poll_until: the client's whole book equals the exchange's at the
    update id the client's book is at (a book moves every 100 ms: compare like with like)."""

    def check() -> bool:
        if not book.in_sync:
            return False
        mine = book.snapshot()
        exchange = sim.book(SYMBOL, mine.exchange_sequence)
        return mine.bids.top() == levels(exchange["bids"]) and mine.asks.top() == levels(
            exchange["asks"]
        )

    return check


def test_a_clients_book_equals_the_exchanges_through_a_dropped_delta(
    client_settings: ClientSettings, sim: SimulatorControl
) -> None:
    events: list[BookEvent] = []
    with (
        Client(settings=client_settings) as client,
        client.book(TICKER, on_event=events.append) as book,
    ):
        assert book.wait_synced(90), f"no book within 90 s: {book.status}"
        poll_until(
            "the client's book equal to the exchange's", equal_to_the_exchange(book, sim), 30
        )
        bid, ask = book.best_bid(), book.best_ask()
        assert bid is not None and ask is not None and bid[0] < ask[0]

        sim.add_fault("book_drop", symbol=SYMBOL, exchange="binance")
        dropped_at = time.monotonic()
        reset = poll_until(
            "the reset reported",
            lambda: [e for e in events if e.kind == "reset" and "SEQUENCE_GAP" in e.reason],
            30,
        )
        healed_s = time.monotonic() - dropped_at
        poll_until("equal again after the reset", equal_to_the_exchange(book, sim), 30)

    assert reset[0].reason.startswith("SEQUENCE_GAP: "), reset[0]
    stats: dict[str, Any] = book.stats
    assert stats.get("snapshots", 0) >= 2, stats
    print(f"book reset reported {healed_s:.2f} s after the dropped delta")
