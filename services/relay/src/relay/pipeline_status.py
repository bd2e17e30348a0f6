"""The relay's view of the pipeline: can history submits and trigger registrations be served?

    pipeline PUB :5557 (or a parent relay's :5558) -> SUB `PIPELINE:status` -> PipelineWatch

The pipeline publishes `PipelineStatus` every `interval_ms` (docs/protocol.md,
"Pipeline liveness"). Market data flows through libzmq's proxy thread, out of
Python's sight, so the relay reads the heartbeat on a SUB of its own connected to
the same upstreams: its subscription travels up a relay tree like a client's, and
the heartbeat comes down the same path the notifications take. A submit accepted
while nothing upstream answers would be an OK followed by minutes of silence; it
is refused `pipeline_unavailable` instead, with the reason.

A request accepted just before the heartbeat stopped is still waited for by its
client. So that it ends in seconds too, the relay speaks in the pipeline's stead
once the heartbeat is overdue: every refresh (`stats_interval_s`, 1 s) it publishes
a `PipelineStatus` with `history` and `triggers` false and the refusal's reason on
`PIPELINE:status`, which the SDK watches while it waits. One message for every
waiting client, no per-request state; it stops as soon as a heartbeat comes back.

`PipelineWatch` is the rule: pure, `now` passed in, unit-tested without sockets.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from mdproto import envelope, topics
from mdproto.error_codes import PIPELINE_UNAVAILABLE, UNEXPECTED_TYPE
from mdproto.errors import ProtocolError
from mdproto.messages import PipelineStatus
from relay.metrics import RelayMetrics

log = logging.getLogger(__name__)


class Part(Enum):
    """The part of the pipeline a request needs."""

    HISTORY = "history"
    TRIGGERS = "triggers"

    @property
    def requests(self) -> str:
        return "history submits" if self is Part.HISTORY else "trigger registrations"


@dataclass(frozen=True, slots=True)
class Refusal:
    error_code: str
    reason: str


class PipelineWatch:
    """Heartbeats in, a refusal (or None) out.

    - No heartbeat for `timeout_s` (or 3 of the pipeline's own intervals, if
      longer), or none since the relay started: every kind of work is refused
      (a stopped, hung or unreachable pipeline answers nothing).
    - A fresh heartbeat that says a part is not running (history query stopped,
      CEP disabled): that work is refused with the pipeline's reason.
    - `timeout_s` 0: never refuse (a pipeline that sends no heartbeat).
    """

    def __init__(self, timeout_s: float, now: float) -> None:
        self._timeout_s = timeout_s
        self._started = now
        self._last: PipelineStatus | None = None
        self._last_at = 0.0
        self._expiry = 0.0  # of the last heartbeat
        self._serves: dict[Part, bool] = {}  # by the last heartbeat

    @property
    def enabled(self) -> bool:
        return self._timeout_s > 0

    def beat(self, status: PipelineStatus, now: float) -> None:
        """Record a heartbeat; what it says is read here, once, not per request."""
        self._last, self._last_at = status, now
        self._expiry = max(self._timeout_s, 3 * status.interval_ms / 1000.0)
        self._serves = {Part.HISTORY: status.history, Part.TRIGGERS: status.triggers}

    def fresh(self, now: float) -> bool:
        """A heartbeat arrived within the expiry."""
        return self._last is not None and now - self._last_at <= self._expiry

    def refusal(self, work: Part, now: float) -> Refusal | None:
        """Why `work` cannot be accepted now, or None if it can."""
        if not self.enabled:
            return None
        last = self._last
        if last is None:
            return Refusal(
                PIPELINE_UNAVAILABLE,
                f"no heartbeat from the pipeline since the relay started {now - self._started:.0f}"
                " s ago: it is not running, still starting, or unreachable; retry once it runs",
            )
        if not self.fresh(now):
            return Refusal(
                PIPELINE_UNAVAILABLE,
                f"the pipeline's last heartbeat came {now - self._last_at:.1f} s ago: it is hung,"
                " stopped or unreachable, so nothing would answer; retry once it runs",
            )
        if not self._serves[work]:
            why = last.reason or f"{work.value} not served"
            return Refusal(PIPELINE_UNAVAILABLE, f"the pipeline cannot serve {work.value}: {why}")
        return None

    def down_report(self, now: float, wall_ms: int, interval_ms: int) -> PipelineStatus | None:
        """What to publish on `PIPELINE:status` in the pipeline's stead, or None.

        Only once a heartbeat was heard and is now overdue: before the first one
        this relay accepted nothing, and another relay that does hear the pipeline
        may have (a report would fail its clients' requests for nothing).
        """
        if not self.enabled or self._last is None or self.fresh(now):
            return None
        refusal = self.refusal(Part.HISTORY, now)
        reason = refusal.reason if refusal is not None else ""
        return PipelineStatus(
            sent_at_ms=wall_ms, interval_ms=interval_ms, history=False, triggers=False,
            reason=f"relay: {reason}",
        )  # fmt: skip

    def serving(self, now: float) -> dict[Part, bool]:
        """Per kind of work, whether it would be accepted now (metrics, health)."""
        return {work: self.refusal(work, now) is None for work in Part}


# --- the adapter (loop thread): heartbeats off the SUB, gauges, one log line per change ---


Publish = Callable[[list[bytes]], bool]


class PipelineHeartbeats:
    """Feeds `PipelineWatch` from the heartbeat SUB and reports what it concludes:
    gauges, log lines, and the down report on `PIPELINE:status` (through `publish`,
    the market-data stream) while the heartbeat is overdue."""

    def __init__(
        self,
        timeout_s: float,
        metrics: RelayMetrics,
        now: float,
        *,
        publish: Publish | None = None,
        wall_ms: Callable[[], int] = lambda: 0,
        report_interval_s: float = 1.0,
    ) -> None:
        self.watch = PipelineWatch(timeout_s, now)
        self._metrics = metrics
        self._publish = publish
        self._wall_ms = wall_ms
        self._report_interval_ms = max(1, round(report_interval_s * 1000))
        self._serving: dict[Part, bool] = {}
        self.refresh(now)

    def on_frames(self, frames: list[bytes], now: float) -> None:
        """One heartbeat; raises ProtocolError for anything else (counted as a bad frame)."""
        _topic, message = envelope.decode_sub(frames)
        if not isinstance(message, PipelineStatus):
            raise ProtocolError(
                UNEXPECTED_TYPE, f"{message.DESCRIPTOR.name} on {topics.PIPELINE_STATUS}"
            )
        self.watch.beat(message, now)
        self._metrics.pipeline_heartbeats.inc()
        self.refresh(now)

    def refusal(self, work: Part, now: float) -> Refusal | None:
        return self.watch.refusal(work, now)

    def refresh(self, now: float) -> None:
        """Gauges per kind of work, a log line whenever one changes, and the down
        report while the heartbeat is overdue (the loop calls this every second)."""
        if not self.watch.enabled:
            return
        report = self.watch.down_report(now, self._wall_ms(), self._report_interval_ms)
        publish = self._publish
        if report is not None and publish is not None:
            sent = publish(envelope.encode_pub(topics.PIPELINE_STATUS, report))
            self._metrics.pipeline_down_reports.inc(sent)
        for work in Part:
            refusal = self.watch.refusal(work, now)
            serving = refusal is None
            self._metrics.pipeline_serving.labels(work.value).set(serving)
            if self._serving.get(work) == serving:
                continue
            first = work not in self._serving
            self._serving[work] = serving
            if refusal is None:
                log.info("pipeline serves %s: accepting %s", work.value, work.requests)
            elif not first:  # at start-up nothing was accepted yet: no news
                log.warning("refusing %s from now on: %s", work.requests, refusal.reason)
