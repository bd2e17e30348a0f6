"""Fault points for recovery tests: kill the driver, or fail a micro-batch, at a named line.

``PIPELINE_CRASH_AT=<point>`` kills the driver there: SIGKILL of the Spark JVM,
then of this process (``kill -9`` at that line, no cleanup). ``PIPELINE_FAIL_AT=
<point>[,<point>...]`` raises `InjectedFailureError` the first time each point is
reached: the micro-batch fails after its commit landed, as when a commit's
state is unknown, and the query dies (app.py restarts it). Off the production
path: app.py gives history, stored answers and live `armed`'s hook only when a
variable is set (else they hold a no-op).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable

from pipeline.preflight import StartupError

CRASH_ENV = "PIPELINE_CRASH_AT"
FAIL_ENV = "PIPELINE_FAIL_AT"
POINTS = frozenset(
    {
        "history-after-ohlc-commit",
        "history-after-requests-commit",
        "history-after-publish",
        "stored-answer-after-publish",
        "live-after-ticks-commit",
        "live-after-candles-commit",
    }
)
#: Called with a point's name where a recovery test may kill the driver or fail the batch.
CrashPoint = Callable[[str], None]

log = logging.getLogger(__name__)


class InjectedFailureError(RuntimeError):
    """Raised at a ``PIPELINE_FAIL_AT`` point (test-only)."""


def armed(jvm_pid: int | None) -> CrashPoint | None:
    """The hook for ``PIPELINE_CRASH_AT`` / ``PIPELINE_FAIL_AT``; None when both are unset
    (production). An unknown point refuses the start rather than never firing."""
    crash = os.environ.get(CRASH_ENV) or None
    fail = {p.strip() for p in os.environ.get(FAIL_ENV, "").split(",") if p.strip()}
    for env, points in ((CRASH_ENV, {crash} if crash else set()), (FAIL_ENV, fail)):
        unknown = sorted(points - POINTS)
        if unknown:
            raise StartupError(f"{env}={','.join(unknown)!r} is not one of {sorted(POINTS)}")
    if crash is None and not fail:
        return None
    return _Faults(crash, fail, jvm_pid)


class _Faults:
    def __init__(self, crash: str | None, fail: set[str], jvm_pid: int | None) -> None:
        self._crash = crash
        self._pending = set(fail)  # each fails once: the restarted query then gets through
        self._lock = threading.Lock()
        self._jvm_pid = jvm_pid

    def __call__(self, name: str) -> None:
        if name == self._crash:
            _crash_at(name, self._jvm_pid)
        with self._lock:
            if name not in self._pending:
                return
            self._pending.discard(name)
        log.warning("fail point %s reached: raising (%s)", name, FAIL_ENV)
        raise InjectedFailureError(f"injected failure at {name} ({FAIL_ENV}), after the commit")


def _crash_at(name: str, jvm_pid: int | None) -> None:
    log.critical("crash point %s reached: SIGKILL of the driver", name)
    for handler in logging.getLogger().handlers:
        handler.flush()
    if jvm_pid is not None:
        os.kill(jvm_pid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
