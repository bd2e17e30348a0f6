"""Who fetches a request when several ingestors serve one exchange.

The relay PUBlishes every request to every subscribed ingestor. Each one
appends a claim (key request_id, value ingestor_id) to the one-partition
topic `ingest.claims` and reads that partition until it has seen its own
claim. The first claim for a request_id in partition order wins: every
ingestor reads the same order, so they all agree on the winner without
talking to each other; the others skip the request.

Why this is safe: an ingestor decides only after reading up to its own
claim's offset, and the winning claim's offset is at most that. Each ingestor
reads the partition from `lookback_s` before it started, so a claim made just
before a restart is still seen. If no verdict arrives in time (Kafka trouble),
the ingestor fetches anyway: a duplicate fetch is harmless downstream (rows
MERGE on their natural key, notifications dedupe by request_id), a lost one
is not.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

log = logging.getLogger(__name__)


class ClaimRecord(Protocol):
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def timestamp_ms(self) -> int: ...


class ClaimLedger:
    """First claimant per request_id, in partition order (pure bookkeeping)."""

    def __init__(self, capacity: int = 100_000) -> None:
        self._first: OrderedDict[str, tuple[int, str, int]] = OrderedDict()
        self._capacity = capacity
        self.position = 0  # every offset below this has been read

    def add(self, offset: int, request_id: str, ingestor_id: str, timestamp_ms: int) -> None:
        if request_id and request_id not in self._first:
            self._first[request_id] = (offset, ingestor_id, timestamp_ms)
            while len(self._first) > self._capacity:
                self._first.popitem(last=False)
        self.advance(offset + 1)

    def advance(self, position: int) -> None:
        self.position = max(self.position, position)

    def winner(self, request_id: str) -> str | None:
        entry = self._first.get(request_id)
        return None if entry is None else entry[1]

    def prune(self, older_than_ms: int) -> int:
        """Forget claims older than the cut-off (they arrive in time order); how many."""
        dropped = 0
        while self._first:
            _, (_, _, ts) = next(iter(self._first.items()))
            if ts >= older_than_ms:
                break
            self._first.popitem(last=False)
            dropped += 1
        return dropped

    def __len__(self) -> int:
        return len(self._first)


class Claims:
    """Decides, per request_id, whether this ingestor fetches it."""

    def __init__(
        self,
        ingestor_id: str,
        publish: Callable[[str, str], Awaitable[int]],
        wait_timeout_s: float,
        ledger: ClaimLedger | None = None,
    ) -> None:
        self.ingestor_id = ingestor_id
        self._publish = publish  # (request_id, ingestor_id) -> offset of the claim
        self._wait_timeout_s = wait_timeout_s
        self.ledger = ledger or ClaimLedger()
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    def on_records(self, records: Sequence[ClaimRecord]) -> None:
        """Feed records read from the claims partition (called on the event loop)."""
        for record in records:
            try:
                request_id = (record.key or b"").decode()
                claimant = (record.value or b"").decode()
            except UnicodeDecodeError:
                self.ledger.advance(record.offset + 1)
                continue
            self.ledger.add(record.offset, request_id, claimant, record.timestamp_ms)
        position = self.ledger.position
        still: list[tuple[int, asyncio.Future[None]]] = []
        for offset, future in self._waiters:
            if offset < position:
                if not future.done():
                    future.set_result(None)
            else:
                still.append((offset, future))
        self._waiters = still

    async def claim(self, request_id: str) -> bool:
        """True if this ingestor should fetch `request_id`."""
        try:
            async with asyncio.timeout(self._wait_timeout_s):
                offset = await self._publish(request_id, self.ingestor_id)
                if offset >= self.ledger.position:
                    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                    self._waiters.append((offset, future))
                    await future
        except TimeoutError:
            log.warning("request %s: no claim verdict in time; fetching anyway", request_id)
            return True
        except Exception as exc:
            log.warning("request %s: claim failed (%s); fetching anyway", request_id, exc)
            return True
        winner = self.ledger.winner(request_id)
        if winner is None:  # our own claim fell out of a full ledger: cannot happen in practice
            return True
        return winner == self.ingestor_id
