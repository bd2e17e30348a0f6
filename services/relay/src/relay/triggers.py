"""Where validated CEP trigger requests go, and when the client hears OK.

`relay.trigger_kafka.KafkaTriggerSink` stores them in the compacted Kafka topic
`cep.triggers` (key trigger_id, so a CANCEL replaces its REGISTER) for the
pipeline to evaluate, and answers LIST from that topic; it is used when
`kafka.bootstrap_servers` is configured. A REGISTER or CANCEL is acknowledged
OK only once the broker has it (`Stored` is called back), so an OK never hides
a trigger that will not be evaluated. Without Kafka, `NoTriggerStore` refuses
every trigger request with `no_trigger_store`: nothing could evaluate it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from mdproto.error_codes import NO_TRIGGER_STORE, SINK_ERROR
from mdproto.messages import CEPTriggerRequest

#: Called once per submitted request, from any thread: None once it is durably
#: stored, else why it is not.
Stored = Callable[[str | None], None]


class TriggerSinkError(Exception):
    """The sink refuses the request at once; the client gets an ack with this reason."""

    def __init__(self, reason: str, code: str = SINK_ERROR) -> None:
        super().__init__(reason)
        self.code = code


class TriggerSink(Protocol):
    def start(self) -> object:
        """Connect to the store; the relay calls it once, from `Relay.start`."""

    def submit(self, request: CEPTriggerRequest, stored: Stored) -> None:
        """Store one validated REGISTER or CANCEL without blocking the relay's loop, and
        call `stored` when the store has it (or cannot take it); raise TriggerSinkError
        to refuse it at once."""

    def list(self, client_id: str, now_ms: int) -> list[CEPTriggerRequest]:
        """The client's registered, unexpired triggers; TriggerSinkError if unknown."""

    def tickers(self) -> set[str]:
        """Tickers with registered triggers (the relay keeps their live data flowing)."""

    def close(self) -> None: ...


class NoTriggerStore:
    """The sink of a relay without Kafka: every trigger request is refused."""

    REASON = (
        "this relay has no trigger store (kafka.bootstrap_servers is empty), so no "
        "trigger would be evaluated"
    )

    def start(self) -> None:
        return None

    def submit(self, request: CEPTriggerRequest, stored: Stored) -> None:
        raise TriggerSinkError(self.REASON, NO_TRIGGER_STORE)

    def list(self, client_id: str, now_ms: int) -> list[CEPTriggerRequest]:
        raise TriggerSinkError(self.REASON, NO_TRIGGER_STORE)

    def tickers(self) -> set[str]:
        return set()

    def close(self) -> None:
        return None
