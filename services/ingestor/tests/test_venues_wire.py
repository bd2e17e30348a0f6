"""Real exchange payloads through ccxt and the ingestor's paging and parsing.

The fixtures (tests/fixtures/exchanges/<ccxt id>/, provenance in SOURCE.md) are
candle responses recorded from the exchanges' real APIs and kept by ccxt as
static test data. They are served as HTTP answers through the adapter's injected
transport, so each venue's request is built and each answer parsed exactly as
in production (ccxt signs and judges it); only the network is replaced.

1. Replays: each recorded response, served verbatim, must come out of
   `ExchangeAdapter.fetch_candles` with exactly the recorded values.
2. Paging: the recordings hold 3 to 6 candles, too few for multi-page
   windows. So a small fake per exchange (`*Wire` below) serves a longer
   series made of the recorded raw rows (re-stamped on consecutive periods,
   some periods left empty as an exchange does when nothing traded) in that
   exchange's real wire format and with its real window semantics (documented
   on each class; every query parameter is checked, unknown ones refused).
   Page sizes 1, 2, 7 and the exchange's maximum must give exactly the
   exchange's candles of the range, each once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import astuple, replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infra.exchange_sim.replay import (
    HOUR,
    MIN,
    WINDOWS,
    CoinbaseWindows,
    KrakenWindows,
    RefusedError,
    recorded_rows,
    recording,
)
from infra.exchange_sim.replay import series as replay_series
from ingestor.config import ExchangeSettings
from ingestor.errors import RequestFailedError
from ingestor.exchange_calls import FetchEnv
from ingestor.exchanges import ExchangeAdapter
from ingestor.model import Candle, ExchangeCallError, FaultKind
from ingestor.pages import iter_pages, plan_request
from ingestor.rest import HttpAnswer
from mdproto.messages import DataRequest, Status


def ccxt_row(row: list[Any]) -> Candle:
    """A row of ccxt's OHLCV ([ms, open, high, low, close, volume]) as a Candle."""
    return Candle(int(row[0]), *(float(v) for v in row[1:6]))


def market(exchange_id: str, market_id: str) -> dict[str, Any]:
    """The one ccxt market the tests use (spot BTC/USDT), as load_markets would set it."""
    return {
        "id": market_id,
        "symbol": "BTC/USDT",
        "base": "BTC",
        "quote": "USDT",
        "baseId": "BTC",
        "quoteId": "USDT",
        "type": "spot",
        "spot": True,
        "active": True,
        "info": {},
    }


class Wire:
    """An exchange's candle endpoint (infra.exchange_sim.replay) as the adapter's
    transport: a refused request is answered HTTP 400 with the refusal's message."""

    def __init__(
        self, exchange_id: str, rows: list[list[Any]], period_ms: int, now_ms: int
    ) -> None:
        self.windows = WINDOWS[exchange_id]()
        self.rows = rows
        self.period_ms = period_ms
        self.now_ms = now_ms
        self.requests: list[dict[str, str]] = []

    async def __call__(
        self, url: str, method: str, headers: Mapping[str, str], body: str | None
    ) -> HttpAnswer:
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        assert method == "GET", url
        assert parts.path in self.windows.paths, url
        self.requests.append(query)
        try:
            rows = self.windows.answer(self.rows, self.period_ms, self.now_ms, parts.path, query)
        except RefusedError as exc:
            return HttpAnswer.of_json({"message": str(exc)}, status=400)
        return HttpAnswer.of_json(rows)


def _binance(row: list[Any]) -> Candle:
    return replace(
        ccxt_row(row),
        trade_count=int(row[8]),
        quote_volume=float(row[7]),
        taker_buy_volume=float(row[9]),
        taker_buy_quote_volume=float(row[10]),
    )


def _kraken(row: list[Any]) -> Candle:
    """A committed entry (the tests expect closed candles only)."""
    return replace(Candle(*KrakenWindows.ohlcv(row)), trade_count=int(row[7]), final=True)


#: Each exchange's documented row layout, read without ccxt (the oracle), with
#: what it reports beyond OHLCV.
CANDLES: dict[str, Callable[[list[Any]], Candle]] = {
    "binance": _binance,
    "okx": lambda row: replace(ccxt_row(row), quote_volume=float(row[7]), final=row[8] == "1"),
    "bybit": lambda row: replace(ccxt_row(row), quote_volume=float(row[6])),
    "kraken": _kraken,
    "coinbaseexchange": lambda row: Candle(*CoinbaseWindows.ohlcv(row)),
}


def adapter_for(
    exchange_id: str, transport: Callable[..., Any], page_limit: int = 1000, prefix: str = "X"
) -> ExchangeAdapter:
    """An adapter whose REST calls go to `transport`: no session is opened, none to close."""
    settings = ExchangeSettings(prefix=prefix, enable_rate_limit=False, page_limit=page_limit)
    adapter = ExchangeAdapter(exchange_id, settings, transport=transport)
    adapter.preload_markets([market(exchange_id, WINDOWS[exchange_id].market_id)])
    return adapter


# --------------------------------------------------------------------------
# 1. Recorded responses, verbatim.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("exchange_id", sorted(WINDOWS))
def test_recorded_response_parses_to_the_recorded_values(exchange_id: str) -> None:
    fixture = recording(exchange_id)
    seen: list[str] = []

    async def replay(url: str, method: str, headers: Any, body: Any) -> HttpAnswer:
        seen.append(url)
        return HttpAnswer.of_json(fixture["httpResponse"])

    _, timeframe, since, limit = fixture["input"][:4]
    parsed = fixture["parsedResponse"]
    since = since if since is not None else parsed[0][0]

    adapter = adapter_for(exchange_id, replay)
    fetch = adapter.fetch_candles("BTC/USDT", timeframe, since, since + 10**10, limit)
    candles = asyncio.run(fetch)
    assert len(seen) == 1
    assert [replace(c, **RAW_DEFAULTS) for c in candles] == [ccxt_row(r) for r in parsed]
    assert {c.open_time_ms: kept(c) for c in candles} == KEPT[exchange_id]


RAW_DEFAULTS: dict[str, Any] = {
    "trade_count": None,
    "quote_volume": None,
    "taker_buy_volume": None,
    "taker_buy_quote_volume": None,
    "final": None,
}


def kept(candle: Candle) -> tuple[Any, ...]:
    return tuple(getattr(candle, name) for name in RAW_DEFAULTS)


#: What each recorded response says beyond OHLCV, per candle, read off the
#: fixtures by hand: (trade count, quote volume, taker buy base, taker buy
#: quote, final). None: the exchange does not report it.
KEPT: dict[str, dict[int, tuple[Any, ...]]] = {
    "binance": {
        1706630400000: (3743, 891428.4285807, 10.91428, 473782.9573992, None),
        1706634000000: (4365, 946546.0494168, 11.70274, 508392.7477704, None),
        1706637600000: (4063, 1027527.7711617, 15.19718, 660419.7327528, None),
    },
    "okx": {
        1706630400000: (None, 309343235.363089398, None, None, True),
        1706634000000: (None, 195072853.268772597, None, None, True),
        1706637600000: (None, 220057933.233687634, None, None, True),
    },
    "bybit": {
        1706630400000: (None, 58117391.4117, None, None, None),
        1706634000000: (None, 138878389.2519, None, None, None),
        1706637600000: (None, 68345898.1407, None, None, None),
    },
    "kraken": {
        1706630400000: (126, None, None, None, True),
        1706634000000: (127, None, None, None, True),
        1706637600000: (434, None, None, None, True),
    },
    "coinbaseexchange": {1710327600000: (None, None, None, None, None)},
}


@pytest.mark.parametrize("exchange_id", sorted(WINDOWS))
def test_oracle_reads_the_recorded_rows_as_ccxt_does(exchange_id: str) -> None:
    """The fakes' own reading of each raw layout agrees with the recorded parse and KEPT."""
    fixture = recording(exchange_id)
    parsed = {c.open_time_ms: c for c in map(ccxt_row, fixture["parsedResponse"])}
    mine = {c.open_time_ms: c for c in map(CANDLES[exchange_id], recorded_rows(exchange_id))}
    assert parsed
    for t, candle in parsed.items():
        assert replace(mine[t], **RAW_DEFAULTS) == candle
        assert kept(mine[t]) == KEPT[exchange_id][t]


# --------------------------------------------------------------------------
# 2. Multi-page requests over each exchange's real window semantics.
# --------------------------------------------------------------------------

SLOTS = 60  # periods in the served series
NOW_SLOT = SLOTS  # "now" is the open of slot 60: slots 0..59 closed, one still open


def series(exchange_id: str, t0: int, holes: set[int], period_ms: int) -> list[list[Any]]:
    """SLOTS + 1 rows (the last still open) cycling the recorded rows, none at `holes`."""
    return replay_series(exchange_id, t0, SLOTS + 1, holes, period_ms)


async def fetch_range(
    exchange_id: str, wire: Wire, start: int, end: int, page_limit: int, period_ms: int
) -> list[Candle]:
    adapter = adapter_for(exchange_id, wire, page_limit)
    env = FetchEnv(
        page_limit=adapter.page_limit,
        bounded_pages=adapter.bounded_pages,
        venue=adapter.venue,
        now_ms=lambda: wire.now_ms,
    )
    request = DataRequest(
        request_id="r",
        kind=DataRequest.HISTORICAL,
        ticker="X:BTC/USDT",
        period_seconds=period_ms // 1000,
        start_time_ms=start,
        end_time_ms=end,
    )
    symbol, plan = plan_request(request, adapter, env)
    return [c async for page in iter_pages(adapter, symbol, plan, env) for c in page]


def page_sizes(exchange_id: str) -> list[int]:
    return [1, 2, 7, WINDOWS[exchange_id].max_limit]


T0 = 1_706_630_400_000  # the recordings' first hour, 2024-01-30T16:00Z


@pytest.mark.parametrize("exchange_id", sorted(WINDOWS))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    holes=st.sets(st.integers(0, SLOTS), max_size=20),
    first=st.integers(0, SLOTS - 1),
    length=st.integers(1, SLOTS + 5),
    period_ms=st.sampled_from([MIN, HOUR]),
    into_slot=st.sampled_from([0, 1, 1000, 59_999]),
)
def test_every_page_size_returns_every_candle_once(
    exchange_id: str, holes: set[int], first: int, length: int, period_ms: int, into_slot: int
) -> None:
    oracle, open_ms = CANDLES[exchange_id], WINDOWS[exchange_id].open_ms
    rows = series(exchange_id, T0, holes, period_ms)
    now = T0 + NOW_SLOT * period_ms + into_slot  # somewhere in the still-open slot
    start = T0 + first * period_ms
    end = start + length * period_ms
    expected = [
        oracle(r) for r in rows if start <= open_ms(r) < min(end, T0 + NOW_SLOT * period_ms)
    ]
    for size in page_sizes(exchange_id):
        wire = Wire(exchange_id, rows, period_ms, now)
        got = asyncio.run(fetch_range(exchange_id, wire, start, end, size, period_ms))
        assert got == expected, (size, len(wire.requests))


@pytest.mark.parametrize("exchange_id", ["okx", "bybit", "coinbaseexchange"])
def test_newest_first_exchanges_lose_nothing_of_a_long_range(exchange_id: str) -> None:
    """The issue's case: a range several pages long on a newest-first exchange."""
    rows = series(exchange_id, T0, set(), MIN)
    wire = Wire(exchange_id, rows, MIN, T0 + NOW_SLOT * MIN)
    got = asyncio.run(fetch_range(exchange_id, wire, T0, T0 + SLOTS * MIN, 7, MIN))
    assert [c.open_time_ms for c in got] == [T0 + i * MIN for i in range(SLOTS)]
    assert len(wire.requests) == -(-SLOTS // 7)  # one bounded window per page


def test_a_candle_the_exchange_calls_unfinished_is_not_written() -> None:
    """OKX confirm=0 on a candle the local clock thinks closed (clock skew): left out."""
    rows = series("okx", T0, set(), MIN)
    rows[SLOTS - 1] = [*rows[SLOTS - 1][:8], "0"]
    wire = Wire("okx", rows, MIN, T0 + NOW_SLOT * MIN + 1000)
    got = asyncio.run(fetch_range("okx", wire, T0, T0 + SLOTS * MIN, 300, MIN))
    assert [c.open_time_ms for c in got] == [T0 + i * MIN for i in range(SLOTS - 1)]
    assert all(c.final for c in got)


def test_kraken_refuses_a_range_older_than_its_720_entries() -> None:
    now = T0 + 1000 * MIN
    wire = Wire("kraken", series("kraken", T0, set(), MIN), MIN, now)
    earliest = now - 718 * MIN  # Kraken still has now - 719, but not for long
    with pytest.raises(RequestFailedError) as failure:
        asyncio.run(fetch_range("kraken", wire, earliest - MIN, now, 720, MIN))
    assert failure.value.error_code == "history_unavailable"
    iso = datetime.fromtimestamp(earliest / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert iso in failure.value.reason and str(earliest) in failure.value.reason
    assert wire.requests == []  # refused before asking the exchange
    # The earliest slot itself is served.
    got = asyncio.run(fetch_range("kraken", wire, earliest, now, 720, MIN))
    assert got == []  # the series ends long before: nothing traded in the window


def test_a_wider_window_than_coinbase_allows_is_an_error_not_a_gap() -> None:
    rows = series("coinbaseexchange", T0, set(), MIN)
    wire = Wire("coinbaseexchange", rows, MIN, T0 + NOW_SLOT * MIN)

    adapter = adapter_for("coinbaseexchange", wire)
    with pytest.raises(ExchangeCallError, match="exceeds 300") as failure:
        asyncio.run(adapter.fetch_candles("BTC/USDT", "1m", T0, T0 + 400 * MIN, 300))
    assert failure.value.kind == FaultKind.BAD_REQUEST  # not retried, the request fails


def test_an_unreadable_extra_field_costs_the_extras_never_the_candles(
    caplog: pytest.LogCaptureFixture,
) -> None:
    body = recording("binance")["httpResponse"]
    garbled = [[*row[:8], "not a count", *row[9:]] for row in body]

    async def replay(url: str, method: str, headers: Any, payload: Any) -> HttpAnswer:
        return HttpAnswer.of_json(garbled)

    adapter = adapter_for("binance", replay)
    candles = asyncio.run(adapter.fetch_candles("BTC/USDT", "1h", T0, T0 + 3 * HOUR, 3))
    assert [replace(c, **RAW_DEFAULTS) for c in candles] == [
        ccxt_row(r) for r in recording("binance")["parsedResponse"]
    ]
    assert all(kept(c) == (None,) * 5 for c in candles)  # unknown, not guessed
    assert "raw candle fields unreadable" in caplog.text


# --------------------------------------------------------------------------
# 3. The same, through a running ingestor and real Kafka.
# --------------------------------------------------------------------------


def row_values(row: Any) -> tuple[Any, ...]:
    """An OHLC record row as (open time, OHLCV..., kept fields) with None for unset."""
    optional = ("trade_count", "quote_volume", "taker_buy_volume", "taker_buy_quote_volume")
    return (
        row.open_time_ms,
        row.open,
        row.high,
        row.low,
        row.close,
        row.volume,
        *(getattr(row, f) if row.HasField(f) else None for f in optional),
    )


@pytest.mark.stack
@pytest.mark.parametrize("exchange_id", sorted(WINDOWS))
def test_a_multi_page_request_reaches_kafka_as_exactly_the_exchanges_candles(
    exchange_id: str, harness: Any, run_ingestor: Any
) -> None:
    """Seven-candle pages of each exchange's wire format, through the ingestor to Kafka."""
    from ingestor.app import Ingestor

    now = int(time.time() * 1000)
    t0 = now - now % MIN - 90 * MIN  # recent: inside Kraken's 720 entries
    rows = series(exchange_id, t0, {0, 3, 4, 17, 40, 59}, MIN)
    wire = Wire(exchange_id, rows, MIN, now)
    end = t0 + SLOTS * MIN
    expected = [
        (*astuple(c)[:6], *kept(c)[:4])
        for c in map(CANDLES[exchange_id], rows)
        if c.open_time_ms < end
    ]
    prefix = "REPLAY"
    request = DataRequest(
        request_id=f"replay-{exchange_id}",
        client_id="client-1",
        kind=DataRequest.HISTORICAL,
        ticker=f"{prefix}:BTC/USDT",
        period_seconds=60,
        start_time_ms=t0,
        end_time_ms=end,
        notification_topic="RESPONSE:client-1",
    )

    async def scenario() -> list[Any]:
        relay = harness.FakeRelay()
        settings = harness.settings(relay, exchanges={exchange_id: {"prefix": prefix}})
        adapter = adapter_for(exchange_id, wire, page_limit=7, prefix=prefix)
        ingestor = Ingestor(settings, adapters={exchange_id: adapter})
        task = await run_ingestor(ingestor)
        try:
            await relay.wait_subscribed()
            await relay.publish(request)
            return list(
                await asyncio.to_thread(harness.batches_until_final, settings, request.request_id)
            )
        finally:
            await ingestor.stop()
            await task
            relay.close()

    batches = asyncio.run(scenario())
    final = batches[-1].metadata
    assert [row_values(r) for b in batches[:-1] for r in b.rows] == expected
    assert (final.status, final.total_rows, final.expected_gaps) == (Status.OK, 54, 6)
    assert len(wire.requests) > 54 // 7  # several pages
