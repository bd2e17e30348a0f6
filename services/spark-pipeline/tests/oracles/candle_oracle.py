"""The stored (event-time) candle, the oracle the Spark aggregation must match.

A candle of period P covers trade times [open_time, open_time + P) with
open_time = floor(trade_time / P) * P (epoch-aligned, UTC). Ticks are ordered by
*trade time*, not by arrival: open is the price of the earliest trade, close the
price of the latest, ties broken by trade id (numeric ids compare numerically).
Duplicate ticks (same ticker and trade id) count once.

`pipeline/live.py` builds the same definition out of Spark's min_by/max_by; the
tests check both against hand-computed values. CEP's `ArrivalCandle` differs on
purpose (docs/cep.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from pipeline.candle_close import Trade


class TradeLike(Trade, Protocol):
    """What the math needs of a tick (``mdproto.messages.Tick`` fits)."""

    @property
    def ticker(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Candle:
    ticker: str
    period_seconds: int
    open_time_ms: int
    open: float
    high: float
    low: float
    close: float
    volume: float
    trade_count: int

    @property
    def close_time_ms(self) -> int:
        return self.open_time_ms + self.period_seconds * 1000


def window_start_ms(timestamp_ms: int, period_seconds: int) -> int:
    """Epoch-aligned start of the period that contains ``timestamp_ms``."""
    width = period_seconds * 1000
    return timestamp_ms - timestamp_ms % width


def trade_order(timestamp_ms: int, trade_id: str) -> tuple[int, int, str]:
    """Sort key of a trade: time, then id (shorter first, so "9" < "10")."""
    return (timestamp_ms, len(trade_id), trade_id)


def aggregate(ticks: Iterable[TradeLike], periods: Sequence[int]) -> list[Candle]:
    """All candles of ``ticks`` for each period, sorted by (ticker, period, open_time)."""
    seen: set[tuple[str, str]] = set()
    groups: dict[tuple[str, int, int], list[TradeLike]] = {}
    for tick in ticks:
        key = (tick.ticker, tick.trade_id)
        if key in seen:
            continue
        seen.add(key)
        for period in periods:
            start = window_start_ms(tick.timestamp_ms, period)
            groups.setdefault((tick.ticker, period, start), []).append(tick)
    candles = []
    for (ticker, period, start), trades in sorted(groups.items()):
        ordered = sorted(trades, key=lambda t: trade_order(t.timestamp_ms, t.trade_id))
        prices = [t.price for t in ordered]
        candles.append(
            Candle(
                ticker=ticker,
                period_seconds=period,
                open_time_ms=start,
                open=prices[0],
                high=max(prices),
                low=min(prices),
                close=prices[-1],
                volume=sum(t.amount for t in ordered),
                trade_count=len(ordered),
            )
        )
    return candles
