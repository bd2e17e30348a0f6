"""The simulator's Bybit REST front-end against REAL, unmodified ccxt.

Why: the platform serves Bybit through ccxt's bybit adapter, so markets, the
newest-first candle windows and recent trades are checked through ccxt itself
against the independently computed model (its trade stream: test_exchange_sim.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
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

SPOT_ONLY = {"options": {"fetchMarkets": {"types": ["spot"]}}}
T0 = interval_open("1d", 1_700_000_000_000) + 6 * 3_600_000
FROZEN_NOW = T0 + 3 * 3_600_000 + 25 * MINUTE_MS + 30_500  # mid-minute


@pytest.fixture(scope="module")
def sim() -> Iterator[ThreadedSimulator]:
    with run_in_thread(now_ms=FROZEN_NOW) as server:
        yield server


def bybit(sim: ThreadedSimulator) -> Any:
    exchange = ccxt.bybit(SPOT_ONLY)
    point_ccxt_at(exchange, sim.base_url)
    exchange.load_markets()
    return exchange


def ohlcv(klines: list[Any]) -> list[list[float | int]]:
    return [k.ohlcv() for k in klines]


def test_markets_time_and_newest_first_candle_windows(sim: ThreadedSimulator) -> None:
    exchange = bybit(sim)
    assert set(exchange.markets) == set(DEFAULT_MODEL.specs)
    btc = exchange.market("BTC/USDT")
    assert btc["id"] == "BTCUSDT" and btc["spot"] and btc["precision"]["price"] == 0.01
    assert exchange.market("OLD/USDT")["active"] is False
    assert exchange.fetch_time() == FROZEN_NOW
    # A window holding more than `limit` candles: Bybit returns its NEWEST ones.
    since = T0 - 600 * MINUTE_MS
    until = since + 599 * MINUTE_MS
    page = exchange.fetch_ohlcv("BTC/USDT", "1m", since=since, limit=200, params={"until": until})
    assert page == ohlcv(expected_klines("BTC/USDT", "1m", since + 400 * MINUTE_MS, until))
    hours = exchange.fetch_ohlcv(
        "ETH/USDT", "1h", since=T0 - 24 * 3_600_000, limit=24, params={"until": T0 - 1}
    )
    assert hours == ohlcv(expected_klines("ETH/USDT", "1h", T0 - 24 * 3_600_000, T0 - 1))
    sparse = exchange.fetch_ohlcv("XYZ/USDT", "1m", since=since, limit=300, params={"until": T0})
    assert sparse == ohlcv(expected_klines("XYZ/USDT", "1m", since, T0))[-300:]
    with pytest.raises(ccxt.BadRequest):  # retCode 10001 with HTTP 200
        exchange.publicGetV5MarketKline({"category": "spot", "symbol": "NOPEUSDT", "interval": 1})


def test_recent_trades_are_the_latest_model_trades(sim: ThreadedSimulator) -> None:
    trades = bybit(sim).fetch_trades("BTC/USDT", limit=50)  # Bybit answers newest first
    latest = list(itertools.islice(DEFAULT_MODEL.iter_trades_backward("BTC/USDT", FROZEN_NOW), 50))
    assert [int(t["id"]) for t in trades] == sorted(t.id for t in latest)
    by_id = {t.id: t for t in latest}
    sides = ["sell" if by_id[int(t["id"])].buyer_is_maker else "buy" for t in trades]
    assert [t["side"] for t in trades] == sides


def test_okx_candle_windows_share_the_newest_first_paging(sim: ThreadedSimulator) -> None:
    """OKX's window (`before < ts < after`, exclusive) also holds its NEWEST `limit` candles."""
    exchange = ccxt.okx(SPOT_ONLY)
    point_ccxt_at(exchange, sim.base_url)
    exchange.load_markets()
    since = T0 - 600 * MINUTE_MS
    until = since + 599 * MINUTE_MS
    page = exchange.fetch_ohlcv("BTC/USDT", "1m", since=since, limit=200, params={"until": until})
    # ccxt sends after=until, exclusive: the window ends one minute before `until`.
    newest = expected_klines("BTC/USDT", "1m", since + 399 * MINUTE_MS, until - MINUTE_MS)
    assert page == ohlcv(newest) and len(page) == 200
