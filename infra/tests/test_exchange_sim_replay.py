"""Recorded exchange candles served by the simulator (`POST /_sim/replay`), read back
through unmodified ccxt: every exchange's window semantics over the recorded raw rows,
the model for everything else, and the model back after the replay is cleared."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import ccxt
import pytest

from infra.exchange_sim import ThreadedSimulator, expected_klines, point_ccxt_at, run_in_thread
from infra.exchange_sim.control import SimulatorControl
from infra.exchange_sim.replay import MIN, WINDOWS, series

NOW = 1_800_000_000_000 - 1_800_000_000_000 % MIN + 30_000  # frozen mid-minute
T0 = NOW - NOW % MIN - 200 * MIN  # inside Kraken's latest 720 entries
SLOTS = 180
HOLES = {0, 7, 8, 99, 150}


@pytest.fixture(scope="module")
def sim() -> Iterator[ThreadedSimulator]:
    with run_in_thread(now_ms=NOW) as server:
        yield server


def connect(exchange_id: str, sim: ThreadedSimulator) -> Any:
    exchange = getattr(ccxt, exchange_id)({"options": {"fetchMarkets": {"types": ["spot"]}}})
    point_ccxt_at(exchange, sim.base_url)
    exchange.load_markets()
    return exchange


def window(exchange: Any, until: int) -> dict[str, int]:
    """ccxt's `until`, where the exchange takes an end (Kraken refuses one)."""
    return {} if exchange.id == "kraken" else {"until": until}


def page_through(exchange: Any, start: int, end: int, limit: int) -> list[list[Any]]:
    """Oldest-first pages of `limit` minutes, each a bounded window (as the ingestor asks)."""
    rows: list[list[Any]] = []
    for since in range(start, end, limit * MIN):
        until = min(since + limit * MIN, end) - 1
        page = exchange.fetch_ohlcv(
            "BTC/USDT", "1m", since=since, limit=limit, params=window(exchange, until)
        )
        rows += [r for r in page if since <= r[0] <= until]
    return rows


@pytest.mark.parametrize("exchange_id", sorted(WINDOWS))
def test_replayed_rows_come_back_through_ccxt_exactly(
    exchange_id: str, sim: ThreadedSimulator
) -> None:
    rows = series(exchange_id, T0, SLOTS, HOLES, MIN)
    expected = [list(WINDOWS[exchange_id].ohlcv(r)) for r in rows]
    control = SimulatorControl(sim.base_url)
    control.replay(exchange_id, MIN, rows)
    try:
        exchange = connect(exchange_id, sim)
        got = page_through(exchange, T0, T0 + SLOTS * MIN, 50)
        assert got == expected
        # Another symbol is still the model's.
        eth = exchange.fetch_ohlcv(
            "ETH/USDT", "1m", since=T0, limit=5, params=window(exchange, T0 + 4 * MIN)
        )
        model = {k.open_time: k.ohlcv() for k in expected_klines("ETH/USDT", "1m", T0, NOW)}
        shared = [r for r in eth if r[0] in model]
        assert shared and all(r[:5] == model[r[0]][:5] for r in shared)
    finally:
        control.clear_replays()
    exchange = connect(exchange_id, sim)
    back = exchange.fetch_ohlcv(
        "BTC/USDT", "1m", since=T0, limit=5, params=window(exchange, T0 + 4 * MIN)
    )
    model = {k.open_time: k.ohlcv() for k in expected_klines("BTC/USDT", "1m", T0, NOW)}
    assert back and all(r[:5] == model[r[0]][:5] for r in back)  # the model again


def test_a_bad_replay_is_refused_with_the_reason(sim: ThreadedSimulator) -> None:
    control = SimulatorControl(sim.base_url)
    with pytest.raises(Exception, match="400"):
        control.replay("nope", MIN, [])
    with pytest.raises(Exception, match="400"):
        control.replay("okx", 7, [])
