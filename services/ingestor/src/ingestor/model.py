"""Exchange-neutral values passed between the ccxt adapter and the rest.

The adapter (`exchanges.py`) turns ccxt's lists and dicts into these, so the
pure modules never see ccxt types and can be tested with plain values.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple

from mdproto import error_codes


@dataclass(frozen=True, slots=True)
class Candle:
    """One OHLCV candle as the exchange reported it.

    The optional fields are None where the exchange does not report them (so a
    real zero and "unknown" stay apart). `final` is the exchange's own "this
    candle is complete" flag where it has one (OKX `confirm`, Kraken `last`).
    """

    open_time_ms: int
    open: float
    high: float
    low: float
    close: float
    volume: float
    trade_count: int | None = None
    quote_volume: float | None = None
    taker_buy_volume: float | None = None
    taker_buy_quote_volume: float | None = None
    final: bool | None = None


class RawFields(NamedTuple):
    """A candle's fields that ccxt's OHLCV drops, read from the raw response.

    A tuple in `Candle`'s order of its optional fields, so a candle is completed
    with one constructor call (`Candle(*ohlcv, *fields)`), cheap at 1000 a page.
    """

    trade_count: int | None = None
    quote_volume: float | None = None
    taker_buy_volume: float | None = None
    taker_buy_quote_volume: float | None = None
    final: bool | None = None


@dataclass(frozen=True, slots=True)
class Trade:
    """One executed trade from the exchange's trade stream."""

    trade_id: str
    price: float
    amount: float
    timestamp_ms: int
    side: str  # "buy", "sell" or "" (taker side)


@dataclass(frozen=True, slots=True)
class MarketInfo:
    """The metadata the platform publishes for one listed market."""

    symbol: str  # unified, BASE/QUOTE
    exchange_symbol: str  # exchange-native id, e.g. BTCUSDT
    base: str
    quote: str
    active: bool
    price_precision: float
    amount_precision: float
    min_amount: float
    max_amount: float
    min_price: float
    max_price: float
    min_cost: float


class FaultKind(enum.Enum):
    """Why an exchange call failed, as far as retrying is concerned."""

    RATE_LIMITED = error_codes.RATE_LIMITED  # 429/418, DDoSProtection, RateLimitExceeded
    UNAVAILABLE = error_codes.EXCHANGE_UNAVAILABLE  # 503, refused connection, maintenance
    TIMEOUT = error_codes.TIMEOUT  # request timed out
    NETWORK = error_codes.NETWORK_ERROR  # other transient failure (disconnect, bad nonce)
    BAD_SYMBOL = error_codes.BAD_SYMBOL  # the exchange does not know the symbol
    BAD_REQUEST = error_codes.BAD_REQUEST  # the exchange rejected the parameters
    NOT_SUPPORTED = error_codes.NOT_SUPPORTED  # the exchange lacks the feature
    EXCHANGE_ERROR = error_codes.EXCHANGE_ERROR  # any other error the exchange reported

    @property
    def transient(self) -> bool:
        return self in _TRANSIENT


_TRANSIENT = frozenset(
    {FaultKind.RATE_LIMITED, FaultKind.UNAVAILABLE, FaultKind.TIMEOUT, FaultKind.NETWORK}
)


class ExchangeCallError(Exception):
    """An exchange call failed; `kind` drives the retry policy.

    `retry_after_s` is the wait the exchange asked for (Retry-After header or a
    ban's end), when it said one.
    """

    def __init__(self, kind: FaultKind, reason: str, retry_after_s: float | None = None) -> None:
        super().__init__(f"{kind.value}: {reason}")
        self.kind = kind
        self.reason = reason
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class BookView:
    """The best `depth` levels per side of an exchange's book after one update.

    Copied out of ccxt's book at once (ccxt mutates its book in place on the
    next message). `nonce` is the exchange's update id the book is at (0: none).
    """

    bids: dict[float, float]
    asks: dict[float, float]
    nonce: int
    timestamp_ms: int


class BookIntegrity(enum.Enum):
    """Why the exchange's book stream cannot be trusted any more (a reset's cause)."""

    SEQUENCE_GAP = "sequence_gap"  # an update id was skipped
    CHECKSUM = "checksum"  # the exchange's checksum disagrees with the book


class BookIntegrityError(Exception):
    """The book the exchange stream built is wrong; watching again rebuilds it from a
    fresh snapshot (ccxt forgets its book when it raises)."""

    def __init__(self, kind: BookIntegrity, reason: str) -> None:
        super().__init__(f"{kind.value}: {reason}")
        self.kind = kind
        self.reason = reason
