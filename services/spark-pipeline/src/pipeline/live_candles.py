"""Live candles of every ticker: previews, closes and corrections, as OHLC messages.

Pure (no Kafka, no sockets): the live engine (``live_engine.py``) feeds it the
decoded ticks and the clock, publishes what it returns and keeps its snapshot.
The per-ticker rules (event-time close, idle timeout, lateness, corrections,
trade-time open/close) are ``candle_close.TickerCandles``'.

- ``add`` returns a preview (``closed=false``) of every open window the ticks
  changed: one message per window per call, however many trades it got, and with
  ``preview_every_ms`` at most one round of previews per that much time (the
  windows changed meanwhile wait for the next call after it, with their latest
  values): the previews' cost then follows the windows, not the batches.
  Re-deliveries are dropped by trade id, so a preview never counts a trade twice.
- ``close_due`` returns each window once as ``closed=true`` when it closes, and
  again with ``correction=true`` after a late trade amended it or a trade after a
  feed gap (``Tick.gap_before``) made it ``incomplete``.
- While the engine catches up on a backlog (``idle=False``) only event time
  closes windows: a ticker whose trades are further down the backlog must not
  look idle.
- ``close_due`` looks only at the tickers that got trades since the last call and
  at those whose idle close is due (a heap of due times): its cost follows the
  trades, not the number of tickers, however often it is called.
"""

from __future__ import annotations

import heapq
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
    #: At most one round of previews per this many ms (0: every call).
    preview_every_ms: int = 0
    #: Windows changed since the last round of previews, and when that was.
    pending: dict[tuple[str, int, int], None] = field(default_factory=dict)
    previewed_ms: int = 0
    #: Tickers with trades since the last `close_due`; each ticker's idle close (ms of
    #: processing time) as scheduled, and the heap of them (stale entries skipped).
    touched: set[str] = field(default_factory=set)
    idle_due: dict[str, int] = field(default_factory=dict)
    heap: list[tuple[int, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for ticker, candles in self.tickers.items():
            self._schedule(ticker, candles)

    def put(self, ticker: str, candles: TickerCandles) -> None:
        """A ticker's restored windows (their idle close scheduled)."""
        self.tickers[ticker] = candles
        self._schedule(ticker, candles)

    def drop(self, ticker: str) -> None:
        """Forget a ticker (its partition went to another engine)."""
        self.tickers.pop(ticker, None)
        self.idle_due.pop(ticker, None)

    def add(self, ticks: Iterable[Tick], now_ms: int) -> list[OHLC]:
        """Count validated ticks in their windows; previews of the open windows they changed."""
        by_ticker: dict[str, list[Tick]] = {}
        for t in ticks:
            same = by_ticker.get(t.ticker)
            if same is None:
                by_ticker[t.ticker] = [t]
            else:
                same.append(t)
        cfg, tickers, pending = self.cfg, self.tickers, self.pending
        for ticker, trades in by_ticker.items():
            candles = tickers.get(ticker)
            if candles is None:
                exchange, symbol = records.split_ticker(ticker) or ("", "")
                candles = tickers[ticker] = TickerCandles(exchange, symbol)
            candles.last_arrival_ms = now_ms
            self.touched.add(ticker)
            for at in candles.add(cfg, trades):
                for period, width in cfg.widths:
                    pending[(ticker, period, at - at % width)] = None
        if not pending or now_ms - self.previewed_ms < self.preview_every_ms:
            return []
        previews = []
        for ticker, period, start in pending:
            candles = tickers.get(ticker)  # None: its partition went to another engine
            window = candles.windows.get((period, start)) if candles is not None else None
            if window is not None and not window.emitted:
                previews.append(candle(ticker, period, start, window, closed=False))
        pending.clear()
        self.previewed_ms = now_ms
        return previews

    def close_due(self, now_ms: int, *, idle: bool = True) -> list[OHLC]:
        """Windows closed (or amended) by now; ``idle=False``: by event time only."""
        names, self.touched = self.touched, set()
        if idle:
            names |= self._due_by(now_ms)
        out: list[OHLC] = []
        cfg, tickers = self.cfg, self.tickers
        for ticker in sorted(names):
            candles = tickers.get(ticker)
            if candles is None:  # its partition went to another engine
                self.idle_due.pop(ticker, None)
                continue
            now = now_ms if idle else candles.last_arrival_ms
            for period, start, window, amended in candles.advance(cfg, now):
                out.append(candle(ticker, period, start, window, closed=True, correction=amended))
            self._schedule(ticker, candles)
        return out

    def next_due_ms(self, now_ms: int) -> int | None:
        """Milliseconds until the next idle close (None: no window is open)."""
        heap = self.heap
        while heap and self.idle_due.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        return max(1, heap[0][0] - now_ms) if heap else None

    def _due_by(self, now_ms: int) -> set[str]:
        """The tickers whose idle close is due by `now_ms` (taken off the heap). An entry
        may be early (`_schedule`): its ticker's time is taken again, and put back if
        trades came since."""
        due, heap, idle_due, tickers = set(), self.heap, self.idle_due, self.tickers
        while heap and heap[0][0] <= now_ms:
            at, ticker = heapq.heappop(heap)
            if idle_due.get(ticker) != at:
                continue  # a stale entry: the ticker was rescheduled or dropped
            candles = tickers.get(ticker)
            now_at = candles.idle_due_ms(self.cfg) if candles is not None else None
            if now_at is not None and now_at > now_ms:
                idle_due[ticker] = now_at
                heapq.heappush(heap, (now_at, ticker))
            else:
                del idle_due[ticker]  # off the heap: `close_due` schedules it again
                due.add(ticker)
        return due

    def _schedule(self, ticker: str, candles: TickerCandles) -> None:
        """Schedule the ticker's idle close. An entry already due no later stays: a
        ticker that trades pushes its time back at every batch, and one entry per quiet
        spell, taken again when due (`_due_by`), costs less than one per batch."""
        at = candles.idle_due_ms(self.cfg)
        if at is None:
            self.idle_due.pop(ticker, None)
            return
        scheduled = self.idle_due.get(ticker)
        if scheduled is None or at < scheduled:
            self.idle_due[ticker] = at
            heapq.heappush(self.heap, (at, ticker))

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
