"""Closed candles of one period from ticks, for triggers on a candle period.

A candle closes when a tick of a later candle arrives, or when processing time
passes its end plus a grace period (`flush`), so an idle market still closes
it. Ticks of a candle that is already closed are late and ignored (`late`
counts them). The first candle after a trigger's registration may be partial.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass  # no slots: pickled in every snapshot, __dict__ is the fast path
class Candle:
    open_time_ms: int
    open: float
    high: float
    low: float
    close: float
    volume: float
    trades: int = 1


class CandleBuilder:
    __slots__ = ("_closed_until", "_current", "late", "period_ms")

    def __init__(self, period_seconds: int) -> None:
        self.period_ms = period_seconds * 1000
        self._current: Candle | None = None
        self._closed_until = 0  # ticks before this belong to closed candles
        self.late = 0

    def add(self, time_ms: int, price: float, amount: float) -> list[Candle]:
        """Fold in one tick; returns the candle it closed, if any."""
        if time_ms < self._closed_until:
            self.late += 1
            return []
        open_time = time_ms - time_ms % self.period_ms
        current = self._current
        if current is not None and open_time == current.open_time_ms:
            current.high = max(current.high, price)
            current.low = min(current.low, price)
            current.close = price
            current.volume += amount
            current.trades += 1
            return []
        closed: list[Candle] = []
        if current is not None:
            if open_time < current.open_time_ms:  # earlier candle, never closed: late too
                self.late += 1
                return []
            closed.append(self._close(current))
        self._current = Candle(open_time, price, price, price, price, amount)
        return closed

    def flush(self, now_ms: int, grace_ms: int) -> list[Candle]:
        """Close the open candle once processing time is past its end plus grace."""
        current = self._current
        if current is None or now_ms < current.open_time_ms + self.period_ms + grace_ms:
            return []
        return [self._close(current)]

    def close_time(self, candle: Candle) -> int:
        return candle.open_time_ms + self.period_ms

    def _close(self, candle: Candle) -> Candle:
        self._current = None
        self._closed_until = candle.open_time_ms + self.period_ms
        return candle
