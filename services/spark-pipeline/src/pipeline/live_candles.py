"""Live candles of every ticker: previews, closes and corrections, as OHLC messages.

Pure (no Kafka, no sockets): the live engine (``live_engine.py``) feeds it the
decoded ticks and the clock, publishes what it returns and keeps its snapshot.
The per-ticker rules (event-time close, idle timeout, lateness, corrections,
trade-time open/close) are ``candle_close.TickerCandles``'.

- ``add`` returns a preview (``closed=false``) of every open window the ticks
  changed: one message per window per call, however many trades it got.
  Re-deliveries are dropped by trade id, so a preview never counts a trade twice.
- ``close_due`` returns each window once as ``closed=true`` when it closes, and
  again with ``correction=true`` after a late trade amended it or a trade after a
  feed gap (``Tick.gap_before``) made it ``incomplete``.
- While the engine catches up on a backlog (``idle=False``) only event time
  closes windows: a ticker whose trades are further down the backlog must not
  look idle.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mdproto.messages import OHLC, Tick
from pipeline import records
from pipeline.candle_close import Closing, TickerCandles, Window


@dataclass
class LiveCandles:
    """Every ticker's open windows; ``snapshot``/``restore`` carry them across restarts."""

    cfg: Closing
    tickers: dict[str, TickerCandles] = field(default_factory=dict)

    def add(self, ticks: Iterable[Tick], now_ms: int) -> list[OHLC]:
        """Count validated ticks in their windows; previews of the open windows they changed."""
        by_ticker: dict[str, list[Tick]] = {}
        for t in ticks:
            same = by_ticker.get(t.ticker)
            if same is None:
                by_ticker[t.ticker] = [t]
            else:
                same.append(t)
        cfg, tickers = self.cfg, self.tickers
        previews = []
        for ticker, trades in by_ticker.items():
            candles = tickers.get(ticker)
            if candles is None:
                exchange, symbol = records.split_ticker(ticker) or ("", "")
                candles = tickers[ticker] = TickerCandles(exchange, symbol)
            candles.last_arrival_ms = now_ms
            changed = {
                (period, at - at % width)
                for at in candles.add(cfg, trades)
                for period, width in cfg.widths
            }
            windows = candles.windows
            for period, start in sorted(changed):
                window = windows.get((period, start))
                if window is not None and not window.emitted:
                    previews.append(candle(ticker, period, start, window, closed=False))
        return previews

    def close_due(self, now_ms: int, *, idle: bool = True) -> list[OHLC]:
        """Windows closed (or amended) by now; ``idle=False``: by event time only."""
        out: list[OHLC] = []
        for ticker, candles in self.tickers.items():
            now = now_ms if idle else candles.last_arrival_ms
            for period, start, window, amended in candles.advance(self.cfg, now):
                out.append(candle(ticker, period, start, window, closed=True, correction=amended))
        return out

    def next_due_ms(self, now_ms: int) -> int | None:
        """Milliseconds until the next idle close (None: no window is open)."""
        dues = [c.timeout_ms(self.cfg, now_ms) for c in self.tickers.values()]
        return min((d for d in dues if d is not None), default=None)

    def snapshot(self) -> dict[str, Any]:
        return {ticker: c.to_dict() for ticker, c in self.tickers.items()}

    @classmethod
    def restore(cls, cfg: Closing, snapshot: Mapping[str, Any]) -> LiveCandles:
        return cls(cfg, {t: TickerCandles.from_dict(d, cfg) for t, d in snapshot.items()})


def candle(
    ticker: str, period: int, start_us: int, w: Window, *, closed: bool, correction: bool = False
) -> OHLC:
    return OHLC(
        ticker=ticker,
        period_seconds=period,
        open_time_ms=start_us // 1000,
        open=w.open,
        high=w.high,
        low=w.low,
        close=w.close,
        volume=w.volume,
        trade_count=w.count,
        closed=closed,
        correction=correction,
        incomplete=w.incomplete,
    )
