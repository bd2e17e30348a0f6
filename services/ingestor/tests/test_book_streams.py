"""Books over the ingestor's own websocket (ADR 0019): each venue's parser fed the
exchanges' recorded messages (infra/tests/fixtures/books), OKX's guard, the pure book,
and the connection handler against an in-process fake exchange (aiohttp server):
resubscribe after a drop, a gap -> a fresh snapshot, keep-alive pings, the watchdog."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import WSMsgType, web

from ingestor.book_streams import BookStreams, L2Book, link_of
from ingestor.model import (
    BookIntegrity,
    BookIntegrityError,
    BookView,
    ExchangeCallError,
    FaultKind,
)
from ingestor.rest import Network
from ingestor.retry import RetryPolicy
from ingestor.venues import bybit, coinbaseexchange, kraken, okx, venue_for
from ingestor.venues.base import BookContext, BookMessage, BookTopic, BookVerdict

FIXTURES = Path(__file__).parents[3] / "infra" / "tests" / "fixtures" / "books"
MARKETS: dict[str, Mapping[str, Any]] = {
    key: {"id": "BTC-USDT", "symbol": "BTC/USDT"} for key in ("BTC-USDT", "BTC/USDT")
}


def recorded(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


# ------------------------------------------------------------ the venues' parsers


def test_okx_parses_its_books_channel() -> None:
    snapshot = okx.parse_book(recorded("okx_books_snapshot.json"))
    assert snapshot is not None and snapshot.snapshot and snapshot.market == "BTC-USDT"
    assert snapshot.bids[0] == (31684.9, 0.01) and snapshot.asks[0] == (31685.0, 0.78069158)
    assert snapshot.timestamp_ms == 1626532416403
    update = okx.parse_book(recorded("okx_books_update.json"))
    assert update is not None and not update.snapshot
    assert update.asks[0] == (31657.7, 0.0)  # size "0": the level goes
    ack = {"event": "subscribe", "arg": {"channel": "books", "instId": "BTC-USDT"}}
    assert okx.parse_book(ack) is None and okx.book_refusal(ack) is None
    error = {"event": "error", "code": "60018", "msg": "Wrong URL or channel"}
    assert okx.book_refusal(error) == "60018 Wrong URL or channel"
    topic = BookTopic("BTC/USDT", "BTC-USDT", 400)
    assert okx.book_request("subscribe", topic) == {
        "op": "subscribe",
        "args": [{"channel": "books", "instId": "BTC-USDT"}],
    }
    assert okx.book_url({"ws": "ws://127.0.0.1:1/ws/ws/v5"}) == "ws://127.0.0.1:1/ws/ws/v5/public"


def test_bybit_kraken_coinbase_parse_their_channels() -> None:
    delta = bybit.parse_book(recorded("bybit_orderbook_delta.json"))
    assert delta == BookMessage(
        "BTCUSDT", False, ((16493.5, 0.0),), ((16611.0, 0.04), (16611.5, 1.51)), 1672304484998
    )
    assert bybit.parse_book({"success": True, "ret_msg": "pong", "op": "ping"}) is None
    assert bybit.book_refusal({"success": False, "ret_msg": "handler not found"}) is not None
    book = kraken.parse_book(recorded("kraken_book_snapshot.json"))
    assert book is not None and book.snapshot and book.timestamp_ms == 0
    assert book.market == "MATIC/USD" and book.bids[0] == (0.5666, 4831.75496356)
    update = kraken.parse_book(recorded("kraken_book_update.json"))
    assert update is not None and update.timestamp_ms == 1696613755440
    assert kraken.parse_book({"channel": "status", "type": "update", "data": []}) is None
    assert kraken.book_request("subscribe", BookTopic("BTC/USD", "XBTUSD", 100))["params"] == {
        "channel": "book",
        "symbol": ["BTC/USD"],
        "depth": 100,
    }
    first = coinbaseexchange.parse_book(recorded("coinbase_level2_snapshot.json"))
    assert first == BookMessage("BTC-USD", True, ((10101.1, 0.4505414),), ((10102.55, 0.57753524),))
    l2 = coinbaseexchange.parse_book(recorded("coinbase_level2_update.json"))
    assert l2 == BookMessage("BTC-USD", False, ((10101.8, 0.162567),), (), 1565815347265)
    assert coinbaseexchange.parse_book({"type": "subscriptions", "channels": []}) is None
    assert coinbaseexchange.book_request("subscribe", BookTopic("BTC/USD", "BTC-USD", 100))[
        "channels"
    ] == ["level2_batch"]


def test_every_venue_but_binance_owns_its_book_channel() -> None:
    assert venue_for("binance").books is None  # ccxt.pro checks Binance's update ids
    for exchange in ("okx", "bybit", "kraken", "coinbaseexchange"):
        assert venue_for(exchange).books is not None


def test_okx_guard_follows_seq_ids() -> None:
    """`prevSeqId` must be the book's `seqId` (the recorded levels are cut to three, so
    their checksums are dropped here; the checksum has its own test in test_books)."""
    guard = okx.OkxBookGuard(BookContext(MARKETS.__getitem__, lambda symbol: None))
    snapshot, update = recorded("okx_books_snapshot.json"), recorded("okx_books_update.json")
    for message in (snapshot, update):
        del message["data"][0]["checksum"]
    assert guard.check(update) == BookVerdict("BTC/USDT", stale=True)  # before any snapshot
    assert guard.check(snapshot) == BookVerdict("BTC/USDT", sequence=123456)
    assert guard.check(update) == BookVerdict("BTC/USDT", sequence=123457)
    skipped = copy.deepcopy(update)
    skipped["data"][0].update(prevSeqId=123458, seqId=123459)  # 123458 lost
    gap = guard.check(skipped)
    assert gap is not None and gap.problem is BookIntegrity.SEQUENCE_GAP
    assert "prevSeqId 123458, the book is at seqId 123457" in gap.reason
    after = guard.check(update)
    assert after is not None and after.stale  # nothing until the new snapshot
    assert guard.check({"event": "subscribe", "arg": {"channel": "books"}}) is None


def test_book_keeps_levels_and_cuts_to_the_depth_when_asked() -> None:
    book = L2Book()
    book.apply(BookMessage("X", True, ((100.0, 1.0), (99.0, 2.0)), ((101.0, 1.0),)), 7)
    book.apply(BookMessage("X", False, ((100.0, 0.0), (98.0, 3.0)), ((102.0, 4.0),), 55), 8)
    view = book.view(1)
    assert (view.bids, view.asks, view.nonce, view.timestamp_ms) == (
        {99.0: 2.0},
        {101.0: 1.0},
        8,
        55,
    )
    cut = L2Book(keep=2)  # Kraken sends no removal for a level leaving the depth
    cut.apply(BookMessage("X", True, ((100.0, 1.0), (99.0, 1.0)), ()))
    cut.apply(BookMessage("X", False, ((101.0, 1.0),), ()))
    cut.apply(BookMessage("X", False, ((101.0, 0.0),), ()))
    assert cut.view(10).bids == {100.0: 1.0}  # 99 was pushed out and never comes back


# ------------------------------------------------------- the connection handler


class FakeOkx:
    """An in-process OKX public stream: records what each connection receives, answers
    `ping`, and sends the books the test scripts (`push`) to every connection."""

    def __init__(self, *, answer_pings: bool = True) -> None:
        self.answer_pings = answer_pings
        self.received: list[list[str]] = []  # per connection, in order
        self.sockets: list[web.WebSocketResponse] = []
        self.subscribed = asyncio.Event()
        self.unsubscribed = asyncio.Event()
        self.pinged = asyncio.Event()

    async def handle(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        self.sockets.append(ws)
        texts: list[str] = []
        self.received.append(texts)
        async for message in ws:
            if message.type is not WSMsgType.TEXT:
                continue
            texts.append(message.data)
            if message.data == "ping":
                self.pinged.set()
                if self.answer_pings:
                    await ws.send_str("pong")
            elif json.loads(message.data)["op"] == "subscribe":
                self.subscribed.set()
            elif json.loads(message.data)["op"] == "unsubscribe":
                self.unsubscribed.set()
        return ws

    async def push(self, action: str, seq: int, previous: int, bids: list[list[str]]) -> None:
        data = {"bids": bids, "asks": [], "ts": str(seq), "prevSeqId": previous, "seqId": seq}
        message = {"arg": {"channel": "books", "instId": "BTC-USDT"}, "action": action}
        await self.sockets[-1].send_json({**message, "data": [data]})

    async def next_subscription(self) -> None:
        await asyncio.wait_for(self.subscribed.wait(), 5)
        self.subscribed.clear()

    async def next_unsubscription(self) -> None:
        await asyncio.wait_for(self.unsubscribed.wait(), 5)
        self.unsubscribed.clear()

    async def next_ping(self) -> None:
        await asyncio.wait_for(self.pinged.wait(), 5)
        self.pinged.clear()

    async def answer(self, streams: BookStreams, seq: int, bids: list[list[str]]) -> BookView:
        """A watch, the subscription it makes, and the snapshot answering it."""
        watch = asyncio.create_task(streams.watch(TOPIC, 10))
        await self.next_subscription()
        await self.push("snapshot", seq, -1, bids)
        return await watch


@asynccontextmanager
async def streams_on(
    server: FakeOkx, adjust: Callable[[Any], Any] = lambda wire: wire, *, proxied: bool = False
) -> AsyncIterator[BookStreams]:
    """Streams on `server`; `proxied`: the exchange's host cannot be resolved, `server`
    is ccxt's websocket proxy (it answers the absolute-form request a proxy gets)."""
    app = web.Application()
    app.router.add_get("/ws/v5/public", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    wire = adjust(okx.BOOKS)
    host = "okx.invalid" if proxied else f"127.0.0.1:{port}"
    url = wire.url({"ws": f"ws://{host}/ws/v5"})
    link = link_of(wire, 5.0, RetryPolicy(base_delay_s=0.01, max_delay_s=0.05))
    network = Network(ws_proxy=f"http://127.0.0.1:{port}") if proxied else None
    streams = BookStreams(wire, url, MARKETS.__getitem__, "okx", link, network)
    try:
        yield streams
    finally:
        await streams.close()
        await runner.cleanup()


TOPIC = BookTopic("BTC/USDT", "BTC-USDT", 400)


def test_a_drop_fails_the_watch_and_the_connection_resubscribes() -> None:
    async def run() -> None:
        server = FakeOkx()
        async with streams_on(server) as streams:
            assert (await server.answer(streams, 1, [["100", "1"]])).bids == {100.0: 1.0}
            watch = asyncio.create_task(streams.watch(TOPIC, 10))
            await server.sockets[-1].close()  # the exchange drops the connection
            with pytest.raises(ExchangeCallError) as lost:
                await watch
            assert lost.value.kind is FaultKind.NETWORK
            await server.next_subscription()  # subscribed again, unasked
            watch = asyncio.create_task(streams.watch(TOPIC, 10))
            await asyncio.sleep(0)  # one turn of the loop: the watch runs up to its wait
            await server.push("snapshot", 5, -1, [["99", "2"]])
            view = await watch
            assert (view.bids, view.nonce) == ({99.0: 2.0}, 5)
            assert streams.connection.connects == 2
            assert [json.loads(t)["op"] for t in server.received[1]] == ["subscribe"]

    asyncio.run(run())


def test_books_go_through_ccxts_websocket_proxy() -> None:
    async def run() -> None:
        server = FakeOkx()
        async with streams_on(server, proxied=True) as streams:
            assert (await server.answer(streams, 1, [["100", "1"]])).bids == {100.0: 1.0}

    asyncio.run(run())


def test_network_settings_are_ccxts_for_the_exchange() -> None:
    import ccxt.pro

    exchange = ccxt.pro.okx({"wssProxy": "http://proxy:3128", "httpsProxy": "http://proxy:8080"})
    network = Network.of(exchange)
    assert (network.ws_proxy, network.proxy, network.verify) == (
        "http://proxy:3128",
        "http://proxy:8080",
        True,
    )
    exchange.verify = False
    assert Network.of(exchange).tls() is False


def test_a_gap_unsubscribes_and_the_next_watch_gets_a_fresh_snapshot() -> None:
    async def run() -> None:
        server = FakeOkx()
        async with streams_on(server) as streams:
            await server.answer(streams, 1, [["100", "1"]])
            await server.push("update", 2, 1, [["100", "2"]])
            await server.push("update", 4, 3, [["100", "3"]])  # seqId 3 lost
            await server.next_unsubscription()  # the gap seen; no watch waiting: the next gets it
            with pytest.raises(BookIntegrityError) as gap:
                await streams.watch(TOPIC, 10)
            assert gap.value.kind is BookIntegrity.SEQUENCE_GAP
            view = await server.answer(streams, 9, [["101", "1"]])
            assert (view.bids, view.nonce) == ({101.0: 1.0}, 9)
            ops = [json.loads(t)["op"] for t in server.received[0]]
            assert ops == ["subscribe", "unsubscribe", "subscribe"]
            assert streams.connection.connects == 1

    asyncio.run(run())


def test_pings_keep_it_alive_and_silence_ends_it() -> None:
    def fast(wire: Any) -> Any:
        return dataclasses.replace(wire, ping_interval_s=0.05)

    async def run(answer_pings: bool) -> tuple[int, list[str]]:
        server = FakeOkx(answer_pings=answer_pings)
        async with streams_on(server, fast) as streams:
            await server.answer(streams, 1, [["100", "1"]])
            if answer_pings:  # 3 pings outlast the watchdog's 2.5 silent periods
                while server.received[0].count("ping") < 3:
                    await server.next_ping()
            else:  # the watchdog ends the silent connection; the next one subscribes
                await server.next_subscription()
            return streams.connection.connects, server.received[0]

    connects, texts = asyncio.run(run(answer_pings=True))
    assert connects == 1 and texts.count("ping") >= 3
    connects, _ = asyncio.run(run(answer_pings=False))
    assert connects >= 2  # a silent connection was ended and made again


def test_a_refused_subscription_fails_the_watch_and_a_crash_is_reported() -> None:
    """The exchange's refusal fails the watch (EXCHANGE_ERROR); a parser that raises
    something unexpected fails the watch instead of leaving it waiting, and the next
    watch runs the connection again."""
    crashes = [RuntimeError("a bug")]

    def parse_once_broken(message: Mapping[str, Any]) -> BookMessage | None:
        if crashes:
            raise crashes.pop()
        return okx.parse_book(message)

    def broken(wire: Any) -> Any:
        return dataclasses.replace(wire, parse=parse_once_broken)

    async def run() -> None:
        server = FakeOkx()
        async with streams_on(server, broken) as streams:
            watch = asyncio.create_task(streams.watch(TOPIC, 10))
            await server.next_subscription()
            await server.sockets[-1].send_json({"event": "error", "code": "60018", "msg": "no"})
            with pytest.raises(ExchangeCallError) as refused:
                await watch
            assert refused.value.kind is FaultKind.EXCHANGE_ERROR and "60018" in str(refused.value)
            watch = asyncio.create_task(streams.watch(TOPIC, 10))
            await server.next_subscription()
            await server.push("snapshot", 1, -1, [["100", "1"]])  # the parser raises
            with pytest.raises(ExchangeCallError) as crashed:
                await watch
            assert "a bug" in str(crashed.value)
            view = await server.answer(streams, 2, [["100", "2"]])
            assert view.bids == {100.0: 2.0}

    asyncio.run(run())
