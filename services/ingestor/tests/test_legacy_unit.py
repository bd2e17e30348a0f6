"""Legacy inline DataResponse built from the same fetch loop."""

from __future__ import annotations

import asyncio
from typing import Any

from ingestor.exchange_calls import FetchEnv
from ingestor.legacy import legacy_response
from ingestor.model import ExchangeCallError, FaultKind
from mdproto.messages import DataRequest, Status

MIN = 60_000


def req(limit: int = 0, start: int = 0, end: int = 3000 * MIN) -> DataRequest:
    return DataRequest(
        request_id="L1",
        kind=DataRequest.HISTORICAL,
        ticker="BINANCE:BTC/USDT",
        period_seconds=60,
        start_time_ms=start,
        end_time_ms=end,
        legacy_sync=True,
        limit=limit,
    )


def respond(exchange: Any, request: DataRequest, max_candles: int = 50_000) -> Any:
    env = FetchEnv(now_ms=lambda: 10**9 * MIN)
    return asyncio.run(
        legacy_response(request, exchange, env, ingestor_id="ing", max_candles=max_candles)
    )


def test_limit_takes_the_first_candles_and_stops_fetching(fakes: Any) -> None:
    exchange = fakes.FakeExchange(fakes.make_candles(range(0, 3000 * MIN, MIN)))
    response = respond(exchange, req(limit=1500))
    assert response.status == Status.OK and response.reason == ""
    assert [c.open_time_ms for c in response.candles] == list(range(0, 1500 * MIN, MIN))
    assert len(exchange.calls) == 2  # no third page
    assert (
        response.request_id,
        response.ticker,
        response.period_seconds,
        response.ingestor_id,
    ) == (
        "L1",
        "BINANCE:BTC/USDT",
        60,
        "ing",
    )
    assert all(c.closed and c.ticker == "BINANCE:BTC/USDT" for c in response.candles)


def test_no_limit_returns_everything_up_to_the_cap(fakes: Any) -> None:
    exchange = fakes.FakeExchange(fakes.make_candles(range(0, 3000 * MIN, MIN)))
    assert len(respond(exchange, req()).candles) == 3000
    # More candles than a legacy response carries: an explicit error, not a short answer.
    capped = respond(exchange, req(), max_candles=100)
    assert capped.status == Status.ERROR and len(capped.candles) == 0
    assert capped.reason.startswith("too_many_candles:") and "100" in capped.reason
    # An explicit limit within the bound is an answer of that many candles.
    assert len(respond(exchange, req(limit=100), max_candles=100).candles) == 100


def test_errors_and_empty_ranges(fakes: Any) -> None:
    bad = fakes.FakeExchange(
        [], faults=[ExchangeCallError(FaultKind.BAD_SYMBOL, "Invalid symbol.")]
    )
    response = respond(bad, req())
    assert response.status == Status.ERROR and "bad_symbol" in response.reason
    assert "Invalid symbol." in response.reason and len(response.candles) == 0
    assert respond(fakes.FakeExchange([]), req()).status == Status.NOT_FOUND
