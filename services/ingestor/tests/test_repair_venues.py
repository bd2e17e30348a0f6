"""A gap repaired through ccxt against the simulator, venue by venue: the real paging
(Binance `fromId`, OKX and Coinbase `after`, Kraken `since`, Bybit's latest trades)
and the real parsing give back exactly the model trades the gap lacks."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import SecretStr

from ingestor.config import Credentials, ExchangeSettings
from ingestor.exchange_calls import FetchEnv
from ingestor.exchanges import ExchangeAdapter
from ingestor.live import GapFound, TradePoint
from ingestor.repair import Outcome, repair_gap
from mdproto.messages import Tick, TradeGap

MINUTE_MS = 60_000
SYMBOL = "BTC/USDT"


@pytest.fixture(scope="module")
def sim() -> Iterator[Any]:
    from infra.exchange_sim import run_in_thread

    with run_in_thread() as running:
        yield running


def model_gap(sim: Any, minutes_ago: int, minutes: int) -> tuple[GapFound, list[str]]:
    """A gap over `minutes` of BTC/USDT's model trades ending `minutes_ago` ago."""
    end = (sim.now_ms() // MINUTE_MS - minutes_ago) * MINUTE_MS
    trades = list(sim.model.iter_trades(SYMBOL, end - minutes * MINUTE_MS, end))
    first, last = trades[0], trades[-1]
    gap = GapFound(
        f"X:{SYMBOL}",
        TradePoint(str(first.id), first.time_ms),
        TradePoint(str(last.id), last.time_ms),
        TradeGap.RECONNECT,
        last.id - first.id - 1,
    )
    return gap, [str(t.id) for t in trades[1:-1]]


def repair(fakes: Any, sim: Any, exchange_id: str, gap: GapFound) -> tuple[Outcome, list[Tick]]:
    async def run() -> tuple[Outcome, list[Tick]]:
        adapter = ExchangeAdapter(
            exchange_id,
            ExchangeSettings(api_base_url=sim.base_url, enable_rate_limit=False),
            Credentials(api_key=SecretStr("simulator")),  # Binance's historicalTrades
        )
        sink = fakes.FakeSink()

        async def progress(_state: int, _reason: str) -> None:
            return None

        try:
            await adapter.load_markets()
            outcome = await repair_gap(
                gap,
                adapter,
                sink,
                FetchEnv(venue=adapter.venue),
                page_limit=1000,
                max_pages=100,
                progress=progress,
            )
        finally:
            await adapter.close()
        return outcome, [t for _, t in sink.ticks]

    return asyncio.run(run())


@pytest.mark.parametrize("exchange_id", ["binance", "okx", "coinbaseexchange", "kraken"])
def test_a_gap_comes_back_whole_through_each_venues_paging(
    fakes: Any, sim: Any, exchange_id: str
) -> None:
    gap, missing = model_gap(sim, minutes_ago=2, minutes=4)
    outcome, ticks = repair(fakes, sim, exchange_id, gap)
    assert (outcome.state, outcome.recovered) == (TradeGap.REPAIRED, len(missing)), outcome
    assert sorted(t.trade_id for t in ticks) == sorted(missing)
    model = {
        str(t.id): t for t in sim.model.iter_trades(SYMBOL, gap.before.time_ms, gap.after.time_ms)
    }
    for tick in ticks:
        trade = model[tick.trade_id]
        assert (tick.price, tick.amount, tick.timestamp_ms) == (
            float(trade.price),
            float(trade.qty),
            trade.time_ms,
        )
        assert tick.repaired


def test_bybit_repairs_only_what_its_latest_trades_cover(fakes: Any, sim: Any) -> None:
    old, _ = model_gap(sim, minutes_ago=10, minutes=2)
    outcome, ticks = repair(fakes, sim, "bybit", old)
    assert outcome.state == TradeGap.UNREPAIRABLE
    assert "bybit serves only its latest 60 trades over REST" in outcome.reason
    assert ticks == []
