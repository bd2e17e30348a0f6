"""Where validated CEP trigger requests go.

A later issue stores them in the compacted Kafka topic `cep.triggers` (key
trigger_id, so a CANCEL replaces its REGISTER) for the pipeline to evaluate.
Until then the relay validates and acknowledges triggers and hands them to a
`TriggerSink`; the default one only logs.
"""

from __future__ import annotations

import logging
from typing import Protocol

from mdproto.messages import CEPTriggerRequest

log = logging.getLogger(__name__)


class TriggerSinkError(Exception):
    """The sink could not take the trigger; the client gets an ERROR ack with this reason."""


class TriggerSink(Protocol):
    def submit(self, request: CEPTriggerRequest) -> None:
        """Store one validated trigger request. Must not block the relay's loop for long;
        raise TriggerSinkError when the request cannot be stored."""

    def close(self) -> None: ...


class LoggingTriggerSink:
    """Default sink: logs and forgets (no trigger is evaluated yet)."""

    def submit(self, request: CEPTriggerRequest) -> None:
        log.info(
            "CEP trigger %s: %s %s (%d condition(s)), not stored: no trigger store configured",
            CEPTriggerRequest.Action.Name(request.action),
            request.trigger_id,
            request.ticker,
            len(request.conditions),
        )

    def close(self) -> None:
        return None
