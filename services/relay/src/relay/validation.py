"""Request validation: a client request in, the reply and the work to publish out.

Pure functions (no sockets, no clock: `now_ms` and `new_id` are passed in), so
every rule is unit-tested without I/O. The `error_code` values are part of the
client contract (docs/protocol.md, "Relay replies").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mdproto import topics
from mdproto.errors import ProtocolError
from mdproto.messages import (
    CEPCondition,
    CEPTriggerAck,
    CEPTriggerRequest,
    DataRequest,
    NotifyPattern,
    OHLCRequest,
    Status,
    SubmitHistoricalRequest,
    SubmitResponse,
)

# Rejection codes (docs/protocol.md).
MISSING_ID = "missing_id"
BAD_ID = "bad_id"
BAD_TICKER = "bad_ticker"
UNKNOWN_EXCHANGE = "unknown_exchange"
BAD_PERIOD = "bad_period"
BAD_TIME_RANGE = "bad_time_range"
RANGE_TOO_LARGE = "range_too_large"
BAD_NOTIFY = "bad_notify"
BAD_ACTION = "bad_action"
BAD_CONDITION = "bad_condition"
EXPIRED = "expired"

# Enum values looked up once: protobuf's module-level enum access costs ~1 us a time.
_OK = Status.OK
_REJECTED = Status.REJECTED
_HISTORICAL = DataRequest.HISTORICAL
_PER_CLIENT = NotifyPattern.NOTIFY_PER_CLIENT
_AUTO = NotifyPattern.NOTIFY_AUTO
_WINDOWED = (CEPCondition.PCT_MOVE, CEPCondition.VOLUME_OVER)
_NOTIFY_PATTERNS = frozenset(NotifyPattern.values())
_CONDITION_KINDS = frozenset(CEPCondition.Kind.values()) - {CEPCondition.KIND_UNSPECIFIED}


@dataclass(frozen=True, slots=True)
class Policy:
    """The configurable limits validation applies."""

    known_exchanges: frozenset[str]
    max_candles: int = 10_000_000
    max_future_ms: int = 24 * 3600 * 1000

    @classmethod
    def of(cls, exchanges: Iterable[str], max_candles: int, max_future_ms: int) -> Policy:
        return cls(frozenset(exchanges), max_candles, max_future_ms)


@dataclass(frozen=True, slots=True)
class Rejection:
    error_code: str
    reason: str


@dataclass(frozen=True, slots=True)
class Work:
    """A `DataRequest` for the ingestors and its PUB topic (the exchange prefix)."""

    topic: str
    request: DataRequest


@dataclass(frozen=True, slots=True)
class SubmitOutcome:
    reply: SubmitResponse
    work: Work | None  # None: rejected


@dataclass(frozen=True, slots=True)
class TriggerOutcome:
    reply: CEPTriggerAck
    accepted: bool


class _Invalid(Exception):  # noqa: N818 (internal control flow, never escapes)
    def __init__(self, error_code: str, reason: str) -> None:
        super().__init__(reason)
        self.rejection = Rejection(error_code, reason)


def check_submit(
    req: SubmitHistoricalRequest, policy: Policy, now_ms: int, new_id: Callable[[], str]
) -> SubmitOutcome:
    """Validate a `SubmitHistoricalRequest` and build its `SubmitResponse`.

    An empty request_id is generated when client_id is set (the client learns it
    from the reply); with neither id there is nothing to notify, so it is rejected.
    """
    try:
        request_id = _request_id(req.request_id, req.client_id, new_id)
        prefix = _ticker_prefix(req.ticker, policy)
        _check_range(req.period_seconds, req.start_time_ms, req.end_time_ms, policy, now_ms)
        topic = _notification_topic(req.notify, request_id, req.client_id)
    except _Invalid as invalid:
        rejection = invalid.rejection
        return SubmitOutcome(
            SubmitResponse(
                request_id=req.request_id,
                status=_REJECTED,
                reason=rejection.reason,
                error_code=rejection.error_code,
            ),
            None,
        )
    work = DataRequest(
        request_id=request_id,
        client_id=req.client_id,
        kind=_HISTORICAL,
        ticker=req.ticker,
        period_seconds=req.period_seconds,
        start_time_ms=req.start_time_ms,
        end_time_ms=req.end_time_ms,
        notification_topic=topic,
        submitted_at_ms=now_ms,
    )
    reply = SubmitResponse(request_id=request_id, status=_OK, notification_topic=topic)
    return SubmitOutcome(reply, Work(prefix, work))


def check_legacy(
    req: OHLCRequest, policy: Policy, now_ms: int, new_id: Callable[[], str]
) -> Work | Rejection:
    """Validate a legacy `OHLCRequest`; the client waits, so any request_id will do."""
    try:
        request_id = req.request_id or new_id()
        _check_ids(request_id=request_id, client_id=req.client_id)
        prefix = _ticker_prefix(req.ticker, policy)
        _check_range(req.period_seconds, req.start_time_ms, req.end_time_ms, policy, now_ms)
    except _Invalid as invalid:
        return invalid.rejection
    return Work(
        prefix,
        DataRequest(
            request_id=request_id,
            client_id=req.client_id,
            kind=_HISTORICAL,
            ticker=req.ticker,
            period_seconds=req.period_seconds,
            start_time_ms=req.start_time_ms,
            end_time_ms=req.end_time_ms,
            legacy_sync=True,
            submitted_at_ms=now_ms,
            limit=req.limit,
        ),
    )


def check_trigger(req: CEPTriggerRequest, policy: Policy, now_ms: int) -> TriggerOutcome:
    """Validate a `CEPTriggerRequest` (REGISTER, CANCEL or LIST) and build its ack.

    `event_topic` follows `notify`: RESPONSE:{client_id} per client (AUTO with a
    client_id), else CEP:{trigger_id}. CANCEL needs only the trigger_id, LIST only
    the client_id (the relay fills `triggers` in from its trigger store).
    """
    try:
        if req.action == CEPTriggerRequest.LIST:
            if not req.client_id:
                raise _Invalid(MISSING_ID, "LIST needs the client_id whose triggers to list")
            _check_ids(client_id=req.client_id)
            ack = CEPTriggerAck(trigger_id=req.trigger_id, status=_OK)
            return TriggerOutcome(ack, True)
        if not req.trigger_id:
            raise _Invalid(MISSING_ID, "trigger_id is required")
        _check_ids(trigger_id=req.trigger_id, client_id=req.client_id)
        if req.action == CEPTriggerRequest.CANCEL:
            if req.ticker:
                _ticker_prefix(req.ticker, policy)
            event_topic = ""
        elif req.action == CEPTriggerRequest.REGISTER:
            _ticker_prefix(req.ticker, policy)
            _check_conditions(req)
            if req.expires_at_ms and req.expires_at_ms <= now_ms:
                raise _Invalid(EXPIRED, f"expires_at_ms {req.expires_at_ms} is in the past")
            event_topic = _event_topic(req.notify, req.trigger_id, req.client_id)
        else:
            raise _Invalid(BAD_ACTION, f"action must be REGISTER, CANCEL or LIST, got {req.action}")
    except _Invalid as invalid:
        rejection = invalid.rejection
        ack = CEPTriggerAck(
            trigger_id=req.trigger_id,
            status=_REJECTED,
            reason=rejection.reason,
            error_code=rejection.error_code,
        )
        return TriggerOutcome(ack, False)
    ack = CEPTriggerAck(trigger_id=req.trigger_id, status=_OK, event_topic=event_topic)
    return TriggerOutcome(ack, True)


def _request_id(request_id: str, client_id: str, new_id: Callable[[], str]) -> str:
    if not request_id:
        if not client_id:
            raise _Invalid(MISSING_ID, "request_id or client_id is required")
        request_id = new_id()
    _check_ids(request_id=request_id, client_id=client_id)
    return request_id


def _check_ids(**ids: str) -> None:
    for name, value in ids.items():
        if value and not topics.is_valid_id(value):
            raise _Invalid(BAD_ID, f"{name} must be 1-128 characters of [A-Za-z0-9_.-]")


def _ticker_prefix(ticker: str, policy: Policy) -> str:
    try:
        parsed = topics.parse_ticker(ticker)
    except ProtocolError as exc:
        raise _Invalid(BAD_TICKER, exc.reason) from None
    if parsed.exchange not in policy.known_exchanges:
        known = ", ".join(sorted(policy.known_exchanges))
        raise _Invalid(UNKNOWN_EXCHANGE, f"exchange {parsed.exchange} is not served ({known})")
    return parsed.prefix


def _check_range(period: int, start_ms: int, end_ms: int, policy: Policy, now_ms: int) -> None:
    if period <= 0:
        raise _Invalid(BAD_PERIOD, "period_seconds must be > 0")
    if start_ms < 0 or end_ms <= start_ms:
        raise _Invalid(
            BAD_TIME_RANGE,
            f"need 0 <= start_time_ms < end_time_ms, got [{start_ms}, {end_ms})",
        )
    if end_ms > now_ms + policy.max_future_ms:
        raise _Invalid(BAD_TIME_RANGE, f"end_time_ms {end_ms} is too far in the future")
    candles = math.ceil((end_ms - start_ms) / (period * 1000))
    if candles > policy.max_candles:
        raise _Invalid(
            RANGE_TOO_LARGE,
            f"range spans {candles} candles, more than the limit {policy.max_candles}",
        )


def _notification_topic(notify: int, request_id: str, client_id: str) -> str:
    if notify not in _NOTIFY_PATTERNS:
        raise _Invalid(BAD_NOTIFY, f"unknown notify pattern {notify}")
    try:
        return topics.notification_topic(notify, request_id, client_id)
    except ProtocolError as exc:
        raise _Invalid(BAD_NOTIFY, exc.reason) from None


def _event_topic(notify: int, trigger_id: str, client_id: str) -> str:
    if notify not in _NOTIFY_PATTERNS:
        raise _Invalid(BAD_NOTIFY, f"unknown notify pattern {notify}")
    per_client = notify == _PER_CLIENT or (notify == _AUTO and bool(client_id))
    if not per_client:
        return topics.cep_topic(trigger_id)
    if not client_id:
        raise _Invalid(BAD_NOTIFY, "per-client notifications need a client_id")
    return topics.response_topic(client_id)


def _check_conditions(req: CEPTriggerRequest) -> None:
    count = len(req.conditions)
    if count not in (1, 2):
        raise _Invalid(BAD_CONDITION, f"need one condition or a sequence of two, got {count}")
    for i, cond in enumerate(req.conditions):
        if cond.kind not in _CONDITION_KINDS:
            raise _Invalid(BAD_CONDITION, f"condition {i}: unknown kind {cond.kind}")
        if not math.isfinite(cond.threshold) or cond.threshold <= 0:
            raise _Invalid(BAD_CONDITION, f"condition {i}: threshold must be finite and > 0")
        if cond.kind in _WINDOWED and cond.window_seconds == 0:
            raise _Invalid(BAD_CONDITION, f"condition {i}: window_seconds must be > 0")
    if count == 2 and req.within_seconds == 0:
        raise _Invalid(BAD_CONDITION, "a sequence of two conditions needs within_seconds > 0")
