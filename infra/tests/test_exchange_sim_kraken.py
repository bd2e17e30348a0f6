"""The simulator's Kraken front-end, and its Coinbase one, against REAL, unmodified ccxt
and against payloads recorded from the real APIs.

Why: the platform serves Kraken and Coinbase through ccxt's adapters, so markets
and candle pages are checked through ccxt itself against the independently
computed model; the raw bodies must have the recorded payloads' layout (what
ccxt's maintainers recorded from the live APIs: services/ingestor/tests/fixtures/
exchanges/SOURCE.md), so the ingestor's own reading of the raw rows (Kraken's
trade counts, its committed cursor) holds on the real exchange too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ccxt
import pytest

from infra.exchange_sim import (
    DEFAULT_MODEL,
    ThreadedSimulator,
    expected_klines,
    interval_open,
    point_ccxt_at,
    run_in_thread,
)
from infra.exchange_sim.model import MINUTE_MS
from ingestor.venues import kraken as kraken_venue

RECORDED = Path(__file__).parents[2] / "services/ingestor/tests/fixtures/exchanges"
T0 = interval_open("1d", 1_700_000_000_000) + 6 * 3_600_000
FROZEN_NOW = T0 + 13 * 3_600_000 + 25 * MINUTE_MS + 30_500  # mid-minute
CURRENT = interval_open("1m", FROZEN_NOW)
OLDEST = CURRENT - 719 * MINUTE_MS  # Kraken serves the latest 720 entries only


@pytest.fixture(scope="module")
def sim() -> Iterator[ThreadedSimulator]:
    with run_in_thread(now_ms=FROZEN_NOW) as server:
        yield server


def connect(exchange_id: str, sim: ThreadedSimulator) -> Any:
    exchange = getattr(ccxt, exchange_id)()
    point_ccxt_at(exchange, sim.base_url)
    exchange.load_markets()
    return exchange


def ohlcv(klines: list[Any]) -> list[list[float | int]]:
    return [k.ohlcv() for k in klines]


def layout(rows: list[list[Any]]) -> set[tuple[str, ...]]:
    """The JSON types of each column of candle rows (int, float, str)."""
    return {tuple(type(v).__name__ for v in row) for row in rows}


def test_kraken_markets_time_and_the_latest_720_entries(sim: ThreadedSimulator) -> None:
    exchange = connect("kraken", sim)
    assert set(exchange.markets) == set(DEFAULT_MODEL.specs)
    btc = exchange.market("BTC/USDT")
    assert (btc["id"], btc["baseId"], btc["wsId"]) == ("XBTUSDT", "BTC", "XBT/USDT")
    assert btc["precision"]["price"] == 0.01 and btc["spot"]
    assert exchange.market("ETH/USDT")["id"] == "ETHUSDT"
    assert exchange.market("OLD/USDT")["active"] is False
    assert exchange.fetch_time() == FROZEN_NOW // 1000 * 1000
    # Paging from `since`: oldest first, then on from the last row, up to the open entry.
    since = CURRENT - 600 * MINUTE_MS
    first = exchange.fetch_ohlcv("BTC/USDT", "1m", since=since, limit=250)
    rest = exchange.fetch_ohlcv("BTC/USDT", "1m", since=first[-1][0] + MINUTE_MS)
    served = expected_klines("BTC/USDT", "1m", since, CURRENT, now_ms=FROZEN_NOW)
    assert first + rest == ohlcv(served) and len(first) == 250
    # Older than the latest 720 entries: not served at all, the page starts at the oldest.
    old = exchange.fetch_ohlcv("ETH/USDT", "1m", since=T0 - 3_600_000)
    assert old == ohlcv(expected_klines("ETH/USDT", "1m", OLDEST, CURRENT, now_ms=FROZEN_NOW))
    assert len(old) == 720
    hours = exchange.fetch_ohlcv("SOL/USDT", "1h", since=T0, limit=5)
    assert hours == ohlcv(expected_klines("SOL/USDT", "1h", T0, T0 + 4 * 3_600_000))
    sparse = exchange.fetch_ohlcv("XYZ/USDT", "1m", since=since)
    assert sparse == ohlcv(expected_klines("XYZ/USDT", "1m", since, CURRENT, now_ms=FROZEN_NOW))
    # HTTP 200 {"error": ["EQuery:Unknown asset pair"]}, as Kraken; ccxt maps it to no subclass.
    with pytest.raises(ccxt.ExchangeError, match="EQuery:Unknown asset pair"):
        exchange.publicGetOHLC({"pair": "NOPEUSDT", "interval": 1})


def test_kraken_rows_have_the_recorded_layout_and_exact_trade_counts(
    sim: ThreadedSimulator,
) -> None:
    recorded = json.loads((RECORDED / "kraken/fetch_ohlcv.json").read_text())["httpResponse"]
    body = connect("kraken", sim).publicGetOHLC(
        {"pair": "XBTUSDT", "interval": 1, "since": (CURRENT - 30 * MINUTE_MS) // 1000}
    )
    assert body.keys() == recorded.keys() and body["error"] == []
    assert body["result"].keys() == {"XBTUSDT", "last"} == recorded["result"].keys()
    assert type(body["result"]["last"]) is type(recorded["result"]["last"])
    rows = body["result"]["XBTUSDT"]
    assert layout(rows) == layout(recorded["result"]["XBTUSDT"])
    # The ingestor's reading: Kraken's trade count per candle, final up to `last`.
    fields = {c.open_time_ms: c for c in kraken_venue.parse_candles(body, "XBTUSDT")}
    served = expected_klines("BTC/USDT", "1m", CURRENT - 29 * MINUTE_MS, CURRENT, now_ms=FROZEN_NOW)
    assert {t: f.trade_count for t, f in fields.items()} == {k.open_time: k.trades for k in served}
    assert {t: f.final for t, f in fields.items()} == {k.open_time: k.closed for k in served}
    assert all(k.trades > 0 for k in served)


def test_coinbase_rows_have_the_recorded_layout(sim: ThreadedSimulator) -> None:
    """Coinbase's rows carry no trade count: the platform stores none (null)."""
    recorded = json.loads((RECORDED / "coinbaseexchange/fetch_ohlcv.json").read_text())
    exchange = connect("coinbaseexchange", sim)
    rows = exchange.publicGetProductsIdCandles({"id": "BTC-USDT", "granularity": 3600})
    assert len(rows) >= 299 and layout(rows) == layout(recorded["httpResponse"])
    # ccxt reads the simulator's rows as it reads the recorded ones: the model's candles.
    start = FROZEN_NOW - 299 * 3_600_000  # the default window: 300 hours up to now
    served = expected_klines("BTC/USDT", "1h", start, FROZEN_NOW, now_ms=FROZEN_NOW)
    assert exchange.parse_ohlcvs(rows) == ohlcv(served)
