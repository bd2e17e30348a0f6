"""ccxt adapter: exception classification (what the retry policy sees), through the
REST seam with each venue's error answers."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from ccxt.base import errors as e

from ingestor.config import ExchangeSettings
from ingestor.exchanges import ExchangeAdapter, fault_from
from ingestor.model import ExchangeCallError, FaultKind
from ingestor.rest import HttpAnswer


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (e.DDoSProtection("429"), FaultKind.RATE_LIMITED),
        (e.RateLimitExceeded("x"), FaultKind.RATE_LIMITED),
        (e.ExchangeNotAvailable("503"), FaultKind.UNAVAILABLE),
        (e.OnMaintenance("m"), FaultKind.UNAVAILABLE),
        (e.RequestTimeout("t"), FaultKind.TIMEOUT),
        (e.NetworkError("n"), FaultKind.NETWORK),
        (e.BadResponse("garbled"), FaultKind.NETWORK),
        (e.BadSymbol("s"), FaultKind.BAD_SYMBOL),
        (e.BadRequest("b"), FaultKind.BAD_REQUEST),
        (e.NotSupported("ns"), FaultKind.NOT_SUPPORTED),
        (e.AuthenticationError("a"), FaultKind.EXCHANGE_ERROR),
        (e.ExchangeError("x"), FaultKind.EXCHANGE_ERROR),
        (ValueError("odd"), FaultKind.EXCHANGE_ERROR),
    ],
)
def test_classification(exc: Exception, kind: FaultKind) -> None:
    fault = fault_from(exc)
    assert fault.kind == kind
    assert fault.kind.transient == (
        kind
        in {FaultKind.RATE_LIMITED, FaultKind.UNAVAILABLE, FaultKind.TIMEOUT, FaultKind.NETWORK}
    )


def test_ban_time_is_read_from_the_message() -> None:
    now = 1_700_000_000_000
    fault = fault_from(e.DDoSProtection(f"binance 418 IP banned until {now + 5000}."), now_ms=now)
    assert fault.retry_after_s == 5.0


def test_rows_with_missing_values_convert_safely() -> None:
    from ingestor.exchanges import _candle
    from ingestor.model import Candle

    assert _candle([60_000, None, "2", 3, 4.5]) == Candle(60_000, 0.0, 2.0, 3.0, 4.5, 0.0)


# --------------------------------------------------------------------------
# The REST seam: an exchange's error answer, classified with its status, headers, body.
# --------------------------------------------------------------------------

VENUE_MARKETS = {
    "binance": "BTCUSDT",
    "okx": "BTC-USDT",
    "bybit": "BTCUSDT",
    "kraken": "XBTUSDT",
    "coinbaseexchange": "BTC-USDT",
}

#: Each venue's answer naming a market it does not list (status, body), from its
#: documentation and ccxt's exception tables.
UNKNOWN_MARKET = {
    "binance": (400, {"code": -1121, "msg": "Invalid symbol."}),
    "okx": (200, {"code": "51001", "msg": "Instrument ID does not exist", "data": []}),
    "bybit": (200, {"retCode": 10001, "retMsg": "Not supported symbols", "result": {}}),
    "kraken": (200, {"error": ["EQuery:Invalid asset pair"]}),
    # Coinbase answers 404 NotFound, which ccxt 4.5.90 names OrderNotFound: an exchange
    # error (not retried), never BAD_SYMBOL; see test_coinbases_unknown_product.
}


#: Each venue's body of a 429 (its documentation's).
TOO_MANY = {
    "binance": {"code": -1003, "msg": "Too many requests; current limit is 6000 weight."},
    "okx": {"msg": "Too Many Requests", "code": "50011"},
    "bybit": {"retCode": 10006, "retMsg": "Too many visits!", "result": {}},
    "kraken": {"error": ["EAPI:Rate limit exceeded"]},
    "coinbaseexchange": {"message": "Public rate limit exceeded"},
}


def answering(exchange_id: str, answer: HttpAnswer) -> tuple[ExchangeAdapter, list[str]]:
    """An adapter whose every REST request gets `answer`; the URLs asked kept."""
    asked: list[str] = []

    async def transport(url: str, method: str, headers: Any, body: Any) -> HttpAnswer:
        asked.append(url)
        return answer

    settings = ExchangeSettings(prefix="X", enable_rate_limit=False)
    adapter = ExchangeAdapter(exchange_id, settings, transport=transport)
    symbol = {"id": VENUE_MARKETS[exchange_id], "symbol": "BTC/USDT", "base": "BTC"}
    adapter.preload_markets([{**symbol, "quote": "USDT", "type": "spot", "spot": True}])
    return adapter, asked


def failure(adapter: ExchangeAdapter, call: str) -> ExchangeCallError:
    async def run() -> None:
        if call == "candles":
            await adapter.fetch_candles("BTC/USDT", "1m", 1_706_630_400_000, 1_706_630_700_000, 5)
        else:
            await adapter.fetch_trades("BTC/USDT", 5)

    with pytest.raises(ExchangeCallError) as raised:
        asyncio.run(run())
    return raised.value


@pytest.mark.parametrize("call", ["candles", "trades"])
@pytest.mark.parametrize("exchange_id", sorted(VENUE_MARKETS))
def test_a_429_with_retry_after_is_rate_limited_for_that_long(exchange_id: str, call: str) -> None:
    """Retry-After is on the answer's headers only: ccxt's error names no wait."""
    answer = HttpAnswer.of_json(TOO_MANY[exchange_id], 429, {"Retry-After": "7"})
    adapter, asked = answering(exchange_id, answer)
    fault = failure(adapter, call)
    assert len(asked) == 1
    assert (fault.kind, fault.retry_after_s) == (FaultKind.RATE_LIMITED, 7.0)


@pytest.mark.parametrize("exchange_id", sorted(UNKNOWN_MARKET))
def test_an_unknown_market_answer_is_a_bad_symbol(exchange_id: str) -> None:
    status, body = UNKNOWN_MARKET[exchange_id]
    adapter, asked = answering(exchange_id, HttpAnswer.of_json(body, status=status))
    fault = failure(adapter, "candles")
    assert len(asked) == 1
    assert fault.kind == FaultKind.BAD_SYMBOL, fault
    assert not fault.kind.transient


def test_coinbases_unknown_product() -> None:
    adapter, _ = answering("coinbaseexchange", HttpAnswer.of_json({"message": "NotFound"}, 404))
    fault = failure(adapter, "candles")
    assert fault.kind == FaultKind.EXCHANGE_ERROR and not fault.kind.transient


def test_a_symbol_the_exchange_does_not_list_is_refused_before_any_request() -> None:
    adapter, asked = answering("coinbaseexchange", HttpAnswer.of_json([]))
    with pytest.raises(ExchangeCallError) as raised:
        asyncio.run(adapter.fetch_candles("NOPE/USDT", "1m", 0, 60_000, 5))
    assert raised.value.kind == FaultKind.BAD_SYMBOL and asked == []


def test_the_binance_ban_time_in_a_418_body_is_honoured() -> None:
    until = int(time.time() * 1000) + 60_000
    body = {"code": -1003, "msg": f"Way too much request weight used; IP banned until {until}."}
    adapter, _ = answering("binance", HttpAnswer.of_json(body, status=418))
    fault = failure(adapter, "candles")
    assert fault.kind == FaultKind.RATE_LIMITED
    assert fault.retry_after_s is not None and 55 < fault.retry_after_s <= 60


@pytest.mark.parametrize("exchange_id", sorted(VENUE_MARKETS))
def test_an_empty_429_is_judged_by_its_status(exchange_id: str) -> None:
    """A body ccxt's error reader cannot read (Kraken's reader fails on an empty one)."""
    answer = HttpAnswer(429, {"Retry-After": "3"}, "", "Too Many Requests")
    fault = failure(answering(exchange_id, answer)[0], "candles")
    assert fault.kind.transient and fault.retry_after_s == 3.0
