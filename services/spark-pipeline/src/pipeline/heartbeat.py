"""The pipeline's heartbeat: `PipelineStatus` on `PIPELINE:status` every `heartbeat_s`.

Relays refuse history submits and trigger registrations while no heartbeat
arrives, or while it says the part they need is down (docs/protocol.md,
"Pipeline liveness"): a hung pipeline costs a client seconds and a reason, not
a timeout. The beat has its own driver thread and asks the JVM for the history
query's state each time, so a stopped driver, JVM or PUB process stops it;
`pipeline_status` (pure) words what it says.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from enum import Enum

from google.protobuf.message import Message

from mdproto import topics
from mdproto.messages import PipelineStatus

log = logging.getLogger(__name__)


class QueryState(Enum):
    """The history query as the relay needs to know it."""

    DISABLED = "disabled"  # history.enabled is false
    STARTING = "starting"  # the pipeline has not started it yet
    RUNNING = "running"
    # Not active: it failed and restarts from its checkpoint (requests wait in Kafka), or
    # the pipeline gives up and exits, which ends the heartbeat.
    RESTARTING = "restarting"


_HISTORY_DOWN = {
    QueryState.DISABLED: "history is disabled in this pipeline (history.enabled: false)",
    QueryState.STARTING: "the pipeline is starting (its history query does not run yet)",
}


def pipeline_status(
    history: QueryState, cep_enabled: bool, interval_s: float, now_ms: int
) -> PipelineStatus:
    """What the relays are told. A restarting query still serves: it reads the
    requests written meanwhile once it is back."""
    down = [_HISTORY_DOWN[history]] if history in _HISTORY_DOWN else []
    if not cep_enabled:
        down.append("CEP is disabled in this pipeline (cep.enabled: false)")
    return PipelineStatus(
        sent_at_ms=now_ms,
        interval_ms=round(interval_s * 1000),
        history=history not in _HISTORY_DOWN,
        triggers=cep_enabled,
        reason="; ".join(down),
    )


class Heartbeat:
    """A daemon thread that publishes `pipeline_status` until `stop`."""

    def __init__(
        self,
        publish: Callable[[str, Message], None],
        history: Callable[[], QueryState],
        *,
        cep_enabled: bool,
        interval_s: float,
    ) -> None:
        self._publish = publish
        self._history = history
        self._cep_enabled = cep_enabled
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pipeline-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self._interval_s + 15)

    def _run(self) -> None:
        while True:
            try:
                status = pipeline_status(
                    self._history(), self._cep_enabled, self._interval_s, time.time_ns() // 10**6
                )
                self._publish(topics.PIPELINE_STATUS, status)
            except Exception as exc:  # the relays notice the silence; we say why here
                log.warning("heartbeat not sent: %s", exc)
            if self._stop.wait(self._interval_s):
                return
