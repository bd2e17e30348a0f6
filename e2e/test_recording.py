"""Recording through the whole platform, with no client subscribed.

The e2e stack records LINK, DOT and LTC of the simulated Binance
(`infra.testing.E2E_RECORDED`). The simulator drops trade ids of one market and cuts
another's websocket; then the ingestor is restarted. Each fault is found and repaired
from the exchange's trade history, and afterwards Iceberg `market.ticks` equals the
simulator's own trades over the whole window, trade for trade, with no duplicate;
`market.gaps` lists the faults REPAIRED, and the stored one-minute candles over the
repaired stretches are complete.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.exceptions import NoSuchTableError

from infra.exchange_sim.control import SimulatorControl
from infra.exchange_sim.model import MarketModel
from infra.platform.faults import Faults
from infra.platform.supervisor import PlatformEndpoints
from infra.testing import E2E_RECORDED
from mdproto import contracts
from mdproto.tables import Gaps, Ohlc, Ticks

pytestmark = [pytest.mark.e2e, pytest.mark.stack, pytest.mark.spark, pytest.mark.timeout(1200)]

TICKERS = [f"BINANCE:{s}" for s in E2E_RECORDED]
QUOTED = "(" + ", ".join(f"'{t}'" for t in TICKERS) + ")"
DROPPED, CUT, _ = TICKERS
WAIT_S = 300.0


def until(condition: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    """Poll `condition` (a table read) every second until it returns something true."""
    deadline = time.monotonic() + timeout_s
    while not (result := condition()):
        assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {what}"
        time.sleep(1.0)
    return result


class Lake:
    def __init__(self, endpoints: PlatformEndpoints) -> None:
        stack = endpoints.stack
        self._catalog = load_catalog(stack.catalog_name, **stack.pyiceberg_catalog_properties())

    def rows(self, name: str, row_filter: str) -> pa.Table | None:
        try:
            table = self._catalog.load_table(name)
        except NoSuchTableError:
            return None
        return table.scan(row_filter=row_filter).to_arrow()

    def ticks(self, since_ms: int = 0) -> pa.Table:
        rows = self.rows(
            contracts.ICEBERG_TICKS,
            f"{Ticks.TICKER} IN {QUOTED} AND {Ticks.TRADE_TIME} >= '{iso(since_ms)}'",
        )
        return rows if rows is not None else pa.table({})

    def gaps(self) -> list[dict[str, Any]]:
        rows = self.rows(contracts.ICEBERG_GAPS, f"{Gaps.TICKER} IN {QUOTED}")
        return [] if rows is None else rows.to_pylist()


def iso(ms: float) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def newest_ms(ticks: pa.Table, ticker: str) -> int | None:
    times = [r[Ticks.TRADE_TIME] for r in ticks.to_pylist() if r[Ticks.TICKER] == ticker]
    return int(max(times).timestamp() * 1000) if times else None


def test_a_recorded_universe_survives_dropped_ids_an_outage_and_a_restart(
    endpoints: PlatformEndpoints, sim: SimulatorControl, faults: Faults
) -> None:
    lake = Lake(endpoints)

    def every_market_stored() -> list[int] | None:
        ticks = lake.ticks()
        newest = [newest_ms(ticks, t) for t in TICKERS] if ticks.num_rows else []
        return [n for n in newest if n] if newest and all(newest) else None

    # The window starts once every market's recording reached Iceberg.
    begin_ms = max(until(every_market_stored, "the recorded markets' trades in market.ticks"))

    sim.trade_drop(DROPPED.split(":")[1], count=3, exchange="binance")
    sim.ws_outage(symbol=CUT.split(":")[1], exchange="binance", seconds=5)

    def repaired(*causes: str) -> list[dict[str, Any]] | None:
        gaps = [g for g in lake.gaps() if g[Gaps.DETECTED_AT].timestamp() * 1000 >= begin_ms]
        if {g[Gaps.CAUSE] for g in gaps} >= set(causes) and all(
            g[Gaps.STATUS] == "REPAIRED" for g in gaps
        ):
            return gaps
        return None

    until(lambda: repaired("SKIPPED_IDS", "RECONNECT"), "the dropped ids and the outage repaired")
    faults.restart("ingestor")
    faults.wait_ready("ingestor")
    end_ms = int(time.time() * 1000)

    def recorded_past_the_window() -> bool:
        ticks = lake.ticks(end_ms)
        return all((newest_ms(ticks, t) or 0) > end_ms for t in TICKERS)

    until(recorded_past_the_window, "every market recorded again after the restart")
    gaps = until(lambda: repaired("SKIPPED_IDS", "RECONNECT"), "every gap repaired")

    by_cause = {(g[Gaps.TICKER], g[Gaps.CAUSE]): g for g in gaps}
    dropped = by_cause[(DROPPED, "SKIPPED_IDS")]
    assert (dropped[Gaps.MISSING_IDS], dropped[Gaps.TRADES_RECOVERED]) == (3, 3)
    assert (CUT, "RECONNECT") in by_cause
    assert all(g[Gaps.CAUSE] in ("SKIPPED_IDS", "RECONNECT", "RESTART") for g in gaps)

    # market.ticks equals the simulator's trades over the window, trade for trade.
    stored = lake.ticks(begin_ms).to_pylist()
    model = MarketModel()
    for ticker in TICKERS:
        symbol = ticker.split(":")[1]
        want = [
            (str(t.id), float(t.price), float(t.qty), t.time_ms)
            for t in model.iter_trades(symbol, begin_ms, end_ms)
        ]
        got = sorted(
            (
                r[Ticks.TRADE_ID],
                r[Ticks.PRICE],
                r[Ticks.AMOUNT],
                int(r[Ticks.TRADE_TIME].timestamp() * 1000),
            )
            for r in stored
            if r[Ticks.TICKER] == ticker
            and begin_ms <= r[Ticks.TRADE_TIME].timestamp() * 1000 <= end_ms
        )
        assert got == sorted(want), f"{ticker}: {len(got)} stored, {len(want)} traded"

    # The one-minute candles over the dropped ids were rebuilt complete.
    window = dropped[Gaps.FROM_TIME].timestamp() * 1000 // 60_000 * 60_000

    def rebuilt() -> bool:
        rows = lake.rows(
            contracts.ICEBERG_OHLC,
            f"{Ohlc.TICKER} = '{DROPPED}' AND {Ohlc.PERIOD_SECONDS} = 60"
            f" AND {Ohlc.OPEN_TIME} >= '{iso(window)}'",
        )
        to_ms = dropped[Gaps.TO_TIME].timestamp() * 1000
        over = [
            r
            for r in (rows.to_pylist() if rows is not None else [])
            if r[Ohlc.OPEN_TIME].timestamp() * 1000 <= to_ms
        ]
        return bool(over) and not any(r[Ohlc.INCOMPLETE] for r in over)

    until(rebuilt, "the candles over the dropped ids stored complete")
