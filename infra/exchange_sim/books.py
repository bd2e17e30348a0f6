"""L2 order books: a deterministic book per market and the two wire formats that carry it.

Why a pure function of (seed, symbol, step): a test recomputes the very book the
simulator served at any update id (`BookModel.book_at`), so "the platform's book
equals the exchange's, level by level" is checked without racing the stream.

The book (README "Order books"): a step every 100 ms of the simulator clock; the
update id of a step is its index (`t_ms // 100`). Around the last model trade
price `P` (in ticks), the best bid is one or two ticks below `P`, the best ask
one or two above, then `levels` price ticks per side with some holes. Each level
redraws its amount every `life` steps (5-49, per price, with a per-price phase),
so a step changes a handful of levels and a price move shifts the whole side. A
paced (universe) market's book centres on its minute's price path instead (open to
close, linear in time: `MarketModel.path_ticks`), not on the last trade (whose price
jumps around the path by up to a quarter of the minute's range, which would shift
every level at every trade), and its levels live 0.5-1.5x a mean life set by its trade
rate (`Pacing.book_ratio` level changes per trade; shorter in its burst minutes): book
traffic follows trade traffic, and the busiest markets change every level every step.

Wire formats, as the exchanges send them (fixtures: infra/tests/fixtures/books/):

- Binance spot diff depth stream `<symbol>@depth[@100ms]`:
  `{"e": "depthUpdate", "E": ms, "s": "BTCUSDT", "U": first id, "u": last id,
  "b": [["price", "qty"], ...], "a": [...]}` (qty "0.00000000" removes) and REST
  `GET /api/v3/depth` `{"lastUpdateId": id, "bids": [...], "asks": [...]}`.
- OKX `books`: `{"arg": {"channel": "books", "instId": "BTC-USDT"}, "action":
  "snapshot"|"update", "data": [{"asks": [["px", "sz", "0", "orders"], ...],
  "bids": [...], "ts": "ms", "checksum": int32, "prevSeqId": id|-1, "seqId": id}]}`.
  The checksum is OKX's: CRC32 (signed) of the top 25 levels interleaved
  `bid:size:ask:size:...`, the exchange's own strings (`okx_checksum`).
- Bybit v5 `orderbook.{depth}.{symbol}`: `{"topic", "type": "snapshot"|"delta", "ts",
  "data": {"s", "b": [["price", "size"], ...], "a": [...], "u": update id, "seq": cross
  sequence}, "cts"}`; `u` counts the topic's messages (+1 each), `seq` is the book's
  step here; only the best `depth` levels are kept (one leaving the top is sent with
  size "0").
- Kraken websocket v2 `book`: `{"channel": "book", "type": "snapshot"|"update", "data":
  [{"symbol": "BTC/USDT", "bids": [{"price": n, "qty": n}], "asks": [...], "checksum":
  uint32, "timestamp": RFC 3339}]}`, numbers written with the pair's full precision
  (`kraken_text`); the checksum is CRC32 of the best 10 asks then the best 10 bids,
  each price and qty without its "." and leading zeros (`kraken_checksum`). No
  sequence. Levels leaving the subscribed depth are not removed on the wire.
- Coinbase Exchange `level2` / `level2_batch`: `{"type": "snapshot", "product_id",
  "bids": [["price", "size"]], "asks": [...]}` then `{"type": "l2update", "product_id",
  "changes": [["buy"|"sell", "price", "size"]], "time": ISO}`. No sequence, no checksum.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import json
import re
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, NamedTuple

from .model import MarketModel, fmt8

STEP_MS = 100
DEFAULT_LEVELS = 40
CHECKSUM_LEVELS = 25  # OKX checksums the best 25 levels per side
KRAKEN_CHECKSUM_LEVELS = 10  # Kraken checksums the best 10 levels per side
_MIN_LIFE, _LIFE_SPAN = 5, 45
_HOLE = 0.15  # chance that a level below the best is empty
_PRICE_LOOKBACK_MIN = 60  # an idle market's book sits at its centre price
_PACED_CACHE = 20_000  # price levels kept per universe market before starting afresh
_MAX_LIFE = 1e6  # steps: a paced market that hardly trades keeps its levels ~a day

#: One level as the simulator keeps it: exact decimals, best first.
Level = tuple[Decimal, Decimal]


class SimBook(NamedTuple):
    """A market's whole book at one step (`step` is the exchange's update id)."""

    step: int
    bids: tuple[Level, ...]  # price descending
    asks: tuple[Level, ...]  # price ascending


@dataclass(frozen=True, slots=True)
class BookUpdate:
    """The levels that turn `before` into `after` (amount 0 removes), one stream event."""

    before: SimBook
    after: SimBook
    bids: tuple[Level, ...]
    asks: tuple[Level, ...]


def _unit(*parts: object) -> int:
    """A stable 64-bit number for `parts` (blake2b: never the salted `hash()`)."""
    key = "|".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")


_MASK64 = (1 << 64) - 1


def _mix(a: int, b: int) -> int:
    """A 64-bit hash of two integers (splitmix64's finaliser): what a paced market's
    book draws per level and epoch, ~10x cheaper than blake2b, as deterministic."""
    z = (a * 0x9E3779B97F4A7C15 + b * 0xBF58476D1CE4E5B9 + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def step_of(t_ms: int) -> int:
    return t_ms // STEP_MS


@dataclass
class _PacedState:
    """A universe market's book as last computed (``BookModel._paced_sides``): each
    price level in the window with (level, hole, the step its epoch ends), a heap of
    those ends, and the levels' timings at this mean life."""

    step: int
    mean_life: float
    levels: dict[int, tuple[Level, bool, int]] = field(default_factory=dict)
    heap: list[tuple[int, int]] = field(default_factory=list)
    timings: dict[int, tuple[int, int, int | None]] = field(default_factory=dict)


class BookModel:
    """Books of every market of `model`, `levels` price levels per side at most."""

    def __init__(self, model: MarketModel, levels: int = DEFAULT_LEVELS) -> None:
        if levels < 1:
            raise ValueError("levels must be >= 1")
        self.model = model
        self.levels = levels
        # A level's hashes change only when its epoch does: cached, a step of a watched
        # book costs dict look-ups, not 2 x levels blake2b calls (a universe has many).
        self._timing = functools.lru_cache(maxsize=1 << 18)(self._compute_timing)
        self._level = functools.lru_cache(maxsize=1 << 17)(self._compute_level)
        self._price = functools.lru_cache(maxsize=1 << 16)(self._compute_price)
        self._paced: dict[str, _PacedState] = {}  # universe markets: see _paced_sides

    def _compute_timing(
        self, symbol: str, index: int, mean_life: float | None
    ) -> tuple[int, int, int | None]:
        """A price level's life (steps), phase and draw key: per price, as the default
        markets always drew them; a paced market's life from its mean (``_mean_life``),
        and its key: the per-price hash mixed with that life."""
        per_price = _unit(self.model.seed, symbol, "level", index)
        if mean_life is None:
            life = _MIN_LIFE + per_price % _LIFE_SPAN
            return life, (per_price >> 16) % life, None
        life = max(1, round(mean_life * (0.5 + (per_price % 1000) / 1000)))  # 0.5-1.5x
        return life, (per_price >> 16) % life, _mix(per_price, life)

    def _compute_level(
        self, symbol: str, index: int, epoch: int, key: int | None
    ) -> tuple[Level, bool]:
        """A price level's (price, amount) in ``epoch``, and whether it is a hole there."""
        # The default markets' draws are blake2b's, as ever; a paced market's levels
        # change up to every step, so theirs is a cheap integer mix.
        draw = _unit(self.model.seed, symbol, index, epoch) if key is None else _mix(key, epoch)
        amount = Decimal(self.model.spec(symbol).step) * (1 + draw % 100_000)
        return (self._price(symbol, index), amount), (draw >> 40) / (1 << 24) < _HOLE

    def _compute_price(self, symbol: str, index: int) -> Decimal:
        return Decimal(index).scaleb(-self.model.spec(symbol).price_decimals)

    def _mean_life(self, symbol: str, step: int) -> float | None:
        """A paced market's mean level life in steps, so that its book changes about
        ``book_ratio`` levels per trade (bursts included); None for the others."""
        spec = self.model.spec(symbol)
        pacing = spec.pacing
        if pacing is None:
            return None
        rate = spec.trades_per_minute / 60.0
        if self.model.in_burst(spec.symbol, step * STEP_MS):
            rate *= pacing.burst_factor
        changes_per_step = pacing.book_ratio * rate * STEP_MS / 1000.0
        return min(_MAX_LIFE, 2.0 * self.levels / max(changes_per_step, 1e-9))

    def _last_price_ticks(self, symbol: str, t_ms: int) -> int:
        spec = self.model.spec(symbol)
        if spec.pacing is not None:  # a universe market: its minute's path, not its trades
            path = self.model.path_ticks(spec.symbol, t_ms)
            return path if path is not None else round(spec.price / float(spec.tick))
        tick = Decimal(spec.tick)
        last = self.model.last_price(spec.symbol, t_ms, _PRICE_LOOKBACK_MIN)
        price = last if last is not None else Decimal(str(spec.price))
        return int(price / tick)

    def book_at(self, symbol: str, step: int) -> SimBook:
        """The book at update id `step` (pure: the same for every caller, every run)."""
        spec = self.model.spec(symbol)
        seed = self.model.seed
        ticks = self._last_price_ticks(spec.symbol, step * STEP_MS)
        mean_life = self._mean_life(spec.symbol, step)
        if mean_life is None:
            spread = _unit(seed, spec.symbol, "spread", step)
        else:  # a universe market's spread changes as often as a level does
            life = max(1, round(mean_life))
            spread = _unit(seed, spec.symbol, "spread", step // life, life)
        best_bid = max(1, ticks - 1 - spread % 2)
        best_ask = max(best_bid + 1, ticks + 1 + (spread >> 8) % 2)
        bid_prices = range(best_bid, max(0, best_bid - self.levels), -1)
        ask_prices = range(best_ask, best_ask + self.levels)
        if mean_life is not None:
            bids, asks = self._paced_sides(spec.symbol, bid_prices, ask_prices, step, mean_life)
        else:
            bids = self._side(spec.symbol, bid_prices, step)
            asks = self._side(spec.symbol, ask_prices, step)
        return SimBook(step, bids, asks)

    def _side(self, symbol: str, indexes: Iterable[int], step: int) -> tuple[Level, ...]:
        timing, level_of = self._timing, self._level
        side: list[Level] = []
        best = True  # the best level is never a hole
        for index in indexes:
            life, phase, key = timing(symbol, index, None)
            level, hole = level_of(symbol, index, (step + phase) // life, key)
            if hole and not best:
                continue
            best = False
            side.append(level)
        return tuple(side)

    def _paced_sides(
        self, symbol: str, bid_prices: range, ask_prices: range, step: int, mean_life: float
    ) -> tuple[tuple[Level, ...], tuple[Level, ...]]:
        """Both sides of a universe market's book at ``step``: the values of ``_side``,
        computed incrementally. Each price level is kept with the step its epoch ends
        (a heap orders them), so a step re-draws only the levels whose epoch ended and
        those entering the window: a book is recomputed 10 times a second for every
        watched market, mostly to change a few of its levels. Any other step (earlier,
        another mean life) starts afresh: the result never depends on the history."""
        state = self._paced.get(symbol)
        if state is None or state.mean_life != mean_life or step < state.step:
            state = self._paced[symbol] = _PacedState(step, mean_life)
        levels, heap, timings = state.levels, state.heap, state.timings
        while heap and heap[0][0] <= step:  # epochs ended: those levels are re-drawn
            due, index = heapq.heappop(heap)
            kept = levels.get(index)
            if kept is not None and kept[2] == due:
                del levels[index]
        state.step = step
        if len(levels) > 6 * self.levels:  # the window moved on: forget what it left
            window = {*bid_prices, *ask_prices}
            state.levels = levels = {i: v for i, v in levels.items() if i in window}
            state.heap = heap = [(v[2], i) for i, v in levels.items()]
            heapq.heapify(heap)
        sides: list[tuple[Level, ...]] = []
        for prices in (bid_prices, ask_prices):
            for index in [i for i in prices if i not in levels]:  # re-drawn or new
                timing = timings.get(index)
                if timing is None:
                    timing = timings[index] = self._compute_timing(symbol, index, mean_life)
                life, phase, key = timing
                epoch = (step + phase) // life
                level, hole = self._compute_level(symbol, index, epoch, key)
                levels[index] = (level, hole, (epoch + 1) * life - phase)
                heapq.heappush(heap, ((epoch + 1) * life - phase, index))
            rows = [levels[i] for i in prices]
            # the best level is never a hole
            sides.append(tuple([r[0] for r in rows[:1]] + [r[0] for r in rows[1:] if not r[1]]))
        if len(timings) > _PACED_CACHE:
            timings.clear()
        return sides[0], sides[1]

    def update(self, before: SimBook, after: SimBook) -> BookUpdate:
        return BookUpdate(
            before, after, _diff(before.bids, after.bids), _diff(before.asks, after.asks)
        )


def _diff(old: Sequence[Level], new: Sequence[Level]) -> tuple[Level, ...]:
    if old == new:  # most steps of a quiet book
        return ()
    was = set(old)  # (price, amount): prices are unique on a side
    now = {p for p, _ in new}
    changed = [level for level in new if level not in was]
    changed.extend((p, Decimal(0)) for p, _ in old if p not in now)
    return tuple(changed)


# ------------------------------------------------------------------ Binance


def binance_levels(levels: Iterable[Level]) -> list[list[str]]:
    return [[fmt8(p), fmt8(a)] for p, a in levels]


def binance_depth_event(market_id: str, update: BookUpdate, event_ms: int) -> dict[str, Any]:
    """One `<symbol>@depth` event: every change from the previous event's id to this one's."""
    return {
        "e": "depthUpdate",
        "E": event_ms,
        "s": market_id,
        "U": update.before.step + 1,
        "u": update.after.step,
        "b": binance_levels(update.bids),
        "a": binance_levels(update.asks),
    }


def binance_depth_snapshot(book: SimBook, limit: int) -> dict[str, Any]:
    """`GET /api/v3/depth`: the best `limit` levels per side at `lastUpdateId`."""
    return {
        "lastUpdateId": book.step,
        "bids": binance_levels(book.bids[:limit]),
        "asks": binance_levels(book.asks[:limit]),
    }


# ---------------------------------------------------------------------- OKX


def okx_number(value: Decimal) -> str:
    """OKX prints numbers without trailing zeros: "8476.98", "415", "0.0001"."""
    return format(value.normalize(), "f")


def okx_levels(levels: Iterable[Level]) -> list[list[str]]:
    """`[price, size, "0" (deprecated liquidated orders), orders]` as OKX sends them."""
    return [
        [okx_number(p), okx_number(a), "0", "0" if not a else str(1 + int(p * 100) % 9)]
        for p, a in levels
    ]


def okx_checksum(bids: Sequence[Sequence[str]], asks: Sequence[Sequence[str]]) -> int:
    """OKX's book checksum: CRC32 of `bid1:size1:ask1:size1:bid2:...` over the best 25
    levels (a side with fewer levels just ends), as a signed 32-bit integer."""
    parts: list[str] = []
    for i in range(CHECKSUM_LEVELS):
        if i < len(bids):
            parts.extend((bids[i][0], bids[i][1]))
        if i < len(asks):
            parts.extend((asks[i][0], asks[i][1]))
    crc = zlib.crc32(":".join(parts).encode())
    return crc - (1 << 32) if crc >= 1 << 31 else crc


def _okx_push(
    inst_id: str, action: str, data: dict[str, Any], book: SimBook, ts_ms: int, corrupt: bool
) -> dict[str, Any]:
    top_bids = okx_levels(book.bids[:CHECKSUM_LEVELS])
    top_asks = okx_levels(book.asks[:CHECKSUM_LEVELS])
    checksum = okx_checksum(top_bids, top_asks)
    if corrupt:  # wrong, and still a signed int32
        checksum = checksum + 1 if checksum < (1 << 31) - 1 else checksum - 1
    data.update({"ts": str(ts_ms), "checksum": checksum})
    return {"arg": {"channel": "books", "instId": inst_id}, "action": action, "data": [data]}


def okx_snapshot(inst_id: str, book: SimBook, ts_ms: int) -> dict[str, Any]:
    data = {
        "asks": okx_levels(book.asks),
        "bids": okx_levels(book.bids),
        "prevSeqId": -1,
        "seqId": book.step,
    }
    return _okx_push(inst_id, "snapshot", data, book, ts_ms, False)


def okx_update(
    inst_id: str, update: BookUpdate, ts_ms: int, *, corrupt: bool = False
) -> dict[str, Any]:
    data = {
        "asks": okx_levels(update.asks),
        "bids": okx_levels(update.bids),
        "prevSeqId": update.before.step,
        "seqId": update.after.step,
    }
    return _okx_push(inst_id, "update", data, update.after, ts_ms, corrupt)


# -------------------------------------------------------------------- Bybit


def _top_update(update: BookUpdate, depth: int) -> tuple[tuple[Level, ...], tuple[Level, ...]]:
    """The changes of the best `depth` levels (a level leaving them is removed)."""
    before, after = update.before, update.after
    return _diff(before.bids[:depth], after.bids[:depth]), _diff(
        before.asks[:depth], after.asks[:depth]
    )


def _bybit_push(
    market_id: str, kind: str, bids: Iterable[Level], asks: Iterable[Level], *ids: int, ts: int
) -> dict[str, Any]:
    depth, update_id, seq = ids
    return {
        "topic": f"orderbook.{depth}.{market_id}",
        "type": kind,
        "ts": ts,
        "data": {
            "s": market_id,
            "b": binance_levels(bids),
            "a": binance_levels(asks),
            "u": update_id,
            "seq": seq,
        },
        "cts": ts,
    }


def bybit_snapshot(
    market_id: str, book: SimBook, depth: int, update_id: int, ts_ms: int
) -> dict[str, Any]:
    """The first push of `orderbook.{depth}.{symbol}`: the best `depth` levels."""
    return _bybit_push(
        market_id,
        "snapshot",
        book.bids[:depth],
        book.asks[:depth],
        depth,
        update_id,
        book.step,
        ts=ts_ms,
    )


def bybit_delta(
    market_id: str, update: BookUpdate, depth: int, update_id: int, ts_ms: int
) -> dict[str, Any] | None:
    """A `delta` push, or None when none of the best `depth` levels changed."""
    bids, asks = _top_update(update, depth)
    if not bids and not asks:
        return None
    return _bybit_push(
        market_id, "delta", bids, asks, depth, update_id, update.after.step, ts=ts_ms
    )


# ------------------------------------------------------------------- Kraken


def kraken_digits(value: str) -> str:
    """A number as Kraken's checksum reads it: no ".", no leading zeros."""
    return value.replace(".", "").lstrip("0")


def kraken_checksum(bids: Sequence[Sequence[str]], asks: Sequence[Sequence[str]]) -> int:
    """Kraken's book checksum: CRC32 (unsigned) of the best 10 asks, then the best 10
    bids, each `price qty` in full precision with "." and leading zeros removed."""
    parts = [
        kraken_digits(price) + kraken_digits(qty)
        for side in (asks, bids)
        for price, qty, *_ in side[:KRAKEN_CHECKSUM_LEVELS]
    ]
    return zlib.crc32("".join(parts).encode())


def _kraken_levels(levels: Iterable[Level], places: tuple[int, int]) -> list[list[str]]:
    return [[f"{p:.{places[0]}f}", f"{a:.{places[1]}f}"] for p, a in levels]


def _kraken_push(
    symbol: str,
    kind: str,
    changed: tuple[Iterable[Level], Iterable[Level]],
    book: SimBook,
    places: tuple[int, int],
    ts_ms: int | None,
    corrupt: bool = False,
) -> dict[str, Any]:
    checksum = kraken_checksum(
        _kraken_levels(book.bids[:KRAKEN_CHECKSUM_LEVELS], places),
        _kraken_levels(book.asks[:KRAKEN_CHECKSUM_LEVELS], places),
    )
    if corrupt:
        checksum ^= 1
    data: dict[str, Any] = {
        "symbol": symbol,
        "bids": [{"price": p, "qty": q} for p, q in _kraken_levels(changed[0], places)],
        "asks": [{"price": p, "qty": q} for p, q in _kraken_levels(changed[1], places)],
        "checksum": checksum,
    }
    if ts_ms is not None:
        data["timestamp"] = (
            datetime.fromtimestamp(ts_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "Z"
        )
    return {"channel": "book", "type": kind, "data": [data]}


def kraken_snapshot(
    symbol: str, book: SimBook, depth: int, places: tuple[int, int]
) -> dict[str, Any]:
    """The snapshot after a subscription: the best `depth` levels (`places`: the
    pair's price and qty decimals), with the checksum of the best 10."""
    return _kraken_push(
        symbol, "snapshot", (book.bids[:depth], book.asks[:depth]), book, places, None
    )


def kraken_update(
    symbol: str,
    update: BookUpdate,
    depth: int,
    places: tuple[int, int],
    ts_ms: int,
    *,
    corrupt: bool = False,
) -> dict[str, Any] | None:
    """An update of the best `depth` levels, or None when none of them changed. A
    level pushed out of the depth is not removed: the client truncates its book."""
    before, after = update.before, update.after
    bids = _kept(_diff(before.bids[:depth], after.bids[:depth]), after.bids)
    asks = _kept(_diff(before.asks[:depth], after.asks[:depth]), after.asks)
    if not bids and not asks:
        return None
    return _kraken_push(symbol, "update", (bids, asks), after, places, ts_ms, corrupt)


def _kept(changes: Iterable[Level], side: Sequence[Level]) -> list[Level]:
    """`changes` without the removal of a level that still exists beyond the depth."""
    present = {price for price, _ in side}
    return [(p, a) for p, a in changes if a or p not in present]


_QUOTED_NUMBER = re.compile(r'"(price|qty)":"(-?[0-9]+(?:\.[0-9]+)?)"')


def kraken_text(message: dict[str, Any]) -> str:
    """The JSON text Kraken sends: prices and quantities as numbers with every digit
    of the pair's precision (`0.10000000`), which `json.dumps` of a float would drop."""
    return _QUOTED_NUMBER.sub(r'"\1":\2', json.dumps(message, separators=(",", ":")))


# ----------------------------------------------------------------- Coinbase


def coinbase_levels(levels: Iterable[Level], price_places: int) -> list[list[str]]:
    return [[f"{p:.{price_places}f}", fmt8(a)] for p, a in levels]


def coinbase_snapshot(product_id: str, book: SimBook, price_places: int) -> dict[str, Any]:
    """The first `level2` message: the whole book."""
    return {
        "type": "snapshot",
        "product_id": product_id,
        "bids": coinbase_levels(book.bids, price_places),
        "asks": coinbase_levels(book.asks, price_places),
    }


def coinbase_update(
    product_id: str, update: BookUpdate, price_places: int, ts_ms: int
) -> dict[str, Any]:
    """One `l2update`: `[side, price, size]` changes, size "0.00000000" removes."""
    changes = [
        [side, *level]
        for side, levels in (("buy", update.bids), ("sell", update.asks))
        for level in coinbase_levels(levels, price_places)
    ]
    return {
        "type": "l2update",
        "product_id": product_id,
        "changes": changes,
        "time": datetime.fromtimestamp(ts_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "Z",
    }


# ------------------------------------------------------------- the stream


class BookStream:
    """Per-market stream positions: the book subscribers last got, and the next event.

    Events are cut at the pump's pace (every 100 ms): one event from the last
    emitted step to now, or none when no level changed (the id then keeps
    counting steps, so the next event's range starts right after the last one).
    """

    def __init__(self, books: BookModel) -> None:
        self.books = books
        self._at: dict[str, SimBook] = {}  # unified symbol -> book at the last event

    def current(self, symbol: str, now_ms: int) -> SimBook:
        """The book subscribers hold (the last event's), starting the stream if new."""
        book = self._at.get(symbol)
        if book is None:
            book = self._at[symbol] = self.books.book_at(symbol, step_of(now_ms))
        return book

    def advance(self, symbol: str, now_ms: int) -> BookUpdate | None:
        """The next event of `symbol`, or None when nothing changed since the last one."""
        before = self.current(symbol, now_ms)
        step = step_of(now_ms)
        if step <= before.step:
            return None
        after = self.books.book_at(symbol, step)
        update = self.books.update(before, after)
        if not update.bids and not update.asks:
            return None
        self._at[symbol] = after
        return update

    def forget(self, symbol: str) -> None:
        self._at.pop(symbol, None)

    def symbols(self) -> list[str]:
        return list(self._at)


__all__ = [
    "CHECKSUM_LEVELS",
    "DEFAULT_LEVELS",
    "STEP_MS",
    "BookModel",
    "BookStream",
    "BookUpdate",
    "SimBook",
    "binance_depth_event",
    "binance_depth_snapshot",
    "bybit_delta",
    "bybit_snapshot",
    "coinbase_snapshot",
    "coinbase_update",
    "kraken_checksum",
    "kraken_snapshot",
    "kraken_text",
    "kraken_update",
    "okx_checksum",
    "okx_snapshot",
    "okx_update",
    "step_of",
]
