"""Bounded memory of recent ids: a repeated history request (the copy a second
relay publishes, history.py) and a trade a reconnect replays (live.py) are
recognised and dropped."""

from __future__ import annotations

from collections import deque


class RecentIds:
    """The last `capacity` ids seen; `add` says whether an id is new."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self._capacity = capacity
        self._order: deque[str] = deque()
        self._seen: set[str] = set()

    def add(self, item: str) -> bool:
        if item in self._seen:
            return False
        self._seen.add(item)
        self._order.append(item)
        if len(self._order) > self._capacity:
            self._seen.discard(self._order.popleft())
        return True

    def __len__(self) -> int:
        return len(self._order)
