"""Fault injection rules: the next N matching requests misbehave in a chosen way.

Why: the ingestor's retry/back-off logic must be tested against the real
failure modes of an exchange (rate limits, bans, outages, slowness, bad
symbols) and those must be switchable per test, from Python or over HTTP; and
its integrity report against answers that are wrong without saying so (a page
cut short or empty: `truncate`); and its order-book integrity checks against a
stream that loses an event (`book_drop`) or sends a wrong checksum (`book_checksum`):
those two act on the next book event of `symbol`, never on a request.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, cast

FaultKind = Literal[
    "rate_limit",
    "ban",
    "unavailable",
    "slow",
    "unknown_symbol",
    "error",
    "truncate",
    "book_drop",
    "book_checksum",
]

#: Faults of the book streams: consumed by stream events (`FaultBook.take_event`).
STREAM_KINDS: frozenset[str] = frozenset({"book_drop", "book_checksum"})

#: Accepted spellings (HTTP status codes are handy in JSON) -> canonical kind.
KIND_ALIASES: dict[str, FaultKind] = {
    "rate_limit": "rate_limit",
    "429": "rate_limit",
    "ban": "ban",
    "418": "ban",
    "unavailable": "unavailable",
    "503": "unavailable",
    "slow": "slow",
    "delay": "slow",
    "unknown_symbol": "unknown_symbol",
    "bad_symbol": "unknown_symbol",
    "error": "error",
    "truncate": "truncate",
    "book_drop": "book_drop",
    "book_checksum": "book_checksum",
}

_ids = itertools.count(1)


class FaultError(ValueError):
    """A fault description that cannot be applied (bad JSON from a test)."""


@dataclass
class Fault:
    """One armed fault; ``remaining`` counts down as matching requests hit it."""

    kind: FaultKind
    count: int = 1
    path: str | None = None  # substring of the request path; None matches all
    exchange: str | None = None  # "binance" / "coinbase"; None matches both
    retry_after: int = 1  # seconds, for rate_limit / ban
    delay: float = 0.0  # seconds, for slow
    status: int = 500  # for error
    body: str | None = None  # for error (default: the exchange's generic error)
    after: int = 0  # matching requests let through before the fault applies (a later page)
    keep: float = 0.5  # for truncate: the fraction of the candle rows kept (0: an empty page)
    symbol: str | None = None  # for book_*: the market (BTC/USDT); None matches all
    id: int = field(default_factory=lambda: next(_ids))
    remaining: int = -1  # set from count

    def __post_init__(self) -> None:
        if self.remaining < 0:
            self.remaining = self.count

    def matches(self, exchange: str, path: str) -> bool:
        return (
            self.remaining > 0
            and self.kind not in STREAM_KINDS
            and (self.exchange is None or self.exchange == exchange)
            and (self.path is None or self.path in path)
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def parse_fault(data: Mapping[str, Any]) -> Fault:
    """Build a fault from the JSON of ``POST /_sim/faults`` (see README)."""
    raw_kind = str(data.get("kind", ""))
    kind = KIND_ALIASES.get(raw_kind)
    if kind is None:
        raise FaultError(f"unknown fault kind {raw_kind!r}; one of {sorted(KIND_ALIASES)}")
    try:
        fault = Fault(
            kind=kind,
            count=int(data.get("count", 1)),
            path=cast(str | None, data.get("path")),
            exchange=cast(str | None, data.get("exchange")),
            retry_after=int(data.get("retry_after", 1)),
            delay=float(data.get("delay", 0.0)),
            status=int(data.get("status", 500)),
            body=cast(str | None, data.get("body")),
            after=int(data.get("after", 0)),
            keep=float(data.get("keep", 0.5)),
            symbol=cast(str | None, data.get("symbol")),
        )
    except (TypeError, ValueError) as exc:
        raise FaultError(str(exc)) from None
    if fault.count < 1:
        raise FaultError("count must be >= 1")
    if fault.after < 0:
        raise FaultError("after must be >= 0")
    if not 0 <= fault.keep <= 1:
        raise FaultError("keep must be between 0 and 1")
    return fault


def candle_rows(body: Any) -> list[Any] | None:
    """The candle rows of a candle answer of any simulated exchange (the list itself), or
    None: Binance and Coinbase answer a bare list, OKX `data`, Bybit `result.list`,
    Kraken `result.<pair>` (besides `last`)."""
    if isinstance(body, list):
        return body
    if not isinstance(body, dict):
        return None
    if isinstance(body.get("data"), list):
        return cast(list[Any], body["data"])
    result = body.get("result")
    if not isinstance(result, dict):
        return None
    if isinstance(result.get("list"), list):
        return cast(list[Any], result["list"])
    pairs = [v for k, v in result.items() if k != "last" and isinstance(v, list)]
    return pairs[0] if len(pairs) == 1 else None


def truncate(body: Any, keep: float) -> Any:
    """`body` with only the first `keep` fraction of its candle rows, in the order the
    exchange sends them (a page cut short: Binance and Kraken lose their newest
    candles, OKX, Bybit and Coinbase their oldest); anything else unchanged."""
    rows = candle_rows(body)
    if rows is not None:
        del rows[int(len(rows) * keep) :]
    return body


class FaultBook:
    """Armed faults in arrival order; the first matching one is consumed per request."""

    def __init__(self) -> None:
        self._faults: list[Fault] = []

    def add(self, fault: Fault) -> Fault:
        self._faults.append(fault)
        return fault

    def clear(self) -> None:
        self._faults.clear()

    def take(self, exchange: str, path: str) -> Fault | None:
        """Consume one use of the first fault matching this request, if any."""
        for fault in self._faults:
            if fault.matches(exchange, path):
                if fault.after > 0:  # not yet: this request passes this fault
                    fault.after -= 1
                    continue
                fault.remaining -= 1
                if fault.remaining == 0:
                    self._faults.remove(fault)
                return fault
        return None

    def take_event(self, kind: str, exchange: str, symbol: str) -> Fault | None:
        """Consume one use of the first stream fault `kind` armed for this market's event."""
        for fault in self._faults:
            if (
                fault.kind == kind
                and fault.remaining > 0
                and fault.exchange in (None, exchange)
                and fault.symbol in (None, symbol)
            ):
                fault.remaining -= 1
                if fault.remaining == 0:
                    self._faults.remove(fault)
                return fault
        return None

    def pending(self) -> list[Fault]:
        return list(self._faults)
