"""Trade ids, trade-stream faults and trade history of the exchange simulator.

Why: the ingestor detects lost trades from the exchange's own consecutive trade ids
and repairs them by paging the exchange's trade-history REST endpoints. So the
simulator numbers each market's trades 1, 2, 3, ... (no jump between minutes, days
or its id epoch), can make its streams lose trades (`trade_drop`) or go away for a
while (`ws_outage`) and says exactly what was lost, and pages its trade history the
way each real exchange does, checked through unmodified ccxt against the model.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import aiohttp
import ccxt
import ccxt.async_support as ccxt_async
import ccxt.pro as ccxt_pro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra.exchange_sim import (
    DEFAULT_MODEL,
    MarketModel,
    SymbolSpec,
    ThreadedSimulator,
    point_ccxt_at,
    run_in_thread,
)
from infra.exchange_sim.control import SimulatorControl
from infra.exchange_sim.model import (
    DAY_MS,
    ID_EPOCH_MS,
    MINUTE_MS,
    MODEL_ID_FLOOR,
    Trade,
    interval_open,
)

SPOT_ONLY = {"options": {"fetchMarkets": {"types": ["spot"]}}}
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
# Frozen instants a few days after the id epoch: their ids are counted in milliseconds.
NOW = ID_EPOCH_MS + 3 * DAY_MS + 10 * 3_600_000 + 17 * MINUTE_MS + 20_250
MINUTE = interval_open("1m", NOW)


@pytest.fixture(scope="module")
def sim() -> Iterator[ThreadedSimulator]:
    with run_in_thread(now_ms=NOW) as server:
        yield server


@pytest.fixture(autouse=True)
def _clean(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test starts with no faults, zeroed counters and the clock at NOW."""
    if "sim" not in request.fixturenames:
        yield
        return
    server: ThreadedSimulator = request.getfixturevalue("sim")
    server.reset()
    server.set_time(NOW)
    yield
    server.clear_faults()
    server.drop_websockets()


def ids(trades: list[Trade]) -> list[int]:
    return [t.id for t in trades]


def consecutive(numbers: list[int]) -> bool:
    return numbers == list(range(numbers[0], numbers[0] + len(numbers)))


# ------------------------------------------------------------- the id rule
@pytest.mark.parametrize(
    ("symbol", "day"),
    [
        ("BTC/USDT", 20435),  # minute 1398 rounds near a tie: numpy's count is redone exactly
        ("BTC/USDT", ID_EPOCH_MS // DAY_MS),
        ("ETH/USDT", 19675),
        ("XYZ/USDT", 19358),  # listing day of the illiquid market (2023-01-01)
        ("XYZ/USDT", 20001),
        ("OLD/USDT", 19124),  # delisting day (2022-05-13)
        ("OLD/USDT", 17896),  # listing day (2019-01-01)
        ("OLD/USDT", 19500),  # after delisting: nothing
    ],
)
def test_counted_trades_equal_the_bars(symbol: str, day: int) -> None:
    """Ids count trades through a cheaper path than the bars: it must agree exactly."""
    model = MarketModel()
    bars = [b.n if b is not None else 0 for b in model._day(symbol, day)]
    assert model._count_day(symbol, day) == bars  # numpy, if installed
    model.fast_counts = False
    assert model._count_day(symbol, day) == bars  # pure Python


@pytest.mark.parametrize(
    ("symbol", "start"),
    [
        ("BTC/USDT", ID_EPOCH_MS - 4 * MINUTE_MS),  # across the id epoch (a midnight)
        ("ETH/USDT", 1_700_006_400_000 - 3 * MINUTE_MS),  # across a midnight before it
        ("SOL/USDT", NOW - 5 * MINUTE_MS),
    ],
)
def test_ids_are_consecutive_across_minutes_days_and_the_epoch(symbol: str, start: int) -> None:
    trades = list(DEFAULT_MODEL.iter_trades(symbol, start, start + 8 * MINUTE_MS))
    assert len({t.time_ms // DAY_MS for t in trades}) == 2 or symbol == "SOL/USDT"
    assert consecutive(ids(trades)) and trades[0].id > MODEL_ID_FLOOR
    assert [t.time_ms for t in trades] == sorted(t.time_ms for t in trades)
    minute = interval_open("1m", start + 2 * MINUTE_MS)
    first = DEFAULT_MODEL.trades_in_minute(symbol, minute)[0]
    assert DEFAULT_MODEL.first_trade_id(symbol, minute + 59_999) == first.id


def test_ids_of_an_illiquid_market_skip_nothing_over_idle_minutes() -> None:
    trades = list(DEFAULT_MODEL.iter_trades("XYZ/USDT", NOW - DAY_MS, NOW))
    minutes = {t.time_ms // MINUTE_MS for t in trades}
    assert len(minutes) < 0.3 * 1440  # most minutes are idle...
    assert consecutive(ids(trades))  # ...and take no ids


def test_a_market_listed_after_the_epoch_numbers_its_first_trade_one_above_the_floor() -> None:
    listed = ID_EPOCH_MS + 40 * DAY_MS + 7 * MINUTE_MS
    spec = SymbolSpec("NEW/USDT", 1.0, "0.001", "0.1", 0.05, 10, 100.0, listed_ms=listed)
    model = MarketModel([spec])
    trades = list(itertools.islice(model.iter_trades("NEW/USDT", 0, listed + DAY_MS), 50))
    assert trades[0].id == MODEL_ID_FLOOR + 1 and trades[0].time_ms >= listed
    assert consecutive(ids(trades))


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    symbol=st.sampled_from(["BTC/USDT", "XYZ/USDT", "LTC/USDT"]),
    when=st.integers(min_value=NOW - 30 * DAY_MS, max_value=NOW),
    pick=st.integers(min_value=0, max_value=10_000),
)
def test_an_id_finds_its_trade_forward_and_backward(symbol: str, when: int, pick: int) -> None:
    """``fromId``/``before`` lookups land on the very trade, wherever it lies."""
    window = list(DEFAULT_MODEL.iter_trades(symbol, when - 2 * 3_600_000, when))
    if not window:
        return
    trade = window[pick % len(window)]
    assert next(DEFAULT_MODEL.iter_trades(symbol, 0, NOW, from_id=trade.id)) == trade
    assert next(DEFAULT_MODEL.iter_trades_backward(symbol, NOW, before_id=trade.id + 1)) == trade
    minute = DEFAULT_MODEL.trade_minute(symbol, trade.id, NOW)
    assert minute == interval_open("1m", trade.time_ms)


def test_ids_outside_the_history() -> None:
    model, symbol = DEFAULT_MODEL, "ETH/USDT"
    last = next(model.iter_trades_backward(symbol, NOW))
    assert list(model.iter_trades(symbol, 0, NOW, from_id=last.id + 1)) == []
    assert model.trade_minute(symbol, last.id + 1, NOW) == MINUTE  # due later this minute
    tomorrow = model.first_trade_id(symbol, (NOW // DAY_MS + 1) * DAY_MS)
    assert model.trade_minute(symbol, tomorrow, NOW) is None  # looks up to NOW's day only
    assert list(model.iter_trades_backward(symbol, NOW, before_id=MODEL_ID_FLOOR)) == []
    # an id below the floor (an injected trade's) comes before every model trade
    listed = model.spec(symbol).listed_ms
    assert model.trade_minute(symbol, 42, NOW) == interval_open("1m", listed)


def test_ids_are_the_same_with_and_without_numpy() -> None:
    plain = MarketModel()
    plain.fast_counts = False
    minute = interval_open("1m", NOW - 3 * DAY_MS)
    assert plain.trades_in_minute("DOT/USDT", minute) == DEFAULT_MODEL.trades_in_minute(
        "DOT/USDT", minute
    )


# ------------------------------------------------------------ stream faults
def ws_url(sim: ThreadedSimulator, path: str) -> str:
    return sim.base_url.replace("http://", "ws://") + path


async def _connect(
    session: aiohttp.ClientSession, sim: ThreadedSimulator, path: str, symbol: str
) -> aiohttp.ClientWebSocketResponse:
    ws = await session.ws_connect(ws_url(sim, path))
    await asyncio.to_thread(sim.wait_for_subscribers, symbol, 1)
    return ws


async def _bybit(
    session: aiohttp.ClientSession, sim: ThreadedSimulator, symbol: str, count: int
) -> aiohttp.ClientWebSocketResponse:
    ws = await session.ws_connect(ws_url(sim, "/stream/v5/public/spot"))
    market = DEFAULT_MODEL.spec(symbol).binance_id
    await ws.send_json({"op": "subscribe", "args": [f"publicTrade.{market}"], "req_id": "1"})
    assert (await ws.receive_json(timeout=10))["success"]
    await asyncio.to_thread(sim.wait_for_subscribers, symbol, count)
    return ws


async def _binance_ids(ws: aiohttp.ClientWebSocketResponse, last_id: int) -> list[int]:
    """The trade ids a raw Binance trade stream receives, up to ``last_id``."""
    got: list[int] = []
    while not got or got[-1] < last_id:
        got.append(int((await ws.receive_json(timeout=10))["t"]))
    return got


async def _bybit_ids(ws: aiohttp.ClientWebSocketResponse, last_id: int) -> list[int]:
    got: list[int] = []
    while not got or got[-1] < last_id:
        got.extend(int(t["i"]) for t in (await ws.receive_json(timeout=10))["data"])
    return got


def test_trade_drop_skips_the_next_model_trades_of_every_stream(sim: ThreadedSimulator) -> None:
    due = DEFAULT_MODEL.trades_in_minute("SOL/USDT", MINUTE + MINUTE_MS)
    sim.set_time(MINUTE + MINUTE_MS - 1)  # the next advance makes exactly that minute due
    fault = sim.add_fault("trade_drop", symbol="SOLUSDT", count=3)  # any of its ids
    assert fault.symbol == "SOL/USDT"

    async def run() -> tuple[list[int], list[int], int]:
        async with aiohttp.ClientSession() as session:
            binance = await _connect(session, sim, "/ws/solusdt@trade", "SOL/USDT")
            bybit = await _bybit(session, sim, "SOL/USDT", 2)
            sent = await asyncio.to_thread(sim.advance_time, MINUTE_MS)
            got = await _binance_ids(binance, due[-1].id), await _bybit_ids(bybit, due[-1].id)
            return *got, sent

    binance_ids, bybit_ids, sent = asyncio.run(run())
    assert binance_ids == bybit_ids == ids(list(due[3:]))  # the first 3 skipped by both
    assert sent == len(due) - 3
    stats = sim.stats()
    (record,) = [f for f in stats["faults_triggered"] if f["kind"] == "trade_drop"]
    assert record["trade_ids"] == ids(list(due[:3])) and record["id"] == fault.id
    assert record["symbol"] == "SOL/USDT" and record["exchange"] is None
    counters = stats["ws"]["model_trades"]["SOL/USDT"]
    assert counters == {"last_id": due[-1].id, "sent": len(due) - 3, "dropped": 3}
    assert sim.pending_faults() == []  # used up
    # REST still serves the dropped trades
    exchange = ccxt.binance({**SPOT_ONLY, "apiKey": "sim"})  # historicalTrades wants a key
    point_ccxt_at(exchange, sim.base_url)
    exchange.load_markets()
    rest = exchange.fetch_trades(
        "SOL/USDT", params={"fetchTradesMethod": "publicGetHistoricalTrades", "fromId": due[0].id}
    )
    assert [int(t["id"]) for t in rest[:3]] == ids(list(due[:3]))


def test_trade_drop_of_one_exchange_over_http(sim: ThreadedSimulator) -> None:
    """`/_sim/faults` `trade_drop` with `exchange`: only that exchange's stream skips."""
    due = DEFAULT_MODEL.trades_in_minute("ETH/USDT", MINUTE + MINUTE_MS)
    sim.set_time(MINUTE + MINUTE_MS - 1)
    control = SimulatorControl(sim.base_url)

    async def run() -> tuple[list[int], list[int]]:
        async with aiohttp.ClientSession() as session:
            binance = await _connect(session, sim, "/stream?streams=ethusdt@trade", "ETH/USDT")
            bybit = await _bybit(session, sim, "ETH/USDT", 2)
            await asyncio.to_thread(control.trade_drop, "ETH/USDT", 5, "bybit")
            assert control.pending_faults()[0]["kind"] == "trade_drop"
            await asyncio.to_thread(control.advance_time, MINUTE_MS)
            got: list[int] = []
            while not got or got[-1] < due[-1].id:  # combined stream: {"stream", "data"}
                got.append(int((await binance.receive_json(timeout=10))["data"]["t"]))
            return got, await _bybit_ids(bybit, due[-1].id)

    binance_ids, bybit_ids = asyncio.run(run())
    assert binance_ids == ids(list(due))
    assert bybit_ids == ids(list(due[5:]))
    (record,) = control.stats()["faults_triggered"]
    assert record["exchange"] == "bybit" and record["trade_ids"] == ids(list(due[:5]))


async def _handshake_status(
    session: aiohttp.ClientSession, sim: ThreadedSimulator, path: str
) -> int:
    """The HTTP status of a websocket handshake (101: connected)."""
    try:
        async with session.ws_connect(ws_url(sim, path)):
            return 101
    except aiohttp.WSServerHandshakeError as exc:
        return exc.status


def test_ws_outage_closes_refuses_then_resumes_at_now(sim: ThreadedSimulator) -> None:
    """A 2-minute outage: streams closed, reconnects refused (503) until it ends; the
    trades due meanwhile are never streamed, the stream resumes with trades after now."""
    start = MINUTE + MINUTE_MS
    sim.set_time(start - 1)
    before = DEFAULT_MODEL.trades_in_minute("BTC/USDT", start)

    async def run() -> tuple[list[int], list[Trade]]:
        async with aiohttp.ClientSession() as session:
            ws = await _connect(session, sim, "/ws/btcusdt@trade", "BTC/USDT")
            await asyncio.to_thread(sim.advance_time, MINUTE_MS)  # a minute streamed
            assert await _binance_ids(ws, before[-1].id) == ids(list(before))
            fault = await asyncio.to_thread(sim.ws_outage, None, None, 120)
            closing = await ws.receive(timeout=10)
            assert closing.type == aiohttp.WSMsgType.CLOSE and closing.data == 1001
            assert fault.until_ms == start + MINUTE_MS - 1 + 120_000
            for path in ("/ws/btcusdt@trade", "/stream/v5/public/spot", "/ws/ws/v5/public"):
                assert await _handshake_status(session, sim, path) == 503
            await asyncio.to_thread(sim.advance_time, 119_999)
            assert await _handshake_status(session, sim, "/ws/btcusdt@trade") == 503
            await asyncio.to_thread(sim.advance_time, 1)  # the outage is over
            assert sim.pending_faults() == []
            ws = await _connect(session, sim, "/ws/btcusdt@trade", "BTC/USDT")
            await asyncio.to_thread(sim.advance_time, MINUTE_MS)
            now = sim.now_ms()
            after = list(DEFAULT_MODEL.iter_trades("BTC/USDT", now - MINUTE_MS + 1, now))
            return await _binance_ids(ws, after[-1].id), after

    received, after = asyncio.run(run())
    assert received == ids(after)  # nothing of the outage's 2 minutes
    assert received[0] > before[-1].id + 1  # the ids show the gap
    (record,) = [f for f in sim.stats()["faults_triggered"] if f["kind"] == "ws_outage"]
    assert record["closed"] == 1 and record["refused"] == 4
    assert record["last_ids"] == {"BTC/USDT": before[-1].id}
    assert record["until_ms"] == record["t_ms"] + 120_000


def test_ws_outage_of_one_market_on_one_exchange(sim: ThreadedSimulator) -> None:
    """Only Binance's ETH/USDT streams go; Bybit's stay; Binance still serves BTC/USDT."""

    async def run() -> None:
        async with aiohttp.ClientSession() as session:
            eth = await _connect(session, sim, "/ws/ethusdt@trade", "ETH/USDT")
            bybit = await _bybit(session, sim, "ETH/USDT", 2)
            control = SimulatorControl(sim.base_url)  # POST /_sim/faults {"kind": "ws_outage"}
            assert await asyncio.to_thread(control.ws_outage, "ETH/USDT", "binance") == 1
            (pending,) = await asyncio.to_thread(control.pending_faults)
            assert pending["kind"] == "ws_outage" and pending["until_ms"] == NOW + 120_000
            assert (await eth.receive(timeout=10)).type == aiohttp.WSMsgType.CLOSE
            await asyncio.to_thread(sim.wait_for_subscribers, "ETH/USDT", 1)  # Bybit's
            assert not bybit.closed
            again = await session.ws_connect(ws_url(sim, "/ws"))
            await again.send_json({"method": "SUBSCRIBE", "params": ["btcusdt@trade"], "id": 1})
            assert await again.receive_json(timeout=10) == {"result": None, "id": 1}
            await again.send_json({"method": "SUBSCRIBE", "params": ["ethusdt@trade"], "id": 2})
            assert await again.receive_json(timeout=10) == {"result": None, "id": 2}
            assert (await again.receive(timeout=10)).type == aiohttp.WSMsgType.CLOSE
            await asyncio.to_thread(control.clear_faults, "ws_outage")  # ends it early
            ok = await session.ws_connect(ws_url(sim, "/ws/ethusdt@trade"))
            await asyncio.to_thread(sim.wait_for_subscribers, "ETH/USDT", 2)
            await ok.close()

    asyncio.run(run())
    (record,) = [f for f in sim.stats()["faults_triggered"] if f["kind"] == "ws_outage"]
    assert (record["symbol"], record["exchange"]) == ("ETH/USDT", "binance")
    assert record["closed"] == 1 and record["refused"] == 1


def test_ccxt_pro_sees_an_outage_as_a_network_error_then_reconnects(
    sim: ThreadedSimulator,
) -> None:
    async def run() -> None:
        exchange = ccxt_pro.binance(SPOT_ONLY)
        point_ccxt_at(exchange, sim.base_url)
        try:
            await exchange.load_markets()
            watch = asyncio.ensure_future(exchange.watch_trades("LTC/USDT"))
            await asyncio.to_thread(sim.wait_for_subscribers, "LTC/USDT", 1)
            await asyncio.to_thread(sim.ws_outage, "LTC/USDT", None, 30)
            with pytest.raises(ccxt.NetworkError):
                await asyncio.wait_for(watch, 10)
            with pytest.raises(ccxt.NetworkError):  # refused while it lasts
                await asyncio.wait_for(exchange.watch_trades("LTC/USDT"), 10)
            await asyncio.to_thread(sim.advance_time, 30_000)
            watch = asyncio.ensure_future(exchange.watch_trades("LTC/USDT"))
            await asyncio.to_thread(sim.wait_for_subscribers, "LTC/USDT", 1)
            await asyncio.to_thread(sim.advance_time, MINUTE_MS)
            trades = await asyncio.wait_for(watch, 10)
            assert trades and all(t["timestamp"] > NOW + 30_000 for t in trades)
        finally:
            await exchange.close()

    asyncio.run(run())


def test_injected_ids_are_consecutive_below_the_model_ids(sim: ThreadedSimulator) -> None:
    first = sim.inject_trades("ADA/USDT", [{"price": "0.4", "qty": "10"}] * 3)
    second = sim.inject_trades("ADA/USDT", [{"price": "0.5", "qty": "1"}])
    numbers = ids(first + second)
    assert consecutive(numbers) and 0 < numbers[0] < MODEL_ID_FLOOR
    assert sim.inject_trades("ADA/USDT", [{"price": "1", "id": 7}])[0].id == 7
    with pytest.raises(ValueError, match="not in"):
        sim.inject_trades("ADA/USDT", [{"price": "1", "id": MODEL_ID_FLOOR + 5}])


# ----------------------------------------------------- trade history (REST)
def same_trades(got: list[dict[str, Any]], want: list[Trade]) -> None:
    """ccxt's trades are the model's: ids, times, prices, amounts, taker sides."""
    assert [int(t["id"]) for t in got] == ids(want)
    assert [t["timestamp"] for t in got] == [t.time_ms for t in want]
    assert [t["price"] for t in got] == [float(t.price) for t in want]
    assert [t["amount"] for t in got] == [float(t.qty) for t in want]
    assert [t["side"] for t in got] == ["sell" if t.buyer_is_maker else "buy" for t in want]
    assert all(t["symbol"] == want[0].symbol for t in got)


def history(symbol: str, first_id: int, count: int) -> list[Trade]:
    return list(
        itertools.islice(DEFAULT_MODEL.iter_trades(symbol, 0, NOW, from_id=first_id), count)
    )


def newest(symbol: str, count: int, before_id: int | None = None) -> list[Trade]:
    """The ``count`` newest model trades up to NOW (older than ``before_id``), newest first."""
    trades = DEFAULT_MODEL.iter_trades_backward(symbol, NOW, before_id=before_id)
    return list(itertools.islice(trades, count))


async def _exchange(sim: ThreadedSimulator, exchange_id: str, **config: Any) -> Any:
    # No client-side throttle: Kraken's would wait a second between calls.
    exchange = getattr(ccxt_async, exchange_id)({**SPOT_ONLY, "enableRateLimit": False, **config})
    point_ccxt_at(exchange, sim.base_url)
    await exchange.load_markets()
    return exchange


def run_with(sim: ThreadedSimulator, exchange_id: str, scenario: Any, **config: Any) -> Any:
    """Run ``scenario(exchange)`` with an async ccxt exchange pointed at the simulator."""

    async def run() -> Any:
        exchange = await _exchange(sim, exchange_id, **config)
        try:
            return await scenario(exchange)
        finally:
            await exchange.close()

    return asyncio.run(run())


@pytest.mark.parametrize("method", ["publicGetAggTrades", "publicGetHistoricalTrades"])
def test_binance_pages_by_from_id(sim: ThreadedSimulator, method: str) -> None:
    """`fromId` is inclusive, 1000 a page; consecutive pages continue exactly."""
    start = DEFAULT_MODEL.first_trade_id("BTC/USDT", MINUTE - 90 * MINUTE_MS) + 17

    async def scenario(exchange: Any) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        cursor = start
        for _ in range(3):
            params = {"fetchTradesMethod": method, "fromId": cursor}
            page = await exchange.fetch_trades("BTC/USDT", limit=1000, params=params)
            assert len(page) == 1000
            got += page
            cursor = int(page[-1]["id"]) + 1
        return got

    got = run_with(sim, "binance", scenario, apiKey="sim")
    want = history("BTC/USDT", start, 3000)
    same_trades(got, want)
    assert len({t.time_ms // MINUTE_MS for t in want}) > 30  # many minute boundaries
    if method == "publicGetAggTrades":
        assert got[0]["info"]["a"] == got[0]["info"]["f"] == got[0]["info"]["l"] == start


def test_binance_trade_windows_and_refusals(sim: ThreadedSimulator) -> None:
    since = MINUTE - 30 * MINUTE_MS + 12_345

    async def scenario(exchange: Any) -> None:
        page = await exchange.fetch_trades("ETH/USDT", since=since, limit=1000)  # 1 h window
        same_trades(
            page, list(itertools.islice(DEFAULT_MODEL.iter_trades("ETH/USDT", since, NOW), 1000))
        )
        with pytest.raises(ccxt.BadRequest):  # fromId with a time window: -1128
            await exchange.fetch_trades("ETH/USDT", since=since, params={"fromId": 5})
        latest = await exchange.fetch_trades("ETH/USDT", limit=7)
        same_trades(latest, newest("ETH/USDT", 7)[::-1])
        recent = await exchange.fetch_trades(
            "ETH/USDT", limit=7, params={"fetchTradesMethod": "publicGetTrades"}
        )
        assert recent == latest or [t["id"] for t in recent] == [t["id"] for t in latest]

    run_with(sim, "binance", scenario)
    # historicalTrades without a key: ccxt refuses before sending; the wire answers -2014
    request = urllib.request.Request(sim.base_url + "/api/v3/historicalTrades?symbol=ETHUSDT")
    with pytest.raises(urllib.error.HTTPError) as error:
        NO_PROXY.open(request, timeout=10)
    assert error.value.code == 401 and json.loads(error.value.read())["code"] == -2014


def test_okx_history_trades_page_by_trade_id(sim: ThreadedSimulator) -> None:
    """`after` = older than this tradeId, 100 a page, newest first; `before` alone gives the
    newest trades, not those right after it; `market/trades` the latest (up to 500)."""
    history_method = {"method": "publicGetMarketHistoryTrades"}
    top = DEFAULT_MODEL.first_trade_id("SOL/USDT", MINUTE - 20 * MINUTE_MS)

    async def scenario(exchange: Any) -> None:
        got: list[dict[str, Any]] = []
        cursor = top
        for _ in range(3):
            page = await exchange.fetch_trades(
                "SOL/USDT", limit=100, params={**history_method, "after": cursor}
            )
            assert len(page) == 100  # ccxt sorts each page oldest first
            got = page + got
            cursor = int(page[0]["id"])
        older = newest("SOL/USDT", 300, before_id=top)
        same_trades(got, older[::-1])
        assert len({t.time_ms // MINUTE_MS for t in older}) > 5

        latest = newest("SOL/USDT", 500)
        page = await exchange.fetch_trades("SOL/USDT", limit=500)  # market/trades
        same_trades(page, latest[::-1])
        page = await exchange.fetch_trades(
            "SOL/USDT", limit=100, params={**history_method, "before": top}
        )
        same_trades(page, latest[:100][::-1])  # the newest, not the ones after `top`
        raw = await exchange.publicGetMarketHistoryTrades(
            {"instId": "SOL-USDT", "after": str(latest[9].id), "before": str(latest[13].id)}
        )
        assert [int(r["tradeId"]) for r in raw["data"]] == ids(latest[10:13])
        assert raw["data"][0] == {
            "instId": "SOL-USDT",
            "tradeId": str(latest[10].id),
            "px": f"{latest[10].price:.8f}",
            "sz": f"{latest[10].qty:.8f}",
            "side": "sell" if latest[10].buyer_is_maker else "buy",
            "source": "0",
            "ts": str(latest[10].time_ms),
        }
        by_time = await exchange.publicGetMarketHistoryTrades(
            {"instId": "SOL-USDT", "type": "2", "after": str(latest[20].time_ms), "limit": "5"}
        )
        want = [t for t in latest if t.time_ms < latest[20].time_ms][:5]
        assert [int(r["tradeId"]) for r in by_time["data"]] == ids(want)
        with pytest.raises(ccxt.BadRequest):
            await exchange.fetch_trades("SOL/USDT", limit=101, params=history_method)

    run_with(sim, "okx", scenario)


def test_kraken_trades_page_by_since_and_last(sim: ThreadedSimulator) -> None:
    """`since` in seconds (what ccxt sends) or the `last` nanosecond cursor; 1000 a page,
    oldest first; following `last` pages on without a loss or a repeat."""
    since = MINUTE - 60 * MINUTE_MS + 7_000

    async def scenario(exchange: Any) -> list[dict[str, Any]]:
        first = await exchange.fetch_trades("BTC/USDT", since=since)
        got = list(first)
        cursor = first[-1]["info"][7]  # ccxt appends the answer's `last` to its last row
        page = await exchange.fetch_trades("BTC/USDT", params={"since": cursor})
        assert len(first) + len(page) > 1000
        got += page
        tail = await exchange.fetch_trades("BTC/USDT", params={"since": page[-1]["info"][7]})
        assert tail == [] or int(tail[0]["id"]) == int(page[-1]["id"]) + 1
        return got

    got = run_with(sim, "kraken", scenario)
    second = since - since % 1000  # ccxt sends whole seconds, then drops what is before since
    want = list(DEFAULT_MODEL.iter_trades("BTC/USDT", second, NOW))
    want = [t for t in want if t.time_ms >= since][: len(got)]
    same_trades(got, want)
    assert consecutive([int(t["id"]) for t in got])
    assert len({t["timestamp"] // MINUTE_MS for t in got}) > 10


def test_kraken_trades_wire_format(sim: ThreadedSimulator) -> None:
    latest = newest("DOGE/USDT", 3)
    body = _get(sim.base_url + "/0/public/Trades?pair=XDGUSDT&count=3")
    rows = body["result"]["XDGUSDT"]
    assert [r[6] for r in rows] == ids(latest[::-1])
    price, volume, seconds, side, kind, misc, _ = rows[-1]
    assert (price, volume) == (f"{latest[0].price:.8f}", f"{latest[0].qty:.8f}")
    assert int(seconds * 1000) == latest[0].time_ms and (kind, misc) == ("l", "")
    assert side == ("s" if latest[0].buyer_is_maker else "b")
    assert int(body["result"]["last"]) // 10**6 == latest[0].time_ms
    again = _get(sim.base_url + f"/0/public/Trades?pair=XDGUSDT&since={body['result']['last']}")
    assert again["result"]["XDGUSDT"] == [] and again["result"]["last"] == body["result"]["last"]
    assert _get(sim.base_url + "/0/public/Trades?pair=NOPE")["error"] == [
        "EQuery:Unknown asset pair"
    ]


def _get(url: str) -> Any:
    with NO_PROXY.open(url, timeout=10) as response:
        return json.loads(response.read())


def test_coinbase_pages_by_after_and_before(sim: ThreadedSimulator) -> None:
    """Newest first; `after` = older than this trade id, `before` = newer (the ones
    right after it); `cb-after`/`cb-before` headers are the page's cursors."""
    top = DEFAULT_MODEL.first_trade_id("LINK/USDT", MINUTE - 10 * MINUTE_MS)

    async def scenario(exchange: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        got: list[dict[str, Any]] = []
        cursor = top
        for _ in range(3):
            page = await exchange.fetch_trades("LINK/USDT", limit=20, params={"after": cursor})
            assert exchange.last_response_headers["cb-after"] == page[0]["id"]
            got = page + got
            cursor = int(page[0]["id"])
        newer = await exchange.fetch_trades("LINK/USDT", limit=20, params={"before": top})
        return got, newer

    got, newer = run_with(sim, "coinbaseexchange", scenario)
    older = newest("LINK/USDT", 60, before_id=top)
    same_trades(got, older[::-1])
    assert len({t.time_ms // MINUTE_MS for t in older}) > 1
    same_trades(newer, history("LINK/USDT", top + 1, 20))


def test_bybit_serves_the_latest_60_only(sim: ThreadedSimulator) -> None:
    async def scenario(exchange: Any) -> list[dict[str, Any]]:
        return list(await exchange.fetch_trades("BNB/USDT", limit=1000))

    got = run_with(sim, "bybit", scenario)
    latest = newest("BNB/USDT", 60)
    same_trades(got, latest[::-1])


# ------------------------------------------------------ OKX trades channel
def test_okx_trades_channel_through_ccxt_pro(sim: ThreadedSimulator) -> None:
    """ccxt.pro okx `watch_trades` gets the model's trades, consecutive tradeIds, one
    fill per push; a `trade_drop` of OKX shows as skipped ids."""
    minute = MINUTE + MINUTE_MS
    due = list(DEFAULT_MODEL.trades_in_minute("SOL/USDT", minute))
    sim.set_time(minute - 1)
    sim.add_fault("trade_drop", symbol="SOL/USDT", count=2, exchange="okx")

    async def run() -> list[dict[str, Any]]:
        exchange = ccxt_pro.okx(SPOT_ONLY)
        point_ccxt_at(exchange, sim.base_url)
        try:
            await exchange.load_markets()
            watch = asyncio.ensure_future(exchange.watch_trades("SOL/USDT"))
            await asyncio.to_thread(sim.wait_for_subscribers, "SOL/USDT", 1)
            await asyncio.to_thread(sim.advance_time, MINUTE_MS)
            await asyncio.wait_for(watch, 10)
            for _ in range(200):  # the cache fills as the pushes arrive
                cache = exchange.trades["SOL/USDT"]
                if int(cache[-1]["id"]) == due[-1].id:
                    return list(cache)
                await asyncio.sleep(0.05)
            raise AssertionError("the minute's trades did not all arrive")
        finally:
            await exchange.close()

    got = asyncio.run(run())
    same_trades(got, due[2:])
    (record,) = sim.stats()["faults_triggered"]
    assert record["exchange"] == "okx" and record["trade_ids"] == ids(due[:2])


def test_okx_trades_channel_wire_format(sim: ThreadedSimulator) -> None:
    async def run() -> None:
        async with aiohttp.ClientSession() as session:
            ws = await session.ws_connect(ws_url(sim, "/ws/ws/v5/public"))
            arg = {"channel": "trades", "instId": "ADA-USDT"}
            await ws.send_json({"op": "subscribe", "args": [arg]})
            ack = await ws.receive_json(timeout=10)
            assert ack["event"] == "subscribe" and ack["arg"] == arg
            await asyncio.to_thread(sim.wait_for_subscribers, "ADA/USDT", 1)
            await asyncio.to_thread(sim.advance_time, MINUTE_MS)
            trade = next(DEFAULT_MODEL.iter_trades("ADA/USDT", NOW + 1, NOW + MINUTE_MS))
            push = await ws.receive_json(timeout=10)
            assert push == {
                "arg": arg,
                "data": [
                    {
                        "instId": "ADA-USDT",
                        "tradeId": str(trade.id),
                        "px": f"{trade.price:.8f}",
                        "sz": f"{trade.qty:.8f}",
                        "side": "sell" if trade.buyer_is_maker else "buy",
                        "source": "0",
                        "ts": str(trade.time_ms),
                        "count": "1",
                    }
                ],
            }
            await ws.send_json({"op": "unsubscribe", "args": [arg]})
            await asyncio.to_thread(sim.wait_for_subscribers, "ADA/USDT", 0)
            await ws.close()

    asyncio.run(run())


def test_a_stream_far_from_the_id_epoch_waits_for_its_ids_and_loses_nothing() -> None:
    """Counting the ids of a day far from the epoch runs in a worker thread (the loop
    keeps serving); the stream then sends every trade due since the subscription."""
    far = interval_open("1m", ID_EPOCH_MS - 500 * DAY_MS) + 30_000
    model = MarketModel()  # nothing counted yet
    # expectations from another instance: the server's model is counted by the server only
    want = list(MarketModel().iter_trades("XRP/USDT", far + 1, far + 90_000))
    with run_in_thread(model=model, now_ms=far) as server:

        async def run() -> list[int]:
            async with aiohttp.ClientSession() as session:
                ws = await session.ws_connect(ws_url(server, "/ws/xrpusdt@trade"))
                await asyncio.to_thread(server.wait_for_subscribers, "XRP/USDT", 1)
                await asyncio.to_thread(server.set_time, far + 90_000)  # no pump: the loop's
                return await _binance_ids(ws, want[-1].id)

        assert not model.ids_ready("XRP/USDT", far)
        got = asyncio.run(run())
        assert model.ids_ready("XRP/USDT", far)  # counted by the server's worker thread
    assert got == ids(want) and consecutive(got)
