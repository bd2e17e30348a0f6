"""Deterministic market model shared by every simulated exchange.

Why: tests and the offline demo must be able to recompute exactly what the
simulator served, so every candle and every trade is a pure function of
(model seed, symbol, time). Nothing here does I/O or reads the clock.

How (see README.md, "Data model"):

* Day anchors: the log price at each UTC midnight comes from a Brownian bridge
  over dyadic day intervals, pinned every 1024 days to a hashed value near the
  symbol's centre price, so prices wander realistically but stay bounded.
* Minutes: inside a day a seeded Gaussian random walk is bridged between the
  two midnight anchors; minute ``i`` opens at walk point ``i`` and closes at
  point ``i + 1``. High/low excursions, trade count, volume and taker split are
  drawn from the same per-day stream. Illiquid symbols skip minutes entirely
  (no trades, so no kline row, as on Binance).
* Trades: the trades of a minute are generated from its bar so that they
  aggregate back to it exactly (open/high/low/close, volume, trade count,
  taker-buy volume). Quote volumes are volume x typical price, not summed.
* Trade ids: consecutive per symbol, as real exchanges number a market's trades:
  a trade's id counts the trades before it from a fixed day (``ID_EPOCH_MS``),
  counted backward before that day; the per-day counts are cached, so ids near the
  epoch are cheap and id -> minute lookups bisect days, then minutes.
* Coarser candles aggregate the 1m bars; a candle that contains "now" is
  aggregated from the trades up to "now" (still open).
* Paced markets (``Pacing``: the load generator's universe, ``universe.py``) take
  their minute trade counts from a fixed day total shared out by weight (bursts,
  jitter) instead of a per-minute draw, so their ids are closed-form at any rate;
  the rest of their bars and trades is drawn as for any market.

All randomness comes from ``random.Random(int).random()`` only, whose sequence
Python guarantees across versions, seeded by blake2b (never the salted
``hash()``), so values are stable across processes.
"""

from __future__ import annotations

import array
import bisect
import dataclasses
import functools
import hashlib
import itertools
import math
import random
import sys
import threading
import typing
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Generic, NamedTuple, TypeVar

try:  # optional: ~6x faster trade-id counting (``_count_day``); exact either way
    import numpy as _np
except ImportError:  # pragma: no cover - the simulator image may lack it
    _np = None  # type: ignore[assignment]

MINUTE_MS = 60_000
HOUR_MS = 60 * MINUTE_MS
DAY_MS = 24 * HOUR_MS
MINUTES_PER_DAY = 1440

#: A model minute holds fewer trades than this (bounds the ids before a symbol's id epoch).
MAX_TRADES_PER_MINUTE = 50_000
#: Model trade ids lie above this floor, consecutive per symbol; injected trades
#: (``/_sim/trades``) take ids below it, so the two never collide (README "Trade ids").
MODEL_ID_FLOOR = 10**14
#: The fewest trades (~11 bytes each) a model keeps generated: more with a universe,
#: whose current and next minute (the streams prefetch it), bursts included, must fit.
DRAWS_CACHE_TRADES = 4_000_000

INTERVAL_MS: dict[str, int] = {
    "1m": MINUTE_MS,
    "3m": 3 * MINUTE_MS,
    "5m": 5 * MINUTE_MS,
    "15m": 15 * MINUTE_MS,
    "30m": 30 * MINUTE_MS,
    "1h": HOUR_MS,
    "2h": 2 * HOUR_MS,
    "4h": 4 * HOUR_MS,
    "6h": 6 * HOUR_MS,
    "8h": 8 * HOUR_MS,
    "12h": 12 * HOUR_MS,
    "1d": DAY_MS,
    "3d": 3 * DAY_MS,
    "1w": 7 * DAY_MS,
}
# Binance opens weekly candles on Monday 00:00 UTC; 1970-01-01 was a Thursday.
_INTERVAL_OFFSET_MS = {"1w": 4 * DAY_MS}

_ANCHOR_SPAN_DAYS = 1024  # pinned anchors this many days apart
_ANCHOR_SPREAD = 0.25  # stdev of log price of pinned anchors around the centre
_BRIDGE_STD_CAP = 0.15  # keeps multi-year swings plausible
_EXCURSION = 0.7  # high/low excursion beyond open/close, in minute sigmas


class UnknownSymbolError(KeyError):
    """Raised for a symbol the model does not list (maps to an exchange's bad-symbol error)."""


class UnknownIntervalError(ValueError):
    """Raised for a candle interval the simulator does not serve."""


def interval_ms(interval: str) -> int:
    """Length of a Binance-style interval string such as ``"15m"``."""
    try:
        return INTERVAL_MS[interval]
    except KeyError:
        raise UnknownIntervalError(interval) from None


def interval_open(interval: str, t_ms: int) -> int:
    """Open time of the candle of ``interval`` that contains ``t_ms`` (UTC aligned)."""
    length = interval_ms(interval)
    offset = _INTERVAL_OFFSET_MS.get(interval, 0)
    return t_ms - (t_ms - offset) % length


def _align_up(interval: str, t_ms: int) -> int:
    """First candle open time at or after ``t_ms`` (Binance's startTime rule)."""
    start = interval_open(interval, t_ms)
    return start if start == t_ms else start + interval_ms(interval)


def fmt8(value: Decimal) -> str:
    """A decimal as exchanges print it: eight places."""
    return f"{value:.8f}"


def _utc_ms(year: int, month: int, day: int) -> int:
    return int(datetime(year, month, day, tzinfo=UTC).timestamp() * 1000)


#: Model ids are counted from this UTC midnight (a symbol listed later, or delisted
#: earlier: from its first, or last, day): forward after it, backward before it. Near
#: it ids are cheap; each day between it and a queried time costs ~2 ms once.
ID_EPOCH_MS = _utc_ms(2025, 7, 1)


def _decimals(text: str) -> int:
    """Number of decimals of a power-of-ten increment such as ``"0.001"``."""
    value = Decimal(text)
    exponent = value.normalize().as_tuple().exponent
    assert isinstance(exponent, int)
    places = max(0, -exponent)
    if value != Decimal(1).scaleb(-places):
        raise ValueError(f"increment {text!r} must be a power of ten <= 1")
    return places


@dataclass(frozen=True)
class Pacing:
    """The trade-rate shape of a *paced* market (the load generator's, ``universe.py``).

    Why a second kind of market: a load generator needs a rate it can dial, bursts it
    can place, and trade ids that stay cheap at any rate. A paced market trades
    exactly ``day_total`` trades every UTC day from its listing day (a midnight), so
    its ids are closed-form (``_PacedIds``: no day is counted), and its minutes share
    those trades by weight: 1, or ``burst_factor`` in the day's burst minutes (the same
    minutes for every paced market of a model: where the seed says), times a lognormal
    ``jitter``. Its order book changes ``book_ratio`` levels per trade on average.
    """

    burst_fraction: float = 0.0  # share of a day's minutes that are burst minutes
    burst_factor: float = 1.0  # trade rate in a burst minute, x the base rate
    jitter: float = 0.1  # stdev of the log of a minute's weight (0: an even rate)
    book_ratio: float = 1.0  # book level changes per trade

    def __post_init__(self) -> None:
        if not 0.0 <= self.burst_fraction <= 1.0:
            raise ValueError("burst_fraction must be in [0, 1]")
        if self.burst_factor <= 0 or self.jitter < 0 or self.book_ratio <= 0:
            raise ValueError("burst_factor and book_ratio must be > 0, jitter >= 0")

    @property
    def burst_minutes(self) -> int:
        """Burst minutes in every UTC day."""
        return round(self.burst_fraction * MINUTES_PER_DAY)

    def day_total(self, per_minute: float) -> int:
        """Trades a day holds at ``per_minute`` outside bursts (the id rule's constant)."""
        weight = MINUTES_PER_DAY + self.burst_minutes * (self.burst_factor - 1.0)
        return max(0, round(per_minute * weight))


@dataclass(frozen=True)
class SymbolSpec:
    """Static description of one market; the walk and the exchange metadata derive from it."""

    symbol: str  # unified ccxt symbol, e.g. "BTC/USDT"
    price: float  # long-run centre of the walk, in quote units
    tick: str  # price increment (power of ten)
    step: str  # quantity increment (power of ten)
    daily_vol: float  # stdev of the daily log return
    trades_per_minute: float  # mean trade count of a minute that trades
    volume_per_minute: float  # mean base volume of a minute that trades
    active_fraction: float = 1.0  # probability that a minute has any trade
    min_notional: str = "5"
    max_qty: str = "9000000"
    listed_ms: int = 0  # no candles or trades before this
    delisted_ms: int | None = None  # no candles after this; status BREAK
    pacing: Pacing | None = None  # a paced market (the load generator's): see Pacing

    def __post_init__(self) -> None:
        if self.price_decimals + self.qty_decimals > 8:
            raise ValueError(f"{self.symbol}: tick x step must be >= 1e-8")
        if "/" not in self.symbol:
            raise ValueError(f"{self.symbol}: expected BASE/QUOTE")
        if self.pacing is not None and (
            self.listed_ms % DAY_MS or self.delisted_ms is not None or self.active_fraction != 1
        ):
            raise ValueError(f"{self.symbol}: a paced market is listed at a midnight, for good")

    # Cached: the streams read them for every message of a busy universe market.
    @functools.cached_property
    def base(self) -> str:
        return self.symbol.split("/")[0]

    @functools.cached_property
    def quote(self) -> str:
        return self.symbol.split("/")[1]

    @functools.cached_property
    def binance_id(self) -> str:
        return self.base + self.quote

    @functools.cached_property
    def coinbase_id(self) -> str:
        return f"{self.base}-{self.quote}"

    @functools.cached_property
    def price_decimals(self) -> int:
        return _decimals(self.tick)

    @functools.cached_property
    def qty_decimals(self) -> int:
        return _decimals(self.step)

    def trading_at(self, t_ms: int) -> bool:
        return t_ms >= self.listed_ms and (self.delisted_ms is None or t_ms < self.delisted_ms)


DEFAULT_SPECS: tuple[SymbolSpec, ...] = (
    SymbolSpec(
        symbol="BTC/USDT",
        price=60_000.0,
        tick="0.01",
        step="0.00001",
        daily_vol=0.025,
        trades_per_minute=60,
        volume_per_minute=2.0,
        max_qty="9000",
        listed_ms=_utc_ms(2017, 8, 17),
    ),
    SymbolSpec(
        symbol="ETH/USDT",
        price=3_000.0,
        tick="0.01",
        step="0.0001",
        daily_vol=0.035,
        trades_per_minute=40,
        volume_per_minute=30.0,
        max_qty="100000",
        listed_ms=_utc_ms(2017, 8, 17),
    ),
    SymbolSpec(
        symbol="SOL/USDT",
        price=150.0,
        tick="0.01",
        step="0.001",
        daily_vol=0.05,
        trades_per_minute=30,
        volume_per_minute=200.0,
        max_qty="900000",
        listed_ms=_utc_ms(2020, 8, 11),
    ),
    # More liquid markets, so that ten tickers can be live at once (issue 25's
    # soak: bench/soak.py --tickers 10): a table, as README.md "Data model" shows.
    # Each symbol's values depend on its own name only: adding one changes no other.
    *(
        SymbolSpec(symbol, price, tick, step, vol, tpm, vpm, listed_ms=_utc_ms(*listed))
        for symbol, price, tick, step, vol, tpm, vpm, listed in (
            # symbol, centre price, tick, step, daily vol, trades/min, base/min, listed
            ("BNB/USDT", 580.0, "0.01", "0.001", 0.03, 35, 20.0, (2017, 11, 6)),
            ("XRP/USDT", 0.6, "0.0001", "0.1", 0.04, 45, 20_000.0, (2018, 5, 4)),
            ("ADA/USDT", 0.45, "0.0001", "0.1", 0.045, 25, 15_000.0, (2018, 4, 17)),
            ("DOGE/USDT", 0.15, "0.00001", "1", 0.055, 50, 100_000.0, (2019, 7, 5)),
            ("AVAX/USDT", 35.0, "0.01", "0.01", 0.05, 20, 300.0, (2020, 9, 22)),
            ("LINK/USDT", 15.0, "0.01", "0.01", 0.045, 20, 600.0, (2019, 1, 16)),
            ("DOT/USDT", 7.0, "0.001", "0.01", 0.045, 15, 1_000.0, (2020, 8, 18)),
            ("LTC/USDT", 80.0, "0.01", "0.001", 0.035, 15, 100.0, (2017, 12, 13)),
        )
    ),
    # Illiquid: ~15% of minutes trade, so most 1m klines are missing.
    SymbolSpec(
        symbol="XYZ/USDT",
        price=0.5,
        tick="0.0001",
        step="1",
        daily_vol=0.06,
        trades_per_minute=2,
        volume_per_minute=500.0,
        active_fraction=0.15,
        min_notional="1",
        listed_ms=_utc_ms(2023, 1, 1),
    ),
    # Delisted: still listed with status BREAK; candles only inside its lifetime.
    SymbolSpec(
        symbol="OLD/USDT",
        price=2.0,
        tick="0.001",
        step="0.1",
        daily_vol=0.05,
        trades_per_minute=10,
        volume_per_minute=1_000.0,
        listed_ms=_utc_ms(2019, 1, 1),
        delisted_ms=_utc_ms(2022, 5, 13),
    ),
)


class Bar(NamedTuple):
    """One candle in integer units: prices in ticks, base in steps, quote in 1e-8."""

    o: int
    h: int
    l: int  # noqa: E741 - OHLC naming
    c: int
    v: int  # base volume, steps
    q: int  # quote volume, 1e-8 quote units
    n: int  # trade count
    tbv: int  # taker-buy base volume, steps
    tbq: int  # taker-buy quote volume, 1e-8 quote units
    nb: int  # trades whose buyer was the taker


def combine_bars(bars: Sequence[Bar | None]) -> Bar | None:
    """Aggregate consecutive bars; missing (no-trade) bars are skipped."""
    present = [b for b in bars if b is not None]
    if not present:
        return None
    return Bar(
        o=present[0].o,
        h=max(b.h for b in present),
        l=min(b.l for b in present),
        c=present[-1].c,
        v=sum(b.v for b in present),
        q=sum(b.q for b in present),
        n=sum(b.n for b in present),
        tbv=sum(b.tbv for b in present),
        tbq=sum(b.tbq for b in present),
        nb=sum(b.nb for b in present),
    )


@dataclass(frozen=True, slots=True)
class Kline:
    """A candle as an exchange reports it; ``closed`` is False for the one containing now."""

    symbol: str
    interval: str
    open_time: int
    close_time: int  # open_time + interval - 1, also while still open (Binance)
    open: Decimal
    high: Decimal
    low: Decimal
    close: Decimal
    volume: Decimal
    quote_volume: Decimal
    trades: int
    taker_buy_base: Decimal
    taker_buy_quote: Decimal
    closed: bool

    def ohlcv(self) -> list[float | int]:
        """The row ccxt's ``fetch_ohlcv`` returns for this candle."""
        return [
            self.open_time,
            float(self.open),
            float(self.high),
            float(self.low),
            float(self.close),
            float(self.volume),
        ]

    def binance_row(self) -> list[object]:
        """The row of Binance's ``GET /api/v3/klines``."""
        return [
            self.open_time,
            _fmt8(self.open),
            _fmt8(self.high),
            _fmt8(self.low),
            _fmt8(self.close),
            _fmt8(self.volume),
            self.close_time,
            _fmt8(self.quote_volume),
            self.trades,
            _fmt8(self.taker_buy_base),
            _fmt8(self.taker_buy_quote),
            "0",
        ]


@dataclass(frozen=True, slots=True)
class Trade:
    """One public trade. ``buyer_is_maker`` is Binance's ``m`` (True: the seller was taker)."""

    symbol: str
    id: int
    time_ms: int
    price: Decimal
    qty: Decimal
    buyer_is_maker: bool


class TradeColumns(NamedTuple):
    """Consecutive model trades of one minute, column by column (``trade_columns``):
    ids from ``first_id`` on, times as offsets from ``minute_ms``, prices in ticks,
    quantities in steps, ``taker_buy`` 1 where the buyer took (``buyer_is_maker`` 0)."""

    first_id: int
    minute_ms: int
    times: Sequence[int]
    prices: Sequence[int]
    qtys: Sequence[int]
    taker_buy: Sequence[int]


@functools.lru_cache(maxsize=16)
def units_text(places: int) -> Callable[[int], str]:
    """The printer of integer units of ``10**-places`` with eight decimals, exactly as
    ``fmt8`` prints the ``Decimal`` (``units_text(2)(6000012)`` -> ``"60000.12000000"``).
    Memoised: a market's prices and sizes repeat, a look-up is ~5x cheaper than printing."""
    if places == 0:

        def text(units: int) -> str:
            return f"{units}.00000000"

    else:
        scale, pad = 10**places, "0" * (8 - places)

        def text(units: int) -> str:
            return f"{units // scale}.{units % scale:0{places}d}{pad}"

    return functools.lru_cache(maxsize=1 << 16)(text)


def _fmt8(value: Decimal) -> str:
    """Binance prints every decimal with 8 places."""
    return f"{value:.8f}"


def _normal_pair(rng: random.Random) -> tuple[float, float]:
    """Two independent N(0,1) draws (Box-Muller) using only ``random()``."""
    radius = math.sqrt(-2.0 * math.log(1.0 - rng.random()))
    angle = 2.0 * math.pi * rng.random()
    return radius * math.cos(angle), radius * math.sin(angle)


def _randbelow(rng: random.Random, n: int) -> int:
    return min(n - 1, int(rng.random() * n))


def _split(rng: random.Random, total: int, parts: int) -> list[int]:
    """Split ``total`` into ``parts`` positive integers (random, exact sum)."""
    if parts == 0:
        return []
    spare = total - parts
    weights = [-math.log(1.0 - rng.random()) + 1e-12 for _ in range(parts)]
    scale = spare / sum(weights)
    shares = [int(w * scale) for w in weights]
    for i in range(spare - sum(shares)):
        shares[i % parts] += 1
    return [1 + s for s in shares]


_U_SCALE = 1.0 / 9007199254740992.0  # random(): (a * 2**26 + b) / 2**53


def _words(raw: bytes) -> Sequence[int]:
    """The 32-bit outputs of a Mersenne Twister stream drawn as one little-endian int."""
    words = array.array("I", raw)
    if sys.byteorder != "little":
        words.byteswap()
    return words


def _count_minute(words: Sequence[int], i: int, spec: SymbolSpec) -> int:
    """Minute ``i``'s trade count as ``_generate_day`` draws it (0: the minute is idle).

    ``random()`` is ``((a >> 5) * 2**26 + (b >> 6)) / 2**53`` of two outputs, so
    ``u[k]`` is made of words ``2 k`` and ``2 k + 1``; minute ``i`` reads ``u[9 i]``
    (active?) and ``u[9 i + 1]``, ``u[9 i + 2]`` (the count's normal draw).
    """
    w = 18 * i
    if ((words[w] >> 5) * 67108864.0 + (words[w + 1] >> 6)) * _U_SCALE >= spec.active_fraction:
        return 0
    u1 = ((words[w + 2] >> 5) * 67108864.0 + (words[w + 3] >> 6)) * _U_SCALE
    u2 = ((words[w + 4] >> 5) * 67108864.0 + (words[w + 5] >> 6)) * _U_SCALE
    z_n = math.sqrt(-2.0 * math.log(1.0 - u1)) * math.cos(2.0 * math.pi * u2)
    n = round(spec.trades_per_minute * math.exp(0.5 * z_n - 0.125))
    return 1 if n < 1 else min(n, MAX_TRADES_PER_MINUTE - 1)


def _counts_numpy(raw: bytes, spec: SymbolSpec) -> list[int]:
    """``_count_minute`` of every minute at once; near-ties recomputed exactly."""
    assert _np is not None
    words = _np.frombuffer(raw, dtype="<u4").reshape(MINUTES_PER_DAY, 18)
    a = (words[:, 0:6:2] >> 5).astype(_np.float64)
    u = (a * 67108864.0 + (words[:, 1:6:2] >> 6)) * _U_SCALE  # u[9 i], u[9 i + 1], u[9 i + 2]
    z_n = _np.sqrt(-2.0 * _np.log(1.0 - u[:, 1])) * _np.cos(2.0 * math.pi * u[:, 2])
    x = spec.trades_per_minute * _np.exp(0.5 * z_n - 0.125)
    n = _np.clip(_np.rint(x), 1, MAX_TRADES_PER_MINUTE - 1).astype(_np.int64)
    n[u[:, 0] >= spec.active_fraction] = 0
    counts: list[int] = n.tolist()
    ties = _np.flatnonzero(_np.abs(x - _np.floor(x) - 0.5) < 1e-6).tolist()
    if ties:  # a last-bit difference from `math` could round these apart
        exact = _words(raw)
        for i in ties:
            counts[i] = _count_minute(exact, i, spec)
    return counts


def _ints(values: list[int]) -> Sequence[int]:
    """``values`` packed: 4 bytes each where they fit (nearly always), else 8."""
    try:
        return array.array("i", values)
    except OverflowError:
        return array.array("q", values)


class _Draws(NamedTuple):
    """A minute's trades before they get ids: offsets in the minute (ms), prices in
    ticks, quantities in steps, taker sides (1: the buyer took); ids need the id
    index, candles do not. Arrays, not tuples of ints: a busy market's minute holds
    hundreds of thousands of trades (11 bytes each here, ~100 as Python ints)."""

    times: Sequence[int]  # array('H'), sorted
    prices: Sequence[int]  # array('i') (or 'q')
    qtys: Sequence[int]  # array('i') (or 'q')
    taker_buy: Sequence[int]  # bytes of 0/1


_NO_BAR = (0,) * len(Bar._fields)


class _DayBars(Sequence[Bar | None]):
    """A day of minute bars in one int64 array (None where nothing traded).

    Why: the live path keeps every watched market's current day cached; as tuples of
    Python ints a day takes ~0.5 MB, so a universe of 1,000 markets ~0.5 GB; as one
    array, ~115 kB a day.
    """

    __slots__ = ("_flat", "_present")
    _WIDTH = len(Bar._fields)

    def __init__(self, bars: Sequence[Bar | None]) -> None:
        self._present = bytes(b is not None for b in bars)
        self._flat: Sequence[int]
        try:
            flat = array.array("q")
            for bar in bars:
                flat.extend(_NO_BAR if bar is None else bar)
            self._flat = flat
        except OverflowError:  # a value beyond int64: keep Python ints
            self._flat = [v for bar in bars for v in (_NO_BAR if bar is None else bar)]

    def __len__(self) -> int:
        return len(self._present)

    def _bar(self, i: int) -> Bar | None:
        if not self._present[i]:
            return None
        w = self._WIDTH * i
        return Bar(*self._flat[w : w + self._WIDTH])

    @typing.overload
    def __getitem__(self, index: int) -> Bar | None: ...

    @typing.overload
    def __getitem__(self, index: slice) -> list[Bar | None]: ...

    def __getitem__(self, index: int | slice) -> Bar | list[Bar | None] | None:
        if isinstance(index, slice):
            return [self._bar(i) for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._bar(index)


K = TypeVar("K")
V = TypeVar("V")


class _SizedLru(Generic[K, V]):
    """An LRU cache bounded by the total ``weight`` of its values (e.g. trades held).

    Why not ``functools.lru_cache``: a busy market's minute of trades weighs 10,000x
    an idle one's, so a bound on entries is no bound on memory; and the streams ask
    whether a value is ready (``in``) before they would compute it on the event loop.
    Thread-safe; a value may be computed twice by racing threads, never stored wrong.
    """

    def __init__(
        self, compute: Callable[[K], V], weight: Callable[[V], int], max_weight: int
    ) -> None:
        self._compute, self._weight, self.max_weight = compute, weight, max_weight
        self._data: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._total = 0
        self._lock = threading.Lock()

    def __contains__(self, key: K) -> bool:
        with self._lock:
            return key in self._data

    def get(self, key: K) -> V:
        with self._lock:
            hit = self._data.get(key)
            if hit is not None:
                self._data.move_to_end(key)
                return hit[0]
        value = self._compute(key)
        weight = 1 + self._weight(value)
        with self._lock:
            if key not in self._data:
                self._data[key] = (value, weight)
                self._total += weight
            while self._total > self.max_weight and len(self._data) > 1:
                _, (_, old) = self._data.popitem(last=False)
                self._total -= old
        return value


class _PacedIds:
    """The id index of a paced market: every day holds ``per_day`` trades, so a day's
    first id is closed-form (``_IdIndex``'s interface, nothing to count or cache)."""

    def __init__(self, spec: SymbolSpec, per_day: int) -> None:
        self.first_day = spec.listed_ms // DAY_MS
        self.per_day = per_day
        self.base = MODEL_ID_FLOOR + 1  # the listing day's first trade

    def covers(self, day: int) -> bool:
        return True

    def day_start(self, day: int) -> int:
        return self.base + max(0, day - self.first_day) * self.per_day

    def day_of(self, trade_id: int, last_day: int) -> int | None:
        if self.per_day == 0:
            return None
        day = self.first_day + max(0, trade_id - self.base) // self.per_day
        return day if day <= last_day else None


class _IdIndex:
    """Cumulative trade counts of one symbol's days, grown outward from its id epoch.

    Why: model ids are consecutive per symbol, so a trade's id is the number of
    trades before it, counted from a fixed day; the counts are cached, and a lookup
    costs only the days between the epoch and the day asked for (never the whole
    history). Thread-safe: REST handlers look ids up from worker threads.
    """

    def __init__(
        self, spec: SymbolSpec, day_total: Callable[[int], int], epoch_ms: int = ID_EPOCH_MS
    ) -> None:
        self.first_day = spec.listed_ms // DAY_MS
        self.last_day = None if spec.delisted_ms is None else (spec.delisted_ms - 1) // DAY_MS
        epoch = max(epoch_ms // DAY_MS, self.first_day)
        self.epoch_day = epoch if self.last_day is None else min(epoch, self.last_day)
        # Room for every trade the symbol can have had before its epoch: ids stay > floor.
        slack = (self.epoch_day - self.first_day) * MINUTES_PER_DAY * MAX_TRADES_PER_MINUTE
        self.base = MODEL_ID_FLOOR + 1 + slack  # id of the first trade on the epoch day
        self._total = day_total
        self._fwd = [0]  # _fwd[j]: trades of the days [epoch, epoch + j)
        self._bwd = [0]  # _bwd[j]: trades of the days [epoch - j, epoch)
        self._lock = threading.Lock()

    def _clamp(self, day: int) -> int:
        """Days outside the symbol's life hold no trades: stop counting at its ends."""
        if day < self.first_day:
            return self.first_day
        if self.last_day is not None and day > self.last_day + 1:
            return self.last_day + 1
        return day

    def covers(self, day: int) -> bool:
        """Whether `day_start(day)` is already counted (cheap: no day to generate)."""
        day = self._clamp(day)
        j = day - self.epoch_day
        return j < len(self._fwd) if j >= 0 else -j < len(self._bwd)

    def day_start(self, day: int) -> int:
        """Id of the first model trade at or after ``day``'s midnight."""
        day = self._clamp(day)
        if day >= self.epoch_day:
            return self.base + self._forward(day - self.epoch_day)[day - self.epoch_day]
        return self.base - self._backward(self.epoch_day - day)[self.epoch_day - day]

    def _forward(self, j: int) -> list[int]:
        if j >= len(self._fwd):
            with self._lock:
                while len(self._fwd) <= j:
                    day = self.epoch_day + len(self._fwd) - 1
                    self._fwd.append(self._fwd[-1] + self._total(day))
        return self._fwd

    def _backward(self, j: int) -> list[int]:
        if j >= len(self._bwd):
            with self._lock:
                while len(self._bwd) <= j:
                    day = self.epoch_day - len(self._bwd)
                    self._bwd.append(self._bwd[-1] + self._total(day))
        return self._bwd

    def day_of(self, trade_id: int, last_day: int) -> int | None:
        """The day holding the first model trade with an id >= ``trade_id`` among the
        days up to ``last_day``; None if there is none. Counts only from the epoch to
        the answer (or to ``last_day`` / the listing day), never beyond."""
        if trade_id >= self.base:
            rel = trade_id - self.base
            stop = self._clamp(last_day + 1) - self.epoch_day  # _fwd index of day last+1
            j = 0
            while True:
                fwd = self._forward(j)
                if fwd[-1] > rel or len(fwd) > stop:
                    break
                j = min(2 * len(fwd), stop)  # grow in doubling steps, then bisect
            if fwd[-1] <= rel:
                return None
            return self.epoch_day + bisect.bisect_right(fwd, rel) - 1
        need = self.base - trade_id  # trades between the id and the epoch
        deepest = self.epoch_day - self.first_day  # _bwd index of the listing day
        j = 0
        while True:
            bwd = self._backward(j)
            if bwd[-1] >= need or len(bwd) > deepest:
                break
            j = min(2 * len(bwd), deepest)
        j = bisect.bisect_left(bwd, need)
        day = self.epoch_day - min(j, deepest)  # before every trade: the listing day
        return day if day <= last_day else None


class MarketModel:
    """The deterministic world: per-symbol minute bars, trades and candles.

    Instances are cheap to query repeatedly (per-day and per-candle LRU caches)
    and safe to share between threads (values never change).
    """

    def __init__(self, specs: Sequence[SymbolSpec] = DEFAULT_SPECS, seed: int | str = 0) -> None:
        self.seed = seed
        self.specs: dict[str, SymbolSpec] = {s.symbol: s for s in specs}
        self.fast_counts = True  # numpy for `_count_day` when installed (tests turn it off)
        self._aliases: dict[str, str] = {}
        for spec in specs:
            for alias in (spec.symbol, spec.binance_id, spec.coinbase_id):
                self._aliases[alias.upper()] = spec.symbol
        # Caches hold at least every market's current day (the live path reads it each
        # minute): sized by the number of markets, a universe of 1,000 included.
        markets = len(self.specs)
        self._anchor = functools.lru_cache(maxsize=1 << 16)(self._compute_anchor)
        self._day = functools.lru_cache(maxsize=64 + 2 * markets)(self._generate_day)
        self._paced = functools.lru_cache(maxsize=64 + 2 * markets)(self._paced_counts)
        self._bursts = functools.lru_cache(maxsize=64)(self._burst_minutes)
        self._draws_cache: _SizedLru[tuple[str, int], _Draws | None] = _SizedLru(
            lambda key: self._generate_draws(*key),
            lambda draws: 0 if draws is None else len(draws.times),
            self._draws_budget(),
        )
        self._closed = functools.lru_cache(maxsize=1 << 17)(self._compute_closed_bar)
        self._offsets = functools.lru_cache(maxsize=256 + 2 * markets)(self._minute_offsets)
        self._ids: dict[str, _IdIndex | _PacedIds] = {
            s.symbol: (
                _IdIndex(s, functools.partial(self._day_total, s.symbol))
                if s.pacing is None
                else _PacedIds(s, s.pacing.day_total(s.trades_per_minute))
            )
            for s in specs
        }

    def _draws_budget(self) -> int:
        """Trades the draws cache holds: two minutes of every market at its burst rate,
        twice over (a burst minute and the next prefetched), and room for REST pages."""
        busiest = sum(
            s.trades_per_minute * max(1.0, s.pacing.burst_factor if s.pacing else 1.0)
            for s in self.specs.values()
        )
        return max(DRAWS_CACHE_TRADES, int(4 * busiest) + 1_000_000)

    # ------------------------------------------------------------------ symbols
    def spec(self, symbol: str) -> SymbolSpec:
        """Spec by unified symbol (``BTC/USDT``), Binance id or Coinbase id."""
        try:
            return self.specs[self._aliases[symbol.upper()]]
        except KeyError:
            raise UnknownSymbolError(symbol) from None

    def with_specs(self, specs: Sequence[SymbolSpec]) -> MarketModel:
        """This model's markets and ``specs`` (e.g. a universe's), same seed."""
        taken = {a for spec in specs for a in (spec.binance_id, spec.coinbase_id)}
        clash = sorted(taken.intersection(a.replace("/", "") for a in self._aliases))
        clash += sorted(taken.intersection(self._aliases))
        if clash:
            raise ValueError(f"markets already listed: {', '.join(clash)}")
        return MarketModel([*self.specs.values(), *specs], seed=self.seed)

    def with_trade_rate(self, rate: float | Mapping[str, float]) -> MarketModel:
        """A model whose symbols trade ``rate`` times per second (per traded minute).

        Changing the rate changes the world (volumes split into more trades), so
        compute expected candles from the returned model, not the default one.
        """
        specs = []
        for spec in self.specs.values():
            per_second = rate if isinstance(rate, int | float) else rate.get(spec.symbol)
            if per_second is not None:
                per_minute = min(float(per_second) * 60.0, MAX_TRADES_PER_MINUTE - 1.0)
                spec = dataclasses.replace(spec, trades_per_minute=per_minute)
            specs.append(spec)
        return MarketModel(specs, seed=self.seed)

    # ------------------------------------------------------------- randomness
    def _rng(self, *parts: object) -> random.Random:
        key = "|".join(str(p) for p in (self.seed, *parts)).encode()
        return random.Random(int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big"))

    def _compute_anchor(self, symbol: str, day: int) -> float:
        """Log price at midnight of ``day`` (days since epoch): a dyadic Brownian bridge."""
        spec = self.specs[symbol]
        if day % _ANCHOR_SPAN_DAYS == 0:
            z, _ = _normal_pair(self._rng(symbol, "pin", day))
            return math.log(spec.price) + _ANCHOR_SPREAD * z
        half = day & -day  # day is the midpoint of [day - half, day + half]
        mid = 0.5 * (self._anchor(symbol, day - half) + self._anchor(symbol, day + half))
        std = min(spec.daily_vol * math.sqrt(2 * half) / 2.0, _BRIDGE_STD_CAP)
        z, _ = _normal_pair(self._rng(symbol, "mid", day))
        return mid + std * z

    # ------------------------------------------------------------ minute bars
    def _generate_day(self, symbol: str, day: int) -> Sequence[Bar | None]:
        """The 1440 full minute bars of a UTC day (None where nothing traded).

        Hot path (a 1d candle needs a whole day), hence the inlined arithmetic. A paced
        market takes its trade counts from ``_paced`` and scales volume with them; the
        rest of its bar is drawn as for any market.
        """
        spec = self.specs[symbol]
        day_start = day * DAY_MS
        if not (spec.trading_at(day_start) or spec.trading_at(day_start + DAY_MS - 1)):
            return _DayBars((None,) * MINUTES_PER_DAY)
        paced = self._paced(symbol, day) if spec.pacing is not None else None
        rng = self._rng(symbol, "day", day)
        rnd = rng.random
        log, sqrt, cos, sin = math.log, math.sqrt, math.cos, math.sin
        exp, expm1 = math.exp, math.expm1
        two_pi = 2.0 * math.pi
        sigma = spec.daily_vol / sqrt(MINUTES_PER_DAY)
        a0, a1 = self._anchor(symbol, day), self._anchor(symbol, day + 1)
        walk = [0.0] * (MINUTES_PER_DAY + 1)
        acc = 0.0
        for i in range(0, MINUTES_PER_DAY, 2):
            radius = sqrt(-2.0 * log(1.0 - rnd())) * sigma
            angle = two_pi * rnd()
            acc += radius * cos(angle)
            walk[i + 1] = acc
            acc += radius * sin(angle)
            walk[i + 2] = acc
        drift = (acc - (a1 - a0)) / MINUTES_PER_DAY  # bridge: end exactly at a1
        tick = float(spec.tick)
        ticks = [
            max(1, round(exp(a0 + walk[j] - drift * j) / tick)) for j in range(MINUTES_PER_DAY + 1)
        ]
        # Nine uniforms per minute, drawn up front: a fixed count keeps every
        # minute independent of the branches taken for earlier minutes.
        u = [rnd() for _ in range(9 * MINUTES_PER_DAY)]
        vol_units = spec.volume_per_minute / float(spec.step)
        tpm = spec.trades_per_minute
        active_fraction = spec.active_fraction
        excursion = sigma * _EXCURSION
        max_n = MAX_TRADES_PER_MINUTE - 1
        quote_scale = 10 ** (8 - spec.price_decimals - spec.qty_decimals)
        lo_minute = (spec.listed_ms - day_start) // MINUTE_MS
        hi_minute = MINUTES_PER_DAY
        if spec.delisted_ms is not None:
            hi_minute = min(hi_minute, -((day_start - spec.delisted_ms) // MINUTE_MS))
        bars: list[Bar | None] = []
        append = bars.append
        for i in range(MINUTES_PER_DAY):
            k = 9 * i
            if paced is not None:
                n = paced[i]
                if not n or not lo_minute <= i < hi_minute:
                    append(None)
                    continue
            elif u[k] >= active_fraction or not lo_minute <= i < hi_minute:
                append(None)
                continue
            r1 = sqrt(-2.0 * log(1.0 - u[k + 1]))
            a1_ = two_pi * u[k + 2]
            z_n, z_v = r1 * cos(a1_), r1 * sin(a1_)
            r2 = sqrt(-2.0 * log(1.0 - u[k + 3]))
            a2_ = two_pi * u[k + 4]
            z_up, z_dn = abs(r2 * cos(a2_)), abs(r2 * sin(a2_))
            r3 = sqrt(-2.0 * log(1.0 - u[k + 5]))
            a3_ = two_pi * u[k + 6]
            z_nb, z_tb = r3 * cos(a3_), r3 * sin(a3_)
            o, c = ticks[i], ticks[i + 1]
            if paced is None:
                n = round(tpm * exp(0.5 * z_n - 0.125))
                n = 1 if n < 1 else (max_n if n > max_n else n)
            if n == 1:
                c = o  # a single trade opens and closes the minute
            top, bot = (o, c) if o >= c else (c, o)
            if n <= 2:
                h, lo = top, bot  # no interior trade can print a wider range
            else:
                h = top + int(top * expm1(z_up * excursion))
                lo = bot - int(bot * -expm1(-z_dn * excursion))
                if lo < 1:
                    lo = 1
                if n == 3 and h > top and lo < bot:  # one interior trade: one extreme
                    if u[k + 7] < 0.5:
                        lo = bot
                    else:
                        h = top
            v = round(vol_units * (1.0 if paced is None else n / tpm) * exp(0.7 * z_v - 0.245))
            if v < n:
                v = n
            p_buy = 0.35 + 0.3 * u[k + 8]
            nb = round(n * p_buy + sqrt(n * p_buy * (1.0 - p_buy)) * z_nb)
            nb = 0 if nb < 0 else (n if nb > n else nb)
            if nb == 0:
                tbv = 0
            elif nb == n:
                tbv = v
            else:
                tbv = round(v * nb / n * (1.0 + 0.2 * z_tb))
                tbv = max(nb, min(v - (n - nb), tbv))
            q = (v * (o + h + lo + c) * quote_scale + 2) // 4
            append(Bar(o, h, lo, c, v, q, n, tbv, q * tbv // v, nb))
        return _DayBars(bars)

    def _burst_minutes(self, day: int, count: int) -> frozenset[int]:
        """The day's burst minutes (indices): ``count`` of them, where the seed says.
        The same for every paced market (a burst is market-wide, as a crash is); a
        larger ``count`` keeps the smaller one's minutes (a partial Fisher-Yates)."""
        rng = self._rng("bursts", day)
        picks = list(range(MINUTES_PER_DAY))
        for i in range(min(count, MINUTES_PER_DAY)):
            j = i + _randbelow(rng, MINUTES_PER_DAY - i)
            picks[i], picks[j] = picks[j], picks[i]
        return frozenset(picks[:count])

    def _paced_counts(self, symbol: str, day: int) -> Sequence[int]:
        """A paced market's trade count of each minute of ``day``: exactly
        ``Pacing.day_total`` in all, shared by weight (1, or ``burst_factor`` in burst
        minutes, times a lognormal jitter; cumulative floors keep the sum exact)."""
        spec = self.specs[symbol]
        pacing = spec.pacing
        assert pacing is not None
        total = pacing.day_total(spec.trades_per_minute)
        bursts = self._bursts(day, pacing.burst_minutes)
        rnd = self._rng(symbol, "pace", day).random
        sigma, factor = pacing.jitter, pacing.burst_factor
        log, sqrt, cos, sin, exp = math.log, math.sqrt, math.cos, math.sin, math.exp
        bias = -0.5 * sigma * sigma  # the lognormal's mean is 1
        cum = [0.0] * (MINUTES_PER_DAY + 1)
        acc = 0.0
        for i in range(0, MINUTES_PER_DAY, 2):
            radius = sqrt(-2.0 * log(1.0 - rnd()))
            angle = 2.0 * math.pi * rnd()
            for j, z in ((i, radius * cos(angle)), (i + 1, radius * sin(angle))):
                acc += exp(sigma * z + bias) * (factor if j in bursts else 1.0)
                cum[j + 1] = acc
        bounds = [int(total * c / acc) for c in cum]  # floors: c, total, acc >= 0
        bounds[-1] = total
        return array.array("q", [bounds[i + 1] - bounds[i] for i in range(MINUTES_PER_DAY)])

    def _count_day(self, symbol: str, day: int) -> list[int]:
        """The trade count of each minute of a day: ``[bar.n or 0 for bar in _day()]``.

        Why a second path: ids need the counts of every day between the id epoch and
        the day asked for, and drawing only what the counts depend on is much cheaper
        than ``_generate_day`` (~0.4 ms a day with numpy, ~2 ms without). It replays
        the same random stream (the walk's 1440 draws skipped in one call, then the
        per-minute uniforms read from the raw Mersenne Twister words exactly as
        ``random()`` combines them), so it is exact; numpy's transcendental functions
        may differ from ``math``'s in the last bits, so a count whose unrounded value
        lies near a rounding boundary is recomputed with ``math``. Tests compare the
        paths with the bars.
        """
        spec = self.specs[symbol]
        day_start = day * DAY_MS
        if not (spec.trading_at(day_start) or spec.trading_at(day_start + DAY_MS - 1)):
            return [0] * MINUTES_PER_DAY
        if spec.pacing is not None:
            return list(self._paced(symbol, day))  # listed at a midnight: whole days
        rng = self._rng(symbol, "day", day)
        rng.getrandbits(64 * MINUTES_PER_DAY)  # the walk: 1440 random() calls, 2 words each
        raw = rng.getrandbits(64 * 9 * MINUTES_PER_DAY).to_bytes(72 * MINUTES_PER_DAY, "little")
        lo_minute = max(0, (spec.listed_ms - day_start) // MINUTE_MS)
        hi_minute = MINUTES_PER_DAY
        if spec.delisted_ms is not None:
            hi_minute = min(hi_minute, -((day_start - spec.delisted_ms) // MINUTE_MS))
        if _np is not None and self.fast_counts:
            counts = _counts_numpy(raw, spec)
        else:
            words = _words(raw)
            counts = [_count_minute(words, i, spec) for i in range(MINUTES_PER_DAY)]
        counts[:lo_minute] = [0] * lo_minute
        counts[hi_minute:] = [0] * (MINUTES_PER_DAY - hi_minute)
        return counts

    def _day_total(self, symbol: str, day: int) -> int:
        return sum(self._count_day(symbol, day))

    def _minute_offsets(self, symbol: str, day: int) -> Sequence[int]:
        """Trades of the day before each minute (1441 entries, the last the day's total)."""
        return array.array("q", itertools.accumulate(self._count_day(symbol, day), initial=0))

    def minute_bar(self, symbol: str, minute_ms: int) -> Bar | None:
        """Full bar of the minute opening at ``minute_ms`` (None: no trades)."""
        sym = self.spec(symbol).symbol
        day, offset = divmod(minute_ms, DAY_MS)
        return self._day(sym, day)[offset // MINUTE_MS]

    # ------------------------------------------------------------------ trades
    def _generate_draws(self, symbol: str, minute_index: int) -> _Draws | None:
        """The trades of one minute, built to aggregate exactly to its bar (None: no bar).

        Cost ~2 us a trade (a busy universe market's minute is 10^5-10^6 trades: the
        streams generate it in a worker thread ahead of time, ``prepare``); written for
        speed, the draws are those of the plain loops they replace, in the same order.
        """
        bar = self.minute_bar(symbol, minute_index * MINUTE_MS)
        if bar is None:
            return None
        rng = self._rng(symbol, "trades", minute_index)
        rnd = rng.random
        n = bar.n
        last = MINUTE_MS - 1
        times = [int(rnd() * MINUTE_MS) for _ in range(n)]  # _randbelow(rng, MINUTE_MS)
        times = sorted([t if t < last else last for t in times])
        prices = [0] * n
        prices[0], prices[-1] = bar.o, bar.c
        # Two random interior slots (a partial Fisher-Yates over positions 1..n-2).
        inner = n - 2
        moved: dict[int, int] = {}
        for i in range(min(2, max(inner, 0))):
            j = i + _randbelow(rng, inner - i)
            moved[i], moved[j] = moved.get(j, j + 1), moved.get(i, i + 1)
        free = iter([moved.get(i, i + 1) for i in range(min(2, max(inner, 0)))])
        top, bot = max(bar.o, bar.c), min(bar.o, bar.c)
        special: dict[int, int] = {}
        if bar.h > top:
            special[next(free)] = bar.h
        if bar.l < bot:
            special[next(free)] = bar.l
        spread = (bar.h - bar.l) / 4.0
        o, dc, span, lo, hi = bar.o, bar.c - bar.o, n - 1, bar.l, bar.h
        for pos in range(1, n - 1):
            if pos in special:
                prices[pos] = special[pos]
                continue
            noisy = round(o + dc * pos / span + (rnd() * 2.0 - 1.0) * spread)
            prices[pos] = lo if noisy < lo else (hi if noisy > hi else noisy)
        order = list(range(n))
        for i in range(bar.nb):  # first nb shuffled positions are buyer-taker trades
            j = i + _randbelow(rng, n - i)
            order[i], order[j] = order[j], order[i]
        taker_buy = bytearray(n)
        for pos in order[: bar.nb]:
            taker_buy[pos] = 1
        buy_qty = iter(_split(rng, bar.tbv, bar.nb))
        sell_qty = iter(_split(rng, bar.v - bar.tbv, n - bar.nb))
        qtys = [next(buy_qty) if buy else next(sell_qty) for buy in taker_buy]
        return _Draws(array.array("H", times), _ints(prices), _ints(qtys), bytes(taker_buy))

    def _draws(self, symbol: str, minute_index: int) -> _Draws | None:
        return self._draws_cache.get((symbol, minute_index))

    def _trade_slice(
        self, spec: SymbolSpec, minute_index: int, draws: _Draws, positions: range
    ) -> Iterator[Trade]:
        """The trades at ``positions`` of a minute, with their ids (consecutive from the
        minute's first id). Built on demand: a minute's trades are never all objects."""
        if not positions:
            return
        pd, qd = spec.price_decimals, spec.qty_decimals
        first_id = self._minute_start_id(spec.symbol, minute_index)
        minute_ms = minute_index * MINUTE_MS
        times, prices, qtys, buys = draws
        symbol = spec.symbol
        for pos in positions:
            yield Trade(
                symbol=symbol,
                id=first_id + pos,
                time_ms=minute_ms + times[pos],
                price=Decimal(prices[pos]).scaleb(-pd),
                qty=Decimal(qtys[pos]).scaleb(-qd),
                buyer_is_maker=not buys[pos],
            )

    # --------------------------------------------------------------- trade ids
    def _minute_start_id(self, symbol: str, minute_index: int) -> int:
        day, i = divmod(minute_index, MINUTES_PER_DAY)
        return self._ids[symbol].day_start(day) + self._offsets(symbol, day)[i]

    def first_trade_id(self, symbol: str, t_ms: int) -> int:
        """Id of the first model trade in or after the minute containing ``t_ms``: the
        id a trade of that minute starts with, also where the minute has none."""
        return self._minute_start_id(self.spec(symbol).symbol, t_ms // MINUTE_MS)

    def trade_minute(self, symbol: str, trade_id: int, until_ms: int) -> int | None:
        """Open time of the minute holding the first model trade with an id >=
        ``trade_id``, looking no later than ``until_ms``'s day; None if there is none.

        An id before every trade (e.g. below ``MODEL_ID_FLOOR``: injected) gives the
        listing minute. Cost: the days between the id epoch and the answer, once.
        """
        spec = self.spec(symbol)
        index = self._ids[spec.symbol]
        if trade_id <= MODEL_ID_FLOOR:
            return max(spec.listed_ms - spec.listed_ms % MINUTE_MS, 0)
        day = index.day_of(trade_id, until_ms // DAY_MS)
        if day is None:
            return None
        offsets = self._offsets(spec.symbol, day)
        i = bisect.bisect_right(offsets, trade_id - index.day_start(day)) - 1
        return (day * MINUTES_PER_DAY + min(max(i, 0), MINUTES_PER_DAY - 1)) * MINUTE_MS

    def ids_ready(self, symbol: str, t_ms: int) -> bool:
        """Whether the ids of ``t_ms``'s day are counted (else the first lookup counts
        every day from the id epoch: ~2 ms each; a server does it off its loop)."""
        return self._ids[self.spec(symbol).symbol].covers(t_ms // DAY_MS)

    def warm_ids(self, symbol: str, t_ms: int) -> None:
        """Count the ids up to ``t_ms``'s day (call it from a worker thread)."""
        self._ids[self.spec(symbol).symbol].day_start(t_ms // DAY_MS)

    def trade_columns(self, symbol: str, start_ms: int, end_ms: int) -> list[TradeColumns]:
        """The trades of ``[start_ms, end_ms]`` as one ``TradeColumns`` per minute that
        has some, oldest first: slices of the generated arrays, no object per trade.
        The streams' hot path (a busy universe prints them column by column)."""
        spec = self.spec(symbol)
        start_ms = max(start_ms, spec.listed_ms)
        out: list[TradeColumns] = []
        for minute in range(start_ms // MINUTE_MS, end_ms // MINUTE_MS + 1):
            draws = self._draws(spec.symbol, minute)
            if draws is None:
                continue
            minute_ms = minute * MINUTE_MS
            times, prices, qtys, buys = draws
            lo = bisect.bisect_left(times, start_ms - minute_ms)
            hi = bisect.bisect_right(times, end_ms - minute_ms)
            if lo < hi:
                first_id = self._minute_start_id(spec.symbol, minute) + lo
                out.append(
                    TradeColumns(
                        first_id, minute_ms, times[lo:hi], prices[lo:hi], qtys[lo:hi], buys[lo:hi]
                    )
                )
        return out

    def trades_in_minute(self, symbol: str, minute_ms: int) -> tuple[Trade, ...]:
        """All model trades of the minute that opens at (or contains) ``minute_ms``."""
        spec = self.spec(symbol)
        draws = self._draws(spec.symbol, minute_ms // MINUTE_MS)
        if draws is None:
            return ()
        positions = range(len(draws.times))
        return tuple(self._trade_slice(spec, minute_ms // MINUTE_MS, draws, positions))

    def path_ticks(self, symbol: str, t_ms: int) -> int | None:
        """The price path at ``t_ms``, in ticks: its minute's open to its close, linear in
        time (the last close before an idle minute; None: nothing traded in the last
        hour). What a universe market's book centres on: it moves as the market does,
        without every trade's jitter."""
        spec = self.spec(symbol)
        minute = t_ms - t_ms % MINUTE_MS
        bar = self.minute_bar(spec.symbol, minute)
        if bar is not None:
            return round(bar.o + (bar.c - bar.o) * (t_ms - minute) / MINUTE_MS)
        for back in range(1, 61):
            bar = self.minute_bar(spec.symbol, minute - back * MINUTE_MS)
            if bar is not None:
                return bar.c
        return None

    def trade_position(self, symbol: str, trade_id: int, time_ms: int) -> tuple[int, int, int]:
        """Where a model trade lies: (its position in its minute, the minute's trade
        count, the trades of the same millisecond before it)."""
        spec = self.spec(symbol)
        minute = time_ms // MINUTE_MS
        position = trade_id - self._minute_start_id(spec.symbol, minute)
        draws = self._draws(spec.symbol, minute)
        if draws is None:
            return position, 0, 0
        first = bisect.bisect_left(draws.times, time_ms - minute * MINUTE_MS)
        return position, len(draws.times), position - first

    def burst_minutes(self, symbol: str, day: int) -> list[int]:
        """Open times of the burst minutes of ``day`` (days since 1970) for a paced
        market (none for the others): where the seed says, the same for every paced
        market with the same ``burst_fraction``."""
        pacing = self.spec(symbol).pacing
        if pacing is None:
            return []
        picked = self._bursts(day, pacing.burst_minutes)
        return [day * DAY_MS + i * MINUTE_MS for i in sorted(picked)]

    def in_burst(self, symbol: str, t_ms: int) -> bool:
        """Whether ``t_ms`` falls in a burst minute of a paced market."""
        pacing = self.spec(symbol).pacing
        if pacing is None or not pacing.burst_minutes:
            return False
        day, offset = divmod(t_ms, DAY_MS)
        return offset // MINUTE_MS in self._bursts(day, pacing.burst_minutes)

    def trades_ready(self, symbol: str, first_ms: int, last_ms: int) -> bool:
        """Whether the trades of ``[first_ms, last_ms]`` cost the caller nothing: ids
        counted and every minute generated (else ``prepare`` them in a worker thread)."""
        spec = self.spec(symbol)
        if not (self.ids_ready(spec.symbol, first_ms) and self.ids_ready(spec.symbol, last_ms)):
            return False
        minutes = range(first_ms // MINUTE_MS, last_ms // MINUTE_MS + 1)
        return all((spec.symbol, m) in self._draws_cache for m in minutes)

    def prepare(self, symbol: str, first_ms: int, last_ms: int) -> None:
        """Count the ids and generate the trades of ``[first_ms, last_ms]`` (call it from
        a worker thread: a busy market's minute takes a good fraction of a second)."""
        spec = self.spec(symbol)
        self.warm_ids(spec.symbol, first_ms)
        self.warm_ids(spec.symbol, last_ms)
        for minute in range(first_ms // MINUTE_MS, last_ms // MINUTE_MS + 1):
            self._draws(spec.symbol, minute)

    def iter_trades(
        self, symbol: str, start_ms: int, end_ms: int, *, from_id: int | None = None
    ) -> Iterator[Trade]:
        """Trades with ``start_ms <= time <= end_ms`` (and ``id >= from_id``), oldest first."""
        spec = self.spec(symbol)
        if from_id is not None:
            located = self.trade_minute(spec.symbol, from_id, end_ms)
            if located is None:
                return
            start_ms = max(start_ms, located)
        start_ms = max(start_ms, spec.listed_ms)
        minute = start_ms // MINUTE_MS
        while minute * MINUTE_MS <= end_ms:
            draws = self._draws(spec.symbol, minute)
            if draws is not None:
                minute_ms = minute * MINUTE_MS
                lo = bisect.bisect_left(draws.times, start_ms - minute_ms)
                hi = bisect.bisect_right(draws.times, end_ms - minute_ms)
                if from_id is not None and lo < hi:
                    lo = max(lo, from_id - self._minute_start_id(spec.symbol, minute))
                yield from self._trade_slice(spec, minute, draws, range(lo, hi))
            minute += 1

    def iter_trades_backward(
        self,
        symbol: str,
        end_ms: int,
        *,
        before_id: int | None = None,
        max_minutes: int = 7 * MINUTES_PER_DAY,
    ) -> Iterator[Trade]:
        """Trades with ``time <= end_ms`` (and ``id < before_id``), newest first.

        Scans at most ``max_minutes`` minutes back so an idle symbol cannot loop forever.
        """
        spec = self.spec(symbol)
        if before_id is not None:
            if before_id <= MODEL_ID_FLOOR + 1:
                return  # no model trade has a smaller id
            located = self.trade_minute(spec.symbol, before_id - 1, end_ms)
            if located is not None:  # else every trade up to end_ms is older
                end_ms = min(end_ms, located + MINUTE_MS - 1)
        minute = end_ms // MINUTE_MS
        stop = max(spec.listed_ms // MINUTE_MS, minute - max_minutes)
        while minute >= stop:
            draws = self._draws(spec.symbol, minute)
            if draws is not None:
                hi = bisect.bisect_right(draws.times, end_ms - minute * MINUTE_MS)
                if before_id is not None and hi:
                    hi = min(hi, before_id - self._minute_start_id(spec.symbol, minute))
                yield from self._trade_slice(spec, minute, draws, range(hi - 1, -1, -1))
            minute -= 1

    def last_price(self, symbol: str, t_ms: int, max_minutes: int) -> Decimal | None:
        """Price of the last model trade at or before ``t_ms`` within ``max_minutes``
        (None: no trade): what books centre on; needs no trade ids."""
        spec = self.spec(symbol)
        minute = t_ms // MINUTE_MS
        stop = max(spec.listed_ms // MINUTE_MS, minute - max_minutes)
        while minute >= stop:
            draws = self._draws(spec.symbol, minute)
            if draws is not None:
                offset = t_ms - minute * MINUTE_MS
                done = bisect.bisect_right(draws.times, offset)
                if done:
                    return Decimal(draws.prices[done - 1]).scaleb(-spec.price_decimals)
            minute -= 1
        return None

    # ----------------------------------------------------------------- candles
    def _compute_closed_bar(self, symbol: str, length: int, open_ms: int) -> Bar | None:
        if length == MINUTE_MS:
            return self.minute_bar(symbol, open_ms)
        if length > DAY_MS:
            days = range(open_ms, open_ms + length, DAY_MS)
            return combine_bars([self._closed(symbol, DAY_MS, d) for d in days])
        day, offset = divmod(open_ms, DAY_MS)
        first = offset // MINUTE_MS
        return combine_bars(self._day(symbol, day)[first : first + length // MINUTE_MS])

    def _partial_minute(self, symbol: str, minute_ms: int, now_ms: int) -> Bar | None:
        """The minute containing ``now``: aggregated from its trades so far (no ids needed)."""
        full = self.minute_bar(symbol, minute_ms)
        draws = self._draws(symbol, minute_ms // MINUTE_MS)
        if full is None or draws is None:
            return None
        done = bisect.bisect_right(draws.times, now_ms - minute_ms)
        if not done:
            return None
        prices, qtys, buys = draws.prices[:done], draws.qtys[:done], draws.taker_buy[:done]
        v = sum(qtys)
        tbv = sum(q for q, buy in zip(qtys, buys, strict=True) if buy)
        q = full.q * v // full.v
        return Bar(
            o=prices[0],
            h=max(prices),
            l=min(prices),
            c=prices[-1],
            v=v,
            q=q,
            n=done,
            tbv=tbv,
            tbq=q * tbv // v,
            nb=sum(buys),
        )

    def _open_bar(self, symbol: str, length: int, open_ms: int, now_ms: int) -> Bar | None:
        now_minute = now_ms - now_ms % MINUTE_MS
        parts: list[Bar | None] = []
        t = open_ms
        while t < now_minute:
            if length > DAY_MS and t % DAY_MS == 0 and t + DAY_MS <= now_minute:
                parts.append(self._closed(symbol, DAY_MS, t))
                t += DAY_MS
            else:
                parts.append(self.minute_bar(symbol, t))
                t += MINUTE_MS
        parts.append(self._partial_minute(symbol, now_minute, now_ms))
        return combine_bars(parts)

    def candle(
        self, symbol: str, interval: str, open_ms: int, now_ms: int | None = None
    ) -> Kline | None:
        """The candle opening at ``open_ms``; None if nothing traded in it (or it is future).

        With ``now_ms`` the candle containing it is partial (``closed=False``);
        without it every candle is complete.
        """
        spec = self.spec(symbol)
        length = interval_ms(interval)
        if interval_open(interval, open_ms) != open_ms:
            raise ValueError(f"{open_ms} is not a {interval} open time")
        if now_ms is not None and open_ms > now_ms:
            return None
        closed = now_ms is None or open_ms + length <= now_ms
        if closed:
            bar = self._closed(spec.symbol, length, open_ms)
        else:
            assert now_ms is not None
            bar = self._open_bar(spec.symbol, length, open_ms, now_ms)
        if bar is None:
            return None
        return _kline(spec, interval, open_ms, length, bar, closed)

    def rolling_day(self, symbol: str, now_ms: int) -> Kline | None:
        """The 24 h before the minute containing ``now_ms`` (its 1,440 closed minutes),
        as one candle (interval ``"24h"``; None: nothing traded): what the exchanges'
        24 h tickers report. Closed minutes only, so it never generates the current
        minute's trades (seconds of work for a hot universe market)."""
        spec = self.spec(symbol)
        end = now_ms - now_ms % MINUTE_MS
        parts: list[Bar | None] = []
        t = end - DAY_MS
        while t < end:
            day, offset = divmod(t, DAY_MS)
            first = offset // MINUTE_MS
            count = min(MINUTES_PER_DAY - first, (end - t) // MINUTE_MS)
            parts.extend(self._day(spec.symbol, day)[first : first + count])
            t += count * MINUTE_MS
        bar = combine_bars(parts)
        if bar is None:
            return None
        return _kline(spec, "24h", end - DAY_MS, DAY_MS, bar, True)

    def klines(
        self, symbol: str, interval: str, start_ms: int, end_ms: int, now_ms: int | None = None
    ) -> list[Kline]:
        """Every candle with ``start_ms <= open <= end_ms`` (and open <= now), oldest first."""
        return self.select_klines(
            symbol, interval, start_ms=start_ms, end_ms=end_ms, limit=None, now_ms=now_ms
        )

    def select_klines(
        self,
        symbol: str,
        interval: str,
        *,
        start_ms: int | None,
        end_ms: int | None,
        limit: int | None,
        now_ms: int | None,
    ) -> list[Kline]:
        """Binance's klines selection.

        With a start: the first ``limit`` candles opening at or after it. Without:
        the last ``limit`` candles opening at or before the end (default now).
        Candles with no trades are skipped and do not count toward the limit.
        """
        spec = self.spec(symbol)
        length = interval_ms(interval)
        bounds = [t for t in (end_ms, now_ms) if t is not None]
        if spec.delisted_ms is not None:
            bounds.append(spec.delisted_ms - 1)
        if not bounds:
            raise ValueError("need end_ms or now_ms")
        upper = min(bounds)
        if upper < 0:
            return []
        last_open = interval_open(interval, upper)
        first_open = interval_open(interval, spec.listed_ms)
        out: list[Kline] = []
        if start_ms is not None:
            t = max(_align_up(interval, max(start_ms, 0)), first_open)
            while t <= last_open and (limit is None or len(out) < limit):
                kline = self.candle(spec.symbol, interval, t, now_ms)
                if kline is not None:
                    out.append(kline)
                t += length
            return out
        t = last_open
        while t >= first_open and (limit is None or len(out) < limit):
            kline = self.candle(spec.symbol, interval, t, now_ms)
            if kline is not None:
                out.append(kline)
            t -= length
        out.reverse()
        return out


DEFAULT_MODEL = MarketModel()


def expected_klines(
    symbol: str,
    interval: str,
    start_ms: int,
    end_ms: int,
    *,
    now_ms: int | None = None,
    model: MarketModel | None = None,
) -> list[Kline]:
    """Candles the simulator serves for ``symbol``/``interval`` with open in [start, end].

    Pass the server's ``now_ms`` to include the still-open candle exactly as
    served; use ``model=server.model`` when the server was built with a
    non-default model.
    """
    return (model or DEFAULT_MODEL).klines(symbol, interval, start_ms, end_ms, now_ms=now_ms)


def _kline(
    spec: SymbolSpec, interval: str, open_ms: int, length: int, bar: Bar, closed: bool
) -> Kline:
    """``bar`` (integer units) as the candle of ``spec`` opening at ``open_ms``."""
    pd, qd = spec.price_decimals, spec.qty_decimals
    return Kline(
        symbol=spec.symbol,
        interval=interval,
        open_time=open_ms,
        close_time=open_ms + length - 1,
        open=Decimal(bar.o).scaleb(-pd),
        high=Decimal(bar.h).scaleb(-pd),
        low=Decimal(bar.l).scaleb(-pd),
        close=Decimal(bar.c).scaleb(-pd),
        volume=Decimal(bar.v).scaleb(-qd),
        quote_volume=Decimal(bar.q).scaleb(-8),
        trades=bar.n,
        taker_buy_base=Decimal(bar.tbv).scaleb(-qd),
        taker_buy_quote=Decimal(bar.tbq).scaleb(-8),
        closed=closed,
    )
