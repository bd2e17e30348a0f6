"""Request validation: a client request in, the reply and the work to publish out.

The rules themselves live in `mdproto.rules` (the client and the pipeline check
the same ones); this module adds the relay's policy (served exchanges, limits)
and builds the replies. Pure: `now_ms` and `new_id` are passed in, and so is
`symbols`, the market-metadata predicate (`relay.markets`), checked last.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from mdproto import rules
from mdproto.messages import (
    CEPTriggerAck,
    CEPTriggerRequest,
    DataRequest,
    OHLCRequest,
    Status,
    SubmitHistoricalRequest,
    SubmitResponse,
)
from mdproto.rules import RuleViolation

# Enum values looked up once: protobuf's module-level enum access costs ~1 us a time.
_OK = Status.OK
_REJECTED = Status.REJECTED
_HISTORICAL = DataRequest.HISTORICAL

SymbolCheck = Callable[[str, bool], str | None]
"""Why a (well-formed) ticker cannot be served (the flag: live use, where an inactive
market fails too), or None: `MarketDirectory.check`."""


@dataclass(frozen=True, slots=True)
class Policy:
    """The configurable limits validation applies."""

    known_exchanges: frozenset[str]  # empty: any (whether one is served is decided later)
    max_candles: int = 10_000_000
    max_future_ms: int = 24 * 3600 * 1000

    @classmethod
    def of(cls, exchanges: Iterable[str], max_candles: int, max_future_ms: int) -> Policy:
        return cls(frozenset(exchanges), max_candles, max_future_ms)


@dataclass(frozen=True, slots=True)
class Rejection:
    error_code: str
    reason: str

    @classmethod
    def of(cls, violation: RuleViolation) -> Rejection:
        return cls(violation.error_code, violation.reason)


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


def check_submit(
    req: SubmitHistoricalRequest,
    policy: Policy,
    now_ms: int,
    new_id: Callable[[], str],
    *,
    symbols: SymbolCheck | None = None,
) -> SubmitOutcome:
    """Validate a `SubmitHistoricalRequest` and build its `SubmitResponse`.

    An empty request_id is generated when client_id is set (the client learns it
    from the reply); with neither id there is nothing to notify, so it is rejected.
    """
    try:
        request_id = _request_id(req.request_id, req.client_id, new_id)
        prefix = _ticker_prefix(req.ticker, policy)
        _check_range(req.period_seconds, req.start_time_ms, req.end_time_ms, policy, now_ms)
        topic = rules.notification_topic(req.notify, request_id, req.client_id)
        _check_symbol(req.ticker, symbols)
    except RuleViolation as bad:
        return SubmitOutcome(_rejected(SubmitResponse(request_id=req.request_id), bad), None)
    work = _historical(req, request_id, now_ms, notification_topic=topic, refetch=req.refetch)
    reply = SubmitResponse(request_id=request_id, status=_OK, notification_topic=topic)
    return SubmitOutcome(reply, Work(prefix, work))


def check_legacy(
    req: OHLCRequest,
    policy: Policy,
    now_ms: int,
    new_id: Callable[[], str],
    *,
    symbols: SymbolCheck | None = None,
) -> Work | Rejection:
    """Validate a legacy `OHLCRequest`; the client waits, so any request_id will do."""
    try:
        request_id = req.request_id or new_id()
        rules.check_ids(request_id=request_id, client_id=req.client_id)
        prefix = _ticker_prefix(req.ticker, policy)
        _check_range(req.period_seconds, req.start_time_ms, req.end_time_ms, policy, now_ms)
        _check_symbol(req.ticker, symbols)
    except RuleViolation as bad:
        return Rejection.of(bad)
    return Work(prefix, _historical(req, request_id, now_ms, legacy_sync=True, limit=req.limit))


def _historical(
    req: SubmitHistoricalRequest | OHLCRequest,
    request_id: str,
    now_ms: int,
    *,
    notification_topic: str = "",
    legacy_sync: bool = False,
    limit: int = 0,
    refetch: bool = False,
) -> DataRequest:
    """The `DataRequest` of a validated history request, submitted or legacy (the
    proto3 defaults of the flow-specific fields are what the other flow leaves unset)."""
    return DataRequest(
        request_id=request_id,
        client_id=req.client_id,
        kind=_HISTORICAL,
        ticker=req.ticker,
        period_seconds=req.period_seconds,
        start_time_ms=req.start_time_ms,
        end_time_ms=req.end_time_ms,
        notification_topic=notification_topic,
        legacy_sync=legacy_sync,
        submitted_at_ms=now_ms,
        limit=limit,
        refetch=refetch,
    )


def check_trigger(
    req: CEPTriggerRequest, policy: Policy, now_ms: int, *, symbols: SymbolCheck | None = None
) -> TriggerOutcome:
    """Validate a `CEPTriggerRequest` (REGISTER, CANCEL or LIST) and build its ack.

    `event_topic` follows `notify`: RESPONSE:{client_id} per client (AUTO with a
    client_id), else CEP:{trigger_id}. CANCEL needs only the trigger_id, LIST only
    the client_id (the relay fills `triggers` in from its trigger store). Only
    REGISTER is checked against market metadata: a CANCEL always goes through.
    """
    try:
        if req.action == CEPTriggerRequest.LIST:
            if not req.client_id:
                raise RuleViolation(
                    rules.MISSING_ID, "LIST needs the client_id whose triggers to list"
                )
            rules.check_ids(client_id=req.client_id)
            return TriggerOutcome(CEPTriggerAck(trigger_id=req.trigger_id, status=_OK), True)
        if req.action == CEPTriggerRequest.REGISTER:
            event_topic = rules.register(req, now_ms)
            _ticker_prefix(req.ticker, policy)
            _check_symbol(req.ticker, symbols, live=True)
        elif req.action == CEPTriggerRequest.CANCEL:
            if not req.trigger_id:
                raise RuleViolation(rules.MISSING_ID, "trigger_id is required")
            rules.check_ids(trigger_id=req.trigger_id, client_id=req.client_id)
            if req.ticker:
                _ticker_prefix(req.ticker, policy)
            event_topic = ""
        else:
            raise RuleViolation(
                rules.BAD_ACTION, f"action must be REGISTER, CANCEL or LIST, got {req.action}"
            )
    except RuleViolation as bad:
        return TriggerOutcome(_rejected(CEPTriggerAck(trigger_id=req.trigger_id), bad), False)
    ack = CEPTriggerAck(trigger_id=req.trigger_id, status=_OK, event_topic=event_topic)
    return TriggerOutcome(ack, True)


_Reply = TypeVar("_Reply", SubmitResponse, CEPTriggerAck)


def _rejected(reply: _Reply, bad: RuleViolation) -> _Reply:
    reply.status, reply.reason, reply.error_code = _REJECTED, bad.reason, bad.error_code
    return reply


def _request_id(request_id: str, client_id: str, new_id: Callable[[], str]) -> str:
    if not request_id:
        if not client_id:
            raise RuleViolation(rules.MISSING_ID, "request_id or client_id is required")
        request_id = new_id()
    rules.check_ids(request_id=request_id, client_id=client_id)
    return request_id


def _ticker_prefix(ticker: str, policy: Policy) -> str:
    exchange = rules.ticker(ticker).exchange
    if policy.known_exchanges and exchange not in policy.known_exchanges:
        known = ", ".join(sorted(policy.known_exchanges))
        raise RuleViolation(rules.UNKNOWN_EXCHANGE, f"exchange {exchange} is not served ({known})")
    return f"{exchange}:"


def _check_symbol(ticker: str, symbols: SymbolCheck | None, *, live: bool = False) -> None:
    why = symbols(ticker, live) if symbols is not None else None
    if why is not None:
        raise RuleViolation(rules.BAD_SYMBOL, why)


def _check_range(period: int, start_ms: int, end_ms: int, policy: Policy, now_ms: int) -> None:
    rules.history_range(period, start_ms, end_ms)
    rules.range_limits(
        period, start_ms, end_ms, now_ms=now_ms, max_future_ms=policy.max_future_ms,
        max_candles=policy.max_candles,
    )  # fmt: skip
