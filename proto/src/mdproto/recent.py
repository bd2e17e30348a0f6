"""Bounded memory of recent keys, shared by every service that must drop repeats:
a trade a reconnect replays (ingestor), a history request a second relay copies
(ingestor), a record Kafka delivers twice (pipeline live engine and CEP).

Why not cachetools' FIFOCache: it accounts a size per item and goes through its
`Cache` mapping on every insert; this sits on the per-trade hot path and needs
only membership and oldest-first eviction, which `OrderedDict` gives in O(1).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator
from itertools import islice
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class RecentKeys(Generic[K]):
    """The last `capacity` keys seen; `first_time` says whether a key is new."""

    __slots__ = ("_capacity", "_keys")

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self._capacity = capacity
        self._keys: OrderedDict[K, None] = OrderedDict()

    def first_time(self, key: K) -> bool:
        if key in self._keys:
            return False
        self._keys[key] = None
        if len(self._keys) > self._capacity:
            self._keys.popitem(last=False)
        return True

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[K]:
        """Oldest first (what a snapshot saves, to restore in the same order)."""
        return iter(self._keys)

    def newest(self, n: int) -> list[K]:
        """The newest `n` keys, oldest first, without walking the older ones."""
        newest_first = list(islice(reversed(self._keys), n))
        newest_first.reverse()
        return newest_first
