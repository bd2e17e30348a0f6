"""Trigger specs and notices: the engine's input and output vocabulary.

A `TriggerSpec` is a validated `CEPTriggerRequest{REGISTER}` (the relay checks
the same rules; records reach Kafka from elsewhere too, so the pipeline checks
again and never trusts a record). A `Notice` is what the engine has to tell a
client; `to_message` turns it into the `CEPTriggerEvent` published on the
trigger's topic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

from mdproto import ProtocolError, topics
from mdproto.messages import CEPCondition, CEPTriggerEvent, CEPTriggerRequest


class Kind(Enum):
    PRICE_ABOVE = CEPCondition.PRICE_ABOVE
    PRICE_BELOW = CEPCondition.PRICE_BELOW
    PCT_MOVE = CEPCondition.PCT_MOVE
    VOLUME_OVER = CEPCondition.VOLUME_OVER

    @property
    def windowed(self) -> bool:
        return self in (Kind.PCT_MOVE, Kind.VOLUME_OVER)


class InvalidTrigger(ValueError):  # noqa: N818 (reads as the verdict it is)
    """A trigger record the engine cannot evaluate; the reason names the field."""


@dataclass(frozen=True)  # no slots: pickled in every snapshot
class Condition:
    kind: Kind
    threshold: float
    window_ms: int = 0  # PCT_MOVE and VOLUME_OVER only

    def describe(self) -> str:
        window = f" within {self.window_ms // 1000}s" if self.kind.windowed else ""
        unit = "%" if self.kind is Kind.PCT_MOVE else ""
        return f"{self.kind.name} {self.threshold:g}{unit}{window}"


@dataclass(frozen=True)  # no slots: pickled in every snapshot
class TriggerSpec:
    trigger_id: str
    client_id: str
    ticker: str
    period_seconds: int  # 0 = raw ticks
    conditions: tuple[Condition, ...]  # one, or two evaluated as a sequence
    within_ms: int  # sequence: the second condition at most this long after the first
    repeating: bool
    expires_at_ms: int  # 0 = never
    topic: str  # where its events go
    registered_ms: int = 0  # Kafka timestamp of the REGISTER record

    @property
    def is_sequence(self) -> bool:
        return len(self.conditions) == 2

    def describe(self) -> str:
        text = " then ".join(c.describe() for c in self.conditions)
        if self.is_sequence:
            text += f" within {self.within_ms // 1000}s"
        series = f"{self.period_seconds}s candles" if self.period_seconds else "ticks"
        return f"{self.ticker} {series}: {text}"


def spec_from_request(request: CEPTriggerRequest, registered_ms: int = 0) -> TriggerSpec:
    """Validate a REGISTER request; raises InvalidTrigger with the reason."""
    if request.action != CEPTriggerRequest.REGISTER:
        raise InvalidTrigger(f"action {request.action} is not REGISTER")
    if not topics.is_valid_id(request.trigger_id):
        raise InvalidTrigger(f"trigger_id {request.trigger_id!r} is not a valid id")
    if request.client_id and not topics.is_valid_id(request.client_id):
        raise InvalidTrigger(f"client_id {request.client_id!r} is not a valid id")
    try:
        topics.parse_ticker(request.ticker)
        topic = topics.cep_event_topic(request.notify, request.trigger_id, request.client_id)
    except ProtocolError as exc:
        raise InvalidTrigger(exc.reason) from None
    count = len(request.conditions)
    if count not in (1, 2):
        raise InvalidTrigger(f"need one condition or a sequence of two, got {count}")
    conditions = tuple(_condition(i, c) for i, c in enumerate(request.conditions))
    if count == 2 and request.within_seconds == 0:
        raise InvalidTrigger("a sequence of two conditions needs within_seconds > 0")
    if request.expires_at_ms < 0:
        raise InvalidTrigger(f"expires_at_ms {request.expires_at_ms} is negative")
    return TriggerSpec(
        trigger_id=request.trigger_id,
        client_id=request.client_id,
        ticker=request.ticker,
        period_seconds=request.period_seconds,
        conditions=conditions,
        within_ms=request.within_seconds * 1000,
        repeating=request.repeating,
        expires_at_ms=request.expires_at_ms,
        topic=topic,
        registered_ms=registered_ms,
    )


def _condition(index: int, cond: CEPCondition) -> Condition:
    try:
        kind = Kind(cond.kind)
    except ValueError:
        raise InvalidTrigger(f"condition {index}: unknown kind {cond.kind}") from None
    if not math.isfinite(cond.threshold) or cond.threshold <= 0:
        raise InvalidTrigger(f"condition {index}: threshold must be finite and > 0")
    if kind.windowed and cond.window_seconds == 0:
        raise InvalidTrigger(f"condition {index}: window_seconds must be > 0")
    window_ms = cond.window_seconds * 1000 if kind.windowed else 0
    return Condition(kind, cond.threshold, window_ms)


class NoticeKind(Enum):
    FIRED = CEPTriggerEvent.FIRED
    ARMED = CEPTriggerEvent.ARMED
    EXPIRED = CEPTriggerEvent.EXPIRED
    CANCELLED = CEPTriggerEvent.CANCELLED


@dataclass(frozen=True, slots=True)
class Notice:
    kind: NoticeKind
    trigger_id: str
    ticker: str
    topic: str
    event_time_ms: int
    fire_count: int
    final: bool
    description: str = ""
    values: dict[str, float] = field(default_factory=dict)

    def to_message(self) -> CEPTriggerEvent:
        return CEPTriggerEvent(
            trigger_id=self.trigger_id,
            ticker=self.ticker,
            event_time_ms=self.event_time_ms,
            values=self.values,
            description=self.description,
            fire_count=self.fire_count,
            final=self.final,
            kind=self.kind.value,
        )
