"""Arrival-order candles of one period, for triggers on a candle period.

Open/close are the first and last tick *seen*; a candle closes when a tick of a
later candle arrives or, for an idle market, when processing time passes its end
plus a grace (`flush`), so a trigger never waits for a watermark. Later ticks of
a closed candle are ignored (`late`). The stored `ohlc` candle is event-time and
can differ (docs/cep.md, "Two candles, two meanings").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass  # no slots: pickled in every snapshot, __dict__ is the fast path
class ArrivalCandle:
    open_time_ms: int
    open: float
    high: float
    low: float
    close: float
    volume: float
    trades: int = 1


Candle = ArrivalCandle  # the name pickled in snapshots written before the rename


class CandleBuilder:
    __slots__ = ("_closed_until", "_current", "late", "period_ms")

    def __init__(self, period_seconds: int) -> None:
        self.period_ms = period_seconds * 1000
        self._current: ArrivalCandle | None = None
        self._closed_until = 0  # ticks before this belong to closed candles
        self.late = 0

    def add(self, time_ms: int, price: float, amount: float) -> list[ArrivalCandle]:
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
        closed: list[ArrivalCandle] = []
        if current is not None:
            if open_time < current.open_time_ms:  # earlier candle, never closed: late too
                self.late += 1
                return []
            closed.append(self._close(current))
        self._current = ArrivalCandle(open_time, price, price, price, price, amount)
        return closed

    def flush(self, now_ms: int, grace_ms: int) -> list[ArrivalCandle]:
        """Close the open candle once processing time is past its end plus grace."""
        current = self._current
        if current is None or now_ms < current.open_time_ms + self.period_ms + grace_ms:
            return []
        return [self._close(current)]

    def dump(self) -> dict[str, Any]:
        """The open candle and what is closed (JSON: the live engine's partition state)."""
        current = None if self._current is None else dataclasses.astuple(self._current)
        return {"current": current, "closed_until": self._closed_until, "late": self.late}

    def load(self, d: dict[str, Any]) -> None:
        current = d["current"]
        self._current = None if current is None else ArrivalCandle(*current)
        self._closed_until = int(d["closed_until"])
        self.late = int(d["late"])

    def close_time(self, candle: ArrivalCandle) -> int:
        return candle.open_time_ms + self.period_ms

    def _close(self, candle: ArrivalCandle) -> ArrivalCandle:
        self._current = None
        self._closed_until = candle.open_time_ms + self.period_ms
        return candle
