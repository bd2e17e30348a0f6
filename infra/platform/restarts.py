"""When `make run` restarts a crashed component, and when it gives up.

A component that crashes now and then (a bug hit once, a dependency gone for a
moment) should come back by itself, like a compose `restart: on-failure` policy.
One that crashes again and again right after being started will not be fixed by
restarting it, and restarting it forever would hide that: after `limit` crashes of
the same component within `window_s` seconds the platform stops and says why.

The decision is a pure function of the crash history and an injected clock, so it
is tested without processes; `infra.platform.__main__.supervise` applies it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Restart:
    """Start the component again: crash number `crashes` of `limit` within the window."""

    component: str
    crashes: int
    limit: int


@dataclass(frozen=True)
class GiveUp:
    """Stop the platform: the component crashed `crashes` times within `window_s`."""

    component: str
    crashes: int
    window_s: float


Action = Restart | GiveUp


class RestartPolicy:
    """Per-component crash history; `crashed()` records one crash and decides."""

    def __init__(
        self, limit: int, window_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """`limit=1` never restarts (any crash stops the platform)."""
        if limit < 1 or window_s <= 0:
            raise ValueError(f"need limit >= 1 and window_s > 0, not {limit} and {window_s}")
        self.limit = limit
        self.window_s = window_s
        self._clock = clock
        self._crashes: dict[str, list[float]] = {}

    def crashed(self, component: str) -> Action:
        """Record a crash of `component` now; crashes older than the window are forgotten."""
        now = self._clock()
        recent = [t for t in self._crashes.get(component, []) if now - t < self.window_s]
        recent.append(now)
        self._crashes[component] = recent
        if len(recent) >= self.limit:
            return GiveUp(component, len(recent), self.window_s)
        return Restart(component, len(recent), self.limit)
