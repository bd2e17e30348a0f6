"""ccxt adapter: exception classification (what the retry policy sees)."""

from __future__ import annotations

import pytest
from ccxt.base import errors as e

from ingestor.exchanges import fault_from
from ingestor.model import FaultKind


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (e.DDoSProtection("429"), FaultKind.RATE_LIMITED),
        (e.RateLimitExceeded("x"), FaultKind.RATE_LIMITED),
        (e.ExchangeNotAvailable("503"), FaultKind.UNAVAILABLE),
        (e.OnMaintenance("m"), FaultKind.UNAVAILABLE),
        (e.RequestTimeout("t"), FaultKind.TIMEOUT),
        (e.NetworkError("n"), FaultKind.NETWORK),
        (e.BadResponse("garbled"), FaultKind.NETWORK),
        (e.BadSymbol("s"), FaultKind.BAD_SYMBOL),
        (e.BadRequest("b"), FaultKind.BAD_REQUEST),
        (e.NotSupported("ns"), FaultKind.NOT_SUPPORTED),
        (e.AuthenticationError("a"), FaultKind.EXCHANGE_ERROR),
        (e.ExchangeError("x"), FaultKind.EXCHANGE_ERROR),
        (ValueError("odd"), FaultKind.EXCHANGE_ERROR),
    ],
)
def test_classification(exc: Exception, kind: FaultKind) -> None:
    fault = fault_from(exc)
    assert fault.kind == kind
    assert fault.kind.transient == (
        kind
        in {FaultKind.RATE_LIMITED, FaultKind.UNAVAILABLE, FaultKind.TIMEOUT, FaultKind.NETWORK}
    )


def test_ban_time_is_read_from_the_message() -> None:
    now = 1_700_000_000_000
    fault = fault_from(e.DDoSProtection(f"binance 418 IP banned until {now + 5000}."), now_ms=now)
    assert fault.retry_after_s == 5.0


def test_rows_with_missing_values_convert_safely() -> None:
    from ingestor.exchanges import _candle
    from ingestor.model import Candle

    assert _candle([60_000, None, "2", 3, 4.5]) == Candle(60_000, 0.0, 2.0, 3.0, 4.5, 0.0)
