"""When `make run` treats a running component as hung: its liveness probe, like Kubernetes'.

A process that exits is restarted by `infra.platform.restarts`; one that hangs (a
SIGSTOP, a deadlock, a JVM stuck in GC) keeps its pid and its sockets, so nothing
exits and nothing restarts it. Each service serves `GET /healthz` from a thread of
its own (mdproto.runtime.metrics_http), and the pipeline's asks its JVM: a frozen
process, or a stuck JVM, does not answer at all. The supervisor probes it every
`period_s` and declares the component hung after `failures` probes in a row got no
answer (Kubernetes' `periodSeconds` and `failureThreshold`, with its defaults 10 s
and 3); it is then killed and restarted, counted against the same crash budget as
a crash.

An answer, even a 503, passes: the service runs and says what it lacks, mostly a
dependency it retries by itself (the relay's market reader while Kafka is down, a
pipeline query in its restart backoff). Restarting it would not bring Kafka back,
and a restart that fails while Kafka is down would spend the crash budget and stop
the whole platform (docs/adr/0013-liveness-restarts.md).

`LivenessPolicy` only counts (probe results in, `Hung` out, time from an injected
clock); `healthz` probes and `infra.platform.__main__.supervise` acts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from infra.localstack.components import NotReadyError
from infra.platform.services import http_get


@dataclass(frozen=True)
class Hung:
    """Restart `component`: `failures` probes in a row got no answer over `for_s` s."""

    component: str
    failures: int
    for_s: float
    reason: str  # the last probe's failure


@dataclass
class _Record:
    last_probe: float
    failures: int = 0
    first_failure: float = 0.0


class LivenessPolicy:
    """Per-component probe history: `due()` says when to probe, `probed()` decides."""

    def __init__(
        self, period_s: float, failures: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if period_s <= 0 or failures < 1:
            raise ValueError(f"need period_s > 0 and failures >= 1, not {period_s}, {failures}")
        self.period_s = period_s
        self.failures = failures
        self._clock = clock
        self._records: dict[str, _Record] = {}

    def due(self, component: str) -> bool:
        """Whether `component` should be probed now (one period after its last probe; a
        component seen for the first time, or just restarted, waits one period)."""
        now = self._clock()
        record = self._records.setdefault(component, _Record(last_probe=now))
        return now - record.last_probe >= self.period_s

    def probed(self, component: str, failure: str | None) -> Hung | None:
        """Record one probe (`failure`: None when it passed, else why not); a `Hung`
        once `failures` probes in a row failed. One success clears the count."""
        now = self._clock()
        record = self._records.setdefault(component, _Record(last_probe=now))
        record.last_probe = now
        if failure is None:
            record.failures = 0
            return None
        if record.failures == 0:
            record.first_failure = now
        record.failures += 1
        if record.failures < self.failures:
            return None
        return Hung(component, record.failures, now - record.first_failure, failure)

    def forget(self, component: str) -> None:
        """Start afresh (after a restart): the next probe is one period away."""
        self._records.pop(component, None)


#: A liveness probe: a service's base URL -> None when it answers, else why not.
Probe = Callable[[str], str | None]


def healthz(base_url: str) -> str | None:
    """`GET /healthz` answers, whatever its status, within services.http_get's 3 s."""
    try:
        http_get(f"{base_url}/healthz")
    except NotReadyError as exc:
        return str(exc)
    return None
