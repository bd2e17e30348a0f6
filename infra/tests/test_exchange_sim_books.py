"""The simulator's order books: the model, the wire shapes, and REAL ccxt.pro reading them.

Why: the ingestor keeps books through ccxt.pro's `watch_order_book`, so the
simulator's Binance depth stream and OKX `books` channel must have the shapes of
the exchanges' own messages (fixtures/books/, replayed through ccxt's parsers),
and its faults must trip ccxt's own gap checks.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import ccxt.pro as ccxtpro
import pytest

from infra.exchange_sim import DEFAULT_MODEL, ThreadedSimulator, point_ccxt_at, run_in_thread
from infra.exchange_sim.books import (
    BookModel,
    kraken_checksum,
    kraken_text,
    okx_checksum,
    step_of,
)

FIXTURES = Path(__file__).parent / "fixtures" / "books"
FROZEN_NOW = 1_700_000_000_000 + 12_345
SPOT_ONLY = {"options": {"fetchMarkets": {"types": ["spot"]}}}


def recorded(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def shape(value: Any) -> Any:
    """Keys and value types, recursively (a list by its first item)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


@pytest.fixture(scope="module")
def frozen() -> Iterator[ThreadedSimulator]:
    with run_in_thread(now_ms=FROZEN_NOW) as server:
        yield server


@pytest.fixture(scope="module")
def live() -> Iterator[ThreadedSimulator]:
    with run_in_thread() as server:
        yield server


def test_book_is_a_pure_function_near_the_last_trade() -> None:
    books = BookModel(DEFAULT_MODEL)
    step = step_of(FROZEN_NOW)
    book = books.book_at("BTC/USDT", step)
    assert book == BookModel(DEFAULT_MODEL).book_at("BTC/USDT", step)
    assert book.bids == tuple(sorted(book.bids, reverse=True))
    assert book.asks == tuple(sorted(book.asks))
    last = next(DEFAULT_MODEL.iter_trades_backward("BTC/USDT", FROZEN_NOW))
    tick = Decimal("0.01")
    assert last.price - 3 * tick <= book.bids[0][0] < last.price < book.asks[0][0]
    assert book.asks[0][0] <= last.price + 3 * tick
    assert 0 < len(book.bids) <= books.levels and 0 < len(book.asks) <= books.levels
    later = books.book_at("BTC/USDT", step + 1)
    update = books.update(book, later)
    assert 0 < len(update.bids) + len(update.asks) < len(book.bids) + len(book.asks)


def _signed(crc: int) -> int:
    return crc - (1 << 32) if crc >= 1 << 31 else crc


def test_okx_checksum_follows_the_documented_algorithm() -> None:
    # OKX v5 docs, "Checksum": best levels interleaved bid:size:ask:size, the exchange's
    # strings, CRC32 as a signed 32-bit integer; a shorter side just ends.
    bids = [["3366.1", "7", "0", "3"], ["3366", "6", "3", "4"]]
    asks = [["3366.8", "9", "10", "3"], ["3368", "8", "3", "4"]]
    assert okx_checksum(bids, asks) == _signed(zlib.crc32(b"3366.1:7:3366.8:9:3366:6:3368:8"))
    short = [["3366.1", "7", "0", "3"]]
    more = [*asks, ["3372", "8", "3", "4"]]
    assert okx_checksum(short, more) == _signed(zlib.crc32(b"3366.1:7:3366.8:9:3368:8:3372:8"))
    # Only the best 25 levels count.
    deep = [[str(100 - i), "1", "0", "1"] for i in range(30)]
    assert okx_checksum(deep, []) == okx_checksum(deep[:25], [])
    # Signed: some books checksum below zero, as OKX's payloads show.
    values = {okx_checksum([[str(i), "1"]], []) for i in range(50)}
    assert min(values) < 0 < max(values)


async def _ws_messages(url: str, subscribe: dict[str, Any], count: int, sim: Any) -> list[Any]:
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        await ws.send_str(json.dumps(subscribe))
        messages: list[Any] = []
        while len(messages) < count:
            if len(messages) == count - 1 and count > 1:  # before the last: move the clock on
                await asyncio.to_thread(sim.advance_time, 1_000)
            msg = await asyncio.wait_for(ws.receive(), 10)
            messages.append(json.loads(msg.data))
        return messages


def test_binance_depth_has_the_recorded_shapes(frozen: ThreadedSimulator) -> None:
    url = frozen.base_url.replace("http", "ws") + "/stream/ws/0"
    subscribe = {"method": "SUBSCRIBE", "params": ["btcusdt@depth@100ms"], "id": 7}
    ack, event = asyncio.run(_ws_messages(url, subscribe, 2, frozen))
    assert ack == {"result": None, "id": 7}
    assert shape(event) == shape(recorded("binance_depth_update.json"))
    assert event["u"] >= event["U"] and event["s"] == "BTCUSDT"
    rest = asyncio.run(_get(frozen.base_url + "/api/v3/depth?symbol=BTCUSDT&limit=5"))
    assert shape(rest) == shape(recorded("binance_depth_rest.json"))
    assert rest["lastUpdateId"] == event["u"] and len(rest["bids"]) == 5


async def _get(url: str) -> Any:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return await resp.json()


def test_okx_books_have_the_recorded_shapes(frozen: ThreadedSimulator) -> None:
    url = frozen.base_url.replace("http", "ws") + "/ws/ws/v5/public"
    subscribe = {"op": "subscribe", "args": [{"channel": "books", "instId": "BTC-USDT"}]}
    ack, snapshot, update = asyncio.run(_ws_messages(url, subscribe, 3, frozen))
    assert ack["event"] == "subscribe" and ack["arg"] == subscribe["args"][0]
    assert shape(snapshot) == shape(recorded("okx_books_snapshot.json"))
    assert shape(update) == shape(recorded("okx_books_update.json"))
    assert update["data"][0]["prevSeqId"] == snapshot["data"][0]["seqId"]
    book = frozen.book("BTC/USDT", update["data"][0]["seqId"])
    top = [[f"{p.normalize():f}", f"{a.normalize():f}"] for p, a in book.bids[:25]]
    top_asks = [[f"{p.normalize():f}", f"{a.normalize():f}"] for p, a in book.asks[:25]]
    assert update["data"][0]["checksum"] == okx_checksum(top, top_asks)


def test_recorded_okx_messages_parse_through_ccxt(live: ThreadedSimulator) -> None:
    """The exchanges' own messages through ccxt.pro's handlers: the path the sim's take."""

    async def run() -> Any:
        exchange = ccxtpro.okx()
        point_ccxt_at(exchange, live.base_url)
        await exchange.load_markets()
        client = exchange.client(exchange.urls["api"]["ws"] + "/public")
        client.subscriptions["books:BTC/USDT"] = True
        exchange.handle_message(client, recorded("okx_books_snapshot.json"))
        exchange.handle_message(client, recorded("okx_books_update.json"))
        book = exchange.orderbooks["BTC/USDT"]
        await exchange.close()
        return book

    book = asyncio.run(run())
    assert book["nonce"] == 123457
    assert [31685.0, 0.78069158] in [list(level[:2]) for level in book["asks"]]
    assert 31657.7 not in [level[0] for level in book["asks"]]  # "0" removed it
    assert book["bids"][0][:2] == [31684.9, 0.01]


def _as_float(levels: Any) -> list[list[float]]:
    return [[float(p), float(a)] for p, a in levels]


@pytest.mark.parametrize(
    ("exchange_id", "error"), [("binance", "ChecksumError"), ("okx", "InvalidNonce")]
)
def test_ccxt_keeps_the_simulators_book_and_sees_a_dropped_event(
    live: ThreadedSimulator, exchange_id: str, error: str
) -> None:
    """Unmodified ccxt.pro: its book equals the simulator's at every id; a dropped event
    trips ccxt's own gap check; watching again rebuilds the book from a snapshot."""

    async def run() -> list[str]:
        exchange = getattr(ccxtpro, exchange_id)(SPOT_ONLY if exchange_id == "binance" else {})
        point_ccxt_at(exchange, live.base_url)
        await exchange.load_markets()
        seen: list[str] = []
        try:
            for _ in range(3):
                book = await exchange.watch_order_book("BTC/USDT", 100)
                expected = live.book("BTC/USDT", book["nonce"])
                assert [list(x[:2]) for x in book["bids"]] == _as_float(expected.bids)
                assert [list(x[:2]) for x in book["asks"]] == _as_float(expected.asks)
            live.add_fault("book_drop", symbol="BTC/USDT", exchange=exchange_id)
            with pytest.raises(Exception) as raised:
                for _ in range(50):
                    await exchange.watch_order_book("BTC/USDT", 100)
            seen.append(type(raised.value).__name__)
            book = await exchange.watch_order_book("BTC/USDT", 100)
            expected = live.book("BTC/USDT", book["nonce"])
            assert [list(x[:2]) for x in book["bids"]] == _as_float(expected.bids)
        finally:
            await exchange.close()
        return seen

    assert asyncio.run(run()) == [error]


# ------------------------------------------------- Bybit, Kraken, Coinbase


def test_kraken_checksum_follows_the_documented_algorithm() -> None:
    # Kraken's "Book checksum (WebSocket v2)": asks low to high, then bids high to low;
    # each price and qty in full precision without "." and leading zeros; CRC32 unsigned.
    asks = [["45285.2", "0.00100000"]]
    bids = [["45283.5", "0.10000000"]]
    assert kraken_checksum(bids, asks) == zlib.crc32(b"452852100000" + b"452835" + b"10000000")
    deep = [[f"{100 - i}.0", "1.00000000"] for i in range(12)]
    assert kraken_checksum(deep, []) == kraken_checksum(deep[:10], [])  # only the best 10
    assert kraken_checksum([], [["0.05000", "0.00000304"]]) == zlib.crc32(b"5000304")


def _levels(book: Any, side: str, places: int, qty_places: int) -> list[list[str]]:
    return [[f"{p:.{places}f}", f"{a:.{qty_places}f}"] for p, a in getattr(book, side)[:10]]


def test_bybit_books_have_the_recorded_shapes(frozen: ThreadedSimulator) -> None:
    url = frozen.base_url.replace("http", "ws") + "/stream/v5/public/spot"
    subscribe = {"op": "subscribe", "args": ["orderbook.50.BTCUSDT"], "req_id": "1"}
    ack, snapshot, delta = asyncio.run(_ws_messages(url, subscribe, 3, frozen))
    assert ack["success"] is True and ack["op"] == "subscribe"
    assert shape(snapshot) == shape(recorded("bybit_orderbook_snapshot.json"))
    assert shape(delta) == shape(recorded("bybit_orderbook_delta.json"))
    assert delta["data"]["u"] == snapshot["data"]["u"] + 1  # one message, one id
    assert delta["data"]["seq"] > snapshot["data"]["seq"]
    book = frozen.book("BTC/USDT", delta["data"]["seq"])  # seq: the book's step here
    assert len(snapshot["data"]["b"]) <= 50
    assert [float(p) for p, _ in snapshot["data"]["b"]] == sorted(
        (float(p) for p, _ in snapshot["data"]["b"]), reverse=True
    )
    assert book.step == delta["data"]["seq"]


def test_kraken_books_have_the_recorded_shapes_and_checksums(frozen: ThreadedSimulator) -> None:
    url = frozen.base_url.replace("http", "ws") + "/ws/v2"
    subscribe = {
        "method": "subscribe",
        "params": {"channel": "book", "symbol": ["BTC/USDT"], "depth": 10},
        "req_id": 3,
    }
    status, ack, snapshot, update = asyncio.run(_ws_messages(url, subscribe, 4, frozen))
    assert status["channel"] == "status"
    assert ack["success"] is True and ack["result"]["depth"] == 10 and ack["req_id"] == 3
    assert shape(snapshot) == shape(recorded("kraken_book_snapshot.json"))
    recorded_update = recorded("kraken_book_update.json")
    assert set(update["data"][0]) == set(recorded_update["data"][0])
    assert len(snapshot["data"][0]["bids"]) == 10
    spec = DEFAULT_MODEL.spec("BTC/USDT")
    places = (spec.price_decimals, spec.qty_decimals)
    top = snapshot["data"][0]  # depth 10: the snapshot is the checksummed top
    text = [[f"{x['price']:.{places[0]}f}", f"{x['qty']:.{places[1]}f}"] for x in top["bids"]]
    ask_text = [[f"{x['price']:.{places[0]}f}", f"{x['qty']:.{places[1]}f}"] for x in top["asks"]]
    assert top["checksum"] == kraken_checksum(text, ask_text)
    data = update["data"][0]
    stamp = datetime.fromisoformat(data["timestamp"].replace("Z", "+00:00"))
    book = frozen.book("BTC/USDT", step_of(int(stamp.timestamp() * 1000)))
    bids, asks = _levels(book, "bids", *places), _levels(book, "asks", *places)
    assert data["checksum"] == kraken_checksum(bids, asks)


def test_kraken_numbers_keep_their_full_precision_on_the_wire() -> None:
    message = {"channel": "book", "data": [{"bids": [{"price": "45283.5", "qty": "0.10000000"}]}]}
    assert '"price":45283.5,"qty":0.10000000' in kraken_text(message)


def test_coinbase_level2_has_the_recorded_shapes(frozen: ThreadedSimulator) -> None:
    url = frozen.base_url.replace("http", "ws") + "/ws-feed"
    unsigned = {"type": "subscribe", "product_ids": ["BTC-USDT"], "channels": ["level2"]}
    (refused,) = asyncio.run(_ws_messages(url, unsigned, 1, frozen))
    assert refused["type"] == "error" and "authentication" in refused["reason"]
    subscribe = {**unsigned, "channels": ["level2_batch"]}
    ack, snapshot, update = asyncio.run(_ws_messages(url, subscribe, 3, frozen))
    assert ack == {
        "type": "subscriptions",
        "channels": [{"name": "level2_batch", "product_ids": ["BTC-USDT"]}],
    }
    assert shape(snapshot) == shape(recorded("coinbase_level2_snapshot.json"))
    assert shape(update) == shape(recorded("coinbase_level2_update.json"))
    assert {side for side, *_ in update["changes"]} <= {"buy", "sell"}


def test_recorded_bybit_kraken_coinbase_messages_parse_through_ccxt(
    live: ThreadedSimulator,
) -> None:
    """The exchanges' own messages through ccxt.pro's handlers: the path the sim's take."""

    async def run() -> dict[str, Any]:
        books: dict[str, Any] = {}
        bybit = ccxtpro.bybit(SPOT_ONLY)
        point_ccxt_at(bybit, live.base_url)
        await bybit.load_markets()
        client = bybit.client(bybit.urls["api"]["ws"]["public"]["spot"])
        for name in ("bybit_orderbook_snapshot.json", "bybit_orderbook_delta.json"):
            bybit.handle_message(client, recorded(name))
        books["bybit"] = bybit.orderbooks["BTC/USDT"]
        await bybit.close()
        kraken = ccxtpro.kraken()
        client = kraken.client(kraken.urls["api"]["ws"]["publicV2"])
        kraken.set_markets([_market("MATIC/USD", "MATICUSD", "MATIC", "USD")])
        client.subscriptions["orderbook@MATIC/USD"] = {"limit": 10}
        for name in ("kraken_book_snapshot.json", "kraken_book_update.json"):
            kraken.handle_message(client, recorded(name))
        books["kraken"] = kraken.orderbooks["MATIC/USD"]
        await kraken.close()
        coinbase = ccxtpro.coinbaseexchange()
        client = coinbase.client(coinbase.urls["api"]["ws"])
        coinbase.set_markets([_market("BTC/USD", "BTC-USD", "BTC", "USD")])
        for name in ("coinbase_level2_snapshot.json", "coinbase_level2_update.json"):
            coinbase.handle_message(client, recorded(name))
        books["coinbase"] = coinbase.orderbooks["BTC/USD"]
        await coinbase.close()
        return books

    books = asyncio.run(run())
    assert [list(x[:2]) for x in books["bybit"]["bids"]] == [[16493.0, 0.1]]  # "0" removed
    assert [list(x[:2]) for x in books["bybit"]["asks"]][:2] == [[16611.0, 0.04], [16611.5, 1.51]]
    assert books["bybit"]["nonce"] is None  # ccxt keeps neither `u` nor `seq`: our guard does
    assert [0.5657, 1098.3947558] in [list(x[:2]) for x in books["kraken"]["bids"]]
    assert books["kraken"]["timestamp"] == 1696613755440
    assert [list(x[:2]) for x in books["coinbase"]["bids"]] == [
        [10101.8, 0.162567],
        [10101.1, 0.4505414],
    ]


def _market(symbol: str, market_id: str, base: str, quote: str) -> dict[str, Any]:
    return {
        "id": market_id,
        "symbol": symbol,
        "base": base,
        "quote": quote,
        "baseId": base,
        "quoteId": quote,
        "type": "spot",
        "spot": True,
        "active": True,
        "info": {"wsname": symbol},
        "precision": {},
        "limits": {},
    }
