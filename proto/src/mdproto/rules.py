"""Request rules: what makes a history range, ticker, id or CEP trigger valid.

The relay is the authority (it rejects with these `error_code`s, docs/protocol.md
"Request rules"); the client checks the same rules before sending and the
pipeline again on every record it reads, so all three call these pure functions
and a rule changes in one place.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Final

from mdproto import topics

# The codes a RuleViolation carries (defined in mdproto.error_codes), re-exported
# so callers can name them with the rules: `rules.BAD_ID`.
from mdproto.error_codes import BAD_ACTION as BAD_ACTION
from mdproto.error_codes import BAD_BARS as BAD_BARS
from mdproto.error_codes import BAD_CONDITION as BAD_CONDITION
from mdproto.error_codes import BAD_ID as BAD_ID
from mdproto.error_codes import BAD_NOTIFY as BAD_NOTIFY
from mdproto.error_codes import BAD_PERIOD as BAD_PERIOD
from mdproto.error_codes import BAD_SYMBOL as BAD_SYMBOL
from mdproto.error_codes import BAD_TICKER as BAD_TICKER
from mdproto.error_codes import BAD_TIME_RANGE as BAD_TIME_RANGE
from mdproto.error_codes import EXPIRED as EXPIRED
from mdproto.error_codes import MISSING_ID as MISSING_ID
from mdproto.error_codes import RANGE_TOO_LARGE as RANGE_TOO_LARGE
from mdproto.error_codes import UNKNOWN_EXCHANGE as UNKNOWN_EXCHANGE
from mdproto.errors import ProtocolError
from mdproto.gen.marketdata_pb2 import CEPCondition, CEPTriggerRequest, NotifyPattern

# Plain ints: protobuf enum attribute lookups cost microseconds on the relay's hot path.
WINDOWED = frozenset({int(CEPCondition.PCT_MOVE), int(CEPCondition.VOLUME_OVER)})
KINDS = frozenset(CEPCondition.Kind.values()) - {CEPCondition.KIND_UNSPECIFIED}
_NOTIFY_PATTERNS = frozenset(NotifyPattern.values())


class RuleViolation(ValueError):  # noqa: N818 (reads as the verdict it is)
    """A request breaks a rule; `error_code` travels unchanged to the client."""

    def __init__(self, error_code: str, reason: str) -> None:
        super().__init__(reason)
        self.error_code = error_code
        self.reason = reason


def check_ids(**ids: str) -> None:
    """Ids become topic suffixes and SQL literals; empty means "not given"."""
    for name, value in ids.items():
        check_id(name, value)


def check_id(name: str, value: str) -> None:
    """`check_ids` for one id, without building a dict (the relay's per-request path)."""
    if value and not topics.is_valid_id(value):
        raise RuleViolation(BAD_ID, f"{name} must be 1-128 characters of [A-Za-z0-9_.-]")


def ticker(text: str) -> topics.Ticker:
    try:
        return topics.parse_ticker(text)
    except ProtocolError as exc:
        raise RuleViolation(BAD_TICKER, exc.reason) from None


def history_range(period_seconds: int, start_ms: int, end_ms: int) -> None:
    """[start_ms, end_ms) of period_seconds candles: a positive period, a non-empty range."""
    if period_seconds <= 0:
        raise RuleViolation(BAD_PERIOD, "period_seconds must be > 0")
    time_range(start_ms, end_ms)


def time_range(start_ms: int, end_ms: int) -> None:
    """A non-empty [start_ms, end_ms) at or after the epoch."""
    if start_ms < 0 or end_ms <= start_ms:
        raise RuleViolation(
            BAD_TIME_RANGE, f"need 0 <= start_time_ms < end_time_ms, got [{start_ms}, {end_ms})"
        )


#: Bars of N trades / of V base volume (tardis's ``trade_bar_100ticks``, ``..._10000vol``).
TICKS: Final = "ticks"
VOLUME: Final = "vol"
MAX_TICKS = 1_000_000_000
MAX_VOLUME = Decimal("1e15")
_BARS = re.compile(r"^(?:([1-9][0-9]{0,9})ticks|([0-9]{1,16}(?:\.[0-9]{1,16})?)vol)$")


@dataclass(frozen=True, slots=True)
class Bars:
    """A tick or volume bar size: `kind` TICKS or VOLUME, `size` N trades or V volume."""

    kind: str
    size: Decimal

    @property
    def name(self) -> str:
        """The canonical spelling ("100ticks", "2.5vol"): the stored bars' key."""
        return f"{format(self.size.normalize(), 'f')}{self.kind}"


def bars(text: str) -> Bars:
    """Parse a request's ``bars`` ("<N>ticks", "<V>vol"); a violation names the forms."""
    match = _BARS.match(text)
    if match is None:
        raise RuleViolation(
            BAD_BARS, f"bars {text[:40]!r} is not <N>ticks or <V>vol (e.g. 100ticks, 2.5vol)"
        )
    if match.group(1) is not None:
        n = int(match.group(1))
        if n > MAX_TICKS:
            raise RuleViolation(BAD_BARS, f"bars of {n} trades: at most {MAX_TICKS}")
        return Bars(TICKS, Decimal(n))
    v = Decimal(match.group(2))
    if v <= 0 or v > MAX_VOLUME:
        raise RuleViolation(BAD_BARS, f"bars of {v} volume: need 0 < V <= 1e15")
    return Bars(VOLUME, v)


def history_bars(text: str, period_seconds: int) -> Bars:
    """A tick or volume bar request: valid ``bars`` and no period (period_seconds 0, so a
    relay that predates ``bars`` rejects it with ``bad_period`` instead of serving candles)."""
    spec = bars(text)
    if period_seconds != 0:
        raise RuleViolation(
            BAD_BARS, f"bars {spec.name} take period_seconds 0, got {period_seconds}"
        )
    return spec


def range_limits(
    period_seconds: int, start_ms: int, end_ms: int, *, now_ms: int, max_future_ms: int,
    max_candles: int,
) -> None:  # fmt: skip
    """The relay's configured limits on a valid range."""
    future_limit(end_ms, now_ms=now_ms, max_future_ms=max_future_ms)
    candles = math.ceil((end_ms - start_ms) / (period_seconds * 1000))
    if candles > max_candles:
        raise RuleViolation(
            RANGE_TOO_LARGE, f"range spans {candles} candles, more than the limit {max_candles}"
        )


def future_limit(end_ms: int, *, now_ms: int, max_future_ms: int) -> None:
    """The end of a range at most `max_future_ms` ahead of `now_ms`."""
    if end_ms > now_ms + max_future_ms:
        raise RuleViolation(BAD_TIME_RANGE, f"end_time_ms {end_ms} is too far in the future")


def notification_topic(notify: int, request_id: str, client_id: str) -> str:
    """`topics.notification_topic`, with an unknown pattern or missing id a violation."""
    return _topic(topics.notification_topic, notify, request_id, client_id)


def event_topic(notify: int, trigger_id: str, client_id: str) -> str:
    """`topics.cep_event_topic`, with an unknown pattern or missing id a violation."""
    return _topic(topics.cep_event_topic, notify, trigger_id, client_id)


def _topic(route: Callable[[int, str, str], str], notify: int, own_id: str, client_id: str) -> str:
    if notify not in _NOTIFY_PATTERNS:
        raise RuleViolation(BAD_NOTIFY, f"unknown notify pattern {notify}")
    try:
        return route(notify, own_id, client_id)
    except ProtocolError as exc:
        raise RuleViolation(BAD_NOTIFY, exc.reason) from None


def condition(cond: CEPCondition, index: int = 0) -> None:
    """A window for moves and volumes, none for price crossings (it would mean nothing)."""
    where = f"condition {index}"
    if cond.kind not in KINDS:
        raise RuleViolation(BAD_CONDITION, f"{where}: unknown kind {cond.kind}")
    if not math.isfinite(cond.threshold) or cond.threshold <= 0:
        raise RuleViolation(
            BAD_CONDITION, f"{where}: threshold must be a positive number (finite, > 0)"
        )
    name = CEPCondition.Kind.Name(cond.kind)
    if cond.kind in WINDOWED and cond.window_seconds <= 0:
        raise RuleViolation(BAD_CONDITION, f"{where}: {name} needs a window (window_seconds > 0)")
    if cond.kind not in WINDOWED and cond.window_seconds:
        raise RuleViolation(BAD_CONDITION, f"{where}: a price crossing takes no window ({name})")


def register(request: CEPTriggerRequest, now_ms: int | None = None) -> str:
    """A REGISTER request's rules; returns its event topic.

    `now_ms` None skips the expiry check against the clock (the pipeline replays
    records registered long ago and expires them itself).
    """
    if not request.trigger_id:
        raise RuleViolation(MISSING_ID, "trigger_id is required")
    check_ids(trigger_id=request.trigger_id, client_id=request.client_id)
    ticker(request.ticker)
    count = len(request.conditions)
    if count not in (1, 2):
        raise RuleViolation(BAD_CONDITION, f"need one condition or a sequence of two, got {count}")
    for i, cond in enumerate(request.conditions):
        condition(cond, i)
    if count == 2 and request.within_seconds <= 0:
        raise RuleViolation(
            BAD_CONDITION, "a sequence of two conditions needs a time bound: within_seconds > 0"
        )
    expires = request.expires_at_ms
    if expires < 0 or (now_ms is not None and expires and expires <= now_ms):
        raise RuleViolation(EXPIRED, f"expires_at_ms {expires} is in the past (0 = never)")
    return event_topic(request.notify, request.trigger_id, request.client_id)
