"""The exchange simulator against REAL, unmodified ccxt (sync, async_support, pro).

Why: the ingestor trusts that ccxt behaves against the simulator as against
the real exchanges, so every guarantee is checked through ccxt itself, and
every served candle is compared with the independently computed model.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
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
    SimulatorServer,
    ThreadedSimulator,
    expected_klines,
    interval_open,
    point_ccxt_at,
    run_in_thread,
)
from infra.exchange_sim.control import SimulatorControl
from infra.exchange_sim.faults import FaultError, parse_fault, truncate
from infra.exchange_sim.model import INTERVAL_MS, MINUTE_MS

REPO_ROOT = Path(__file__).resolve().parents[2]
SPOT_ONLY = {"options": {"fetchMarkets": {"types": ["spot"]}}}
# A fixed, minute-aligned instant well inside every liquid symbol's history.
T0 = interval_open("1d", 1_700_000_000_000) + 6 * 3_600_000
FROZEN_NOW = T0 + 3 * 3_600_000 + 25 * MINUTE_MS + 30_500  # mid-minute


@pytest.fixture(scope="module")
def sim() -> Iterator[ThreadedSimulator]:
    with run_in_thread() as server:
        yield server


@pytest.fixture(autouse=True)
def _clean(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test starts with no faults, zeroed counters and the wall clock."""
    if "sim" not in request.fixturenames:
        yield
        return
    server: ThreadedSimulator = request.getfixturevalue("sim")
    server.reset()
    server.set_time(None)
    yield
    server.clear_faults()
    server.set_time(None)


def binance(sim: ThreadedSimulator, **config: Any) -> Any:
    exchange = ccxt.binance({**SPOT_ONLY, **config})
    point_ccxt_at(exchange, sim.base_url)
    exchange.load_markets()
    return exchange


def ohlcv(klines: list[Any]) -> list[list[float | int]]:
    return [k.ohlcv() for k in klines]


def http_json(method: str, url: str, body: object | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as response:
        return json.loads(response.read())


# --------------------------------------------------------------------- glue
def test_point_ccxt_at_rewrites_every_api_url() -> None:
    exchange = ccxt_pro.binance()  # pro: REST and websocket URLs
    changes = point_ccxt_at(exchange, "http://127.0.0.1:9")
    api = exchange.urls["api"]
    assert api["public"] == "http://127.0.0.1:9/api/v3"
    assert api["fapiPublic"] == "http://127.0.0.1:9/fapi/v1"
    assert api["ws"]["spot"] == "ws://127.0.0.1:9/stream/ws"
    assert api["ws"]["ws-api"]["spot"] == "ws://127.0.0.1:9/ws-api/ws-api/v3"
    assert "binance.com" not in json.dumps(api)
    assert changes["https://api.binance.com/api/v3"] == "http://127.0.0.1:9/api/v3"
    # another instance keeps the real URLs
    assert ccxt.binance().urls["api"]["public"] == "https://api.binance.com/api/v3"
    coinbase = ccxt.coinbaseexchange()
    point_ccxt_at(coinbase, "http://127.0.0.1:9")
    assert coinbase.urls["api"]["public"] == "http://127.0.0.1:9"


# ------------------------------------------------------------ binance REST
def test_load_markets_spot(sim: ThreadedSimulator) -> None:
    exchange = binance(sim)
    assert set(exchange.markets) == set(DEFAULT_MODEL.specs)
    btc = exchange.market("BTC/USDT")
    assert btc["id"] == "BTCUSDT" and btc["spot"] and btc["active"]
    assert btc["precision"]["price"] == 0.01 and btc["precision"]["amount"] == 0.00001
    assert btc["limits"]["amount"]["min"] == 0.00001
    assert btc["limits"]["cost"]["min"] == 5.0
    assert exchange.market("XYZ/USDT")["precision"]["amount"] == 1.0
    assert exchange.market("OLD/USDT")["active"] is False  # status BREAK
    assert sim.stats()["by_endpoint"] == {"GET /api/v3/exchangeInfo": 1}


def test_load_markets_with_default_options(sim: ThreadedSimulator) -> None:
    exchange = ccxt.binance()  # also asks for linear + inverse markets
    point_ccxt_at(exchange, sim.base_url)
    exchange.load_markets()
    assert set(exchange.symbols) == set(DEFAULT_MODEL.specs)
    assert sim.stats()["by_endpoint"]["GET /fapi/v1/exchangeInfo"] == 1


def test_fetch_ohlcv_pages_equal_expected_klines(sim: ThreadedSimulator) -> None:
    exchange = binance(sim)
    rows: list[list[Any]] = []
    since = T0
    for _ in range(3):  # own pagination loop, as the ingestor does
        page = exchange.fetch_ohlcv("BTC/USDT", "1m", since=since, limit=1000)
        assert len(page) == 1000
        rows += page
        since = page[-1][0] + 60_000
    assert rows == ohlcv(expected_klines("BTC/USDT", "1m", T0, T0 + 2999 * MINUTE_MS))
    for interval in ("5m", "1h", "4h", "1d"):
        start = interval_open(interval, T0)
        page = exchange.fetch_ohlcv("ETH/USDT", interval, since=start, limit=20)
        end = start + 19 * INTERVAL_MS[interval]
        assert page == ohlcv(expected_klines("ETH/USDT", interval, start, end)), interval


def test_raw_kline_rows_are_binance_shaped(sim: ThreadedSimulator) -> None:
    exchange = binance(sim)
    raw = exchange.publicGetKlines(
        {"symbol": "SOLUSDT", "interval": "15m", "startTime": T0, "limit": 4}
    )
    expected = [k.binance_row() for k in expected_klines("SOL/USDT", "15m", T0, T0 + 45 * 60_000)]
    assert raw == expected
    first = raw[0]
    assert len(first) == 12 and first[6] == T0 + 15 * MINUTE_MS - 1
    assert (
        isinstance(first[1], str) and first[1].count(".") == 1 and len(first[1].split(".")[1]) == 8
    )


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    symbol=st.sampled_from(["BTC/USDT", "XYZ/USDT", "OLD/USDT"]),
    interval=st.sampled_from(sorted(INTERVAL_MS)),
    when=st.integers(min_value=T0 - 4 * 365 * 86_400_000, max_value=T0 + 365 * 86_400_000),
    now_offset=st.one_of(st.none(), st.integers(min_value=0, max_value=7 * 86_400_000)),
)
def test_every_interval_aggregates_one_minute_candles(
    symbol: str, interval: str, when: int, now_offset: int | None
) -> None:
    """Coarse candles (also the still-open one) are exactly their 1m candles combined."""
    length = INTERVAL_MS[interval]
    open_ms = interval_open(interval, when)
    now = None if now_offset is None else open_ms + now_offset % length
    kline = DEFAULT_MODEL.candle(symbol, interval, open_ms, now)
    minutes = expected_klines(symbol, "1m", open_ms, open_ms + length - 1, now_ms=now)
    if not minutes:
        assert kline is None
        return
    assert kline is not None and kline.closed == (now is None)
    assert kline.open == minutes[0].open and kline.close == minutes[-1].close
    assert kline.high == max(m.high for m in minutes)
    assert kline.low == min(m.low for m in minutes)
    assert kline.volume == sum(m.volume for m in minutes)
    assert kline.trades == sum(m.trades for m in minutes)
    assert kline.taker_buy_base == sum(m.taker_buy_base for m in minutes)


def test_illiquid_symbol_has_missing_minutes(sim: ThreadedSimulator) -> None:
    exchange = binance(sim)
    rows = exchange.fetch_ohlcv("XYZ/USDT", "1m", since=T0, limit=200)
    assert len(rows) == 200
    gaps = sum(1 for a, b in itertools.pairwise(rows) if b[0] - a[0] > MINUTE_MS)
    assert gaps > 50  # most minutes have no trade, hence no row
    assert rows == ohlcv(expected_klines("XYZ/USDT", "1m", T0, rows[-1][0]))


def test_fetch_trades_aggregate_to_the_kline(sim: ThreadedSimulator) -> None:
    exchange = binance(sim)
    minute = T0 + 17 * MINUTE_MS
    (kline,) = expected_klines("ETH/USDT", "1m", minute, minute)
    trades = exchange.fetch_trades("ETH/USDT", since=minute, limit=1000)
    in_minute = [t for t in trades if minute <= t["timestamp"] < minute + MINUTE_MS]
    assert len(in_minute) == kline.trades
    prices = [Decimal(t["info"]["p"]) for t in in_minute]
    assert prices[0] == kline.open and prices[-1] == kline.close
    assert max(prices) == kline.high and min(prices) == kline.low
    assert sum(Decimal(t["info"]["q"]) for t in in_minute) == kline.volume
    assert [int(t["id"]) for t in in_minute] == sorted(int(t["id"]) for t in in_minute)


def test_last_candle_is_still_open(sim: ThreadedSimulator) -> None:
    sim.set_time(FROZEN_NOW)
    exchange = binance(sim)
    current = interval_open("1m", FROZEN_NOW)
    rows = exchange.fetch_ohlcv("BTC/USDT", "1m", limit=5)
    assert rows[-1][0] == current
    expected = expected_klines(
        "BTC/USDT", "1m", current - 4 * MINUTE_MS, current, now_ms=FROZEN_NOW
    )
    assert not expected[-1].closed and rows == ohlcv(expected)
    raw = exchange.publicGetKlines({"symbol": "BTCUSDT", "interval": "1h", "limit": 2})
    assert int(raw[-1][6]) > FROZEN_NOW  # close time lies in the future
    (full,) = expected_klines("BTC/USDT", "1m", current, current)
    assert Decimal(rows[-1][5]) < full.volume  # only trades so far
    sim.set_time(current + MINUTE_MS)  # the minute completes
    rows = exchange.fetch_ohlcv("BTC/USDT", "1m", since=current, limit=1)
    assert rows == [full.ohlcv()]


def test_weight_headers(sim: ThreadedSimulator) -> None:
    exchange = binance(sim)
    exchange.fetch_ohlcv("BTC/USDT", "1m", limit=2)
    headers = exchange.last_response_headers
    assert int(headers["x-mbx-used-weight-1m"]) >= 22  # exchangeInfo 20 + klines 2


# ------------------------------------------------------------- errors/faults
def test_unknown_symbol_is_bad_symbol(sim: ThreadedSimulator) -> None:
    exchange = binance(sim)
    with pytest.raises(ccxt.BadSymbol):
        exchange.publicGetKlines({"symbol": "NOPEUSDT", "interval": "1m"})
    sim.add_fault("unknown_symbol", path="/api/v3/klines")
    with pytest.raises(ccxt.BadSymbol):
        exchange.fetch_ohlcv("BTC/USDT", "1m", limit=1)
    assert len(exchange.fetch_ohlcv("BTC/USDT", "1m", limit=1)) == 1  # fault consumed
    with pytest.raises(ccxt.BadRequest):
        exchange.publicGetKlines({"symbol": "BTCUSDT", "interval": "7m"})


@pytest.mark.parametrize(("kind", "status"), [("rate_limit", 429), ("ban", 418)])
def test_rate_limit_and_ban_raise_ddos_protection(
    sim: ThreadedSimulator, kind: str, status: int
) -> None:
    exchange = binance(sim)
    sim.add_fault(kind, path="/api/v3/klines", retry_after=7)
    with pytest.raises(ccxt.DDoSProtection):
        exchange.fetch_ohlcv("BTC/USDT", "1m", limit=1)
    assert exchange.last_response_headers["Retry-After"] == "7"
    assert len(exchange.fetch_ohlcv("BTC/USDT", "1m", limit=1)) == 1
    statuses = [e["status"] for e in sim.stats()["log"] if e["path"] == "/api/v3/klines"]
    assert statuses == [status, 200]


def test_unavailable_raises_exchange_not_available(sim: ThreadedSimulator) -> None:
    exchange = binance(sim)
    sim.add_fault("unavailable", count=2)
    for _ in range(2):
        with pytest.raises(ccxt.ExchangeNotAvailable):
            exchange.fetch_ohlcv("BTC/USDT", "1m", limit=1)
    assert len(exchange.fetch_ohlcv("BTC/USDT", "1m", limit=1)) == 1
    assert [f["kind"] for f in sim.stats()["faults_triggered"]] == ["unavailable"] * 2


def test_a_fault_after_n_requests_fails_a_later_page_only(sim: ThreadedSimulator) -> None:
    exchange = binance(sim)
    sim.add_fault("unavailable", path="/api/v3/klines", after=2)
    for _ in range(2):  # the first two pages pass
        assert len(exchange.fetch_ohlcv("BTC/USDT", "1m", since=T0, limit=5)) == 5
    with pytest.raises(ccxt.ExchangeNotAvailable):
        exchange.fetch_ohlcv("BTC/USDT", "1m", since=T0, limit=5)
    assert len(exchange.fetch_ohlcv("BTC/USDT", "1m", since=T0, limit=5)) == 5  # used up


def test_truncate_cuts_a_candle_page_short_in_the_exchanges_order(sim: ThreadedSimulator) -> None:
    """A page that comes back 200 OK with fewer candles than the exchange holds."""
    exchange = binance(sim)
    full = ohlcv(expected_klines("BTC/USDT", "1m", T0, T0 + 9 * MINUTE_MS))
    sim.add_fault("truncate", path="/api/v3/klines", after=1)  # keep=0.5, the second page
    assert exchange.fetch_ohlcv("BTC/USDT", "1m", since=T0, limit=10) == full
    assert exchange.fetch_ohlcv("BTC/USDT", "1m", since=T0, limit=10) == full[:5]  # oldest first
    sim.add_fault("truncate", path="/api/v3/klines", keep=0)
    assert exchange.fetch_ohlcv("BTC/USDT", "1m", since=T0, limit=10) == []  # keep=0: empty
    assert exchange.fetch_ohlcv("BTC/USDT", "1m", since=T0, limit=10) == full  # used up
    coinbase = ccxt.coinbaseexchange()
    point_ccxt_at(coinbase, sim.base_url)
    coinbase.load_markets()
    sim.add_fault("truncate", exchange="coinbase", path="/candles", keep=0.3)
    assert coinbase.fetch_ohlcv("BTC/USDT", "1m", since=T0, limit=10) == full[7:]  # newest first
    assert [f["kind"] for f in sim.stats()["faults_triggered"]] == ["truncate"] * 3


def test_truncate_finds_the_rows_of_every_exchanges_answer() -> None:
    rows = [[1], [2], [3], [4]]
    assert truncate([*rows], 0.5) == [[1], [2]]  # Binance, Coinbase
    assert truncate({"code": "0", "data": [*rows]}, 0.25) == {"code": "0", "data": [[1]]}
    bybit = {"retCode": 0, "result": {"category": "spot", "list": [*rows]}}
    assert truncate(bybit, 0)["result"]["list"] == []
    kraken = {"error": [], "result": {"XXBTZUSDT": [*rows], "last": 4}}
    assert truncate(kraken, 0.75)["result"] == {"XXBTZUSDT": rows[:3], "last": 4}
    assert truncate({"serverTime": 1}, 0) == {"serverTime": 1}  # not a candle answer
    with pytest.raises(FaultError, match="keep"):
        parse_fault({"kind": "truncate", "keep": 2})


def test_slow_response_times_out(sim: ThreadedSimulator) -> None:
    exchange = binance(sim)
    exchange.timeout = 200  # ms
    sim.add_fault("slow", delay=1.0, path="/api/v3/klines")
    with pytest.raises(ccxt.RequestTimeout):
        exchange.fetch_ohlcv("BTC/USDT", "1m", limit=1)


def test_weight_limit_answers_429() -> None:
    with run_in_thread(weight_limit=25, now_ms=FROZEN_NOW) as server:  # one weight minute
        exchange = binance(server)  # exchangeInfo: 20
        exchange.fetch_ohlcv("BTC/USDT", "1m", limit=1)  # 22
        exchange.fetch_ohlcv("BTC/USDT", "1m", limit=1)  # 24
        with pytest.raises(ccxt.DDoSProtection):
            exchange.fetch_ohlcv("BTC/USDT", "1m", limit=1)  # 26 > 25
        assert exchange.last_response_headers["Retry-After"] == "30"  # FROZEN_NOW is hh:mm:30.5


def test_http_control_api(sim: ThreadedSimulator) -> None:
    base = sim.base_url
    exchange = binance(sim)
    added = http_json("POST", f"{base}/_sim/faults", {"kind": "503", "path": "/api/v3/time"})
    assert added["faults"][0]["kind"] == "unavailable"
    assert len(http_json("GET", f"{base}/_sim/faults")["faults"]) == 1
    with pytest.raises(ccxt.ExchangeNotAvailable):
        exchange.fetch_time()
    http_json("POST", f"{base}/_sim/faults", {"faults": [{"kind": "429"}, {"kind": "429"}]})
    assert http_json("DELETE", f"{base}/_sim/faults") == {"ok": True}
    clock = http_json("POST", f"{base}/_sim/clock", {"now_ms": FROZEN_NOW})
    assert clock["frozen"] and exchange.fetch_time() == FROZEN_NOW
    stats = http_json("GET", f"{base}/_sim/stats")
    assert stats["by_status"]["503"] == 1 and stats["by_endpoint"]["GET /api/v3/time"] == 2
    assert http_json("GET", f"{base}/_sim/subscribers?symbol=BTC/USDT")["count"] == 0
    assert http_json("POST", f"{base}/_sim/reset") == {"ok": True}
    assert http_json("GET", f"{base}/_sim/stats?log=0")["requests_total"] == 0


def test_http_trades_list_the_model_trades_of_a_range(sim: ThreadedSimulator) -> None:
    """`GET /_sim/trades`: what a soak checks a recording against, the model's trades."""
    control = SimulatorControl(sim.base_url)
    listed = control.trades("BTCUSDT", T0, T0 + 2 * MINUTE_MS)
    model = list(sim.server.model.iter_trades("BTC/USDT", T0, T0 + 2 * MINUTE_MS))
    assert listed and [t["id"] for t in listed] == [t.id for t in model]
    assert [Decimal(t["price"]) for t in listed] == [t.price for t in model]
    assert all(T0 <= t["time_ms"] <= T0 + 2 * MINUTE_MS for t in listed)
    with pytest.raises(urllib.error.HTTPError) as too_long:
        control.trades("BTC/USDT", T0, T0 + 7 * 3_600_000)
    assert too_long.value.code == 400
    with pytest.raises(urllib.error.HTTPError):
        control.trades("NOPE/USDT", T0, T0 + MINUTE_MS)


# ------------------------------------------------------------ async ccxt
def test_async_fetch_ohlcv_matches_expected(sim: ThreadedSimulator) -> None:
    async def run() -> list[list[Any]]:
        exchange = ccxt_async.binance(SPOT_ONLY)
        point_ccxt_at(exchange, sim.base_url)
        try:
            await exchange.load_markets()
            return list(await exchange.fetch_ohlcv("SOL/USDT", "1m", since=T0, limit=500))
        finally:
            await exchange.close()

    rows = asyncio.run(run())
    assert rows == ohlcv(expected_klines("SOL/USDT", "1m", T0, T0 + 499 * MINUTE_MS))


def test_embedded_async_server_with_frozen_clock() -> None:
    async def run() -> None:
        async with SimulatorServer(now_ms=FROZEN_NOW) as server:
            exchange = ccxt_async.binance(SPOT_ONLY)
            point_ccxt_at(exchange, server.base_url)
            try:
                assert await exchange.fetch_time() == FROZEN_NOW
                rows = await exchange.fetch_ohlcv("ETH/USDT", "1h", limit=3)
            finally:
                await exchange.close()
            hour = interval_open("1h", FROZEN_NOW)
            expected = expected_klines(
                "ETH/USDT", "1h", hour - 2 * 3_600_000, hour, now_ms=FROZEN_NOW
            )
            assert rows == ohlcv(expected)

    asyncio.run(run())


# ----------------------------------------------------------- websockets
async def _watch_injected(
    exchange: Any, sim: ThreadedSimulator, symbol: str, trade: dict[str, Any]
) -> tuple[Any, list[Any]]:
    """watch_trades, and inject ``trade`` once the server has the subscription.

    A watch started right after a drop may still hit the old, closing
    connection and fail with NetworkError; then it is simply retried.
    """
    subscribed = asyncio.ensure_future(asyncio.to_thread(sim.wait_for_subscribers, symbol, 1))
    for _ in range(3):
        watch = asyncio.ensure_future(exchange.watch_trades(symbol))
        done, _ = await asyncio.wait({watch, subscribed}, return_when=asyncio.FIRST_COMPLETED)
        if watch in done:  # failed before subscribing: it used the closing connection
            assert isinstance(watch.exception(), ccxt.NetworkError), watch.exception()
            continue
        await subscribed
        (injected,) = await asyncio.to_thread(sim.inject_trades, symbol, [trade])
        return injected, await asyncio.wait_for(watch, 10)
    raise AssertionError("watch_trades never reconnected")


@pytest.mark.parametrize("mode", ["close", "abort"])
def test_pro_watch_trades_injected_then_reconnects_after_drop(
    sim: ThreadedSimulator, mode: str
) -> None:
    sim.set_time(FROZEN_NOW)  # a frozen clock keeps model trades out of the stream

    async def run() -> None:
        exchange = ccxt_pro.binance(SPOT_ONLY)
        point_ccxt_at(exchange, sim.base_url)
        try:
            await exchange.load_markets()
            trade = {"price": "12345.67", "qty": "0.5", "time_ms": FROZEN_NOW - 5}
            injected, trades = await _watch_injected(exchange, sim, "BTC/USDT", trade)
            got = trades[-1]
            assert got["id"] == str(injected.id) and got["symbol"] == "BTC/USDT"
            assert got["price"] == 12345.67 and got["amount"] == 0.5
            assert got["timestamp"] == FROZEN_NOW - 5 and got["side"] == "buy"

            dropped = await asyncio.to_thread(sim.drop_websockets, "BTC/USDT", mode)
            assert dropped == 1
            await asyncio.to_thread(sim.wait_for_subscribers, "BTC/USDT", 0)
            trade = {"price": "12000.01", "qty": "1", "buyer_is_maker": True}
            injected, trades = await _watch_injected(exchange, sim, "BTC/USDT", trade)
            assert trades[-1]["id"] == str(injected.id) and trades[-1]["side"] == "sell"
        finally:
            await exchange.close()

    asyncio.run(run())
    assert sim.stats()["ws"]["connections_total"] == 2


@pytest.mark.parametrize("exchange_id", ["binance", "bybit"])
def test_pro_model_trade_stream_matches_the_kline(sim: ThreadedSimulator, exchange_id: str) -> None:
    """Both trade streams carry exactly the minute's model trades; unwatching ends them."""
    minute = interval_open("1m", FROZEN_NOW)
    sim.set_time(minute - 1)
    (kline,) = expected_klines("SOL/USDT", "1m", minute, minute)
    wanted = {t.id for t in DEFAULT_MODEL.trades_in_minute("SOL/USDT", minute)}
    filler = {"price": "1", "qty": "1", "time_ms": minute + MINUTE_MS}  # outside the minute

    async def run() -> list[Any]:
        exchange = getattr(ccxt_pro, exchange_id)(SPOT_ONLY)
        point_ccxt_at(exchange, sim.base_url)
        try:
            await exchange.load_markets()
            watch = asyncio.ensure_future(exchange.watch_trades("SOL/USDT"))
            await asyncio.to_thread(sim.wait_for_subscribers, "SOL/USDT", 1)
            sent = await asyncio.to_thread(sim.advance_time, MINUTE_MS)  # whole minute due
            assert sent == kline.trades
            await asyncio.wait_for(watch, 10)
            # ccxt's trade cache holds every message; a watch call only resolves on a
            # message arriving after it, so register one and then send a filler.
            for _ in range(kline.trades + 1):
                cache = exchange.trades["SOL/USDT"]
                if wanted <= {int(t["id"]) for t in cache}:
                    await asyncio.wait_for(exchange.un_watch_trades("SOL/USDT"), 10)
                    await asyncio.to_thread(sim.wait_for_subscribers, "SOL/USDT", 0)
                    return [t for t in cache if int(t["id"]) in wanted]
                watch = asyncio.ensure_future(exchange.watch_trades("SOL/USDT"))
                await asyncio.to_thread(sim.inject_trades, "SOL/USDT", [filler])
                await asyncio.wait_for(watch, 10)
            raise AssertionError("model trades missing from the stream")
        finally:
            await exchange.close()

    trades = sorted(asyncio.run(run()), key=lambda t: int(t["id"]))
    amount = {"binance": "q", "bybit": "v"}[exchange_id]
    assert len(trades) == kline.trades
    assert Decimal(trades[0]["info"]["p"]) == kline.open
    assert Decimal(trades[-1]["info"]["p"]) == kline.close
    assert sum(Decimal(t["info"][amount]) for t in trades) == kline.volume
    assert all(minute <= t["timestamp"] < minute + MINUTE_MS for t in trades)
    assert all(t["symbol"] == "SOL/USDT" for t in trades)


def test_raw_websocket_wire_formats(sim: ThreadedSimulator) -> None:
    sim.set_time(FROZEN_NOW)
    base = sim.base_url
    ws_base = base.replace("http://", "ws://")

    async def run() -> None:
        async with aiohttp.ClientSession() as session:
            # combined endpoint, subscribed through the URL
            async with session.ws_connect(f"{ws_base}/stream?streams=ethusdt@trade") as combined:
                await asyncio.to_thread(sim.wait_for_subscribers, "ETH/USDT", 1)
                await asyncio.to_thread(
                    sim.inject_trades, "ETH/USDT", [{"price": "2000", "qty": "0.25", "id": 42}]
                )
                message = await combined.receive_json(timeout=10)
                assert message["stream"] == "ethusdt@trade"
                assert message["data"] == {
                    "e": "trade",
                    "E": FROZEN_NOW,
                    "s": "ETHUSDT",
                    "t": 42,
                    "p": "2000.00000000",
                    "q": "0.25000000",
                    "T": FROZEN_NOW,
                    "m": False,
                    "M": True,
                }
            await asyncio.to_thread(sim.wait_for_subscribers, "ETH/USDT", 0)
            # raw endpoint, SUBSCRIBE method with ack, aggTrade stream
            async with session.ws_connect(f"{ws_base}/stream/ws/0") as raw:
                await raw.send_json(
                    {"method": "SUBSCRIBE", "params": ["ethusdt@aggTrade"], "id": 7}
                )
                assert await raw.receive_json(timeout=10) == {"result": None, "id": 7}
                await raw.send_json({"method": "LIST_SUBSCRIPTIONS", "id": 8})
                assert await raw.receive_json(timeout=10) == {
                    "result": ["ethusdt@aggTrade"],
                    "id": 8,
                }
                body = {"symbol": "ETH/USDT", "trades": [{"price": "2001.5", "qty": "1", "id": 43}]}
                reply = await asyncio.to_thread(http_json, "POST", f"{base}/_sim/trades", body)
                assert reply["subscribers"] == 1 and reply["trades"][0]["id"] == 43
                event = await raw.receive_json(timeout=10)
                assert (
                    event["e"] == "aggTrade" and event["a"] == 43 and event["p"] == "2001.50000000"
                )
                drop = {"kind": "ws_drop", "symbol": "ETH/USDT"}
                reply = await asyncio.to_thread(http_json, "POST", f"{base}/_sim/faults", drop)
                assert reply["ws_dropped"] == 1
                closing = await raw.receive(timeout=10)
                assert closing.type == aiohttp.WSMsgType.CLOSE and closing.data == 1001

    asyncio.run(run())


# ------------------------------------------------------------- coinbase
def test_coinbase_load_markets_and_candle_pages(sim: ThreadedSimulator) -> None:
    exchange = ccxt.coinbaseexchange()
    point_ccxt_at(exchange, sim.base_url)
    exchange.load_markets()
    assert set(exchange.markets) == set(DEFAULT_MODEL.specs)
    btc = exchange.market("BTC/USDT")
    assert btc["id"] == "BTC-USDT" and btc["precision"]["price"] == 0.01
    assert exchange.market("OLD/USDT")["active"] is False
    rows: list[list[Any]] = []
    since = T0
    for _ in range(2):
        page = exchange.fetch_ohlcv("BTC/USDT", "1m", since=since, limit=300)
        assert len(page) == 300
        rows += page
        since = page[-1][0] + MINUTE_MS
    assert rows == ohlcv(expected_klines("BTC/USDT", "1m", T0, T0 + 599 * MINUTE_MS))
    hours = exchange.fetch_ohlcv("ETH/USDT", "1h", since=T0, limit=24)
    assert hours == ohlcv(expected_klines("ETH/USDT", "1h", T0, T0 + 23 * 3_600_000))
    sparse = exchange.fetch_ohlcv("XYZ/USDT", "1m", since=T0, limit=300)
    assert sparse == ohlcv(expected_klines("XYZ/USDT", "1m", T0, T0 + 299 * MINUTE_MS))
    assert len(sparse) < 150
    with pytest.raises(ccxt.ExchangeError):  # Coinbase answers 404 {"message": "NotFound"}
        exchange.publicGetProductsIdCandles({"id": "NOPE-USDT", "granularity": 60})


def test_coinbase_faults_and_trades(sim: ThreadedSimulator) -> None:
    exchange = ccxt.coinbaseexchange()
    point_ccxt_at(exchange, sim.base_url)
    exchange.load_markets()
    sim.add_fault("rate_limit", exchange="coinbase", path="/candles")
    with pytest.raises(ccxt.RateLimitExceeded):  # base ccxt maps 429 so; binance: DDoSProtection
        exchange.fetch_ohlcv("BTC/USDT", "1m", since=T0, limit=5)
    sim.add_fault("unavailable", exchange="coinbase")
    with pytest.raises(ccxt.ExchangeNotAvailable):
        exchange.fetch_ohlcv("BTC/USDT", "1m", since=T0, limit=5)
    sim.set_time(FROZEN_NOW)
    trades = exchange.fetch_trades("BTC/USDT", limit=50)
    assert len(trades) == 50 and trades[-1]["timestamp"] <= FROZEN_NOW
    model = [
        t
        for m in range(-5, 1)
        for t in DEFAULT_MODEL.trades_in_minute(
            "BTC/USDT", interval_open("1m", FROZEN_NOW) + m * MINUTE_MS
        )
    ]
    latest = [t for t in model if t.time_ms <= FROZEN_NOW][-50:]
    assert [int(t["id"]) for t in trades] == [t.id for t in latest]


# ---------------------------------------------------- every exchange's markets
#: Each front-end's own id of DOGE/USDT (Kraken names DOGE ``XDG``, asset ``XXDG``).
DOGE_IDS = {
    "binance": "DOGEUSDT",
    "bybit": "DOGEUSDT",
    "okx": "DOGE-USDT",
    "coinbaseexchange": "DOGE-USDT",
    "kraken": "XDGUSDT",
}
LIQUID = [s for s in DEFAULT_MODEL.specs.values() if s.active_fraction == 1 and not s.delisted_ms]


def test_ten_liquid_markets_each_trading_every_minute_near_its_price() -> None:
    """Ten tickers can be live at once (issue 25's soak: bench/soak.py --tickers 10)."""
    assert len(LIQUID) >= 10
    for spec in LIQUID:
        rows = expected_klines(spec.symbol, "1m", T0, T0 + 59 * MINUTE_MS)
        assert len(rows) == 60, spec.symbol  # no minute without trades
        assert 0.2 < float(rows[-1].close) / spec.price < 5, spec.symbol
        assert all(k.trades >= 1 and k.low <= k.open <= k.high for k in rows)


@pytest.mark.parametrize("exchange_id", sorted(DOGE_IDS))
def test_every_exchange_lists_every_market_under_its_own_ids(
    sim: ThreadedSimulator, exchange_id: str
) -> None:
    sim.set_time(FROZEN_NOW)
    exchange = getattr(ccxt, exchange_id)(SPOT_ONLY)
    point_ccxt_at(exchange, sim.base_url)
    exchange.load_markets()
    assert set(exchange.markets) == set(DEFAULT_MODEL.specs)
    assert all(exchange.market(s.symbol)["active"] for s in LIQUID)
    doge = exchange.market("DOGE/USDT")
    assert (doge["id"], doge["base"], doge["quote"]) == (DOGE_IDS[exchange_id], "DOGE", "USDT")
    assert doge["precision"]["price"] == 0.00001 and doge["precision"]["amount"] == 1
    since = interval_open("1m", FROZEN_NOW) - 30 * MINUTE_MS
    rows = exchange.fetch_ohlcv("DOGE/USDT", "1m", since=since, limit=10)
    served = ohlcv(
        expected_klines("DOGE/USDT", "1m", since - 30 * MINUTE_MS, FROZEN_NOW, now_ms=FROZEN_NOW)
    )
    assert rows and all(row in served for row in rows)


# ------------------------------------------------------- determinism/CLI
def test_model_is_stable_across_processes() -> None:
    code = (
        "import json; from infra.exchange_sim import expected_klines; "
        f"print(json.dumps([k.binance_row() for k in expected_klines('BTC/USDT', '1h', {T0}, "
        f"{T0 + 5 * 3_600_000})]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "random", "PYTHONPATH": str(REPO_ROOT)},
    ).stdout
    here = [k.binance_row() for k in expected_klines("BTC/USDT", "1h", T0, T0 + 5 * 3_600_000)]
    assert json.loads(out) == here


def test_cli_serves_until_terminated(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    proc = subprocess.Popen(
        [sys.executable, "-m", "infra.exchange_sim", "--port", "0", "--ready-file", str(ready)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once the port accepts connections
        base = line.strip().rsplit(" ", 1)[-1]
        assert base.startswith("http://127.0.0.1:") and ready.read_text().strip() == base
        assert http_json("GET", f"{base}/api/v3/ping") == {}
    finally:
        proc.terminate()
        assert proc.wait(10) == 0
