"""Fault points for recovery tests: kill the driver, fail a micro-batch, or hold it, at a
named line.

``PIPELINE_CRASH_AT=<point>`` kills the driver there: SIGKILL of the Spark JVM,
then of this process (``kill -9`` at that line, no cleanup). ``PIPELINE_FAIL_AT=
<point>[,<point>...]`` raises `InjectedFailureError` the first time each point is
reached: the micro-batch fails after its commit landed, as when a commit's
state is unknown, and the query dies (app.py restarts it). ``PIPELINE_HOLD_AT=
<point>`` with ``PIPELINE_HOLD_FIFO=<path>`` (a named pipe the test made) holds the
batch there the first time: it opens the pipe for reading, which blocks until the
test opens it for writing (so the test knows the batch is there), and reads to the
end, which blocks until the test closes it. In between the test can break what
the rest of the batch needs, e.g. stop the S3 store before Spark's checkpoint
commit. Off the production path: app.py gives history, stored answers and live
`armed`'s hook only when a variable is set (else they hold a no-op).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline.preflight import StartupError

CRASH_ENV = "PIPELINE_CRASH_AT"
FAIL_ENV = "PIPELINE_FAIL_AT"
HOLD_ENV = "PIPELINE_HOLD_AT"
HOLD_FIFO_ENV = "PIPELINE_HOLD_FIFO"
POINTS = frozenset(
    {
        "history-after-ohlc-commit",
        "history-after-requests-commit",
        "history-after-publish",
        "stored-answer-after-publish",
        "live-after-ticks-commit",
        "live-after-candles-commit",
        "live-after-books-commit",
    }
)
#: Called with a point's name where a recovery test may kill the driver or fail the batch.
CrashPoint = Callable[[str], None]

log = logging.getLogger(__name__)


class InjectedFailureError(RuntimeError):
    """Raised at a ``PIPELINE_FAIL_AT`` point (test-only)."""


@dataclass(frozen=True, slots=True)
class Hold:
    """Where a batch is held (``PIPELINE_HOLD_AT``) and the named pipe that releases it."""

    point: str
    fifo: Path


def armed(jvm_pid: int | None) -> CrashPoint | None:
    """The hook for ``PIPELINE_CRASH_AT`` / ``PIPELINE_FAIL_AT`` / ``PIPELINE_HOLD_AT``;
    None when all are unset (production). An unknown point, or a hold without its pipe,
    refuses the start rather than never firing."""
    crash = os.environ.get(CRASH_ENV) or None
    fail = {p.strip() for p in os.environ.get(FAIL_ENV, "").split(",") if p.strip()}
    hold_at = os.environ.get(HOLD_ENV) or None
    for env, points in (
        (CRASH_ENV, {crash} if crash else set()),
        (FAIL_ENV, fail),
        (HOLD_ENV, {hold_at} if hold_at else set()),
    ):
        unknown = sorted(points - POINTS)
        if unknown:
            raise StartupError(f"{env}={','.join(unknown)!r} is not one of {sorted(POINTS)}")
    hold = None
    if hold_at is not None:
        fifo = Path(os.environ.get(HOLD_FIFO_ENV, ""))
        if not fifo.is_fifo():
            raise StartupError(f"{HOLD_ENV} needs {HOLD_FIFO_ENV}, a named pipe: {str(fifo)!r}")
        hold = Hold(hold_at, fifo)
    if crash is None and not fail and hold is None:
        return None
    return _Faults(crash, fail, hold, jvm_pid)


class _Faults:
    def __init__(
        self, crash: str | None, fail: set[str], hold: Hold | None, jvm_pid: int | None
    ) -> None:
        self._crash = crash
        self._pending = set(fail)  # each fails once: the restarted query then gets through
        self._hold = hold  # once, too
        self._lock = threading.Lock()
        self._jvm_pid = jvm_pid

    def __call__(self, name: str) -> None:
        if name == self._crash:
            _crash_at(name, self._jvm_pid)
        if (hold := self._take_hold(name)) is not None:
            _hold_at(hold)
        with self._lock:
            if name not in self._pending:
                return
            self._pending.discard(name)
        log.warning("fail point %s reached: raising (%s)", name, FAIL_ENV)
        raise InjectedFailureError(f"injected failure at {name} ({FAIL_ENV}), after the commit")

    def _take_hold(self, name: str) -> Hold | None:
        with self._lock:
            hold = self._hold
            if hold is None or hold.point != name:
                return None
            self._hold = None
            return hold


def _hold_at(hold: Hold) -> None:
    log.warning(
        "hold point %s reached: waiting for %s to be written and closed", hold.point, hold.fifo
    )
    with hold.fifo.open("rb") as pipe:  # blocks until the test opens the other end
        pipe.read()  # until the test closes it
    log.warning("hold point %s released", hold.point)


def _crash_at(name: str, jvm_pid: int | None) -> None:
    log.critical("crash point %s reached: SIGKILL of the driver", name)
    for handler in logging.getLogger().handlers:
        handler.flush()
    if jvm_pid is not None:
        os.kill(jvm_pid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
