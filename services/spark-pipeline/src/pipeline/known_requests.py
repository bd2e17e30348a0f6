"""The request ids in Iceberg ``requests``, held on the driver.

Why: the history query is the table's only writer, so one read of its ids at
start, plus every id this sink has committed since, is the whole table; a final
marker whose id is not in that set is then new without a Spark query. An id
that is in it (a duplicate, or a batch replayed after a crash) is still looked
up in the table, because the plan needs its stored row.

A miss is authoritative only while the set is complete: after the start-up read
has finished, and as long as no ``requests`` write of this sink failed (its
commit may have landed unseen). Until then the caller looks everything up, as
without the set. After a failure the set stays incomplete: the failed batch
fails the query, and its restart starts a fresh set.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence


class KnownRequests:
    """Request ids recorded in ``requests`` (one per id, about 100 bytes each)."""

    def __init__(self) -> None:
        self._ids: set[str] = set()
        self._loaded = False
        self._failed = False
        self._lock = threading.Lock()

    @property
    def complete(self) -> bool:
        with self._lock:
            return self._loaded and not self._failed

    def loaded(self, ids: Iterable[str]) -> None:
        """The ids the table held when read (commits since are already `added`)."""
        with self._lock:
            self._ids.update(ids)
            self._loaded = True

    def added(self, ids: Iterable[str]) -> None:
        """Ids this sink's ``requests`` commit has just made durable."""
        with self._lock:
            self._ids.update(ids)

    def write_failed(self) -> None:
        """A ``requests`` write raised: whether it landed is unknown."""
        with self._lock:
            self._failed = True

    def to_look_up(self, ids: Sequence[str]) -> list[str]:
        """The ids whose rows must be read from the table: all of them unless complete,
        else only those already recorded."""
        with self._lock:
            if not self._loaded or self._failed:
                return list(ids)
            return [i for i in ids if i in self._ids]
