"""An order book through the whole platform equals the exchange's, through a lost delta.

Simulator (Binance depth stream) -> ingestor (ccxt.pro book, deltas) -> Kafka
`market.book` -> pipeline live engine -> relay -> `Client.book`: the client's book
equals the exchange's at the same update id, level by level; a delta the exchange
drops is healed by a reset snapshot (SEQUENCE_GAP) that the client reports, after
which the book is equal again (docs/protocol.md "Order books"). The checksum path
(OKX, Kraken) and the other exchanges' books run on the platform without Binance
(e2e/test_exchanges_without_binance.py).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from infra.exchange_sim.control import SimulatorControl
from infra.testing import book_equals_exchange, poll_until
from mdclient import Client, ClientSettings
from mdclient.book import BookEvent

pytestmark = [pytest.mark.e2e, pytest.mark.stack]

SYMBOL = "ADA/USDT"
TICKER = f"BINANCE:{SYMBOL}"


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
            "the client's book equal to the exchange's", book_equals_exchange(book, sim, SYMBOL), 30
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
        poll_until("equal again after the reset", book_equals_exchange(book, sim, SYMBOL), 30)

    assert reset[0].reason.startswith("SEQUENCE_GAP: "), reset[0]
    stats: dict[str, Any] = book.stats
    assert stats.get("snapshots", 0) >= 2, stats
    print(f"book reset reported {healed_s:.2f} s after the dropped delta")
