"""The wall clock in epoch milliseconds, the unit of every protocol timestamp.

Pure code takes `now_ms` as a value or a callable (tests pass a fixed one); this
is the production default.
"""

from __future__ import annotations

import time


def wall_clock_ms() -> int:
    return int(time.time() * 1000)
