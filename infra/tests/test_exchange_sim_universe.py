"""The simulator's universe: the load generator's N markets, rates, bursts, ids, books.

Why: the platform is measured (and a whole exchange recorded) against the universe,
so it must be what its flags say: real listed markets on every front-end (checked
through unmodified ccxt), a Zipf law of trade rates that sums to the configured total
in each simulated minute, bursts where the seed says, consecutive trade ids at any
rate, book traffic that follows the trades; and the 13 default markets untouched.
Rates are checked on the model itself, never against the wall clock.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import aiohttp
import ccxt
import pytest

from infra.exchange_sim import (
    DEFAULT_MODEL,
    DEFAULT_SPECS,
    MarketModel,
    SimulatorServer,
    ThreadedSimulator,
    Universe,
    binance,
    bybit,
    okx,
    point_ccxt_at,
    run_in_thread,
)
from infra.exchange_sim import __main__ as cli
from infra.exchange_sim.binance import (
    bybit_trades_text,
    fill_of,
    fills_of_columns,
    okx_trade_text,
    text_frame,
    text_frames,
    trade_event,
    trade_text,
)
from infra.exchange_sim.books import BookModel
from infra.exchange_sim.control import SimulatorControl
from infra.exchange_sim.model import (
    DAY_MS,
    ID_EPOCH_MS,
    MAX_TRADES_PER_MINUTE,
    MINUTE_MS,
    MODEL_ID_FLOOR,
    fmt8,
)
from infra.exchange_sim.universe import UNIVERSE_LISTED_MS

SPOT_ONLY = {"options": {"fetchMarkets": {"types": ["spot"]}}}
NOW = ID_EPOCH_MS + 3 * DAY_MS + 10 * 3_600_000 + 17 * MINUTE_MS + 20_250
DAY = NOW // DAY_MS
BIG = Universe(200, rate=20_000, burst_fraction=0.05, burst_factor=5)
SMALL = Universe(30, rate=300, burst_fraction=0.1, burst_factor=4)


@pytest.fixture(scope="module")
def big() -> MarketModel:
    return BIG.model()


@pytest.fixture(scope="module")
def sim() -> Iterator[ThreadedSimulator]:
    with run_in_thread(universe=SMALL, now_ms=NOW, weight_limit=None) as server:
        yield server


def consecutive(numbers: list[int]) -> bool:
    return numbers == list(range(numbers[0], numbers[0] + len(numbers)))


# ----------------------------------------------------------------- the markets
def test_markets_are_named_by_rank_with_sensible_increments() -> None:
    specs = BIG.specs()
    assert [s.symbol for s in specs[:2]] == ["U001/USDT", "U002/USDT"]
    assert specs[-1].symbol == "U200/USDT" and len(specs) == 200
    assert Universe(1000).symbols()[0] == "U0001/USDT"
    for spec in specs:
        tick, step = Decimal(spec.tick), Decimal(spec.step)
        price = Decimal(str(spec.price))
        assert tick <= Decimal("0.01") and price / tick >= 1000, spec  # >= 4 digits
        assert Decimal("0.0001") <= price * step <= 1, spec  # a step costs little
        assert spec.price_decimals + spec.qty_decimals <= 8
        assert spec.listed_ms == UNIVERSE_LISTED_MS and spec.delisted_ms is None
    assert BIG.specs() == specs  # a pure function of the settings
    assert len({s.price for s in specs}) > 150  # markets differ


def test_the_default_markets_are_unchanged(big: MarketModel) -> None:
    assert tuple(big.specs.values())[: len(DEFAULT_SPECS)] == DEFAULT_SPECS
    minute = NOW - NOW % MINUTE_MS
    for symbol in ("BTC/USDT", "SOL/USDT", "XYZ/USDT"):
        assert big.trades_in_minute(symbol, minute) == DEFAULT_MODEL.trades_in_minute(
            symbol, minute
        )
        assert big.first_trade_id(symbol, NOW) == DEFAULT_MODEL.first_trade_id(symbol, NOW)
    with pytest.raises(ValueError, match="already listed"):
        big.with_specs(BIG.specs()[:1])


def test_rates_follow_a_zipf_law_and_sum_to_the_total() -> None:
    rates = BIG.rates()
    assert math.isclose(sum(rates), 20_000)
    assert math.isclose(rates[0] / rates[1], 2) and math.isclose(rates[0] / rates[9], 10)
    assert rates == sorted(rates, reverse=True)
    flat = Universe(50, rate=1000, skew=0).rates()
    assert all(math.isclose(r, 20) for r in flat)
    steep = Universe(50, rate=1000, skew=2).rates()
    assert steep[0] > 0.6 * 1000  # one market takes most of the trades


# ----------------------------------------------------------------------- rates
def test_every_simulated_minute_sums_to_the_configured_rate(big: MarketModel) -> None:
    """Over a whole UTC day: every minute outside bursts trades the configured rate
    (jitter 0.1: within 12%), on average within 1%; burst minutes ~5x that."""
    counts = [0] * 1440
    for symbol in BIG.symbols():
        for i, n in enumerate(big._count_day(symbol, DAY)):
            counts[i] += n
    bursts = {(t - DAY * DAY_MS) // MINUTE_MS for t in big.burst_minutes("U001/USDT", DAY)}
    normal = [counts[i] / 60 for i in range(1440) if i not in bursts]
    burst = [counts[i] / 60 for i in bursts]
    assert all(0.88 * 20_000 <= rate <= 1.12 * 20_000 for rate in normal)
    assert abs(statistics.mean(normal) / 20_000 - 1) < 0.01
    assert abs(statistics.mean(burst) / (5 * 20_000) - 1) < 0.03
    # the day's trades are exact: what each market's id rule counts on
    want = sum(BIG.pacing().day_total(r * 60) for r in BIG.rates())
    assert sum(counts) == want


def test_an_even_universe_trades_its_rate_to_the_trade() -> None:
    model = Universe(100, rate=5_000, jitter=0).model()
    minute = NOW - NOW % MINUTE_MS
    for start in (minute - 7 * MINUTE_MS, minute, minute + 30 * MINUTE_MS):
        total = 0
        for symbol in model.specs:
            if symbol.startswith("U"):
                bar = model.minute_bar(symbol, start)
                total += bar.n if bar is not None else 0
        assert abs(total - 5_000 * 60) <= 100  # each market rounds by < 1 trade


def test_minute_bars_aggregate_the_trades_of_a_busy_market(big: MarketModel) -> None:
    minute = NOW - NOW % MINUTE_MS
    (kline,) = big.klines("U001/USDT", "1m", minute, minute)
    trades = big.trades_in_minute("U001/USDT", minute)
    assert kline.trades == len(trades) > 150_000  # ~3,400 trades/s
    assert trades[0].price == kline.open and trades[-1].price == kline.close
    assert max(t.price for t in trades) == kline.high and min(t.price for t in trades) == kline.low
    assert sum(t.qty for t in trades) == kline.volume
    buys = sum(t.qty for t in trades if not t.buyer_is_maker)
    assert buys == kline.taker_buy_base


# ---------------------------------------------------------------------- bursts
def test_bursts_happen_where_the_seed_says(big: MarketModel) -> None:
    minutes = big.burst_minutes("U001/USDT", DAY)
    assert len(minutes) == round(0.05 * 1440) == 72
    assert minutes == big.burst_minutes("U200/USDT", DAY)  # market-wide
    assert big.burst_minutes("BTC/USDT", DAY) == []  # default markets never burst
    # pinned: the same on every machine, process and Python (blake2b + random())
    assert [(t - DAY * DAY_MS) // MINUTE_MS for t in minutes[:6]] == [0, 3, 26, 37, 40, 56]
    assert minutes != big.burst_minutes("U001/USDT", DAY + 1)
    other = MarketModel(seed=7).with_specs(BIG.specs())
    assert other.burst_minutes("U001/USDT", DAY) != minutes
    # a burst minute trades ~5x, in every market alike
    burst, calm = minutes[0], minutes[0] - MINUTE_MS
    assert not big.in_burst("U001/USDT", calm) and big.in_burst("U001/USDT", burst + 59_999)
    for symbol in ("U001/USDT", "U050/USDT", "U200/USDT"):
        hot, cold = big.minute_bar(symbol, burst), big.minute_bar(symbol, calm)
        assert hot is not None and cold is not None
        assert 3.5 < hot.n / cold.n < 7
    assert set(Universe(200, burst_fraction=0.1).model().burst_minutes("U001/USDT", DAY)) > set(
        minutes
    )  # more bursts keep the fewer ones


# ------------------------------------------------------------------- trade ids
def test_ids_are_consecutive_across_minutes_days_and_bursts(big: MarketModel) -> None:
    symbol = "U003/USDT"
    midnight = (DAY + 1) * DAY_MS
    trades = list(big.iter_trades(symbol, midnight - 90_000, midnight + 60_000))
    assert consecutive([t.id for t in trades]) and len({t.time_ms // DAY_MS for t in trades}) == 2
    day_total = BIG.pacing().day_total(BIG.rates()[2] * 60)
    listing_day = UNIVERSE_LISTED_MS // DAY_MS
    # closed form: nothing is counted, whatever the day
    assert big.first_trade_id(symbol, midnight) == MODEL_ID_FLOOR + 1 + (
        (DAY + 1 - listing_day) * day_total
    )
    first = next(big.iter_trades(symbol, 0, UNIVERSE_LISTED_MS + DAY_MS))
    assert first.id == MODEL_ID_FLOOR + 1 and first.time_ms >= UNIVERSE_LISTED_MS
    # more than MAX_TRADES_PER_MINUTE in a minute (a hot market bursting) is fine
    burst = big.burst_minutes("U001/USDT", DAY)[3]
    assert big.minute_bar("U001/USDT", burst).n > MAX_TRADES_PER_MINUTE  # type: ignore[union-attr]
    around = list(big.iter_trades("U001/USDT", burst - 2_000, burst + MINUTE_MS + 2_000))
    assert consecutive([t.id for t in around])


def test_an_id_finds_its_trade(big: MarketModel) -> None:
    symbol = "U120/USDT"
    window = list(big.iter_trades(symbol, NOW - 3 * 3_600_000, NOW))
    for trade in (window[0], window[len(window) // 3], window[-1]):
        assert next(big.iter_trades(symbol, 0, NOW, from_id=trade.id)) == trade
        assert next(big.iter_trades_backward(symbol, NOW, before_id=trade.id + 1)) == trade
        assert big.trade_minute(symbol, trade.id, NOW) == trade.time_ms - trade.time_ms % MINUTE_MS
    assert big.trade_minute(symbol, window[-1].id + 10**9, NOW) is None


def test_columns_and_stream_texts_are_what_the_dict_builders_print(big: MarketModel) -> None:
    """The streams' fast path prints exactly what the readable builders would."""
    for symbol in ("U001/USDT", "U005/USDT", "U199/USDT", "BTC/USDT"):
        spec = big.spec(symbol)
        start = NOW - 20_000
        trades = list(big.iter_trades(symbol, start, NOW))
        fills = fills_of_columns(big.trade_columns(symbol, start, NOW), spec)
        assert fills == [fill_of(t) for t in trades]
        pairs = list(zip(fills, trades, strict=True))
        assert all(f[2] == fmt8(t.price) and f[3] == fmt8(t.qty) for f, t in pairs)
        for trade, fill in list(zip(trades, fills, strict=True))[:50]:
            for kind in ("trade", "aggTrade"):
                want = trade_event(kind, spec.binance_id, trade, NOW)
                assert json.loads(trade_text(kind, spec.binance_id, fill, NOW)) == want
            assert json.loads(okx_trade_text(spec.coinbase_id, fill)) == okx.trades_push(
                spec.coinbase_id, trade
            )
        text = bybit_trades_text(spec.binance_id, fills[:20], NOW)
        assert json.loads(text) == bybit.trade_message(spec.binance_id, trades[:20], NOW)
    # a batch of frames as one write: the same bytes as frame by frame
    texts = ["x" * 5, "y" * 125, "z" * 126, "w" * 70_000, '{"é":1}']
    assert text_frames(texts) == b"".join(text_frame(t) for t in texts)
    assert text_frames(texts[:4]) == b"".join(text_frame(t) for t in texts[:4])


# ----------------------------------------------------------------------- books
def level_changes(books: BookModel, symbol: str, first_step: int, steps: int) -> int:
    changes = 0
    before = books.book_at(symbol, first_step)
    for step in range(first_step + 1, first_step + steps + 1):
        after = books.book_at(symbol, step)
        update = books.update(before, after)
        changes += len(update.bids) + len(update.asks)
        before = after
    return changes


def test_book_changes_follow_the_trade_rate() -> None:
    model = SMALL.model()
    books = BookModel(model)
    day = NOW // DAY_MS
    calm = next(
        t
        for t in range(day * DAY_MS, (day + 1) * DAY_MS, MINUTE_MS)
        if not model.in_burst("U001/USDT", t) and not model.in_burst("U001/USDT", t + MINUTE_MS)
    )
    step = calm // 100
    hot = level_changes(books, "U001/USDT", step, 300) / 30  # per second
    mid = level_changes(books, "U010/USDT", step, 300) / 30
    cold = level_changes(books, "U030/USDT", step, 300) / 30
    rates = SMALL.rates()  # U001 ~75 trades/s, U010 ~7.5, U030 ~2.5; book_ratio 1
    assert 0.5 * rates[0] < hot < 3 * rates[0]
    assert 0.5 * rates[9] < mid < 3 * rates[9]
    assert cold < 0.15 * hot  # (the price path's drift adds a few a second)
    burst = model.burst_minutes("U001/USDT", day)[0]
    bursting = level_changes(books, "U001/USDT", burst // 100 + 1, 300) / 30
    assert bursting > 2 * hot  # a burst shakes the book too (4x the trades)


def test_a_universe_book_is_a_pure_function_of_its_step() -> None:
    """Universe books keep their levels between steps (to recompute only what changed):
    the book at a step is still the same whatever was computed before."""
    model = SMALL.model()
    streaming, fresh = BookModel(model), BookModel(model)
    burst = model.burst_minutes("U001/USDT", DAY)[0] // 100
    for symbol in ("U001/USDT", "U015/USDT", "U030/USDT"):
        for step in [*range(burst - 300, burst + 300), burst + 9_000, burst - 50]:
            fresh._paced.clear()
            assert streaming.book_at(symbol, step) == fresh.book_at(symbol, step)


# ------------------------------------------------------------ the front-ends
@pytest.mark.parametrize("exchange_id", ["binance", "okx", "bybit", "kraken", "coinbaseexchange"])
def test_every_front_end_lists_the_universe_through_ccxt(
    sim: ThreadedSimulator, exchange_id: str
) -> None:
    config = SPOT_ONLY if exchange_id in ("binance", "bybit") else {}
    exchange = getattr(ccxt, exchange_id)(config)
    point_ccxt_at(exchange, sim.base_url)
    markets = exchange.load_markets()
    for spec in SMALL.specs():
        market = markets[spec.symbol]
        assert market["spot"] and market["active"] is not False
        assert (market["base"], market["quote"]) == (spec.base, "USDT")
        assert Decimal(str(market["precision"]["price"])) == Decimal(spec.tick)
        assert Decimal(str(market["precision"]["amount"])) == Decimal(spec.step)
    assert "BTC/USDT" in markets and "SOL/USDT" in markets  # the defaults stay listed
    assert len([s for s in markets if s.startswith("U")]) == 30


def test_candles_of_a_universe_market_through_ccxt(sim: ThreadedSimulator) -> None:
    for exchange_id in ("binance", "okx"):
        exchange = getattr(ccxt, exchange_id)(SPOT_ONLY if exchange_id == "binance" else {})
        point_ccxt_at(exchange, sim.base_url)
        exchange.load_markets()
        since = NOW - NOW % MINUTE_MS - 10 * MINUTE_MS
        rows = exchange.fetch_ohlcv("U002/USDT", "1m", since=since, limit=10)
        want = sim.model.klines("U002/USDT", "1m", since, since + 9 * MINUTE_MS)
        assert rows == [k.ohlcv() for k in want]


async def _read_trades(
    session: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse, count: int
) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    while len(got) < count:
        message = json.loads((await ws.receive(timeout=10)).data)
        if message.get("e") == "trade":
            got.append({"id": message["t"], "T": message["T"], "s": message["s"]})
        elif message.get("arg", {}).get("channel") == "trades" and "data" in message:
            got.extend(
                {"id": int(t["tradeId"]), "T": int(t["ts"]), "s": t["instId"]}
                for t in message["data"]
            )
    return got


def test_streams_carry_every_trade_of_the_universe_markets(sim: ThreadedSimulator) -> None:
    """Binance (one trade a message) and OKX streams of three universe markets: every
    model trade of the time advanced, ids consecutive per market."""
    symbols = ["U001/USDT", "U002/USDT", "U030/USDT"]
    sim.set_time(NOW)
    want = {s: [t.id for t in sim.model.iter_trades(s, NOW + 1, NOW + 5_000)] for s in symbols}
    total = sum(len(ids) for ids in want.values())
    base = sim.base_url.replace("http://", "ws://")

    async def run() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with aiohttp.ClientSession() as session:
            binance = await session.ws_connect(base + "/ws")
            params = [s.replace("/", "").lower() + "@trade" for s in symbols]
            await binance.send_json({"method": "SUBSCRIBE", "params": params, "id": 1})
            assert (await binance.receive_json(timeout=10)) == {"result": None, "id": 1}
            okx_ws = await session.ws_connect(base + okx.WS_PATH)
            args = [{"channel": "trades", "instId": s.replace("/", "-")} for s in symbols]
            await okx_ws.send_json({"op": "subscribe", "args": args})
            for symbol in symbols:
                await asyncio.to_thread(sim.wait_for_subscribers, symbol, 2)
            sent = await asyncio.to_thread(sim.advance_time, 5_000)
            assert sent == total
            got = (
                await _read_trades(session, binance, total),
                await _read_trades(session, okx_ws, total),
            )
            await binance.close()
            await okx_ws.close()
            return got

    for got in asyncio.run(run()):
        for symbol in symbols:
            market = sim.model.spec(symbol)
            ids = [t["id"] for t in got if t["s"] in (market.binance_id, market.coinbase_id)]
            assert ids == want[symbol] and consecutive(ids)


def test_a_backlog_larger_than_a_readers_queue_arrives_whole(
    sim: ThreadedSimulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backlog (a start, a clock jump) goes out as the reader's queue allows, whole
    milliseconds at a time: nothing discarded, every id, in order."""
    monkeypatch.setattr(binance, "OUTBOX_LIMIT", 300)
    sim.set_time(NOW)
    want = [t.id for t in sim.model.iter_trades("U001/USDT", NOW + 1, NOW + 20_000)]
    assert len(want) > 1000  # several queues' worth
    base = sim.base_url.replace("http://", "ws://")

    async def run() -> list[int]:
        async with aiohttp.ClientSession() as session:
            ws = await session.ws_connect(base + "/ws/u001usdt@trade")
            await asyncio.to_thread(sim.wait_for_subscribers, "U001/USDT", 1)
            first = await asyncio.to_thread(sim.advance_time, 20_000)
            assert 0 < first <= 300  # what fits now; the pumps send the rest
            got = [t["id"] for t in await _read_trades(session, ws, len(want))]
            await ws.close()
            return got

    assert asyncio.run(run()) == want
    assert sim.stats(include_log=False)["ws"]["messages_discarded"] == 0


def test_whole_milliseconds() -> None:
    fills = [(i, t, "1", "1", False) for i, t in enumerate([5, 5, 6, 6, 6, 7])]
    assert binance._whole_milliseconds(fills, 3) == fills[:2]  # not half of 6
    assert binance._whole_milliseconds(fills, 1) == fills[:2]  # all of the first ms


def test_control_api_and_cli_flags(sim: ThreadedSimulator, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SIM_UNIVERSE", raising=False)
    info = SimulatorControl(sim.base_url).universe()
    assert info["markets"] == 30 and info["symbols"][0] == "U001/USDT"
    assert math.isclose(sum(info["rates"]), 300) and info["burst_factor"] == 4
    args = cli.parse_args(
        [
            "--universe",
            "200",
            "--universe-rate",
            "20000",
            "--universe-bursts",
            "0.05",
            "--universe-burst-factor",
            "5",
        ]
    )
    assert args.universe == Universe(200, rate=20_000, burst_fraction=0.05, burst_factor=5)
    assert cli.parse_args([]).universe is None
    with pytest.raises(SystemExit):
        cli.parse_args(["--universe", "10", "--universe-bursts", "2"])


def test_environment_sets_the_flag_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """`make run` and compose set the universe through SIM_UNIVERSE* variables."""
    monkeypatch.setenv("SIM_UNIVERSE", "50")
    monkeypatch.setenv("SIM_UNIVERSE_RATE", "2000")
    assert cli.parse_args([]).universe == Universe(50, rate=2_000)
    assert cli.parse_args(["--universe", "0"]).universe is None  # a flag wins
    monkeypatch.setenv("SIM_UNIVERSE", "many")
    with pytest.raises(SystemExit):  # a usage error, not a traceback
        cli.parse_args([])


def test_rest_answers_while_the_streams_run_a_fast_clock() -> None:
    """A klines request is answered while the clock runs minutes a second ahead and a
    reader takes a default and a universe market's trades: how the live-candles e2e
    drives the simulator (200x), with an ingestor asking for candles meanwhile."""
    symbols = ["ETH/USDT", "U001/USDT"]

    async def run(sim: ThreadedSimulator) -> int:
        trades = 0
        async with aiohttp.ClientSession() as session:
            base = sim.base_url.replace("http://", "ws://")
            ws = await session.ws_connect(base + "/ws/ethusdt@trade/u001usdt@trade")
            for symbol in symbols:
                await asyncio.to_thread(sim.wait_for_subscribers, symbol, 1)

            async def read() -> None:
                nonlocal trades
                async for message in ws:
                    trades += json.loads(message.data).get("e") == "trade"

            reader = asyncio.create_task(read())
            for _ in range(30):  # ten minutes, 20 s a step: each minute's prefetch ran
                await asyncio.to_thread(sim.advance_time, 20_000)
            url = f"{sim.base_url}/api/v3/klines?symbol=ETHUSDT&interval=1m&limit=5"
            klines = asyncio.create_task(session.get(url))
            while not klines.done():  # the clock keeps running until it is answered
                await asyncio.to_thread(sim.advance_time, 20_000)
            response = await klines
            assert response.status == 200 and len(await response.json()) == 5
            await ws.close()
            await reader
            return trades

    with run_in_thread(universe=SMALL, now_ms=NOW, weight_limit=None) as server:
        assert asyncio.run(asyncio.wait_for(run(server), 120)) > 0  # a hang guard


def test_rest_answers_while_the_generator_is_busy() -> None:
    """The streams' generation (prefetches, warm-ups) never holds the threads the REST
    handlers read the model in, and a paced prefetch ends once the clock reaches its
    minute. Regression: each minute's prefetch slept in the loop's default thread pool,
    paced for a wall-speed clock (~24 s); at 200x they filled that pool and the
    ingestor's klines request queued behind them past its 30 s timeout."""
    minute = NOW - NOW % MINUTE_MS
    url = "/api/v3/klines?symbol=ETHUSDT&interval=1m&limit=5"

    async def prefetch(server: SimulatorServer) -> list[asyncio.Future[None]]:
        # More paced prefetches than any default pool has threads (32 at most), each
        # of a minute the frozen clock has not reached: they sleep.
        return [
            server.streams.prepare(["ETH/USDT"], minute + k * MINUTE_MS, budget_s=3600)
            for k in range(1, 41)
        ]

    async def klines(base_url: str) -> list[Any]:
        async with aiohttp.ClientSession() as session, session.get(base_url + url) as response:
            assert response.status == 200
            rows: list[Any] = await response.json()
            return rows

    fresh = MarketModel(DEFAULT_SPECS)  # nothing generated yet: the prefetches have work
    with run_in_thread(model=fresh, now_ms=NOW, weight_limit=None) as sim:
        prefetches = sim._await(prefetch(sim.server))
        # A hang guard: with the bug the answer waited an hour.
        assert len(asyncio.run(asyncio.wait_for(klines(sim.base_url), 60))) == 5
        assert not any(p.done() for p in prefetches[:2])  # still asleep meanwhile
        sim.advance_time(40 * MINUTE_MS)
        sim._await(asyncio.wait_for(asyncio.gather(*prefetches), 60))  # woken at their minutes
