"""Can an exchange take history work now? Ingestor subscriptions plus their heartbeats.

A subscription on :5555 only proves that an ingestor's TCP connection is up: a
hung process (SIGSTOP, a deadlock) keeps it, and an ingestor whose exchange is
down keeps it too. So each ingestor also sends `IngestorStatus` on :5556 every
`interval_ms`, listing the exchanges it serves and their health. The rule, per
work prefix `X:` (docs/protocol.md, "Ingestor liveness"):

- *unserved* (`no_ingestor`): no ingestor subscribes to `X:`; or some ingestor
  has reported `X` since the prefix was last subscribed, and none of those that
  did was heard from within `expiry_intervals` times its own `interval_ms`.
  An exchange no ingestor ever reported is judged by the subscription alone, so
  ingestors that send no status (older versions) keep working.
- *breaker open* (`exchange_unavailable`): served, and every live ingestor that
  reports `X` says `healthy=false`; the reason carries the latest error.
- else *served*.

When the last subscription to `X:` goes away the heartbeat record of `X` is
forgotten (every ingestor of it is gone). Pure: the caller passes `now`
(monotonic seconds).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum

from mdproto.messages import IngestorStatus

NO_INGESTOR = "no_ingestor"
EXCHANGE_UNAVAILABLE = "exchange_unavailable"

_EXCHANGE = re.compile(r"^[A-Z][A-Z0-9_]{0,31}$")
_MAX_EXCHANGES = 256  # per status: more is a broken sender, not a deployment
_MIN_INTERVAL_S = 0.1  # a smaller interval_ms would expire an ingestor between two loop turns


class BadStatusError(ValueError):
    """An IngestorStatus the relay cannot use (empty id, bad exchange name...)."""


class State(Enum):
    SERVED = "served"
    UNSERVED = "unserved"
    BREAKER_OPEN = "breaker_open"


@dataclass(frozen=True, slots=True)
class Verdict:
    state: State
    alive: int = 0  # live ingestors that report the exchange
    error_code: str = ""  # NO_INGESTOR or EXCHANGE_UNAVAILABLE when not served
    reason: str = ""


@dataclass(frozen=True, slots=True)
class _Health:
    healthy: bool
    failures: int
    error_code: str
    reason: str


@dataclass(slots=True)
class _Ingestor:
    last_seen: float
    expiry_s: float
    exchanges: dict[str, _Health] = field(default_factory=dict)  # by work prefix "X:"

    def alive(self, now: float) -> bool:
        return now - self.last_seen <= self.expiry_s


class Liveness:
    def __init__(self, *, expiry_intervals: float, forget_after_s: float = 3600.0) -> None:
        self._factor = expiry_intervals
        self._forget_after_s = forget_after_s
        self._ingestors: dict[str, _Ingestor] = {}
        self._reported: set[str] = set()  # prefixes some ingestor reported since subscribed

    @property
    def prefixes(self) -> set[str]:
        """Every prefix an ingestor reported (for the metrics)."""
        return set(self._reported)

    def status(self, message: IngestorStatus, now: float) -> None:
        """Record one IngestorStatus; BadStatusError if it is unusable."""
        if not 0 < len(message.ingestor_id) <= 255:
            raise BadStatusError("IngestorStatus without an ingestor_id (or longer than 255)")
        if len(message.exchanges) > _MAX_EXCHANGES:
            raise BadStatusError(f"IngestorStatus lists {len(message.exchanges)} exchanges")
        exchanges: dict[str, _Health] = {}
        for e in message.exchanges:
            if not _EXCHANGE.match(e.exchange):
                raise BadStatusError(f"exchange name {e.exchange!r} is not like BINANCE")
            exchanges[f"{e.exchange}:"] = _Health(
                e.healthy, e.consecutive_failures, e.error_code, e.reason
            )
        interval_s = max(message.interval_ms / 1000.0, _MIN_INTERVAL_S)
        self._ingestors[message.ingestor_id] = _Ingestor(now, self._factor * interval_s, exchanges)
        self._reported.update(exchanges)

    def unsubscribed(self, prefix: str) -> None:
        """No ingestor subscribes to `prefix` any more: forget who reported it."""
        self._reported.discard(prefix)

    def verdict(self, prefix: str, subscribed: bool, now: float) -> Verdict:
        """Whether work for `prefix` ("BINANCE:") can be served now, and if not why."""
        name = prefix.rstrip(":")
        if not subscribed:
            return Verdict(
                State.UNSERVED,
                0,
                NO_INGESTOR,
                f"no ingestor serves {name} right now (none is subscribed to its work "
                "queue); retry once one runs",
            )
        if prefix not in self._reported:
            return Verdict(State.SERVED)  # no ingestor of it sends status: trust the subscription
        reporters = [(i, ing) for i, ing in self._ingestors.items() if prefix in ing.exchanges]
        alive = [(i, ing) for i, ing in reporters if ing.alive(now)]
        if not alive:
            silent = min((now - ing.last_seen for _, ing in reporters), default=None)
            heard = "long ago" if silent is None else f"{silent:.1f} s ago"
            return Verdict(
                State.UNSERVED,
                0,
                NO_INGESTOR,
                f"no ingestor of {name} is alive: the last status came {heard} (hung or cut "
                "off, while still subscribed); retry once one runs",
            )
        if all(not ing.exchanges[prefix].healthy for _, ing in alive):
            ingestor_id, latest = max(alive, key=lambda pair: pair[1].last_seen)
            health = latest.exchanges[prefix]
            return Verdict(
                State.BREAKER_OPEN,
                len(alive),
                EXCHANGE_UNAVAILABLE,
                f"exchange {name} is failing at every ingestor that serves it ({ingestor_id}: "
                f"{health.failures} failed calls in a row, last {health.error_code}: "
                f"{health.reason}); retry later",
            )
        return Verdict(State.SERVED, len(alive))

    def forget_dead(self, now: float) -> list[str]:
        """Drop ingestors silent for `forget_after_s` (bounded memory); their ids."""
        limit = self._forget_after_s
        gone = [i for i, ing in self._ingestors.items() if now - ing.last_seen > limit]
        for ingestor_id in gone:
            del self._ingestors[ingestor_id]
        return gone
