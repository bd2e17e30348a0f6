"""Market metadata records."""

from __future__ import annotations

from ingestor.markets import market_records
from ingestor.model import MarketInfo


def info(symbol: str, active: bool = True) -> MarketInfo:
    base, quote = symbol.split("/")
    return MarketInfo(
        symbol, base + quote, base, quote, active, 0.01, 0.0001, 0.001, 9000, 0.01, 1e6, 5
    )


def test_records_carry_every_field() -> None:
    (m,) = market_records("BINANCE", [info("BTC/USDT")], [], 99)
    assert (m.ticker, m.exchange, m.symbol, m.base, m.quote, m.active) == (
        "BINANCE:BTC/USDT",
        "BINANCE",
        "BTCUSDT",
        "BTC",
        "USDT",
        True,
    )
    assert (m.price_precision, m.amount_precision, m.min_amount, m.max_amount) == (
        0.01,
        0.0001,
        0.001,
        9000,
    )
    assert (m.min_price, m.max_price, m.min_cost, m.updated_at_ms) == (0.01, 1e6, 5, 99)


def test_only_wanted_markets_and_valid_tickers() -> None:
    infos = [info("BTC/USDT"), info("ETH/USDT", active=False), info("odd-1/USDT")]
    assert [m.ticker for m in market_records("BINANCE", infos, [], 0)] == [
        "BINANCE:BTC/USDT",
        "BINANCE:ETH/USDT",
    ]
    assert [m.ticker for m in market_records("BINANCE", infos, ["eth/usdt"], 0)] == [
        "BINANCE:ETH/USDT"
    ]
