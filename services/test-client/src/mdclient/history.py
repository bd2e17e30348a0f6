"""The asynchronous history flow (docs/protocol.md), minus the Iceberg read,
and `HistoryResult`, what a history (or legacy) call returns.

Per attempt (each with a NEW request_id):

    topic = notification_topic(pattern, request_id, client_id)
    register waiter(request_id, topic)      -> nothing can slip past us
    subscribe(topic), confirmed live         -> BEFORE the request leaves
    SubmitHistoricalRequest  -> SubmitResponse (REJECTED: raise, no retry)
    wait for HistoryReadyNotification up to history_timeout_s
      OK / NOT_FOUND -> done; ERROR -> raise HistoryFailed (no retry)
      PIPELINE:status says history is not served (the relay's down report
                     once the heartbeat is 5 s overdue, or the pipeline's own)
                     -> raise PipelineUnavailable (no retry: a submit would
                        be refused until the pipeline is back)
      INGESTORS:{exchange}|status says no live ingestor serves the exchange
                     (the relay's word once the last one died or hung)
                     -> the requests table (`recover`) once, else raise
                        IngestorUnavailable (no_ingestor, no retry)
      nothing        -> ask the requests table (`recover`) for every accepted
                        attempt: a recorded outcome completes the call (the
                        notification was lost); else the next attempt. A late
                        notification for an earlier attempt still completes
                        the call (same query)

Subscriptions are reference-counted by the transport, so the per-client
topic subscribed at connect stays subscribed after a call ends. `PIPELINE:status`
and the exchange's `INGESTORS:{exchange}|status` are subscribed for the length of
the call, before the first submit.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from mdclient import extras
from mdclient.dispatch import Dispatcher, NotificationWaiter
from mdclient.errors import (
    HistoryFailed,
    HistoryTimeout,
    IngestorUnavailable,
    InvalidRequest,
    PipelineUnavailable,
    ProtocolMismatch,
    RequestTimeout,
    SubmitRejected,
)
from mdproto import ProtocolError, envelope, rules, topics
from mdproto.error_codes import (
    HISTORY_TIMEOUT,
    NO_INGESTOR,
    PIPELINE_UNAVAILABLE,
    REQUEST_ID_MISMATCH,
    SUBMIT_TIMEOUT,
    TOPIC_MISMATCH,
    UNEXPECTED_STATUS,
    UNEXPECTED_TYPE,
)
from mdproto.messages import (
    CEPTriggerAck,
    ExchangeServing,
    HistoryReadyNotification,
    NotifyPattern,
    PipelineStatus,
    RequestStatusReply,
    Response,
    Status,
    SubmitHistoricalRequest,
    SubmitResponse,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from google.protobuf.message import Message

log = logging.getLogger(__name__)

Phase = Literal["subscribing", "submitting", "waiting", "retrying", "reading", "done"]
PATTERNS: dict[str, int] = {
    "per_client": NotifyPattern.NOTIFY_PER_CLIENT,
    "per_request": NotifyPattern.NOTIFY_PER_REQUEST,
}


def bars_name(period: int | str) -> str:
    """The canonical tick or volume bars a period argument names ("100ticks", "2.5vol"),
    '' for a time period; InvalidRequest ``bad_bars`` for a malformed one ("0ticks")."""
    if not isinstance(period, str):
        return ""
    text = period.strip().lower()
    if not text.endswith((rules.TICKS, rules.VOLUME)):
        return ""
    try:
        return rules.bars(text).name
    except rules.RuleViolation as bad:
        raise InvalidRequest(bad.reason, error_code=bad.error_code) from None


@dataclass(frozen=True, slots=True)
class HistoryQuery:
    """[start_ms, end_ms) of `period_seconds` candles of `ticker`, or of tick or volume
    bars (`bars` "100ticks" / "2.5vol", period_seconds 0) built from recorded trades."""

    ticker: str
    period_seconds: int
    start_ms: int
    end_ms: int
    bars: str = ""

    def __post_init__(self) -> None:
        try:
            rules.ticker(self.ticker)
            if self.bars:
                rules.history_bars(self.bars, self.period_seconds)
                rules.time_range(self.start_ms, self.end_ms)
            else:
                rules.history_range(self.period_seconds, self.start_ms, self.end_ms)
        except rules.RuleViolation as bad:
            raise InvalidRequest(bad.reason, error_code=bad.error_code) from None


@dataclass(frozen=True, slots=True)
class ProgressEvent:
    """What a long wait is doing; handed to the progress callback."""

    phase: Phase
    attempt: int
    attempts: int
    request_id: str
    elapsed_s: float
    detail: str = ""


ProgressCallback = Callable[[ProgressEvent], None]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    attempts: int = 3
    submit_timeout_s: float = 30.0
    history_timeout_s: float = 120.0
    progress_interval_s: float = 0.2
    #: End the wait early when `PIPELINE:status` says history is not served, or the
    #: exchange's `INGESTORS:{exchange}|status` that no live ingestor serves it.
    watch_pipeline: bool = True


@dataclass(frozen=True, slots=True)
class HistoryOutcome:
    notification: HistoryReadyNotification
    request_ids: tuple[str, ...]  # every attempt's id, in order
    attempts: int
    elapsed_s: float
    recovered: bool = False  # from the requests table: the notification itself was lost


@dataclass(frozen=True)
class HistoryResult:
    """Candles (frames.SCHEMA) plus how they were obtained.

    `status` is "OK" or "NOT_FOUND" (then `table` is empty); failures raise.
    """

    table: pa.Table
    status: str
    request_id: str
    attempts: int
    elapsed_s: float
    snapshot_id: int | None = None
    reported_rows: int = 0  # row_count of the notification (rows written for the request)
    notification: HistoryReadyNotification | None = None
    #: Set when the pinned snapshot was gone and the current one was read instead.
    snapshot_note: str = ""

    def __len__(self) -> int:
        return int(self.table.num_rows)

    @property
    def empty(self) -> bool:
        return bool(self.table.num_rows == 0)

    def to_pandas(self) -> Any:
        """A pandas DataFrame (typed Any: pandas ships no type stubs here).

        pandas is the optional extra `mdclient[pandas]`.
        """
        extras.require("pandas", "HistoryResult.to_pandas()")
        return self.table.to_pandas()


#: A heartbeat saying the pipeline serves outweighs a down report for this many of
#: its intervals: another relay still hears the pipeline (active/active relays).
SERVING_GRACE_INTERVALS = 2


class _DownUnlessServing:
    """A down word ends the wait unless a serving word came within
    `SERVING_GRACE_INTERVALS` of its own interval. Pure: `now` passed in."""

    def __init__(self) -> None:
        self._serving_until = -math.inf

    def _judge(self, serving: bool, interval_ms: int, reason: str, now: float) -> str | None:
        if serving:
            interval_s = max(interval_ms, 1) / 1000.0
            self._serving_until = now + SERVING_GRACE_INTERVALS * interval_s
            return None
        if now <= self._serving_until:
            log.debug("down report outweighed by a serving one: %s", reason)
            return None
        return reason


class PipelineView(_DownUnlessServing):
    """What `PIPELINE:status` says about a history request in flight.

    A status with `history` false ends the wait: a relay's down report (published
    once the pipeline's heartbeat is overdue, 5 s) or the pipeline's own word. A
    pipeline frozen for less than the relay's timeout is never reported, and its
    requests are answered when it resumes. With several relays one that lost its
    link to a running pipeline reports it down while another still passes its
    heartbeats on: a report within `SERVING_GRACE_INTERVALS` of a serving
    heartbeat is not believed.
    """

    def down(self, status: PipelineStatus, now: float) -> str | None:
        """Why the request will not be answered, or None while it still may be."""
        reason = status.reason or "the pipeline does not serve history"
        return self._judge(status.history, status.interval_ms, reason, now)


class ServingView(_DownUnlessServing):
    """What `INGESTORS:{exchange}|status` says about a history request in flight.

    `served` false ends the wait: the relay found no live ingestor of the exchange
    (the last one died, or all went silent: 3 status intervals, 6 s), so nobody is
    left to fetch the request or take its claim over. While another ingestor of
    the exchange lives the relay says served and the takeover answers. As with the
    pipeline, a served word from another relay within `SERVING_GRACE_INTERVALS`
    outweighs the report of one that lost only its own link to the ingestors.
    """

    def down(self, status: ExchangeServing, now: float) -> str | None:
        """Why the request will not be answered, or None while it still may be."""
        reason = status.reason or f"no live ingestor serves {status.exchange}"
        return self._judge(status.served, status.interval_ms, reason, now)


# request_id -> its recorded outcome, or None while there is none (mdclient.request_status).
Recover = Callable[[str], HistoryReadyNotification | None]


class HistoryPorts(Protocol):
    """What the flow needs from the transport."""

    def request(self, frames: Sequence[bytes], timeout_s: float) -> list[bytes]: ...
    def subscribe(self, topic: str) -> None: ...
    def unsubscribe(self, topic: str) -> None: ...


@dataclass
class _Call:
    started: float
    request_ids: list[str] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)
    accepted_ids: list[str] = field(default_factory=list)


def wait_for_history(
    ports: HistoryPorts,
    dispatcher: Dispatcher,
    query: HistoryQuery,
    *,
    client_id: str,
    pattern: int,
    policy: RetryPolicy,
    new_request_id: Callable[[], str],
    progress: ProgressCallback | None = None,
    recover: Recover | None = None,
    refetch: bool = False,
    clock: Callable[[], float] = time.monotonic,
) -> HistoryOutcome:
    """Run the flow above; raises SubmitRejected, HistoryFailed or a timeout."""
    call = _Call(started=clock())
    waiter = NotificationWaiter()
    views = _Views(PipelineView(), ServingView())
    serving_topic = topics.ingestors_status_topic(topics.parse_ticker(query.ticker).exchange)

    def on_status(_topic: str, message: Message) -> None:
        if isinstance(message, PipelineStatus | ExchangeServing):
            waiter.put(message)

    def report(phase: Phase, attempt: int, request_id: str, detail: str = "") -> None:
        if progress is not None:
            elapsed = clock() - call.started
            progress(ProgressEvent(phase, attempt, policy.attempts, request_id, elapsed, detail))

    try:
        if policy.watch_pipeline:
            for watched in (topics.PIPELINE_STATUS, serving_topic):
                dispatcher.add_topic_sink(watched, on_status)
                ports.subscribe(watched)
                call.topics.append(watched)
        for attempt in range(1, policy.attempts + 1):
            request_id = new_request_id()
            topic = topics.notification_topic(pattern, request_id, client_id)
            call.request_ids.append(request_id)
            dispatcher.expect(request_id, topic, waiter)
            report("subscribing", attempt, request_id, topic)
            ports.subscribe(topic)
            call.topics.append(topic)
            report("submitting", attempt, request_id)
            request = SubmitHistoricalRequest(
                request_id=request_id,
                client_id=client_id,
                ticker=query.ticker,
                period_seconds=query.period_seconds,
                start_time_ms=query.start_ms,
                end_time_ms=query.end_ms,
                notify=pattern,  # type: ignore[arg-type]
                refetch=refetch,
                bars=query.bars,
            )
            try:
                reply = ports.request(envelope.encode(request), policy.submit_timeout_s)
            except RequestTimeout as exc:
                report("retrying", attempt, request_id, str(exc))
                continue
            check_submit_reply(reply, request_id, topic)
            call.accepted_ids.append(request_id)
            try:
                notification = _wait(waiter, views, policy, attempt, request_id, report, clock)
            except IngestorUnavailable:
                # The ingestor may have finished before it died: an outcome is an answer.
                if (
                    recover is None
                    or (notification := _recorded(recover, call.accepted_ids)) is None
                ):
                    raise
                recovered = True
            else:
                recovered = False
                if notification is None and recover is not None:
                    notification = _recorded(recover, call.accepted_ids)
                    recovered = notification is not None
            if notification is not None:
                raise_for_status(notification)
                detail = "recovered from the requests table" if recovered else ""
                report("done", attempt, notification.request_id, detail)
                return HistoryOutcome(
                    notification,
                    tuple(call.request_ids),
                    attempt,
                    clock() - call.started,
                    recovered=recovered,
                )
            report("retrying", attempt, request_id, "no notification")
        raise _timeout(call, policy)
    finally:
        if policy.watch_pipeline:
            for watched in (topics.PIPELINE_STATUS, serving_topic):
                dispatcher.remove_topic_sink(watched, on_status)
        for request_id in call.request_ids:
            dispatcher.forget(request_id)
        for topic in call.topics:
            ports.unsubscribe(topic)


M = TypeVar("M", SubmitResponse, CEPTriggerAck, RequestStatusReply)


def decode_reply(
    frames: Sequence[bytes], expected: type[M], request_id: str, rejected: type[SubmitRejected]
) -> M:
    """The relay's reply of type `expected`, or ProtocolMismatch / `rejected`.

    A `Response` is the relay's generic answer to a request it could not handle.
    """
    try:
        message = envelope.decode(frames)
    except ProtocolError as exc:
        raise ProtocolMismatch(
            f"relay reply does not decode: {exc.reason}", error_code=exc.code
        ) from None
    if isinstance(message, Response):
        raise rejected(
            message.reason or f"relay answered {Status.Name(message.status)}",
            error_code=message.error_code,
            request_id=request_id,
        )
    if not isinstance(message, expected):
        raise ProtocolMismatch(
            f"expected {expected.DESCRIPTOR.name}, got {message.DESCRIPTOR.name}",
            error_code=UNEXPECTED_TYPE,
        )
    return message


def check_submit_reply(frames: Sequence[bytes], request_id: str, topic: str) -> SubmitResponse:
    """The relay's answer to a submit, or SubmitRejected / ProtocolMismatch."""
    message = decode_reply(frames, SubmitResponse, request_id, SubmitRejected)
    if message.status == Status.REJECTED:
        raise SubmitRejected(
            message.reason or "rejected without a reason",
            error_code=message.error_code,
            request_id=request_id,
        )
    if message.status != Status.OK:
        raise ProtocolMismatch(
            f"SubmitResponse status {Status.Name(message.status)} is neither OK nor REJECTED",
            error_code=UNEXPECTED_STATUS,
            request_id=request_id,
        )
    if message.request_id and message.request_id != request_id:
        raise ProtocolMismatch(
            f"SubmitResponse is for request {message.request_id!r}, sent {request_id!r}",
            error_code=REQUEST_ID_MISMATCH,
            request_id=request_id,
        )
    if message.notification_topic and message.notification_topic != topic:
        # We would wait on a topic nobody publishes to: a contract bug, retries won't help.
        raise ProtocolMismatch(
            f"relay announces notification topic {message.notification_topic!r}, "
            f"client subscribed to {topic!r}",
            error_code=TOPIC_MISMATCH,
            request_id=request_id,
        )
    return message


def raise_for_status(notification: HistoryReadyNotification) -> None:
    """OK and NOT_FOUND are answers; ERROR (or anything else) raises HistoryFailed."""
    if notification.status in (Status.OK, Status.NOT_FOUND):
        return
    name = Status.Name(notification.status)
    raise HistoryFailed(
        notification.reason or f"history request ended with status {name}",
        error_code=notification.error_code or name.lower(),
        request_id=notification.request_id,
        notification=notification,
    )


@dataclass(frozen=True, slots=True)
class _Views:
    pipeline: PipelineView
    serving: ServingView


def _wait(
    waiter: NotificationWaiter,
    views: _Views,
    policy: RetryPolicy,
    attempt: int,
    request_id: str,
    report: Callable[[Phase, int, str, str], None],
    clock: Callable[[], float],
) -> HistoryReadyNotification | None:
    deadline = clock() + policy.history_timeout_s
    while True:
        remaining = deadline - clock()
        if remaining <= 0:
            return None
        item = waiter.wait(min(remaining, policy.progress_interval_s))
        if isinstance(item, PipelineStatus):
            down = views.pipeline.down(item, clock())
            if down is not None:
                raise PipelineUnavailable(
                    f"the pipeline stopped serving history while the request was in flight "
                    f"({down}); retry once it runs",
                    error_code=PIPELINE_UNAVAILABLE,
                    request_id=request_id,
                )
        elif isinstance(item, ExchangeServing):
            down = views.serving.down(item, clock())
            if down is not None:
                raise IngestorUnavailable(
                    f"no live ingestor is left to serve the request in flight ({down}); "
                    "retry once one runs",
                    error_code=NO_INGESTOR,
                    request_id=request_id,
                )
        elif item is not None:
            return item
        else:
            report("waiting", attempt, request_id, "")


def _recorded(recover: Recover, request_ids: Sequence[str]) -> HistoryReadyNotification | None:
    """The newest accepted attempt's recorded outcome (any attempt answers the same query)."""
    for request_id in reversed(request_ids):
        notification = recover(request_id)
        if notification is not None:
            return notification
    return None


def _timeout(call: _Call, policy: RetryPolicy) -> Exception:
    ids = tuple(call.request_ids)
    if not call.accepted_ids:
        return RequestTimeout(
            f"relay did not acknowledge any of {policy.attempts} submit attempt(s) "
            f"within {policy.submit_timeout_s:g}s each",
            error_code=SUBMIT_TIMEOUT,
            request_id=ids[-1] if ids else "",
        )
    return HistoryTimeout(
        f"no HistoryReadyNotification within {policy.history_timeout_s:g}s for any of "
        f"{len(ids)} attempt(s)",
        error_code=HISTORY_TIMEOUT,
        request_id=ids[-1],
        request_ids=ids,
    )
