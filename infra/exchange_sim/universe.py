"""A universe of markets: the simulator as a load generator (issue 44, item 1).

Why: the platform must be measured at the scale of a whole exchange (hundreds of
markets, tens of thousands of trades a second, a few hot markets and a long tail,
bursts), and recorded at that scale, against data a test can still recompute. A
``Universe`` adds ``markets`` *paced* markets (``model.Pacing``) to the model, listed
by every exchange front-end like the default ones: ``U001/USDT`` (Binance and Bybit
``U001USDT``, OKX and Coinbase ``U001-USDT``, Kraken ``U001USDT``), ... ``U200/USDT``.

* Rates: the market of rank ``r`` (U001 is rank 1) trades ``rate * r**-skew / H``
  trades a second outside bursts (``H`` normalises: the ranks sum to ``rate``), a
  Zipf law; ``skew=0`` gives every market the same rate.
* Bursts: ``burst_fraction`` of each UTC day's minutes (the same minutes for every
  market: a burst is market-wide, as a crash is) trade ``burst_factor`` times the rate.
* Minutes: each minute's count is the rate times a lognormal ``jitter`` (mean 1),
  shared out of a fixed day total, so a market's ids are closed-form (no counting).
* Books change ``book_ratio`` levels per trade on average (at most every level at
  every 100 ms step), so book traffic follows the trade rate.
* Static data (centre price, tick, step, volatility, trade size) are a pure function
  of the market's name: sensible exchange-like values (a 60,000 market ticks 0.01 and
  steps 0.00001, a 0.15 one ticks 0.00001 and steps 1).

Nothing here does I/O: ``Universe(...).model()`` is a ``MarketModel`` like any other.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from .model import DEFAULT_MODEL, MarketModel, Pacing, SymbolSpec

#: Every universe market is listed at this UTC midnight (candles and trades from it on).
UNIVERSE_LISTED_MS = int(datetime(2024, 1, 1, tzinfo=UTC).timestamp() * 1000)


def _units(name: str, count: int) -> list[float]:
    """``count`` uniforms in [0, 1) that depend on ``name`` only (blake2b, unsalted)."""
    digest = hashlib.blake2b(f"universe|{name}".encode(), digest_size=8 * count).digest()
    return [int.from_bytes(digest[8 * i : 8 * i + 8], "big") / 2.0**64 for i in range(count)]


def _power_of_ten(exponent: int) -> str:
    """``-2`` -> ``"0.01"``, ``0`` -> ``"1"``: an increment as SymbolSpec takes it."""
    return format(Decimal(1).scaleb(exponent), "f")


def market_spec(
    symbol: str, trades_per_second: float, pacing: Pacing, listed_ms: int = UNIVERSE_LISTED_MS
) -> SymbolSpec:
    """One universe market: static values from its name, its rate, its pacing."""
    u_price, u_vol, u_size = _units(symbol, 3)
    price = float(f"{10 ** (-3.0 + 7.7 * u_price):.3g}")  # 0.001 .. 50,000
    e = math.floor(math.log10(price))
    tick_exp = max(-8, min(-2, e - 4))  # ~5 significant digits, 0.01 at most (Binance)
    step_exp = min(0, -e - 1)  # a step is worth ~0.1-1 quote units
    notional = 10 ** (1.7 + 1.6 * u_size)  # 50 .. 2,000 quote units a trade
    per_minute = trades_per_second * 60.0
    return SymbolSpec(
        symbol=symbol,
        price=price,
        tick=_power_of_ten(tick_exp),
        step=_power_of_ten(step_exp),
        daily_vol=0.03 + 0.06 * u_vol,
        trades_per_minute=per_minute,
        volume_per_minute=max(per_minute, 1.0) * notional / price,
        listed_ms=listed_ms,
        pacing=pacing,
    )


@dataclass(frozen=True)
class Universe:
    """``markets`` paced markets trading ``rate`` trades/s in all (outside bursts).

    ``skew``: the Zipf exponent over market rank; ``burst_fraction``/``burst_factor``:
    the share of minutes that burst and by how much; ``jitter``: stdev of the log of
    a minute's rate; ``book_ratio``: book level changes per trade.
    """

    markets: int
    rate: float = 1000.0
    skew: float = 1.0
    burst_fraction: float = 0.0
    burst_factor: float = 5.0
    jitter: float = 0.1
    book_ratio: float = 1.0
    prefix: str = "U"
    quote: str = "USDT"

    def __post_init__(self) -> None:
        if self.markets < 1:
            raise ValueError("a universe has at least one market")
        if self.rate < 0 or self.skew < 0:
            raise ValueError("rate and skew must be >= 0")
        if not self.prefix.isalpha() or not self.prefix.isupper():
            raise ValueError("prefix: upper-case letters (market ids are alphanumeric)")
        self.pacing()  # validates the burst, jitter and book values

    def pacing(self) -> Pacing:
        return Pacing(
            burst_fraction=self.burst_fraction,
            burst_factor=self.burst_factor,
            jitter=self.jitter,
            book_ratio=self.book_ratio,
        )

    def symbols(self) -> list[str]:
        """``U001/USDT``, ... hottest first (more digits past 999 markets)."""
        width = max(3, len(str(self.markets)))
        return [f"{self.prefix}{r:0{width}d}/{self.quote}" for r in range(1, self.markets + 1)]

    def rates(self) -> list[float]:
        """Trades a second of each market outside bursts, hottest first; sum: ``rate``."""
        weights = [rank**-self.skew for rank in range(1, self.markets + 1)]
        total = sum(weights)
        return [self.rate * w / total for w in weights]

    def specs(self) -> tuple[SymbolSpec, ...]:
        pacing = self.pacing()
        return tuple(
            market_spec(symbol, rate, pacing)
            for symbol, rate in zip(self.symbols(), self.rates(), strict=True)
        )

    def model(self, base: MarketModel | None = None) -> MarketModel:
        """``base`` (default: the 13 default markets) with this universe's markets."""
        return (base or DEFAULT_MODEL).with_specs(self.specs())


__all__ = ["UNIVERSE_LISTED_MS", "Universe", "market_spec"]
