"""Trigger specs and notices: the engine's input and output vocabulary.

A `TriggerSpec` is a `CEPTriggerRequest{REGISTER}` that passed `mdproto.rules`
(the relay checks the same rules; records reach Kafka from elsewhere too, so the
pipeline checks again and never trusts a record). A `Notice` is what the engine has to tell a
client; `to_message` turns it into the `CEPTriggerEvent` published on the
trigger's topic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from mdproto import rules
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
    try:
        topic = rules.register(request)  # expiry: the engine's clock, not the relay's
    except rules.RuleViolation as bad:
        raise InvalidTrigger(bad.reason) from None
    conditions = tuple(
        Condition(Kind(c.kind), c.threshold, c.window_seconds * 1000) for c in request.conditions
    )
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
