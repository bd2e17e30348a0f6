"""Recording through the whole platform, with no client subscribed.

The e2e stack records LINK, DOT and LTC of the simulated Binance
(`infra.testing.E2E_RECORDED`). The simulator drops trade ids of one market and cuts
another's websocket; then the ingestor is restarted. Each fault is found and repaired
from the exchange's trade history, and afterwards Iceberg `market.ticks` equals the
simulator's own trades over the whole window, trade for trade, with no duplicate;
`market.gaps` lists the faults REPAIRED, and the stored one-minute candles over the
repaired stretches are complete. (`bench/recording_drill.py` runs the longer drill:
three exchanges, ten minutes, a kill.)
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from infra.exchange_sim.control import SimulatorControl
from infra.exchange_sim.model import MarketModel
from infra.platform.faults import Faults
from infra.platform.supervisor import PlatformEndpoints
from infra.testing import E2E_RECORDED, RecordedLake, RecordingCheck, check_recording, epoch_ms
from mdproto.tables import Gaps

pytestmark = [pytest.mark.e2e, pytest.mark.stack, pytest.mark.spark, pytest.mark.timeout(1200)]

TICKERS = [f"BINANCE:{s}" for s in E2E_RECORDED]
DROPPED, CUT, _ = TICKERS
WAIT_S = 300.0
#: The cut starts this long after the test asks for it, at most (the request's way to
#: the simulator; with 1 s, a CI run's outage once made no gap: a late start is the
#: likely cause), and ends this long after the last trade it must miss.
CUT_LEAD_MS, CUT_TAIL_MS = 3_000, 2_000
#: Trades of the cut market the cut must miss: the ids then skip, so a gap is found.
CUT_MISSES = 2
T = TypeVar("T")


def until(
    condition: Callable[[], T | None],
    what: str,
    timeout_s: float = WAIT_S,
    seen: Callable[[], object] = lambda: None,
) -> T:
    """Poll `condition` (a table read) every second until it returns something true;
    on timeout the message carries what `seen` reads then."""
    deadline = time.monotonic() + timeout_s
    while not (result := condition()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what}; seen: {seen()}")
        time.sleep(1.0)
    return result


def cut_seconds(model: MarketModel, symbol: str, now_ms: int) -> float:
    """A websocket cut from `now_ms` that misses CUT_MISSES of the model's trades of
    `symbol`: the trades are the model's, so the cut is as long as that takes (a fixed
    5 s cut of DOT, ~15 trades a minute, missed none about one run in four)."""
    after = model.iter_trades(symbol, now_ms + CUT_LEAD_MS, now_ms + 3_600_000)
    missed = [t.time_ms for t in itertools.islice(after, CUT_MISSES)]
    assert len(missed) == CUT_MISSES, f"{symbol} trades fewer than {CUT_MISSES} times an hour"
    return (missed[-1] + CUT_TAIL_MS - now_ms) / 1000


def test_a_recorded_universe_survives_dropped_ids_an_outage_and_a_restart(
    endpoints: PlatformEndpoints, sim: SimulatorControl, faults: Faults
) -> None:
    stack = endpoints.stack
    lake = RecordedLake(stack.catalog_name, stack.pyiceberg_catalog_properties(), TICKERS)

    def every_market_stored() -> dict[str, int] | None:
        newest = lake.newest_ms()
        return newest if len(newest) == len(TICKERS) else None

    # The window starts once every market's recording reached Iceberg.
    begin_ms = max(until(every_market_stored, "the recorded markets in market.ticks").values())

    sim.trade_drop(DROPPED.split(":")[1], count=3, exchange="binance")
    model = MarketModel()
    cut = CUT.split(":")[1]
    seconds = cut_seconds(model, cut, int(time.time() * 1000))
    assert sim.ws_outage(symbol=cut, exchange="binance", seconds=seconds) > 0

    def repaired(*causes: str) -> list[dict[str, Any]] | None:
        gaps = lake.gaps(begin_ms)
        if {g[Gaps.CAUSE] for g in gaps} >= set(causes) and all(
            g[Gaps.STATUS] == "REPAIRED" for g in gaps
        ):
            return gaps
        return None

    def gaps_now() -> list[tuple[Any, ...]]:
        return [(g[Gaps.TICKER], g[Gaps.CAUSE], g[Gaps.STATUS]) for g in lake.gaps(begin_ms)]

    until(
        lambda: repaired("SKIPPED_IDS", "RECONNECT"),
        "the dropped ids and the outage repaired",
        seen=gaps_now,
    )
    faults.restart("ingestor")
    faults.wait_ready("ingestor")
    end_ms = int(time.time() * 1000)

    def recorded_past_the_window() -> bool:
        newest = lake.newest_ms(end_ms)
        return all(newest.get(t, 0) > end_ms for t in TICKERS)

    until(recorded_past_the_window, "every market recorded again after the restart")
    gaps = until(lambda: repaired("SKIPPED_IDS", "RECONNECT"), "every gap repaired", seen=gaps_now)

    by_cause = {(g[Gaps.TICKER], g[Gaps.CAUSE]): g for g in gaps}
    dropped = by_cause[(DROPPED, "SKIPPED_IDS")]
    assert (dropped[Gaps.MISSING_IDS], dropped[Gaps.TRADES_RECOVERED]) == (3, 3)
    assert (CUT, "RECONNECT") in by_cause
    assert all(g[Gaps.CAUSE] in ("SKIPPED_IDS", "RECONNECT", "RESTART") for g in gaps)

    # market.ticks equals the simulator's trades over the window, trade for trade (the
    # gaps query stores a REPAIRED before ticks-persist stores the repair's trades).
    traded = {t: list(model.iter_trades(t.split(":")[1], begin_ms, end_ms)) for t in TICKERS}

    def checks() -> list[RecordingCheck]:
        ticks = lake.ticks(begin_ms)
        return [check_recording(ticks, gaps, t, traded[t], begin_ms, end_ms) for t in TICKERS]

    def missing_where() -> str:
        """The checks, each missing trade wherever ticks stores it, and the gaps."""
        now = checks()
        missing = [i for c in now for i in c.missing]
        return f"{now}; missing ids stored as {lake.trades(missing)}; gaps {gaps}"

    until(lambda: all(c.ok for c in checks()), "ticks equal to the trades", seen=missing_where)
    assert all(c.traded > 0 for c in checks())

    # The one-minute candles over the dropped ids were rebuilt complete.
    span = (epoch_ms(dropped[Gaps.FROM_TIME]), epoch_ms(dropped[Gaps.TO_TIME]))

    def complete() -> bool:
        stored, incomplete = lake.candles_over(DROPPED, 60, *span)
        return stored > 0 and incomplete == 0

    until(complete, "the candles over the dropped ids stored complete")
