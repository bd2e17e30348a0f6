"""Crash points for recovery tests: ``PIPELINE_CRASH_AT=<point>`` kills the driver there.

The kill is SIGKILL of the Spark JVM and then of this process, the same as
``kill -9`` of the driver at that line: no shutdown hook, no flush, no cleanup.
Unset (production), `crash_point` is a dictionary lookup.
"""

from __future__ import annotations

import logging
import os
import signal

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

log = logging.getLogger(__name__)
_jvm_pid: int | None = None


def set_jvm_pid(pid: int | None) -> None:
    """Remember the Spark JVM's pid so a crash takes it down too (local mode)."""
    global _jvm_pid
    _jvm_pid = pid


def get_jvm_pid() -> int | None:
    return _jvm_pid


def crash_point(name: str) -> None:
    if os.environ.get(CRASH_ENV) != name:
        return
    log.critical("crash point %s reached: SIGKILL of the driver", name)
    for handler in logging.getLogger().handlers:
        handler.flush()
    if _jvm_pid is not None:
        os.kill(_jvm_pid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
