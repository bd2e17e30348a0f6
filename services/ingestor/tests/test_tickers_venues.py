"""24 h volumes through ccxt (`ExchangeAdapter.quote_volumes`, what `recording.top` ranks
by), venue by venue.

1. Replays: the exchange's ticker payload (tests/fixtures/exchanges/<id>/fetch_ticker*.json,
   provenance in SOURCE.md: Binance's is ccxt's recording, the others ccxt's documented
   examples) served through the adapter's transport: the request ccxt sends and the
   volume that comes out (Binance: ccxt's recorded parse).
2. Shapes: the simulator answers the same call with the payload's keys and value types
   (`SIM_DIFFERENCES` lists what differs, and why).
3. Values: against the simulator (frozen clock, a small universe), every market's volume
   is the model's 24 h (the 1,440 one-minute candles before now's minute), and `top: 3`
   records exactly the three largest. Coinbase has no bulk call: a typed error.
"""

from __future__ import annotations

import asyncio
import copy
import json
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import ccxt
import pytest

from ingestor.config import ExchangeSettings, RecordedMarkets
from ingestor.exchanges import ExchangeAdapter
from ingestor.recording import recorded_tickers
from ingestor.rest import HttpAnswer
from ingestor.urls import rewrite_url
from ingestor.venues.base import TickersUnsupportedError

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "exchanges"
NOW_MS = 1_772_454_896_000  # 2026-03-02T12:34:56Z
DAY_MS = 86_400_000


@dataclass(frozen=True)
class Case:
    """A venue's ticker payload, the request ccxt must make for it (`path`, every query
    parameter) and the one market the payload holds."""

    exchange_id: str
    file: str
    path: str
    query: dict[str, str]
    symbol: str
    market_id: str

    def recorded(self) -> dict[str, Any]:
        return dict(json.loads((FIXTURES / self.exchange_id / f"{self.file}.json").read_text()))

    def body(self) -> Any:
        """The bulk endpoint's body (Binance's recording is the one-symbol call: its row
        is what the bulk list holds)."""
        body = self.recorded()["httpResponse"]
        return [body] if self.exchange_id == "binance" else body

    def rows(self, body: Any) -> list[Any]:
        if self.exchange_id == "binance":
            return list(body)
        if self.exchange_id == "okx":
            return list(body["data"])
        if self.exchange_id == "bybit":
            return list(body["result"]["list"])
        return list(body["result"].values())  # kraken: by pair id


def _number(text: str) -> float:
    return float(text)


def expected_volume(case: Case, row: Mapping[str, Any]) -> float:
    """The quote volume read from the raw row by hand (Binance: ccxt's recorded parse)."""
    if case.exchange_id == "binance":
        return float(case.recorded()["parsedResponse"]["quoteVolume"])
    if case.exchange_id == "okx":
        return _number(row["volCcy24h"])
    if case.exchange_id == "bybit":
        return _number(row["turnover24h"])
    return _number(row["v"][1]) * _number(row["p"][1])  # kraken: 24 h volume x vwap


CASES = [
    Case("binance", "fetch_ticker", "/api/v3/ticker/24hr", {}, "BTC/USDT", "BTCUSDT"),
    Case(
        "okx", "fetch_tickers", "/api/v5/market/tickers", {"instType": "SPOT"}, "BCD/BTC", "BCD-BTC"
    ),
    Case(
        "bybit", "fetch_tickers", "/v5/market/tickers", {"category": "spot"}, "BTC/USDT", "BTCUSDT"
    ),
    Case("kraken", "fetch_tickers", "/0/public/Ticker", {}, "ETH/USD", "XETHZUSD"),
]


def spot_market(symbol: str, market_id: str) -> dict[str, Any]:
    """An active ccxt spot market, ccxt filling in the rest (for `preload_markets`)."""
    base, quote = symbol.split("/")
    fields = {"id": market_id, "symbol": symbol, "base": base, "quote": quote}
    return dict(
        ccxt.Exchange().safe_market_structure(
            {**fields, "type": "spot", "spot": True, "active": True}
        )
    )


@dataclass
class Answers:
    """A transport: `body` for every request (None: forward it to `base_url`), each
    request's URL and the body it got kept."""

    body: Any = None
    base_url: str = ""
    seen: list[tuple[str, Any]] | None = None

    async def __call__(
        self, url: str, method: str, headers: Mapping[str, str], payload: str | None
    ) -> HttpAnswer:
        body = self.body
        if body is None:
            request = urllib.request.Request(rewrite_url(url, self.base_url), method=method)

            def get() -> Any:
                with urllib.request.urlopen(request, timeout=120) as response:
                    return json.loads(response.read())

            body = await asyncio.to_thread(get)
        if self.seen is None:
            self.seen = []
        self.seen.append((url, copy.deepcopy(body)))
        return HttpAnswer.of_json(body)


def adapter(
    exchange_id: str, transport: Answers, markets: list[dict[str, Any]] | None
) -> ExchangeAdapter:
    settings = ExchangeSettings(prefix="X", enable_rate_limit=False, timeout_ms=120_000)
    made = ExchangeAdapter(exchange_id, settings, transport=transport)
    if markets is not None:
        made.preload_markets(markets)
    return made


def volumes_of(made: ExchangeAdapter) -> dict[str, float]:
    async def run() -> dict[str, float]:
        try:
            return await made.quote_volumes()
        finally:
            await made._exchange.close()

    return asyncio.run(run())


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.exchange_id)
def test_the_payload_through_ccxt_gives_its_quote_volume(case: Case) -> None:
    answers = Answers(case.body())
    volumes = volumes_of(
        adapter(case.exchange_id, answers, [spot_market(case.symbol, case.market_id)])
    )
    assert answers.seen is not None and len(answers.seen) == 1
    parts = urlsplit(answers.seen[0][0])
    assert parts.path == case.path
    assert dict(parse_qsl(parts.query)) == case.query
    (row,) = case.rows(case.body())
    assert volumes == pytest.approx({case.symbol: expected_volume(case, row)}, rel=1e-12)


def test_coinbase_has_no_bulk_volumes_and_says_so_without_a_request() -> None:
    answers = Answers({})
    made = adapter("coinbaseexchange", answers, [spot_market("BTC/USDT", "BTC-USDT")])
    with pytest.raises(TickersUnsupportedError, match="coinbaseexchange cannot rank"):
        volumes_of(made)
    assert answers.seen is None


def shape(value: Any, path: str = "") -> dict[str, str]:
    """Every key's (and list element's) value type, lists by their first element."""
    found = {path: type(value).__name__}
    if isinstance(value, dict):
        for key, item in value.items():
            found.update(shape(item, f"{path}.{key}"))
    elif isinstance(value, list) and value:
        found.update(shape(value[0], f"{path}[]"))
    return found


def body_shape(case: Case, body: Any) -> dict[str, str]:
    """The envelope's shape (rows left out) and the one shape every row has."""
    rows = [shape(r, "row") for r in case.rows(body)]
    assert rows and all(r == rows[0] for r in rows)
    envelope = copy.deepcopy(body)
    if case.exchange_id == "binance":
        envelope = []
    elif case.exchange_id == "okx":
        envelope["data"] = []
    elif case.exchange_id == "bybit":
        envelope["result"]["list"] = []
    else:
        envelope["result"] = {}
    return {**shape(envelope), **rows[0]}


# ccxt's Binance recording holds the window's times, trade ids and count as strings;
# Binance documents them (and the simulator sends them) as numbers, read alike by ccxt.
BINANCE_NUMBERS = ("openTime", "closeTime", "firstId", "lastId", "count")
SIM_DIFFERENCES: dict[str, set[tuple[str, str | None, str | None]]] = {
    "binance": {(f"row.{key}", "str", "int") for key in BINANCE_NUMBERS},
}


@pytest.fixture(scope="module")
def sim() -> Iterator[Any]:
    from infra.exchange_sim import Universe, run_in_thread

    with run_in_thread(universe=Universe(20, rate=200), now_ms=NOW_MS) as running:
        yield running


WINDOW_END = NOW_MS - NOW_MS % 60_000  # the 24 h end where the minute containing now starts


@pytest.fixture(scope="module")
def minutes(sim: Any) -> dict[str, list[Any]]:
    """Every trading market's 1,440 one-minute candles before now's minute (the oracle)."""
    return {
        s.symbol: sim.model.klines(s.symbol, "1m", WINDOW_END - DAY_MS, WINDOW_END - 1)
        for s in sim.model.specs.values()
        if s.trading_at(NOW_MS)
    }


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.exchange_id)
def test_the_simulator_answers_in_the_payloads_shape_with_the_models_volumes(
    sim: Any, minutes: dict[str, list[Any]], case: Case
) -> None:
    answers = Answers(None, sim.base_url)
    volumes = volumes_of(adapter(case.exchange_id, answers, None))  # markets loaded from it
    assert answers.seen is not None
    url, body = next((u, b) for u, b in answers.seen if urlsplit(u).path == case.path)
    assert dict(parse_qsl(urlsplit(url).query)) == case.query
    recorded = body_shape(case, case.body())
    served = body_shape(case, body)
    found = {
        (path, recorded.get(path), served.get(path))
        for path in set(recorded) | set(served)
        if recorded.get(path) != served.get(path)
    }
    assert found == SIM_DIFFERENCES.get(case.exchange_id, set())
    # Every trading market, with the model's 24 h.
    model_volumes = {sym: float(sum(k.quote_volume for k in ks)) for sym, ks in minutes.items()}
    # Kraken sends volume and vwap, 8 places each, and ccxt multiplies them back: a
    # vwap of 0.001 (the universe's cheapest markets) is off by up to 5e-6 of itself.
    rel = 1e-5 if case.exchange_id == "kraken" else 1e-12
    assert volumes == pytest.approx(model_volumes, rel=rel)
    if case.exchange_id == "binance":
        btc = next(r for r in body if r["symbol"] == "BTCUSDT")
        first = sim.model.first_trade_id("BTC/USDT", WINDOW_END - DAY_MS)
        assert (btc["firstId"], btc["lastId"]) == (first, first + btc["count"] - 1)
        assert btc["count"] == sum(k.trades for k in minutes["BTC/USDT"])


def test_top_three_against_the_simulator_records_its_three_busiest(
    sim: Any, minutes: dict[str, list[Any]]
) -> None:
    """`recording: {exchanges: {binance: {markets: all, quote: USDT, top: 3}}}`: what the
    recorder's `_load_universe` does, against the simulator."""
    made = adapter("binance", Answers(None, sim.base_url), None)

    async def run() -> tuple[list[Any], dict[str, float]]:
        try:
            await made.load_markets()
            return made.markets(), await made.quote_volumes()
        finally:
            await made._exchange.close()

    markets, volumes = asyncio.run(run())
    wanted = RecordedMarkets(markets="all", quote="USDT", top=3)
    universe = recorded_tickers("BINANCE", wanted, markets, volumes)
    by_model = {sym: sum(k.quote_volume for k in ks) for sym, ks in minutes.items()}
    busiest = sorted(by_model, key=lambda s: -by_model[s])[:3]
    assert list(universe.tickers) == sorted(f"BINANCE:{s}" for s in busiest)
    assert all(s.startswith("U") for s in busiest)  # the universe's hot markets
