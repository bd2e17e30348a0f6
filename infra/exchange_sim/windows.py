"""Candle windows shared by the newest-first front-ends (OKX, Bybit).

Why one helper: OKX and Bybit both answer a window with its NEWEST ``limit``
candles, newest first, defaulting the window's low end to ``limit`` periods
below its high end; only the bounds' inclusivity and the row layout differ,
and those stay in the front-ends.
"""

from __future__ import annotations

import asyncio

from .model import Kline, interval_ms
from .state import SimState


async def newest_first(
    state: SimState,
    symbol: str,
    interval: str,
    low: int | None,
    high: int | None,
    limit: int,
) -> list[Kline]:
    """The newest ``limit`` candles opening in ``[low, high]`` (both inclusive), newest first.

    ``high`` defaults to (and is capped at) now; ``low`` defaults to ``limit``
    periods below ``high``. An empty window gives no rows.
    """
    now = state.clock.now_ms()
    top = min(now, high) if high is not None else now
    bottom = low if low is not None else top - limit * interval_ms(interval)
    if bottom > top:
        return []
    rows = await asyncio.to_thread(state.model.klines, symbol, interval, bottom, top, now)
    return list(reversed(rows))[:limit]
