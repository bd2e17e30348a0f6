"""Per-client token buckets, so one flooding client cannot starve the others;
and a log throttle, so one flooding cause cannot drown the log.

Keyed by ROUTER identity (one per connection: a client that reconnects starts
with a full bucket, which bounds the damage but is not an authentication).
The table is an LRU bounded to `max_keys` entries. Pure: `now` is passed in.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass


@dataclass(slots=True)
class _Bucket:
    tokens: float
    stamp: float
    limited: bool = False  # currently refusing: lets the caller log once per episode


class TokenBuckets:
    def __init__(self, rate: float, burst: int, max_keys: int) -> None:
        self._rate = rate
        self._burst = float(burst)
        self._max_keys = max_keys
        self._buckets: OrderedDict[bytes, _Bucket] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self._rate > 0

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, key: bytes, now: float) -> tuple[bool, bool]:
        """(allowed, first refusal of an episode) for one request from `key`."""
        if not self.enabled:
            return True, False
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(self._burst, now)
            if len(self._buckets) > self._max_keys:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
            elapsed = max(0.0, now - bucket.stamp)
            bucket.tokens = min(self._burst, bucket.tokens + elapsed * self._rate)
            bucket.stamp = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            bucket.limited = False
            return True, False
        first = not bucket.limited
        bucket.limited = True
        return False, first


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
