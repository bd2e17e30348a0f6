"""24 h tickers, the figures every venue's ticker endpoint reports (README "Tickers").

Why one module: the five front-ends serve the same statistics in their own wire formats,
and the ingestor's `recording.top` ranks markets by them, so all of them must come from
the model the same way. A market's 24 h are the 1,440 closed minutes before the minute
containing now (`MarketModel.rolling_day`): exact, recomputable by a test, and never the
current minute's trades (generating a hot universe market's minute takes seconds).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from .model import Kline, MarketModel, SymbolSpec, fmt8
from .state import SimState


@dataclass(frozen=True, slots=True)
class DayTicker:
    """One market's 24 h; ``day`` None: nothing traded in them (volumes 0)."""

    spec: SymbolSpec
    day: Kline | None
    now_ms: int
    first_id: int | None  # the window's first model trade id (None: no trade)

    def text(self, field: str) -> str:
        """``open``/``high``/``low``/``close``/``volume``/``quote_volume`` with 8
        decimals ("0.00000000" without trades)."""
        value = getattr(self.day, field) if self.day is not None else Decimal(0)
        return fmt8(value)

    @property
    def trades(self) -> int:
        return self.day.trades if self.day is not None else 0

    @property
    def vwap(self) -> Decimal:
        """Quote volume / base volume (0 without trades)."""
        if self.day is None or not self.day.volume:
            return Decimal(0)
        return self.day.quote_volume / self.day.volume

    @property
    def change(self) -> Decimal:
        return self.day.close - self.day.open if self.day is not None else Decimal(0)

    @property
    def change_ratio(self) -> Decimal:
        """(close - open) / open, 0 without trades."""
        if self.day is None or not self.day.open:
            return Decimal(0)
        return self.change / self.day.open


def day_ticker(model: MarketModel, spec: SymbolSpec, now_ms: int, *, ids: bool) -> DayTicker:
    """``spec``'s 24 h before ``now_ms``'s minute; with ``ids`` its first trade id too."""
    day = model.rolling_day(spec.symbol, now_ms)
    first_id = None
    if ids and day is not None:
        first_id = model.first_trade_id(spec.symbol, day.open_time)
    return DayTicker(spec, day, now_ms, first_id)


async def day_tickers(
    state: SimState, specs: Iterable[SymbolSpec] | None = None, *, ids: bool = False
) -> list[DayTicker]:
    """The tickers of ``specs`` (default: every market trading now), computed in a worker
    thread. The first call of a process reads two days of bars per market (~0.05 s
    each); ``ids`` (Binance's ``firstId``/``lastId``) counts a default market's trade
    ids too (~0.4 s each, once; a universe market's are closed-form)."""
    now = state.clock.now_ms()
    model = state.model
    chosen = [s for s in (model.specs.values() if specs is None else specs) if s.trading_at(now)]
    return await asyncio.to_thread(lambda: [day_ticker(model, s, now, ids=ids) for s in chosen])
