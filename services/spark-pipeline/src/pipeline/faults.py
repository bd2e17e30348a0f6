"""Crash points for recovery tests: ``PIPELINE_CRASH_AT=<point>`` kills the driver there.

Off the production path: app.py gives history and live `armed`'s hook only when
the variable is set (else they hold a no-op). The kill is SIGKILL of the Spark
JVM, then of this process: ``kill -9`` of the driver at that line, no cleanup.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
from collections.abc import Callable

from pipeline.preflight import StartupError

CRASH_ENV = "PIPELINE_CRASH_AT"
POINTS = frozenset(
    {
        "history-after-ohlc-commit",
        "history-after-requests-commit",
        "history-after-publish",
        "live-after-ticks-commit",
        "live-after-candles-commit",
    }
)
#: Called with a point's name where a recovery test may kill the driver.
CrashPoint = Callable[[str], None]

log = logging.getLogger(__name__)


def armed(jvm_pid: int | None) -> CrashPoint | None:
    """SIGKILL of the driver and the JVM ``jvm_pid`` at ``PIPELINE_CRASH_AT``'s point; None
    when unset (production). An unknown point refuses the start rather than never crashing."""
    point = os.environ.get(CRASH_ENV)
    if point and point not in POINTS:
        raise StartupError(f"{CRASH_ENV}={point!r} is not one of {sorted(POINTS)}")
    return functools.partial(_crash_at, point, jvm_pid) if point else None


def _crash_at(point: str, jvm_pid: int | None, name: str) -> None:
    if name != point:
        return
    log.critical("crash point %s reached: SIGKILL of the driver", name)
    for handler in logging.getLogger().handlers:
        handler.flush()
    if jvm_pid is not None:
        os.kill(jvm_pid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
