"""Where validated CEP trigger requests go.

`relay.trigger_kafka.KafkaTriggerSink` stores them in the compacted Kafka topic
`cep.triggers` (key trigger_id, so a CANCEL replaces its REGISTER) for the
pipeline to evaluate, and answers LIST from that topic; it is used when
`kafka.bootstrap_servers` is configured. Without it the default sink only logs
(nothing is evaluated) and LIST is refused.
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

    def list(self, client_id: str, now_ms: int) -> list[CEPTriggerRequest]:
        """The client's registered, unexpired triggers; TriggerSinkError if unknown."""

    def tickers(self) -> set[str]:
        """Tickers with registered triggers (the relay keeps their live data flowing)."""

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

    def list(self, client_id: str, now_ms: int) -> list[CEPTriggerRequest]:
        raise TriggerSinkError("no trigger store configured: triggers cannot be listed")

    def tickers(self) -> set[str]:
        return set()

    def close(self) -> None:
        return None
