"""CEP triggers on the client side: building requests, checking acks, receiving events.

    event topic = RESPONSE:{client_id} (per client) or CEP:{trigger_id} (per trigger)
    subscribe(event topic)                       -> BEFORE the request leaves
    CEPTriggerRequest{REGISTER} -> CEPTriggerAck (REJECTED: TriggerRejected)
    CEPTriggerEvent on the topic: ARMED (the pipeline evaluates it), then FIRED...,
        and a final one (one-shot fired, EXPIRED or CANCELLED)

The condition syntax of the CLI and of `parse_condition` is
`KIND:THRESHOLD[@WINDOW]`: `above:100`, `below:95.5`, `pct:5@60s` (a 5 %
move within 60 s), `volume:1000@5m`. Everything here is pure (no sockets),
so it is unit-tested without a relay.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

from mdclient import timeparse
from mdclient.errors import InvalidRequest, ProtocolMismatch, SubmitRejected
from mdclient.history import decode_reply
from mdclient.streams import QueueStream
from mdproto import rules, topics
from mdproto.error_codes import BAD_CONDITION, WRONG_ID
from mdproto.messages import (
    CEPCondition,
    CEPTriggerAck,
    CEPTriggerEvent,
    CEPTriggerRequest,
    NotifyPattern,
    Status,
)
from mdproto.rules import RuleViolation

log = logging.getLogger(__name__)

KINDS: dict[str, int] = {
    "above": CEPCondition.PRICE_ABOVE,
    "below": CEPCondition.PRICE_BELOW,
    "pct": CEPCondition.PCT_MOVE,
    "volume": CEPCondition.VOLUME_OVER,
}
_NAMES = {value: name for name, value in KINDS.items()}
EVENT_KINDS = {value: name.lower() for name, value in CEPTriggerEvent.Kind.items()}


class TriggerRejected(SubmitRejected):
    """The relay refused a trigger request (CEPTriggerAck REJECTED or ERROR)."""


def parse_condition(text: str) -> CEPCondition:
    """`above:100`, `pct:5@60s`, ... -> CEPCondition; InvalidRequest says what is wrong."""
    kind_text, colon, rest = text.strip().partition(":")
    kind = KINDS.get(kind_text.lower())
    if kind is None or not colon:
        raise InvalidRequest(
            f"condition {text!r}: expected KIND:THRESHOLD[@WINDOW] with KIND one of "
            f"{', '.join(KINDS)}",
            error_code=BAD_CONDITION,
        )
    threshold_text, at, window_text = rest.partition("@")
    try:
        threshold = float(threshold_text)
    except ValueError:
        raise InvalidRequest(
            f"condition {text!r}: threshold {threshold_text!r} is not a number",
            error_code=BAD_CONDITION,
        ) from None
    window = 0
    if at:
        try:
            window = timeparse.parse_period(window_text)
        except timeparse.TimeFormatError as exc:
            raise InvalidRequest(f"condition {text!r}: {exc}", error_code=BAD_CONDITION) from None
    condition = CEPCondition(kind=kind, threshold=threshold, window_seconds=window)  # type: ignore[arg-type]
    check_condition(condition)
    return condition


def check_condition(condition: CEPCondition, index: int = 0) -> None:
    try:
        rules.condition(condition, index)
    except RuleViolation as bad:
        raise InvalidRequest(bad.reason, error_code=bad.error_code) from None


def describe_condition(condition: CEPCondition) -> str:
    """The inverse of `parse_condition`."""
    name = _NAMES.get(condition.kind, str(condition.kind))
    text = f"{name}:{condition.threshold:g}"
    if condition.window_seconds:
        text += f"@{timeparse.format_period(condition.window_seconds)}"
    return text


def build_register(
    *,
    trigger_id: str,
    client_id: str,
    ticker: str,
    conditions: Sequence[CEPCondition],
    period_seconds: int = 0,
    within_seconds: int = 0,
    repeating: bool = False,
    expires_at_ms: int = 0,
    per_client: bool = True,
) -> CEPTriggerRequest:
    """A REGISTER request, checked by the relay's rules (fail before sending)."""
    if period_seconds < 0 or within_seconds < 0:  # uint32 on the wire
        raise InvalidRequest("period and within cannot be negative", error_code=BAD_CONDITION)
    notify = NotifyPattern.NOTIFY_PER_CLIENT if per_client else NotifyPattern.NOTIFY_PER_REQUEST
    request = CEPTriggerRequest(
        trigger_id=trigger_id,
        client_id=client_id,
        action=CEPTriggerRequest.REGISTER,
        ticker=ticker,
        period_seconds=period_seconds,
        conditions=list(conditions),
        within_seconds=within_seconds,
        repeating=repeating,
        expires_at_ms=expires_at_ms,
        notify=notify,
    )
    try:
        rules.register(request)
    except RuleViolation as bad:
        raise InvalidRequest(bad.reason, error_code=bad.error_code) from None
    return request


def event_topic(request: CEPTriggerRequest) -> str:
    return topics.cep_event_topic(request.notify, request.trigger_id, request.client_id)


def check_ack(frames: Sequence[bytes], trigger_id: str) -> CEPTriggerAck:
    """The relay's ack, or TriggerRejected / ProtocolMismatch."""
    message = decode_reply(frames, CEPTriggerAck, trigger_id, TriggerRejected)
    if message.status != Status.OK:
        raise TriggerRejected(
            message.reason or Status.Name(message.status),
            error_code=message.error_code,
            request_id=trigger_id,
        )
    if message.trigger_id and trigger_id and message.trigger_id != trigger_id:
        raise ProtocolMismatch(
            f"ack is for trigger {message.trigger_id}, not {trigger_id}", error_code=WRONG_ID
        )
    return message


def describe_trigger(request: CEPTriggerRequest) -> str:
    """One line: `t1 BINANCE:BTC/USDT ticks above:100 then volume:10@1m within 60s, once`."""
    series = (
        f"{timeparse.format_period(request.period_seconds)} candles"
        if request.period_seconds
        else "ticks"
    )
    text = " then ".join(describe_condition(c) for c in request.conditions)
    if len(request.conditions) == 2:
        text += f" within {request.within_seconds}s"
    mode = "repeating" if request.repeating else "once"
    expiry = (
        f", expires {timeparse.format_ms(request.expires_at_ms)}" if request.expires_at_ms else ""
    )
    return f"{request.trigger_id} {request.ticker} {series} {text}, {mode}{expiry}"


def event_line(event: CEPTriggerEvent) -> str:
    """What `mdclient trigger watch` prints for one event."""
    kind = EVENT_KINDS.get(event.kind, str(event.kind))
    when = timeparse.format_ms(event.event_time_ms) if event.event_time_ms else "-"
    values = " ".join(f"{key}={value:g}" for key, value in sorted(event.values.items()))
    final = " final" if event.final else ""
    count = f" #{event.fire_count}" if event.kind == CEPTriggerEvent.FIRED else ""
    parts = [when, kind.upper() + count + final, event.trigger_id, event.ticker, values]
    if event.description and event.kind != CEPTriggerEvent.FIRED:
        parts.append(f"({event.description})")
    return "  ".join(p for p in parts if p)


class TriggerEvents(QueueStream[CEPTriggerEvent]):
    """Events of some triggers (or every trigger on the watched topics), as they arrive.

    Delivery is filtered on the exact topic (subscriptions are prefix matches)
    and, if given, the trigger ids. With `until_final`, iteration ends once
    every watched trigger has sent its final event. The queue is unbounded:
    events are rare and none may be lost.
    """

    def __init__(
        self,
        topic_list: Iterable[str],
        trigger_ids: Iterable[str] | None,
        closer: Callable[[TriggerEvents], None],
        *,
        until_final: bool = False,
    ) -> None:
        super().__init__(topic_list, closer)
        self.trigger_ids = frozenset(trigger_ids) if trigger_ids is not None else None
        self._until_final = until_final and self.trigger_ids is not None
        self._open = set(self.trigger_ids or ())
        #: Set by `Client.register_trigger`: the trigger this stream was opened for.
        ids = sorted(self.trigger_ids or ())
        self.trigger_id = ids[0] if len(ids) == 1 else ""
        self.ack: CEPTriggerAck | None = None

    @property
    def finished(self) -> bool:
        """Every watched trigger sent its final event (with `until_final`)."""
        return self._until_final and not self._open

    def wants(self, topic: str, event: CEPTriggerEvent) -> bool:
        if topic not in self.topics:
            return False
        return self.trigger_ids is None or event.trigger_id in self.trigger_ids

    def deliver(self, topic: str, event: CEPTriggerEvent) -> None:
        """Sink for the dispatcher (subscriber thread)."""
        if self._closed.is_set() or not self.wants(topic, event):
            return
        self.received += 1
        self._queue.put(event)

    def get(self, timeout_s: float | None = None) -> CEPTriggerEvent | None:
        """Next event, or None after `timeout_s` (or when finished and drained)."""
        if self.finished and self._queue.empty():
            return None
        event = super().get(timeout_s)
        if event is not None and event.final:
            self._open.discard(event.trigger_id)
        return event

    def wait_for(
        self, kind: int, timeout_s: float, trigger_id: str | None = None
    ) -> CEPTriggerEvent | None:
        """Skip events until one of `kind` (for `trigger_id`, if given); None on timeout.

        Skipped events are gone: use it for set-up steps such as waiting for ARMED.
        """
        import time

        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            event = self.get(timeout_s=remaining)
            if event is None:
                if self._closed.is_set():
                    return None
                continue
            if event.kind == kind and trigger_id in (None, event.trigger_id):
                return event
