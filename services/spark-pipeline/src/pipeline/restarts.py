"""When a failed streaming query restarts, and when the pipeline gives up (pure, no I/O).

    query dead -> failure_cause (class + first line, for the log)
               -> Restarts.failed: backoff delay, or None after too many failures in a window
               -> Restarts.due (once the delay passed) -> app.py starts it from its checkpoint

A query dies when a micro-batch raises: a commit whose state is unknown, a
catalog or S3 outage longer than Iceberg's retries, a Kafka error. Its
checkpoint holds the last committed batch and every writer survives the replay
(README "Exactly once per writer"), so restarting it in-process loses and
doubles nothing, and the other queries keep running. A query that keeps
failing is broken, not unlucky: then the process exits for its supervisor.
The clock is injected so the tests drive it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from pipeline.config import RestartConfig

#: A line naming an exception: ``pkg.Name(Error|Exception): message``, as Python prints the
#: exception at a traceback's end and Java at a stack trace's top (or after "Caused by: ").
_EXCEPTION_LINE = re.compile(
    r"^(?:Caused by: |: )?((?:[A-Za-z_$][\w$]*\.)*[A-Za-z_$][\w$]*(?:Exception|Error))(?:: ?(.*))?$"
)
#: Carriers of the real failure: Spark's and py4j's wrappers around a foreachBatch error.
_WRAPPERS = frozenset(
    {
        "StreamingQueryException",
        "ForeachBatchUserFuncException",
        "Py4JJavaError",
        "Py4JException",
        "UnknownException",
    }
)
#: Spark's generic error: its cause, when one is named, says more ("Writing job aborted"
#: over Iceberg's CommitStateUnknownException).
_GENERIC = frozenset({"SparkException"})
_MAX_CHARS = 300


def failure_cause(error: BaseException | None) -> str:
    """``Class: first line`` of what killed a query, found in Spark's wrapped message.

    A foreachBatch error reaches us as a StreamingQueryException whose text holds the
    Python traceback (its last exception line is what the batch raised; a Java error
    from a Spark call follows py4j's line) or a Java stack trace (its first line, or
    the first cause under a generic SparkException).
    """
    if error is None:
        return "stopped without an error"
    text = str(error).split("=== Streaming Query ===", 1)[0]
    lines = [line.strip() for line in text.splitlines()]
    tracebacks = [i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line]
    start = tracebacks[-1] + 1 if tracebacks else 0
    named: list[tuple[str, str]] = []  # (class, message) in order, wrappers left out
    for line in lines[start:]:
        if (match := _EXCEPTION_LINE.match(line)) is not None:
            name = match.group(1).rsplit(".", 1)[-1]
            if name not in _WRAPPERS:
                named.append((name, match.group(2) or ""))
    if named:
        specific = [n for n in named if n[0] not in _GENERIC]
        name, message = (specific or named)[0]
        return _short(f"{name}: {message}".rstrip(": "))
    first = next((line for line in lines if line), "")
    return _short(f"{type(error).__name__}: {first}".rstrip(": "))


def _short(text: str) -> str:
    return text if len(text) <= _MAX_CHARS else text[: _MAX_CHARS - 3] + "..."


class Restarts:
    """Failure times per query -> when to restart it, or None: give up.

    The delay doubles with each failure of the query within ``window_s`` (from
    ``backoff_initial_s`` up to ``backoff_max_s``); more than ``max_restarts``
    failures within the window give up. Failures older than the window are
    forgotten, so a query that failed once a day is restarted quickly every time.
    """

    def __init__(self, config: RestartConfig, clock: Callable[[], float] = time.monotonic):
        self._config = config
        self._clock = clock
        self._failures: dict[str, list[float]] = {}
        self._due: dict[str, float] = {}  # query -> clock time of its restart

    def failed(self, query: str) -> float | None:
        """Record a failure; the delay before the restart, or None when it failed too often."""
        c = self._config
        now = self._clock()
        recent = [t for t in self._failures.get(query, []) if now - t < c.window_s]
        recent.append(now)
        self._failures[query] = recent
        if len(recent) > c.max_restarts:
            self._due.pop(query, None)
            return None
        delay: float = min(c.backoff_max_s, c.backoff_initial_s * 2.0 ** (len(recent) - 1))
        self._due[query] = now + delay
        return delay

    def recent(self, query: str) -> int:
        """Failures of ``query`` within the window (as of its last failure)."""
        return len(self._failures.get(query, []))

    def pending(self, query: str) -> bool:
        """True between a failure and the restart it scheduled."""
        return query in self._due

    def due(self) -> list[str]:
        """Queries whose restart time has come (no longer pending once returned)."""
        now = self._clock()
        ready = [q for q, at in self._due.items() if at <= now]
        for query in ready:
            del self._due[query]
        return ready

    def next_in(self, default: float) -> float:
        """Seconds until the next scheduled restart, at most ``default``."""
        now = self._clock()
        return max(0.0, min([default, *(at - now for at in self._due.values())]))
