"""`RequestFailedError`: a request that cannot complete, with the `error_code` its
ERROR marker or response carries (a constant of `mdproto.error_codes`, or an
exchange call's `FaultKind` value, which is one of them)."""

from __future__ import annotations


class RequestFailedError(Exception):
    """A request that cannot complete; becomes an ERROR marker / response."""

    def __init__(self, error_code: str, reason: str) -> None:
        super().__init__(f"{error_code}: {reason}")
        self.error_code = error_code
        self.reason = reason


class PeriodNotServedError(RequestFailedError):
    """The exchange serves no candles of the period (``unsupported_period``): a history
    request may still be answered with bars from recorded trades (ADR 0015)."""
