"""Garbage collection at the live engine's batch boundaries, not in the middle of one.

CPython's cyclic collector runs on allocation counts. A consume() batch allocates tens
of thousands of short-lived containers (decoded ticks, tuples, messages); those alive
when a collection starts are promoted, and every few batches they add up to a quarter
of the old generation, which triggers a full collection of the engine's whole state
(open windows, trade ids) in the middle of a batch. Refcounting frees the batch anyway:
the collector is only for cycles. So while the engine runs, automatic collections are
set past what one batch allocates, each batch ends with a young-generation collection
(its garbage is dead by then: little to look at) and a full one runs every
``full_every_s``. Why and the figures: docs/adr/0020-engine-gc-pacing.md.

The collector's settings are the process's: `GcPacing` is started by the one engine
thread of a process and restores them when the engine stops.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

#: Automatic collections only past this many net allocations (a batch stays under it).
YOUNG_LIMIT = 500_000
#: A middle-generation collection every this many batches.
MIDDLE_EVERY = 10


class GcPacing:
    """Collections where the engine says a batch ended; none of its own otherwise."""

    def __init__(
        self, full_every_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.full_every_s = full_every_s
        self._clock = clock
        self._saved: tuple[int, int, int] | None = None
        self._batches = 0
        self._full_at = 0.0
        self.full_collections = 0

    def start(self) -> None:
        """Move what exists now (imports, settings) out of every collection; pace the rest."""
        self._saved = gc.get_threshold()
        gc.collect()
        gc.freeze()
        gc.set_threshold(YOUNG_LIMIT, self._saved[1], self._saved[2])
        self._full_at = self._clock()

    def batch_done(self) -> None:
        """After a batch: a full collection when one is due, else a young one."""
        now = self._clock()
        if now - self._full_at >= self.full_every_s:
            gc.collect()
            self._full_at = now
            self.full_collections += 1
            return
        self._batches += 1
        gc.collect(1 if self._batches % MIDDLE_EVERY == 0 else 0)

    def stop(self) -> None:
        """The process's collector as it was before `start`."""
        if self._saved is not None:
            gc.set_threshold(*self._saved)
            gc.unfreeze()
            self._saved = None
