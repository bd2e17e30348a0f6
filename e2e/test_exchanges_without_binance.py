"""A platform without Binance (the default exchange nowhere), end to end.

One platform serves OKX, Bybit, Kraken and Coinbase from the simulator, as
`make run EXCHANGES=okx,bybit,kraken,coinbaseexchange` starts it
(PlatformConfig with `exchanges=[...]`): the relay knows only their prefixes,
the ingestor opens only them, each pointed at the simulator's front-end for
it, which speaks the exchange's wire format and pages like the real one (OKX
and Bybit: a window's newest candles; Kraken: the latest 720 entries from
`since`; Coinbase: bounded windows of at most 300). The ingestor's pages are
small (PAGE_LIMIT candles), so every request spans several. History answers
come back from Iceberg through the client. Each exchange also answers a
request over candles recorded from the real exchange (ccxt's recordings,
served by the simulator with the exchange's window semantics:
infra.exchange_sim.replay) with exactly the recorded values. Bybit's live
candles, built by the pipeline from the simulator's Bybit trade stream, equal
Bybit's own candles. Each exchange's order book reaches the client equal to the
exchange's, and a bad checksum (OKX, Kraken) or a lost update (Bybit) is healed
by a reset the client reports. Binance, the default, is covered the same way on compose
(e2e/test_history.py) and on a platform of its own (e2e/test_live_candles.py).

One platform for the four, not one each: what each test checks is per
exchange (its wire format, its pages, its prefix), and a platform's start
costs minutes of a 2-core CI run.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from infra.exchange_sim import expected_klines, replay
from infra.exchange_sim.control import SimulatorControl
from infra.localstack.components import NotReadyError
from infra.platform import Platform
from infra.platform.services import stored_markets
from infra.testing import (
    assert_live_equals_exchange,
    book_equals_exchange,
    closed_live_candles,
    exchange_rows,
    own_platform,
    platform_client,
    poll_until,
    result_rows,
)
from mdclient import Client, SubmitRejected
from mdclient.book import BookEvent
from mdproto import contracts

# Own platform (Spark start: minutes on loaded cores) plus the run: more than the default.
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.stack,
    pytest.mark.spark,
    pytest.mark.local,  # local processes of its own: not a test of the compose stack
    pytest.mark.timeout(1500),
    pytest.mark.heavy(seconds=200),
]

HOUR_MS = 3_600_000
#: Candles per ingestor call: a 5-hour 1-minute request takes three pages.
PAGE_LIMIT = 100
HOURS = 5


EXCHANGES = ["okx", "bybit", "kraken", "coinbaseexchange"]


#: Rows of Iceberg market.markets per exchange prefix, read the moment `up()` returned
#: (what `make run` calls "running"), or why they could not be read.
MARKETS_WHEN_READY: dict[str, int | str] = {}


@pytest.fixture(scope="module")
def without_binance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    """The platform serving EXCHANGES and no other, with small pages."""
    pages = {f"INGESTOR_EXCHANGES__{e.upper()}__PAGE_LIMIT": str(PAGE_LIMIT) for e in EXCHANGES}
    data_dir = tmp_path_factory.mktemp("platform-without-binance")
    with own_platform(data_dir, EXCHANGES, service_env=pages) as running:
        try:
            MARKETS_WHEN_READY.update(
                stored_markets(running.stack.endpoints, running.config.prefixes)
            )
        except NotReadyError as exc:
            MARKETS_WHEN_READY["error"] = str(exc)
        yield running


def prefix_of(platform: Platform, exchange_id: str) -> str:
    return dict(zip(platform.config.exchanges, platform.config.prefixes, strict=True))[exchange_id]


def candle_calls(sim: SimulatorControl, after_seq: int) -> list[dict[str, Any]]:
    """The simulator's candle requests after log position `after_seq` (any exchange)."""
    log = sim.stats(include_log=True)["log"]
    paths = ("candles", "/kline", "/OHLC", "/klines")  # OKX and Coinbase, Bybit, Kraken, Binance
    return [e for e in log if e["seq"] > after_seq and str(e["path"]).endswith(paths)]


def test_every_exchanges_markets_are_stored_when_the_platform_says_ready(
    without_binance: Platform,
) -> None:
    """`mdclient markets <exchange>`, a README line, answers the moment `make run` says it
    is running (issue 45: it answered "no markets" for a minute, the markets query's
    trigger)."""
    assert set(MARKETS_WHEN_READY) == set(without_binance.config.prefixes), MARKETS_WHEN_READY
    assert all(isinstance(rows, int) and rows > 0 for rows in MARKETS_WHEN_READY.values())


@pytest.mark.parametrize("exchange_id", EXCHANGES)
def test_an_exchange_answers_a_multi_page_history_request(
    without_binance: Platform, exchange_id: str
) -> None:
    prefix = prefix_of(without_binance, exchange_id)
    now = int(time.time() * 1000)
    # Kraken serves only its latest 720 one-minute entries: a range inside them.
    back = 10 * HOUR_MS if exchange_id == "kraken" else 3 * 24 * HOUR_MS
    start = (now - back) // HOUR_MS * HOUR_MS
    end = start + HOURS * HOUR_MS
    # Generous: the first micro-batches of a just-started pipeline took minutes on loaded cores.
    settings = platform_client(without_binance, history_timeout_s=480.0, attempts=1)
    assert without_binance.endpoints.exchange_url is not None
    sim = SimulatorControl(without_binance.endpoints.exchange_url)
    before = int(sim.stats()["requests_total"])
    with Client(settings=settings, client_id=f"e2e-{exchange_id}") as client:
        result = client.history(f"{prefix}:BTC/USDT", "1m", start, end)
        assert len(candle_calls(sim, before)) >= HOURS * 60 // PAGE_LIMIT  # several pages
        assert result.status == "OK"
        assert result_rows(result) == exchange_rows("BTC/USDT", start, end)
        assert len(result) == result.reported_rows == HOURS * 60 > 2 * PAGE_LIMIT
        # Kraken reports each candle's trade count (exact); the others none: null, not 0.
        counts = result.table.column("trade_count").to_pylist()
        if exchange_id == "kraken":
            assert counts == [k.trades for k in expected_klines("BTC/USDT", "1m", start, end - 1)]
        else:
            assert all(n is None for n in counts)
        with pytest.raises(SubmitRejected) as refused:  # the relay knows no Binance
            client.history("BINANCE:BTC/USDT", "1m", start, end)
    assert "BINANCE" in str(refused.value)


@pytest.mark.parametrize("exchange_id", EXCHANGES)
def test_recorded_exchange_candles_come_back_exactly_through_the_whole_platform(
    without_binance: Platform, exchange_id: str
) -> None:
    """ccxt's recordings of the real exchange's candle response (infra.exchange_sim.replay),
    cycled over three hours with some minutes left empty, served by the simulator with
    the exchange's window semantics: ingestor pages, Kafka, Spark, Iceberg, and the
    client reads back exactly the recorded values."""
    prefix = prefix_of(without_binance, exchange_id)
    assert without_binance.endpoints.exchange_url is not None
    sim = SimulatorControl(without_binance.endpoints.exchange_url)
    # After the other test's range (Kraken: still inside its latest 720 entries).
    start = (sim.now_ms() - 4 * HOUR_MS) // HOUR_MS * HOUR_MS
    slots = 3 * 60
    rows = replay.series(exchange_id, start, slots, {0, 1, 57, PAGE_LIMIT, slots - 1}, replay.MIN)
    expected = [tuple(map(float, replay.WINDOWS[exchange_id].ohlcv(r))) for r in rows]
    settings = platform_client(without_binance, history_timeout_s=480.0, attempts=1)
    before = int(sim.stats()["requests_total"])
    sim.replay(exchange_id, replay.MIN, rows)
    try:
        with Client(settings=settings, client_id=f"e2e-replay-{exchange_id}") as client:
            result = client.history(f"{prefix}:BTC/USDT", "1m", start, start + slots * replay.MIN)
    finally:
        sim.clear_replays()
    assert len(candle_calls(sim, before)) >= 2  # several pages
    assert result.status == "OK"
    assert result_rows(result) == expected
    assert result.reported_rows == len(expected) == slots - 5


# The simulator streams trades in Binance's and Bybit's formats (not OKX's). Last in the
# module: it runs the simulator's clock fast, which would move the other tests' ranges.
def test_bybit_live_candles_equal_the_exchange_candles(without_binance: Platform) -> None:
    url = without_binance.endpoints.exchange_url
    assert url is not None
    client = platform_client(without_binance)
    sim = SimulatorControl(url)
    run = closed_live_candles(client, sim, "BYBIT:ETH/USDT", contracts.LIVE_PERIODS)
    for period in contracts.LIVE_PERIODS:
        assert_live_equals_exchange(run, "bybit", "ETH/USDT", period)


#: The fault each exchange's book is checked through, and the reset it must cause;
#: Coinbase sends neither ids nor checksums, so a loss there cannot be seen.
BOOK_FAULTS = {
    "okx": ("book_checksum", "CHECKSUM"),
    "bybit": ("book_drop", "SEQUENCE_GAP"),
    "kraken": ("book_checksum", "CHECKSUM"),
    "coinbaseexchange": None,
}


@pytest.mark.parametrize("exchange_id", EXCHANGES)
def test_an_exchanges_book_reaches_the_client_and_heals_after_a_fault(
    without_binance: Platform, exchange_id: str
) -> None:
    url = without_binance.endpoints.exchange_url
    assert url is not None
    sim = SimulatorControl(url)
    symbol = "BTC/USDT"
    ticker = f"{prefix_of(without_binance, exchange_id)}:{symbol}"
    events: list[BookEvent] = []
    with (
        Client(settings=platform_client(without_binance)) as client,
        client.book(ticker, on_event=events.append) as book,
    ):
        assert book.wait_synced(90), f"no {ticker} book within 90 s: {book.status}"
        poll_until(
            f"{ticker}: the client's book equal to the exchange's",
            book_equals_exchange(book, sim, symbol),
            30,
        )
        fault = BOOK_FAULTS[exchange_id]
        if fault is None:
            return
        name, reason = fault
        sim.add_fault(name, symbol=symbol, exchange=exchange_id)
        poll_until(
            f"{ticker}: a {reason} reset reported",
            lambda: [e for e in events if e.kind == "reset" and e.reason.startswith(f"{reason}: ")],
            30,
        )
        poll_until(
            f"{ticker}: equal again after the reset", book_equals_exchange(book, sim, symbol), 30
        )
