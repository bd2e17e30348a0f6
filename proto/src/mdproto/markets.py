"""Records of the compacted Kafka topic `market.markets`: one decoder for every reader
(the relay's symbol checks, the pipeline's Iceberg table), and how a market's prices
and amounts are shown (`Precision`: the SDK's CLI and the gateway's book ladder)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal

from mdproto import envelope, topics
from mdproto.error_codes import BAD_TICKER
from mdproto.errors import ProtocolError
from mdproto.messages import Market


def decode_market_record(key: bytes | None, value: bytes | None) -> tuple[str, Market | None]:
    """(ticker, Market), or (ticker, None) for a tombstone: the market was removed.

    The record's own `ticker` wins over the key (they agree when an ingestor wrote
    it). Raises `ProtocolError` for a value that does not decode or a ticker that is
    not `EXCHANGE:BASE/QUOTE`.
    """
    ticker = key.decode("utf-8", "replace") if key else ""
    market = envelope.decode_record(value, Market) if value is not None else None
    if market is not None and market.ticker:
        ticker = market.ticker
    try:
        topics.parse_ticker(ticker)
    except ProtocolError as exc:
        raise ProtocolError(BAD_TICKER, exc.reason) from None
    return ticker, market


def step_decimals(step: float) -> int | None:
    """Decimals that show every value on a grid of `step` (a market's tick or lot size,
    `Market.price_precision` / `amount_precision`): 0.01 -> 2, 0.5 -> 1, 10 -> 0,
    1e-8 -> 8; None when the step is unknown (0, negative, not finite).

    Read from the step's shortest decimal form, as the exchange wrote it, so a double
    such as 0.1 (0.1000000000000000055...) gives 1, not 55.
    """
    if not math.isfinite(step) or step <= 0:
        return None
    exponent = Decimal(repr(step)).normalize().as_tuple().exponent
    assert isinstance(exponent, int)  # finite
    return max(0, -exponent)


def price_difference(high: float, low: float) -> float:
    """`high - low` in the prices' own decimals (51788.56 - 51788.55 is 0.01, not
    0.00999999999476131): prices are doubles read from the exchange's decimal strings."""
    return float(Decimal(repr(high)) - Decimal(repr(low)))


@dataclass(frozen=True, slots=True)
class Precision:
    """How a market's prices and amounts are shown: at its tick and lot size.

    A double prints with as many digits as it happens to have (54008, 54007.7,
    54008.13 in one ladder column); at the tick size every price has the same
    decimals. Unknown steps (None: no market metadata) print each value in its
    shortest exact form.
    """

    price_decimals: int | None = None
    amount_decimals: int | None = None

    @classmethod
    def of(cls, price_step: float, amount_step: float) -> Precision:
        """From `Market.price_precision` and `amount_precision` (0: not given)."""
        return cls(step_decimals(price_step), step_decimals(amount_step))

    def price(self, value: float) -> str:
        return _show(value, self.price_decimals)

    def amount(self, value: float) -> str:
        return _show(value, self.amount_decimals)


def _show(value: float, decimals: int | None) -> str:
    if decimals is not None:
        return f"{value:.{decimals}f}"
    if not math.isfinite(value):
        return repr(value)
    return f"{Decimal(repr(value)).normalize():f}"  # 54008.0 -> 54008, 1e-08 -> 0.00000001
