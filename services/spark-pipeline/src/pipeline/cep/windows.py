"""Event-time windows `(now - W, now]` over one series, shared by every trigger using W.

Both support the engine's two samples per point: the value just before the
point (older points evicted, the point not yet added) and just after it. A
condition fires when its threshold lies between the two (see `engine`).
"""

from __future__ import annotations

from collections import deque


class VolumeWindow:
    """Sum of amounts in the window; O(1) amortised per point."""

    __slots__ = ("_points", "_sum", "window_ms")

    def __init__(self, window_ms: int) -> None:
        self.window_ms = window_ms
        self._points: deque[tuple[int, float]] = deque()
        self._sum = 0.0

    def evict(self, now_ms: int) -> float:
        """Drop points at or before now - W; the sum of what is left."""
        horizon = now_ms - self.window_ms
        points = self._points
        while points and points[0][0] <= horizon:
            self._sum -= points.popleft()[1]
        if not points:
            self._sum = 0.0  # no float residue once the window is empty
        return self._sum

    def add(self, time_ms: int, amount: float) -> float:
        self._points.append((time_ms, amount))
        self._sum += amount
        return self._sum

    @property
    def value(self) -> float:
        return self._sum

    def dump(self) -> list[list[float]]:
        """The points, oldest first (JSON: the live engine's partition state)."""
        return [[t, a] for t, a in self._points]

    def load(self, points: list[list[float]]) -> None:
        self._points = deque((int(t), float(a)) for t, a in points)
        self._sum = sum(a for _, a in self._points)


class ExtremaWindow:
    """Rolling min and max of prices in the window (monotonic deques, O(1) amortised)."""

    __slots__ = ("_max", "_min", "window_ms")

    def __init__(self, window_ms: int) -> None:
        self.window_ms = window_ms
        self._min: deque[tuple[int, float]] = deque()  # increasing prices
        self._max: deque[tuple[int, float]] = deque()  # decreasing prices

    def evict(self, now_ms: int) -> None:
        horizon = now_ms - self.window_ms
        for side in (self._min, self._max):
            while side and side[0][0] <= horizon:
                side.popleft()

    def add(self, time_ms: int, price: float) -> None:
        while self._min and self._min[-1][1] >= price:
            self._min.pop()
        self._min.append((time_ms, price))
        while self._max and self._max[-1][1] <= price:
            self._max.pop()
        self._max.append((time_ms, price))

    def dump(self) -> list[list[list[float]]]:
        """The two deques (JSON: the live engine's partition state)."""
        return [[[t, p] for t, p in side] for side in (self._min, self._max)]

    def load(self, sides: list[list[list[float]]]) -> None:
        low, high = sides
        self._min = deque((int(t), float(p)) for t, p in low)
        self._max = deque((int(t), float(p)) for t, p in high)

    def move(self, price: float) -> tuple[float, float]:
        """(|move| in percent, signed move) of `price` against the window's extremes.

        Up: from the window's low; down: from its high; the larger one wins
        (the sign says which). An empty window is no move.
        """
        if not self._min:
            return 0.0, 0.0
        low, high = self._min[0][1], self._max[0][1]
        up = (price - low) / low * 100.0
        down = (high - price) / high * 100.0
        if up >= down:
            return up, up
        return down, -down

    def reference(self, signed_move: float) -> float:
        """The price the move is measured from (the low for up-moves, else the high)."""
        if not self._min:
            return 0.0
        return self._min[0][1] if signed_move >= 0 else self._max[0][1]
