"""Closing candles on event time, one ticker at a time.

Pure (no Kafka, no Spark): ``live_candles.LiveCandles`` keeps one
``TickerCandles`` per ticker inside the live engine; the unit tests drive it
directly.

Rules (docs/protocol.md "What the pipeline announces"):

- The **frontier** is the latest trade time seen for the ticker. A window
  ``[start, end)`` closes as soon as the frontier reaches ``end`` (a trade of a
  later window arrived) or, when the ticker goes quiet, once the frontier plus
  the quiet time beyond ``idle_s`` reaches ``end``: event time is assumed to
  run on with the wall clock. No watermark wait.
- Trades are deduplicated by trade id among the trades not older than
  ``lateness_s`` behind the frontier; an older trade is **too late**: it misses
  its candles (it is still stored in ``ticks``). The ids are kept in one-second
  buckets of trade time, dropped once behind the lateness: what a snapshot holds
  is the lateness's worth of trades, not a whole window's.
- A trade within the lateness for a window that already closed amends it;
  the amended candle is emitted again with ``correction = True``.
- Open/close by (trade time, length of id, id): trade-time order whatever the
  arrival order (tests/oracles/candle_oracle.py).
- A trade that follows a gap in the feed (``Tick.gap_before``) makes every window
  between the newest trade before it and itself **incomplete**: trades of those
  windows may be missing. A window already published closed is emitted again as a
  correction, now incomplete (docs/protocol.md "What the pipeline announces").

A window is emitted closed once, then once per ``advance`` after a trade amended
it. The state round-trips through plain dicts (the engine's snapshot), so a
restored ticker continues exactly where the snapshot left it.

``advance`` runs for every ticker of every batch, and most calls have nothing to
do: each ticker keeps the earliest end of a window still to emit (``next_us``) and
the earliest point past which something can be dropped (``drop_us``), kept exact
(or lower) wherever a window or an id bucket is added, and recomputed by the pass
over the windows that only runs when one of them is reached.

A batch is aggregated per *slice* (the greatest common divisor of the periods:
every window of every period is a whole number of slices) before it touches the
windows: per trade, one slice is updated, not one window per period; each slice
is then merged once into the window of each period that holds it. The result is
the trade-at-a-time one (open/close/high/low/count exactly; volume up to float
rounding, the sum's order being the batch's).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from math import gcd
from typing import Any, Protocol

TradeKey = tuple[int, int, str]  # (trade time us, len(trade_id), trade_id)

US = 1_000_000
#: Trade ids are kept (and dropped) in buckets of this much trade time.
ID_BUCKET_US = US
#: ``next_us`` / ``drop_us`` when nothing is waiting.
NEVER = 1 << 62


class Trade(Protocol):
    """What a trade needs to count (``mdproto.messages.Tick`` has it)."""

    @property
    def trade_id(self) -> str: ...
    @property
    def price(self) -> float: ...
    @property
    def amount(self) -> float: ...
    @property
    def timestamp_ms(self) -> int: ...
    @property
    def gap_before(self) -> bool: ...


@dataclass(slots=True)
class Window:
    """One candle being built; ``emitted`` once published closed, ``dirty`` if amended since;
    ``incomplete`` if the feed may have missed some of its trades."""

    open: float
    open_key: TradeKey
    high: float
    low: float
    close: float
    close_key: TradeKey
    volume: float
    count: int
    emitted: bool = False
    dirty: bool = False
    incomplete: bool = False

    def add(self, price: float, amount: float, key: TradeKey) -> None:
        if key < self.open_key:
            self.open, self.open_key = price, key
        if key > self.close_key:
            self.close, self.close_key = price, key
        if price > self.high:
            self.high = price
        if price < self.low:
            self.low = price
        self.volume += amount
        self.count += 1
        if self.emitted:
            self.dirty = True

    def merge(self, part: Window) -> None:
        """`add` of every trade of ``part`` (a batch's trades in one slice)."""
        if part.open_key < self.open_key:
            self.open, self.open_key = part.open, part.open_key
        if part.close_key > self.close_key:
            self.close, self.close_key = part.close, part.close_key
        if part.high > self.high:
            self.high = part.high
        if part.low < self.low:
            self.low = part.low
        self.volume += part.volume
        self.count += part.count
        if self.emitted:
            self.dirty = True

    def mark_incomplete(self) -> None:
        if not self.incomplete:
            self.incomplete = True
            self.dirty = self.emitted


@dataclass(frozen=True, slots=True)
class Closing:
    """The knobs: candle periods (s), accepted lateness (s), quiet time before idle close (s)."""

    periods: tuple[int, ...]
    lateness_s: float
    idle_s: float
    #: Derived once: read for every trade.
    base_us: int = field(init=False)
    slice_us: int = field(init=False)  # every period's width is a multiple of it
    lateness_us: int = field(init=False)
    widths: tuple[tuple[int, int], ...] = field(init=False)  # (period s, period us)

    def __post_init__(self) -> None:
        object.__setattr__(self, "base_us", min(self.periods) * US)
        object.__setattr__(self, "slice_us", gcd(*self.periods) * US)
        object.__setattr__(self, "lateness_us", round(self.lateness_s * US))
        object.__setattr__(self, "widths", tuple((p, p * US) for p in self.periods))


@dataclass
class TickerCandles:
    """Everything kept for one ticker between micro-batches."""

    exchange: str = ""
    symbol: str = ""
    frontier_us: int | None = None
    closed_until_us: int = 0
    last_arrival_ms: int = 0
    windows: dict[tuple[int, int], Window] = field(default_factory=dict)
    #: trade ids by the start of their bucket of trade time, for deduplication
    ids: dict[int, set[str]] = field(default_factory=dict)
    too_late: int = 0
    #: The buckets' width: `ID_BUCKET_US`, or the shortest period's in a snapshot from
    #: before the buckets (kept until those have gone).
    id_width_us: int = ID_BUCKET_US
    #: Derived, never saved: the earliest end of a window not emitted or amended since,
    #: and the earliest frontier minus lateness at which a window or id bucket goes.
    next_us: int = field(default=NEVER, init=False, repr=False, compare=False)
    drop_us: int = field(default=NEVER, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._reindex()

    def _reindex(self) -> None:
        """`next_us` and `drop_us` from the windows and ids as they are."""
        next_us = drop_us = NEVER
        for (period, start), w in self.windows.items():
            end = start + period * US
            if not w.emitted or w.dirty:
                next_us = min(next_us, end)
            if w.emitted:
                drop_us = min(drop_us, end)
        if self.ids:
            drop_us = min(drop_us, min(self.ids) + self.id_width_us)
        self.next_us, self.drop_us = next_us, drop_us

    def add(self, cfg: Closing, trades: Iterable[Trade]) -> set[int]:
        """Count the trades (in arrival order) in their windows; the starts (us) of the
        slices that got one. A trade too late or re-delivered is not counted.

        A trade with ``gap_before`` follows a hole in the feed: the trades between the
        newest one so far and it may be missing, so the windows in between are marked
        incomplete (after the trades before it are in the windows, as one at a time)."""
        lateness_us, id_width, slice_us = cfg.lateness_us, self.id_width_us, cfg.slice_us
        frontier, ids = self.frontier_us, self.ids
        parts: dict[int, Window] = {}  # slice start -> its trades of this batch
        changed: set[int] = set()
        for t in trades:
            t_us = t.timestamp_ms * 1000
            if frontier is not None and t_us < frontier - lateness_us:
                self.too_late += 1
                continue
            trade_id = t.trade_id
            bucket = t_us - t_us % id_width
            seen = ids.get(bucket)
            if seen is None:
                seen = ids[bucket] = set()
                if bucket + id_width < self.drop_us:
                    self.drop_us = bucket + id_width
            elif trade_id in seen:
                continue
            seen.add(trade_id)
            key = (t_us, len(trade_id), trade_id)
            price, at = t.price, t_us - t_us % slice_us
            part = parts.get(at)
            if part is None:
                parts[at] = Window(price, key, price, price, price, key, t.amount, 1)
            else:
                part.add(price, t.amount, key)
            if t.gap_before:
                changed.update(self._merge(cfg, parts))
                parts = {}
                self._mark_incomplete(t_us if frontier is None else min(frontier, t_us), t_us)
            if frontier is None or t_us > frontier:
                frontier = t_us
        self.frontier_us = frontier
        changed.update(self._merge(cfg, parts))
        return changed

    def _merge(self, cfg: Closing, parts: dict[int, Window]) -> Iterable[int]:
        """Each slice's trades into the window of each period that holds it."""
        windows, next_us = self.windows, self.next_us
        for at, part in parts.items():
            for period, width in cfg.widths:
                where = (period, at - at % width)
                window = windows.get(where)
                if window is None:
                    windows[where] = Window(
                        *(part.open, part.open_key, part.high, part.low, part.close),
                        *(part.close_key, part.volume, part.count),
                    )
                else:
                    window.merge(part)
                    if not window.emitted:
                        continue  # its end was counted when it opened
                end = where[1] + width
                if end < next_us:
                    next_us = end
        self.next_us = next_us
        return parts.keys()

    def _mark_incomplete(self, since_us: int, until_us: int) -> None:
        for (period, start), window in self.windows.items():
            if start <= until_us and start + period * US > since_us:
                window.mark_incomplete()
                if window.dirty:
                    self.next_us = min(self.next_us, start + period * US)

    def advance(self, cfg: Closing, now_ms: int) -> list[tuple[int, int, Window, bool]]:
        """Close what is due at ``now_ms``: (period, start us, window, is_correction)."""
        if self.frontier_us is None:
            return []
        quiet_ms = max(0, now_ms - self.last_arrival_ms - round(cfg.idle_s * 1000))
        self.closed_until_us = max(self.closed_until_us, self.frontier_us + quiet_ms * 1000)
        horizon = self.frontier_us - cfg.lateness_us
        if self.next_us > self.closed_until_us and horizon < self.drop_us:
            return []  # no window to emit, nothing to drop: most calls
        out: list[tuple[int, int, Window, bool]] = []
        for (period, start), window in sorted(self.windows.items()):
            end = start + period * US
            if end > self.closed_until_us:
                continue
            if not window.emitted:
                window.emitted = True
                out.append((period, start, window, False))
            elif window.dirty:
                out.append((period, start, window, True))
            window.dirty = False
        # Dropped in place: the state is not copied.
        windows, ids, width = self.windows, self.ids, self.id_width_us
        for k in [k for k, w in windows.items() if k[1] + k[0] * US <= horizon and w.emitted]:
            del windows[k]
        for b in [b for b in ids if b + width <= horizon]:
            del ids[b]
        if not ids:
            self.id_width_us = ID_BUCKET_US
        self._reindex()
        return out

    def idle_due_ms(self, cfg: Closing) -> int | None:
        """When (processing time, ms) the quiet time closes the next open window if no
        trade comes; None: nothing open. (Early, never late, while an amended window
        waits for its `advance`: that call then finds the true time.)"""
        if self.next_us == NEVER or self.frontier_us is None:
            return None
        wait_ms = max(0, -(-(self.next_us - self.frontier_us) // 1000))
        return self.last_arrival_ms + round(cfg.idle_s * 1000) + wait_ms

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data (short keys: a snapshot holds every ticker's)."""
        return {
            "x": self.exchange,
            "s": self.symbol,
            "f": self.frontier_us,
            "c": self.closed_until_us,
            "a": self.last_arrival_ms,
            "w": [
                [
                    *(p, s, w.open, list(w.open_key), w.high, w.low, w.close),
                    *(list(w.close_key), w.volume, w.count, w.emitted, w.dirty),
                    w.incomplete,
                ]
                for (p, s), w in self.windows.items()
            ],
            "i": {str(b): list(ids) for b, ids in self.ids.items()},
            "iw": self.id_width_us,
            "l": self.too_late,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], cfg: Closing) -> TickerCandles:
        """`to_dict`'s; a snapshot from before the id buckets (no ``iw``) kept its ids by
        the start of the shortest period's window (`cfg`'s)."""
        windows = {
            (w[0], w[1]): Window(
                *(w[2], _key(w[3]), w[4], w[5], w[6], _key(w[7]), w[8], w[9], w[10], w[11]),
                bool(w[12]) if len(w) > 12 else False,  # snapshots from before the flag
            )
            for w in d["w"]
        }
        ids = {int(b): set(v) for b, v in d["i"].items()}
        return cls(
            d["x"], d["s"], d["f"], d["c"], d["a"], windows, ids, d.get("l", 0),
            d.get("iw", cfg.base_us),
        )  # fmt: skip


def _key(raw: list[Any]) -> TradeKey:
    return (int(raw[0]), int(raw[1]), str(raw[2]))
