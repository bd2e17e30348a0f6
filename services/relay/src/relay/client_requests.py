"""Client requests on the ROUTER :5559: every one gets exactly one reply.

    frames -> rate limit (TokenBuckets) -> decode -> rules (check_*) -> symbols
        SubmitHistoricalRequest -> no pipeline or no ingestor? refused
            : DataRequest{HISTORICAL} -> SubmitResponse; the id kept (AcceptedIds)
        RequestStatusQuery -> AcceptedIds -> RequestStatusReply (accepted here, or not)
        CEPTriggerRequest -> no pipeline? REGISTER refused
            : TriggerSink (store, cancel, list) -> CEPTriggerAck (OK once stored)
        OHLCRequest (legacy) -> pending map (legacy.py) + DataRequest{legacy_sync};
            the Response follows when the ingestor's DataResponse arrives, or TIMEOUT

Undecodable frames and unknown types are answered `Response{ERROR}`; refusals
use the reply type the request expects. `ClientRequests` is the adapter (loop
thread only); the decisions it applies are pure sections below it, tested
without sockets (`now`, ids and the symbol predicate are passed in):
validation, the relay's policy (served exchanges, limits) over `mdproto.rules`
(the client and the pipeline check the same rules) and the replies it builds,
the market-metadata check (`relay.markets`) last; the rate limit,
`TokenBuckets` (one flooding client cannot starve the others), whose log lines go
through the relay's `LogThrottle` (log_throttle.py); and `AcceptedIds`, the ids
of the history requests this relay accepted: the one trace of a request between
its ack and its `market.requests` row, so a client can tell "in progress" from
"never seen" (docs/protocol.md "Request status"). It is the relay's only memory
of a history request, bounded in count and age, and lost when the relay restarts.
"""

from __future__ import annotations

import errno
import functools
import logging
import queue
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

import zmq
from google.protobuf.message import Message

from mdproto import envelope, rules
from mdproto.error_codes import INTERNAL, RATE_LIMITED, SINK_ERROR, UNEXPECTED_TYPE
from mdproto.errors import ProtocolError
from mdproto.messages import (
    CEPTriggerAck,
    CEPTriggerRequest,
    DataRequest,
    DataResponse,
    OHLCRequest,
    RequestStatusQuery,
    RequestStatusReply,
    Response,
    Status,
    SubmitHistoricalRequest,
    SubmitResponse,
)
from mdproto.rules import RuleViolation
from mdproto.runtime.zmq_frames import NOBLOCK, send_frames
from relay.config import RelaySettings
from relay.ingestors import Ingestors, Verdict
from relay.legacy import Admission, PendingRequests, response_from, timeout_response
from relay.live_feeds import LiveFeeds
from relay.log_throttle import LogThrottle
from relay.metrics import RelayMetrics
from relay.pipeline_status import Part, PipelineHeartbeats, Refusal
from relay.sockets import Socket
from relay.triggers import TriggerSink, TriggerSinkError

log = logging.getLogger(__name__)

BadFrame = Callable[[str, ProtocolError, float], None]


class ClientRequests:
    def __init__(
        self,
        settings: RelaySettings,
        metrics: RelayMetrics,
        throttle: LogThrottle,
        client: Socket,
        ingestors: Ingestors,
        live: LiveFeeds,
        sink: TriggerSink,
        pipeline: PipelineHeartbeats,
        *,
        symbols: SymbolCheck | None,
        wall_ms: Callable[[], int],
        new_id: Callable[[], str],
        bad_frame: BadFrame,
        wake: Callable[[], None],
    ) -> None:
        s = self._s = settings
        self._metrics = m = metrics
        self._throttle = throttle
        self._client = client
        self._ingestors = ingestors
        self._live = live
        self._sink = sink
        self._pipeline = pipeline
        self._symbols = symbols
        self._wall_ms = wall_ms
        self._new_id = new_id
        self._bad_frame = bad_frame
        self._wake = wake
        # (route, request, ack, error) from the sink's thread; replies leave from the loop.
        self._stored: queue.SimpleQueue[
            tuple[list[bytes], CEPTriggerRequest, CEPTriggerAck, str | None]
        ] = queue.SimpleQueue()
        # Label lookups cost more than the increment: bind the hot ones once.
        self._accepted = {k: m.requests.labels(k, "accepted") for k in ("submit", "legacy", "cep")}
        self._policy = Policy.of(s.known_exchanges, s.max_candles_per_request, s.max_future_ms)
        self._pending = PendingRequests(s.max_pending_requests, s.request_timeout_s)
        self._buckets = TokenBuckets(
            s.client_rate_limit, s.client_rate_burst, s.max_tracked_clients
        )
        self._accepted_ids = AcceptedIds(s.accepted_ids, s.accepted_ids_s)
        # Per work topic, why history cannot be served, judged once per batch: one batch
        # has one `now`, and no heartbeat or subscription is handled in the middle of it.
        self._unserved: dict[str, Refusal | Verdict | None] = {}

    def next_deadline(self) -> float | None:
        return self._pending.next_deadline()

    def on_frames(self, frames: list[bytes], now: float) -> None:
        self.on_batch([frames], now)

    def on_batch(self, batch: list[list[bytes]], now: float) -> None:
        """The requests one loop turn took off the ROUTER, each answered as if alone.

        Three steps, so the fixed costs are paid once per batch rather than per
        request: every request is decided in arrival order (a status query sees a
        submit accepted before it); the accepted submits are counted and the replies
        sent back to back, in order (ack first: nothing after it refuses a request);
        then their DataRequests are published back to back with the spec's lines.
        Sending in runs lets libzmq's I/O thread and the ingestor wake once a batch.
        """
        now_ms = self._wall_ms()
        self._unserved.clear()
        replies: list[tuple[list[bytes], Message]] = []
        works: list[Work] = []
        for frames in batch:
            try:
                route, body = envelope.split_routed(frames)
            except ProtocolError as exc:  # a ROUTER always prepends an identity: not expected
                self._bad_frame("client", exc, now)
                continue
            try:
                reply = self._handle(route, body, now, now_ms, works)
            except Exception:
                log.exception("unexpected error handling a client request")
                reply = Response(status=Status.ERROR, reason="internal error", error_code=INTERNAL)
            if reply is not None:
                replies.append((route, reply))
        if works:
            self._accepted["submit"].inc(len(works))
        for route, reply in replies:
            self._reply(route, reply, now)
        if works:
            self._ingestors.publish_batch(works, "historical", now)

    def _handle(
        self, route: list[bytes], body: list[bytes], now: float, now_ms: int, works: list[Work]
    ) -> Message | None:
        """The immediate reply to one request (an accepted submit's work goes to `works`),
        or None when it comes later (legacy, and trigger REGISTER/CANCEL: once stored)."""
        try:
            message: Message | None = envelope.decode(body, max_payload=self._s.max_request_payload)
            error: ProtocolError | None = None
        except ProtocolError as exc:
            message, error = None, exc
        allowed, first_refusal = self._buckets.take(route[0], now)
        if not allowed:
            self._metrics.rate_limited.inc()
            if first_refusal:
                log.warning(
                    "client %s exceeds %g requests/s: refusing",
                    route[0].hex(),
                    self._s.client_rate_limit,
                )
            return _refusal(message, RATE_LIMITED, "too many requests from this client; slow down")
        if isinstance(message, SubmitHistoricalRequest):
            return self._submit(message, now, now_ms, works)
        if isinstance(message, OHLCRequest):
            return self._legacy_request(route, message, now)
        if isinstance(message, CEPTriggerRequest):
            return self._trigger(route, message, now)
        if isinstance(message, RequestStatusQuery):
            return self._request_status(message, now)
        if error is None:
            assert message is not None
            error = ProtocolError(
                UNEXPECTED_TYPE, f"{message.DESCRIPTOR.name} is not a request the relay accepts"
            )
        self._bad_frame("client", error, now)
        return Response(status=Status.ERROR, reason=error.reason, error_code=error.code)

    # --- history (asynchronous: answered now, data arrives through Kafka/Iceberg) ------

    def _submit(
        self, req: SubmitHistoricalRequest, now: float, now_ms: int, works: list[Work]
    ) -> SubmitResponse:
        """The ack or the refusal; an accepted request's work is appended to `works`
        (counted, acknowledged and published by `on_batch`) and its id kept."""
        outcome = check_submit(req, self._policy, now_ms, self._new_id, symbols=self._symbols)
        if outcome.work is None:
            self._rejected(
                "submit", req.request_id, outcome.reply.error_code, outcome.reply.reason, now
            )
            return outcome.reply
        # Refused now, not an OK followed by minutes of silence: nothing would answer.
        topic = outcome.work.topic
        if topic in self._unserved:  # judged for this batch already: nothing changed since
            unserved = self._unserved[topic]
        else:
            unserved = self._unserved[topic] = self._pipeline.refusal(
                Part.HISTORY, now
            ) or self._ingestors.unserved(topic, now)
        if unserved is not None:
            self._rejected("submit", req.request_id, unserved.error_code, unserved.reason, now)
            return SubmitResponse(
                request_id=outcome.reply.request_id,
                status=Status.REJECTED,
                reason=unserved.reason,
                error_code=unserved.error_code,
            )
        reply = outcome.reply
        self._accepted_ids.add(reply.request_id, reply.notification_topic, now_ms, now)
        works.append(outcome.work)
        return reply

    def _request_status(self, query: RequestStatusQuery, now: float) -> RequestStatusReply:
        reply = request_status(query, self._accepted_ids, now)
        outcome = "rejected" if reply.status == _REJECTED else "accepted"
        self._metrics.requests.labels("status", outcome).inc()
        return reply

    # --- CEP triggers ----------------------------------------------------------------

    def _trigger(
        self, route: list[bytes], req: CEPTriggerRequest, now: float
    ) -> CEPTriggerAck | None:
        outcome = check_trigger(req, self._policy, self._wall_ms(), symbols=self._symbols)
        if not outcome.accepted:
            self._rejected(
                "cep", req.trigger_id, outcome.reply.error_code, outcome.reply.reason, now
            )
            return outcome.reply
        if req.action == CEPTriggerRequest.REGISTER:  # CANCEL and LIST need no pipeline
            refused = self._pipeline.refusal(Part.TRIGGERS, now)
            if refused is not None:
                self._rejected("cep", req.trigger_id, refused.error_code, refused.reason, now)
                return CEPTriggerAck(
                    trigger_id=req.trigger_id,
                    status=Status.REJECTED,
                    reason=refused.reason,
                    error_code=refused.error_code,
                )
        ack = outcome.reply
        try:
            if req.action == CEPTriggerRequest.LIST:
                ack.triggers.extend(self._sink.list(req.client_id, self._wall_ms()))
                self._accepted["cep"].inc()
                return ack
            # OK once the store has it: the sink calls back (any thread), the loop replies.
            self._sink.submit(req, lambda error: self._on_stored(route, req, ack, error))
        except TriggerSinkError as exc:
            return self._trigger_failed(req, exc.code, str(exc), now)
        return None

    def _on_stored(
        self, route: list[bytes], req: CEPTriggerRequest, ack: CEPTriggerAck, error: str | None
    ) -> None:
        self._stored.put((route, req, ack, error))
        self._wake()

    def send_stored_triggers(self, now: float) -> None:
        """Acks for the trigger requests the sink has answered since the last call."""
        while not self._stored.empty():
            route, req, ack, error = self._stored.get_nowait()
            if error is not None:
                self._reply(route, self._trigger_failed(req, SINK_ERROR, error, now), now)
                continue
            self._accepted["cep"].inc()
            if req.action == CEPTriggerRequest.REGISTER:
                self._live.sync_trigger_tickers(now)  # its live data now, not at the next sync
            self._reply(route, ack, now)

    def _trigger_failed(
        self, req: CEPTriggerRequest, code: str, reason: str, now: float
    ) -> CEPTriggerAck:
        """A request the store would not take: REJECTED without a store, else ERROR."""
        if code == SINK_ERROR:
            if req.action != CEPTriggerRequest.LIST:  # the metric counts records not stored
                self._metrics.trigger_sink_errors.inc()
            log.error("CEP trigger %s not handled: %s", req.trigger_id or req.client_id, reason)
        self._rejected("cep", req.trigger_id, code, reason, now)
        status = Status.ERROR if code == SINK_ERROR else Status.REJECTED
        return CEPTriggerAck(
            trigger_id=req.trigger_id, status=status, reason=reason, error_code=code
        )

    # --- legacy synchronous flow -----------------------------------------------------

    def _legacy_request(self, route: list[bytes], req: OHLCRequest, now: float) -> Response | None:
        log.info("Client request routing: legacy OHLCRequest request_id=%s", req.request_id or "-")
        checked = check_legacy(
            req, self._policy, self._wall_ms(), self._new_id, symbols=self._symbols
        )
        if isinstance(checked, Rejection):
            self._rejected("legacy", req.request_id, checked.error_code, checked.reason, now)
            return _legacy_refusal(req.request_id, checked.error_code, checked.reason)
        request_id = checked.request.request_id
        unserved = self._ingestors.unserved(checked.topic, now)
        if unserved is not None:
            self._rejected("legacy", request_id, unserved.error_code, unserved.reason, now)
            return _legacy_refusal(request_id, unserved.error_code, unserved.reason)
        admission = self._pending.add(request_id, route, now)
        if admission is not Admission.ADDED:
            reason = (
                f"{self._s.max_pending_requests} legacy requests already waiting"
                if admission is Admission.FULL
                else f"request {request_id} is already waiting for an answer"
            )
            self._rejected("legacy", request_id, admission.value, reason, now)
            return _legacy_refusal(request_id, admission.value, reason)
        self._accepted["legacy"].inc()
        self._metrics.legacy_pending.set(len(self._pending))
        self._ingestors.publish_work(checked.topic, checked.request, "legacy", now)
        return None

    def on_legacy_response(self, data: DataResponse, now: float) -> None:
        """An ingestor's DataResponse: the Response to the client that waits for it."""
        log.info(
            "Received response from ingestor: request_id=%s, status=%s, candles=%d, ingestor=%s",
            data.request_id,
            Status.Name(data.status) if data.status in Status.values() else data.status,
            len(data.candles),
            data.ingestor_id or "-",
        )
        pending = self._pending.resolve(data.request_id)
        if pending is None:
            self._metrics.legacy_responses.labels("unmatched").inc()
            log.info("no client waits for request_id=%s (late or answered)", data.request_id)
            return
        self._metrics.legacy_responses.labels("matched").inc()
        self._metrics.legacy_pending.set(len(self._pending))
        if self._reply(pending.route, response_from(data), now):
            log.info("Sent response to client: request_id=%s", data.request_id)

    def expire_legacy(self, now: float) -> None:
        expired = self._pending.expire(now)
        if expired:
            self._metrics.legacy_pending.set(len(self._pending))
        for pending in expired:
            self._metrics.legacy_timeouts.inc()
            log.warning(
                "Request timed out: request_id=%s (pending requests: %d)",
                pending.request_id,
                len(self._pending),
            )
            self._reply(pending.route, timeout_response(pending, self._s.request_timeout_s), now)

    # --- replies ---------------------------------------------------------------------

    def _rejected(self, kind: str, request_id: str, code: str, reason: str, now: float) -> None:
        self._metrics.requests.labels(kind, "rejected").inc()
        self._metrics.rejections.labels(kind, code).inc()
        suffix = self._throttle(f"reject:{kind}:{code}", now)
        if suffix is not None:
            log.info("rejected %s request %r: %s: %s%s", kind, request_id, code, reason, suffix)

    def _reply(self, route: list[bytes], message: Message, now: float) -> bool:
        try:
            send_frames(self._client, envelope.encode_routed(route, message), NOBLOCK)
            return True
        except zmq.Again:
            reason = "hwm"
        except zmq.ZMQError as exc:
            reason = "unreachable" if exc.errno == errno.EHOSTUNREACH else "error"
        self._metrics.reply_failures.labels(reason).inc()
        suffix = self._throttle(f"reply:{reason}", now)
        if suffix is not None:
            log.warning("reply to client %s dropped: %s%s", route[0].hex(), reason, suffix)
        return False


def _refusal(message: Message | None, code: str, reason: str) -> Message:
    """A refusal in the reply type the client's request expects."""
    if isinstance(message, SubmitHistoricalRequest):
        return SubmitResponse(
            request_id=message.request_id, status=Status.REJECTED, reason=reason, error_code=code
        )
    if isinstance(message, CEPTriggerRequest):
        return CEPTriggerAck(
            trigger_id=message.trigger_id, status=Status.REJECTED, reason=reason, error_code=code
        )
    if isinstance(message, RequestStatusQuery):
        return RequestStatusReply(
            request_id=message.request_id, status=Status.REJECTED, reason=reason, error_code=code
        )
    request_id = message.request_id if isinstance(message, OHLCRequest) else ""
    return _legacy_refusal(request_id, code, reason)


def _legacy_refusal(request_id: str, code: str, reason: str) -> Response:
    return Response(request_id=request_id, status=Status.REJECTED, reason=reason, error_code=code)


# --- validation (pure: `now_ms`, `new_id` and `symbols` are passed in) -------------

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


class Work(NamedTuple):
    """A `DataRequest` for the ingestors and its PUB topic (the exchange prefix).
    (Tuples, this and SubmitOutcome: one is built per request, and a frozen
    dataclass costs more to build than the checks that fill it.)"""

    topic: str
    request: DataRequest


class SubmitOutcome(NamedTuple):
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
    Each field is read once: a protobuf field read costs about as much as a rule.
    """
    client_id, ticker = req.client_id, req.ticker
    period, start_ms, end_ms = req.period_seconds, req.start_time_ms, req.end_time_ms
    try:
        request_id = _request_id(req.request_id, client_id, new_id)
        prefix = _ticker_prefix(ticker, policy.known_exchanges)
        bars = _check_range(period, start_ms, end_ms, policy, now_ms, req.bars)
        topic = rules.notification_topic(req.notify, request_id, client_id)
        _check_symbol(ticker, symbols)
    except RuleViolation as bad:
        return SubmitOutcome(_rejected_reply(SubmitResponse(request_id=req.request_id), bad), None)
    work = DataRequest(
        request_id=request_id, client_id=client_id, kind=_HISTORICAL, ticker=ticker,
        period_seconds=period, start_time_ms=start_ms, end_time_ms=end_ms,
        notification_topic=topic, submitted_at_ms=now_ms, refetch=req.refetch, bars=bars,
    )  # fmt: skip
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
        prefix = _ticker_prefix(req.ticker, policy.known_exchanges)
        _check_range(req.period_seconds, req.start_time_ms, req.end_time_ms, policy, now_ms)
        _check_symbol(req.ticker, symbols)
    except RuleViolation as bad:
        return Rejection.of(bad)
    work = DataRequest(
        request_id=request_id, client_id=req.client_id, kind=_HISTORICAL, ticker=req.ticker,
        period_seconds=req.period_seconds, start_time_ms=req.start_time_ms,
        end_time_ms=req.end_time_ms, legacy_sync=True, submitted_at_ms=now_ms, limit=req.limit,
    )  # fmt: skip
    return Work(prefix, work)


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
            _ticker_prefix(req.ticker, policy.known_exchanges)
            _check_symbol(req.ticker, symbols, live=True)
        elif req.action == CEPTriggerRequest.CANCEL:
            if not req.trigger_id:
                raise RuleViolation(rules.MISSING_ID, "trigger_id is required")
            rules.check_ids(trigger_id=req.trigger_id, client_id=req.client_id)
            if req.ticker:
                _ticker_prefix(req.ticker, policy.known_exchanges)
            event_topic = ""
        else:
            raise RuleViolation(
                rules.BAD_ACTION, f"action must be REGISTER, CANCEL or LIST, got {req.action}"
            )
    except RuleViolation as bad:
        return TriggerOutcome(_rejected_reply(CEPTriggerAck(trigger_id=req.trigger_id), bad), False)
    ack = CEPTriggerAck(trigger_id=req.trigger_id, status=_OK, event_topic=event_topic)
    return TriggerOutcome(ack, True)


_Reply = TypeVar("_Reply", SubmitResponse, CEPTriggerAck)


def _rejected_reply(reply: _Reply, bad: RuleViolation) -> _Reply:
    reply.status, reply.reason, reply.error_code = _REJECTED, bad.reason, bad.error_code
    return reply


def _request_id(request_id: str, client_id: str, new_id: Callable[[], str]) -> str:
    if not request_id:
        if not client_id:
            raise RuleViolation(rules.MISSING_ID, "request_id or client_id is required")
        request_id = new_id()
    rules.check_id("request_id", request_id)
    rules.check_id("client_id", client_id)
    return request_id


@functools.lru_cache(maxsize=4096)
def _ticker_prefix(ticker: str, known_exchanges: frozenset[str]) -> str:
    """The work topic of a valid ticker of a served exchange. Memoised (clients ask about
    the same few tickers over and over); a RuleViolation is raised again each time."""
    exchange = rules.ticker(ticker).exchange
    if known_exchanges and exchange not in known_exchanges:
        known = ", ".join(sorted(known_exchanges))
        raise RuleViolation(rules.UNKNOWN_EXCHANGE, f"exchange {exchange} is not served ({known})")
    return f"{exchange}:"


def _check_symbol(ticker: str, symbols: SymbolCheck | None, *, live: bool = False) -> None:
    why = symbols(ticker, live) if symbols is not None else None
    if why is not None:
        raise RuleViolation(rules.BAD_SYMBOL, why)


def _check_range(
    period: int, start_ms: int, end_ms: int, policy: Policy, now_ms: int, bars: str = ""
) -> str:
    """The range rules; returns the canonical tick or volume bars ('' for candles). Bars
    have no candle limit: how many there are depends on the trades (Spark reads them)."""
    if bars:
        spec = rules.history_bars(bars, period)
        rules.time_range(start_ms, end_ms)
        rules.future_limit(end_ms, now_ms=now_ms, max_future_ms=policy.max_future_ms)
        return spec.name
    rules.history_range(period, start_ms, end_ms)
    rules.range_limits(
        period, start_ms, end_ms, now_ms=now_ms, max_future_ms=policy.max_future_ms,
        max_candles=policy.max_candles,
    )  # fmt: skip
    return ""


# --- accepted history requests (pure: `now` is passed in) ---------------------------


class _Accepted(NamedTuple):
    topic: str  # the notification topic the ack named
    at_ms: int  # wall clock of the ack
    at: float  # monotonic, for the age limit


class AcceptedIds:
    """The history request ids this relay acknowledged: the newest `capacity`, each for
    at most `max_age_s` (an LRU by acceptance; a resubmitted id counts as new).

    About 350 bytes an id, its strings included (measured: 19 MB of table for 100,000
    32-hex ids, plus the ids and topics): the default 100,000 hold ~35 MB at most, the
    last 100,000 submits (a minute at 1,700 submits/s, a day at ~1/s, whichever ends
    first).
    """

    def __init__(self, capacity: int, max_age_s: float) -> None:
        self.capacity = capacity
        self.max_age_s = max_age_s
        # Plain (topic, at_ms, at) tuples: a NamedTuple costs a Python call per submit.
        self._ids: OrderedDict[str, tuple[str, int, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, request_id: str, topic: str, at_ms: int, now: float) -> None:
        if self.capacity <= 0:
            return
        self._ids.pop(request_id, None)
        self._ids[request_id] = (topic, at_ms, now)
        if len(self._ids) > self.capacity:
            self._ids.popitem(last=False)

    def get(self, request_id: str, now: float) -> _Accepted | None:
        """The acceptance of `request_id`, if remembered; drops what is too old."""
        while self._ids:  # oldest first: expire from the front
            oldest = next(iter(self._ids.values()))
            if now - oldest[2] <= self.max_age_s:
                break
            self._ids.popitem(last=False)
        kept = self._ids.get(request_id)
        return None if kept is None else _Accepted._make(kept)


def request_status(query: RequestStatusQuery, ids: AcceptedIds, now: float) -> RequestStatusReply:
    """OK with the ack's time and topic when this relay accepted the id within its memory,
    NOT_FOUND when it did not (or forgot it); REJECTED for an id no submit could carry."""
    request_id = query.request_id
    remembered = int(ids.max_age_s) if ids.capacity > 0 else 0
    try:
        if not request_id:
            raise RuleViolation(rules.MISSING_ID, "request_id is required")
        rules.check_id("request_id", request_id)
    except RuleViolation as bad:
        return RequestStatusReply(
            request_id=request_id,
            status=_REJECTED,
            reason=bad.reason,
            error_code=bad.error_code,
            remembered_s=remembered,
        )
    accepted = ids.get(request_id, now)
    if accepted is None:
        return RequestStatusReply(
            request_id=request_id,
            status=Status.NOT_FOUND,
            reason=f"not accepted by this relay in the last {remembered} s (or among its "
            f"last {ids.capacity} accepted requests), or the relay restarted since",
            remembered_s=remembered,
        )
    return RequestStatusReply(
        request_id=request_id,
        status=_OK,
        accepted_at_ms=accepted.at_ms,
        notification_topic=accepted.topic,
        remembered_s=remembered,
    )


# --- rate limit and log throttle (pure: `now` is passed in) ------------------------


@dataclass(slots=True)
class _Bucket:
    tokens: float
    stamp: float
    limited: bool = False  # currently refusing: lets the caller log once per episode


class TokenBuckets:
    """Keyed by ROUTER identity (one per connection: a client that reconnects starts
    with a full bucket, which bounds the damage but is not an authentication); an LRU
    bounded to `max_keys` entries."""

    def __init__(self, rate: float, burst: int, max_keys: int) -> None:
        self._rate = rate
        self._burst = float(burst)
        self._max_keys = max_keys
        self._buckets: OrderedDict[bytes, _Bucket] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self._rate > 0

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, key: bytes, now: float) -> tuple[bool, bool]:
        """(allowed, first refusal of an episode) for one request from `key`."""
        if not self.enabled:
            return True, False
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(self._burst, now)
            if len(self._buckets) > self._max_keys:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
            elapsed = max(0.0, now - bucket.stamp)
            bucket.tokens = min(self._burst, bucket.tokens + elapsed * self._rate)
            bucket.stamp = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            bucket.limited = False
            return True, False
        first = not bucket.limited
        bucket.limited = True
        return False, first
