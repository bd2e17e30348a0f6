"""Bybit, Kraken and Coinbase books: the venue guards fed the exchanges' recorded messages
(sequence gaps, checksums, stale updates), and the adapter on the simulator's channels
over the venues' own websocket channels (a dropped delta, a bad checksum ->
BookIntegrityError, then a book rebuilt from a fresh snapshot)."""

from __future__ import annotations

import asyncio
import copy
import json
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from infra.exchange_sim import ThreadedSimulator, run_in_thread
from infra.exchange_sim.books import step_of
from ingestor.config import ExchangeSettings
from ingestor.exchanges import ExchangeAdapter
from ingestor.model import BookIntegrity, BookIntegrityError, BookView
from ingestor.venues import bybit, kraken, venue_for
from ingestor.venues.base import BookContext, BookTopic
from ingestor.venues.bybit import BybitBookGuard
from ingestor.venues.kraken import KrakenBookGuard, book_checksum

FIXTURES = Path(__file__).parents[3] / "infra" / "tests" / "fixtures" / "books"
MARKETS: dict[str, Mapping[str, Any]] = {
    "BTCUSDT": {"id": "BTCUSDT", "symbol": "BTC/USDT"},
    "BTC/USDT": {"id": "BTCUSDT", "symbol": "BTC/USDT"},
    "MATIC/USD": {
        "id": "MATICUSD",
        "symbol": "MATIC/USD",
        "info": {"pair_decimals": 4, "lot_decimals": 8},
    },
}


def recorded(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def context(depth: int | None = None) -> BookContext:
    return BookContext(MARKETS.__getitem__, lambda symbol: depth)


def test_bybit_guard_follows_u_and_reports_seq() -> None:
    guard = BybitBookGuard(context())
    snapshot, delta = (
        recorded("bybit_orderbook_snapshot.json"),
        recorded("bybit_orderbook_delta.json"),
    )
    assert guard.check({"topic": "publicTrade.BTCUSDT", "data": []}) is None  # not a book
    stale = guard.check(delta)
    assert stale is not None and stale.stale  # an update before any snapshot is dropped
    first = guard.check(snapshot)
    assert first is not None and (first.symbol, first.problem, first.sequence) == (
        "BTC/USDT",
        None,
        7961638724,
    )
    second = guard.check(delta)
    assert second is not None and second.problem is None and second.sequence == 7961638748
    skipped = copy.deepcopy(delta)
    skipped["data"]["u"] += 2  # the next message lost
    gap = guard.check(skipped)
    assert gap is not None and gap.problem is BookIntegrity.SEQUENCE_GAP
    assert "18521291 after 18521289 (1 skipped)" in gap.reason
    after = guard.check(delta)
    assert after is not None and after.stale  # nothing until the new snapshot
    assert guard.check(snapshot) == first
    assert bybit.book_request("unsubscribe", BookTopic("BTC/USDT", "BTCUSDT", 200)) == {
        "op": "unsubscribe",
        "args": ["orderbook.200.BTCUSDT"],
    }


def _kraken(
    kind: str, bids: list[tuple[float, float]], asks: list[tuple[float, float]], checksum: int
) -> dict[str, Any]:
    data = {
        "symbol": "MATIC/USD",
        "bids": [{"price": p, "qty": q} for p, q in bids],
        "asks": [{"price": p, "qty": q} for p, q in asks],
        "checksum": checksum,
    }
    return {"channel": "book", "type": kind, "data": [data]}


def test_kraken_guard_checks_the_checksum_in_the_pairs_precision() -> None:
    # Kraken writes every digit of the pair's precision (4 and 8 here): 0.5666 -> "0.5666",
    # 4831.7 -> "4831.70000000"; the checksum drops "." and leading zeros.
    text = b"5668" + b"441079769741" + b"5666" + b"483170000000"
    good = zlib.crc32(text)
    assert book_checksum([["0.5668", "4410.79769741"]], [["0.5666", "4831.70000000"]]) == good
    guard = KrakenBookGuard(context(depth=10))
    stale = guard.check(recorded("kraken_book_update.json"))
    assert stale is not None and stale.stale
    ok = guard.check(_kraken("snapshot", [(0.5666, 4831.7)], [(0.5668, 4410.79769741)], good))
    assert ok is not None and ok.problem is None and ok.symbol == "MATIC/USD"
    removed = zlib.crc32(b"5668" + b"441079769741")
    ok = guard.check(_kraken("update", [(0.5666, 0.0)], [], removed))
    assert ok is not None and ok.problem is None
    bad = guard.check(_kraken("update", [(0.5665, 1.0)], [], removed))
    assert bad is not None and bad.problem is BookIntegrity.CHECKSUM
    after = guard.check(_kraken("update", [], [], removed))
    assert after is not None and after.stale  # the book waits for its new snapshot
    assert kraken.book_request("unsubscribe", BookTopic("MATIC/USD", "MATICUSD", 100))[
        "params"
    ] == {
        "channel": "book",
        "symbol": ["MATIC/USD"],
        "depth": 100,
    }


def test_kraken_guard_truncates_to_the_subscribed_depth() -> None:
    """Kraken sends no removal for a level pushed out of the depth: a level kept past it
    would come back into the best 10 after deletions and break the checksum."""
    bids = [(1.0 - i / 100, 1.0) for i in range(10)]
    texts = [[f"{p:.4f}", "1.00000000"] for p, _ in bids]
    guard = KrakenBookGuard(context(depth=10))
    assert guard.check(_kraken("snapshot", bids, [], book_checksum([], texts))) is not None
    better = [["1.0100", "1.00000000"], *texts[:9]]  # the worst bid falls out of the depth
    verdict = guard.check(_kraken("update", [(1.01, 1.0)], [], book_checksum([], better)))
    assert verdict is not None and verdict.problem is None
    gone = [texts[0], *texts[:9][1:]]  # 1.01 deleted: Kraken's book is 9 deep until it refills
    verdict = guard.check(_kraken("update", [(1.01, 0.0)], [], book_checksum([], gone)))
    assert verdict is not None and verdict.problem is None


def test_book_depth_is_one_the_exchange_serves() -> None:
    assert venue_for("bybit").book_depth(100) == 200
    assert venue_for("bybit").book_depth(5000) == 1000
    assert venue_for("kraken").book_depth(100) == 100
    assert venue_for("kraken").book_depth(20) == 25
    assert venue_for("binance").book_depth(100) == 100


# ------------------------------------------------------------ on the simulator


@pytest.fixture(scope="module")
def sim() -> Iterator[ThreadedSimulator]:
    with run_in_thread() as server:
        yield server


def _step(view: BookView) -> int:
    """The simulator's step of a view: Bybit's `seq` is it; Kraken and Coinbase carry no
    id, their updates' time is the step's."""
    return view.nonce or step_of(view.timestamp_ms)


def _equal(sim: ThreadedSimulator, view: BookView) -> bool:
    book = sim.book("BTC/USDT", _step(view))
    return view.bids == {float(p): float(a) for p, a in book.bids} and view.asks == {
        float(p): float(a) for p, a in book.asks
    }


async def _next_update(adapter: ExchangeAdapter) -> BookView:
    """The next view with a time (Kraken's and Coinbase's snapshots have none)."""
    for _ in range(50):
        view = await adapter.watch_order_book("BTC/USDT", 100)
        if view.timestamp_ms:
            return view
    raise AssertionError("no update")


@pytest.mark.parametrize(
    ("exchange_id", "fault", "kind"),
    [
        ("bybit", "book_drop", BookIntegrity.SEQUENCE_GAP),
        ("kraken", "book_checksum", BookIntegrity.CHECKSUM),
        ("coinbaseexchange", None, None),
    ],
)
def test_adapter_keeps_the_exchanges_book_and_reports_its_faults(
    sim: ThreadedSimulator, exchange_id: str, fault: str | None, kind: BookIntegrity | None
) -> None:
    """The adapter on the simulator (Coinbase without credentials): views equal the
    exchange's book at their step; a dropped delta (Bybit) or a bad checksum (Kraken) is
    a BookIntegrityError; the next watch rebuilds the book from a fresh snapshot."""
    settings = ExchangeSettings(api_base_url=sim.base_url)

    async def run() -> BookIntegrity | None:
        adapter = ExchangeAdapter(exchange_id, settings)
        try:
            await adapter.load_markets()
            for _ in range(3):
                assert _equal(sim, await _next_update(adapter))
            if fault is None:
                return None
            sim.add_fault(fault, symbol="BTC/USDT", exchange=exchange_id)
            with pytest.raises(BookIntegrityError) as raised:
                for _ in range(100):
                    await adapter.watch_order_book("BTC/USDT", 100)
            assert _equal(sim, await _next_update(adapter))
            return raised.value.kind
        finally:
            await adapter.close()

    assert asyncio.run(run()) == kind
