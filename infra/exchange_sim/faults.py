"""Fault injection rules: the next N matching requests misbehave in a chosen way.

Why: the ingestor's retry/back-off logic must be tested against the real
failure modes of an exchange (rate limits, bans, outages, slowness, bad
symbols) and those must be switchable per test, from Python or over HTTP; and
its integrity report against answers that are wrong without saying so (a page
cut short or empty: `truncate`); and its order-book integrity checks against a
stream that loses an event (`book_drop`) or sends a wrong checksum (`book_checksum`):
those two act on the next book event of `symbol`, never on a request. Its trade-gap
repair needs a trade stream that skips trades (`trade_drop`: the next `count` model
trades of `symbol` are not streamed, REST still serves them) and an exchange that is
unreachable for a while (`ws_outage`: stream connections closed and refused for
`seconds` of the simulator clock).
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping
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
    "trade_drop",
    "ws_outage",
]

#: Faults of the streams, never of a request: book events consume `book_*`
#: (`FaultBook.take_event`), model trades `trade_drop` (`take_trades`); `ws_outage`
#: lasts until its `until_ms` (`outage`).
STREAM_KINDS: frozenset[str] = frozenset({"book_drop", "book_checksum", "trade_drop", "ws_outage"})

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
    "trade_drop": "trade_drop",
    "ws_outage": "ws_outage",
    "outage": "ws_outage",
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
    symbol: str | None = None  # book_*, trade_drop, ws_outage: the market; None matches all
    seconds: float = 120.0  # for ws_outage: how long connections are refused (simulator clock)
    mode: str = "close"  # for ws_outage: "close" (close frame 1001) or "abort" (TCP cut)
    until_ms: int | None = None  # for ws_outage: set when it starts
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
            seconds=float(data.get("seconds", 120.0)),
            mode=str(data.get("mode", "close")),
        )
    except (TypeError, ValueError) as exc:
        raise FaultError(str(exc)) from None
    if fault.seconds <= 0:
        raise FaultError("seconds must be > 0")
    if fault.mode not in ("close", "abort"):
        raise FaultError("mode must be 'close' or 'abort'")
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

    def armed(self, kind: str) -> bool:
        return any(f.kind == kind for f in self._faults)

    def take_trades(
        self, symbol: str, exchanges: Collection[str], count: int
    ) -> list[tuple[Fault, int, int]]:
        """Consume the armed `trade_drop`s that hit a batch of `count` model trades of
        `symbol`, streamed to connections of `exchanges`: `(fault, first, n)`, the
        fault drops the batch's trades `[first, first + n)` (for its `exchange` only,
        if it names one). Each fault takes the next trades not yet dropped for it."""
        taken: dict[str | None, int] = {None: 0}
        hits: list[tuple[Fault, int, int]] = []
        for fault in list(self._faults):
            if (
                fault.kind != "trade_drop"
                or fault.remaining <= 0
                or fault.symbol not in (None, symbol)
                or (fault.exchange is not None and fault.exchange not in exchanges)
            ):
                continue
            first = taken[None] + (taken.get(fault.exchange, 0) if fault.exchange else 0)
            n = min(fault.remaining, count - first)
            if n <= 0:
                continue
            taken[fault.exchange] = taken.get(fault.exchange, 0) + n
            fault.remaining -= n
            if fault.remaining == 0:
                self._faults.remove(fault)
            hits.append((fault, first, n))
        return hits

    def outage(self, now_ms: int, exchange: str, symbol: str | None) -> Fault | None:
        """The `ws_outage` refusing `exchange`'s stream connections now: for a new
        connection (`symbol` None) one of all markets; for a subscription to `symbol`
        also one of that market. Ended outages are forgotten."""
        self.expire(now_ms)
        for fault in self._faults:
            if (
                fault.kind == "ws_outage"
                and fault.exchange in (None, exchange)
                and (fault.symbol is None or fault.symbol == symbol)
            ):
                return fault
        return None

    def expire(self, now_ms: int) -> None:
        """Forget the outages whose time is over (connections are accepted again)."""
        self._faults = [
            f
            for f in self._faults
            if f.kind != "ws_outage" or f.until_ms is None or f.until_ms > now_ms
        ]

    def clear_kind(self, kind: str) -> int:
        """Disarm every fault of one kind (e.g. end an outage early); returns how many."""
        before = len(self._faults)
        self._faults = [f for f in self._faults if f.kind != kind]
        return before - len(self._faults)

    def pending(self) -> list[Fault]:
        return list(self._faults)
