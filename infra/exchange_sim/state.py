"""Shared mutable state of one simulator instance: clock, stats, faults.

Why separate: the exchange front-ends (Binance, Coinbase) and the control API
all read and write the same state, and keeping it out of ``server.py`` avoids
import cycles. Everything here is touched only from the server's event loop.
"""

from __future__ import annotations

import copy
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from .books import DEFAULT_LEVELS, BookModel, BookStream
from .faults import FaultBook
from .model import MarketModel


class SimClock:
    """Wall clock by default; tests may freeze it or move it to make candles exact."""

    def __init__(self, frozen_ms: int | None = None) -> None:
        self._frozen = frozen_ms
        self._offset_ms = 0

    @property
    def frozen(self) -> bool:
        return self._frozen is not None

    def now_ms(self) -> int:
        if self._frozen is not None:
            return self._frozen
        return int(time.time() * 1000) + self._offset_ms

    def set(self, now_ms: int | None) -> None:
        """Freeze at ``now_ms``; ``None`` returns to the (unshifted) wall clock."""
        self._frozen = now_ms
        self._offset_ms = 0

    def advance(self, delta_ms: int) -> None:
        """Move time forward (a frozen clock stays frozen, a wall clock is shifted)."""
        if self._frozen is not None:
            self._frozen += delta_ms
        else:
            self._offset_ms += delta_ms


@dataclass
class Stats:
    """Request counters and a bounded request log, for test assertions."""

    log_size: int = 2000
    requests_total: int = 0
    by_endpoint: Counter[str] = field(default_factory=Counter)
    by_status: Counter[str] = field(default_factory=Counter)
    faults_triggered: list[dict[str, Any]] = field(default_factory=list)
    log: deque[dict[str, Any]] = field(default_factory=deque)
    ws_connections_total: int = 0
    ws_messages_sent: int = 0
    ws_messages_discarded: int = 0
    ws_dropped_by_sim: int = 0
    trades_injected: int = 0
    book_events: int = 0  # book stream events sent (per market, not per connection)
    # unified symbol -> {"last_id": last model trade the stream reached (sent or
    # dropped), "sent": model trades streamed, "dropped": model trades skipped by faults}
    model_trades: dict[str, dict[str, int]] = field(default_factory=dict)

    def record(self, entry: dict[str, Any]) -> None:
        self.requests_total += 1
        entry["seq"] = self.requests_total  # a log position that survives the log's trimming
        self.by_endpoint[f"{entry['method']} {entry['route']}"] += 1
        self.by_status[str(entry["status"])] += 1
        self.log.append(entry)
        while len(self.log) > self.log_size:
            self.log.popleft()

    def snapshot(self, *, include_log: bool = True) -> dict[str, Any]:
        data: dict[str, Any] = {
            "requests_total": self.requests_total,
            "by_endpoint": dict(self.by_endpoint),
            "by_status": dict(self.by_status),
            # copies: an outage's entry keeps counting refusals after it was read
            "faults_triggered": [copy.deepcopy(f) for f in self.faults_triggered],
            "ws": {
                "connections_total": self.ws_connections_total,
                "messages_sent": self.ws_messages_sent,
                "messages_discarded": self.ws_messages_discarded,
                "dropped_by_sim": self.ws_dropped_by_sim,
                "trades_injected": self.trades_injected,
                "book_events": self.book_events,
                "model_trades": copy.deepcopy(self.model_trades),
            },
        }
        if include_log:
            data["log"] = list(self.log)
        return data


@dataclass
class SimState:
    """What every front-end needs: the world, the time, the faults and the counters;
    and the order books' stream positions, shared by REST snapshots and streams."""

    model: MarketModel
    clock: SimClock
    faults: FaultBook = field(default_factory=FaultBook)
    stats: Stats = field(default_factory=Stats)
    book_levels: int = DEFAULT_LEVELS
    books: BookStream = field(init=False)

    def __post_init__(self) -> None:
        self.books = BookStream(BookModel(self.model, self.book_levels))
