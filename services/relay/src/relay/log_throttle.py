"""One log line per cause per second, so a flood of one cause cannot drown the log.

Every part of the relay that logs per message (client requests, bad frames,
unrouted work) asks the one `LogThrottle` the relay builds before it logs.
"""

from __future__ import annotations

import math


class LogThrottle:
    """At most one log line per key per second; counts the ones it swallowed."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def __call__(self, key: str, now: float) -> str | None:
        """None: stay quiet; else a suffix for the line about suppressed repeats."""
        if now - self._last.get(key, -math.inf) < 1.0:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return None
        self._last[key] = now
        skipped = self._suppressed.pop(key, 0)
        return f" ({skipped} similar suppressed)" if skipped else ""
