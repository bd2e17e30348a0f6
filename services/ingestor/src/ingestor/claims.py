"""Who fetches a request when several ingestors serve one exchange, and who takes it over.

The relay PUBlishes every request to every subscribed ingestor. Each one
appends a claim (`IngestClaim` CLAIM, key request_id, carrying the
DataRequest) to the one-partition topic `ingest.claims` and reads that
partition until it has seen its own claim. The first claim for a request_id in
partition order wins: every ingestor reads the same order, so they all agree
on the winner without talking to each other; the others skip the request.

Takeover: the winner appends a HEARTBEAT (the request_ids it is fetching)
every `heartbeat_s` and a DONE once the request's final marker was delivered.
Every ingestor keeps the open requests (claimed, not done) of the log; one
whose holder has shown no sign of life for `takeover_after_s` is claimed
again with the next attempt number. A takeover claim for attempt n wins if the
request is still at attempt n-1 when it is read, so again the first one in
partition order wins and everyone agrees. Because the claim carries the
DataRequest, any ingestor can take over, even one that started after the
request was published.

Why this is safe: an ingestor decides only after reading up to its own
claim's offset, and the winning claim's offset is at most that. Each ingestor
reads the partition from `lookback_s` before it started, so a claim made just
before a restart is still seen. If no verdict arrives in time (Kafka trouble),
the ingestor fetches anyway: a duplicate fetch is harmless downstream (rows
MERGE on their natural key, notifications dedupe by request_id), a lost one
is not. For the same reason a false takeover (a slow, not dead, holder) costs
only a second fetch. Decision record: docs/adr/0011-ingestor-claims.md.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from mdproto import ProtocolError, envelope
from mdproto.messages import DataRequest, IngestClaim

log = logging.getLogger(__name__)

CLAIM, HEARTBEAT, DONE = IngestClaim.CLAIM, IngestClaim.HEARTBEAT, IngestClaim.DONE


class ClaimRecord(Protocol):
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def timestamp_ms(self) -> int: ...


@dataclass(slots=True)
class Holding:
    """The current holder of one request_id, as the log says."""

    owner: str
    attempt: int
    request: DataRequest | None  # None: not taken over (legacy claim, legacy_sync, done)
    seen_at: float  # local clock: the owner's last sign of life for this request
    timestamp_ms: int  # of the first claim record (pruning)
    done: bool = False


@dataclass(frozen=True, slots=True)
class Takeover:
    request_id: str
    attempt: int  # the attempt to claim
    request: DataRequest


def decode_claim(key: bytes | None, value: bytes | None) -> IngestClaim:
    """A claims record as an IngestClaim; a bare UTF-8 value is an old-style first claim.

    Raises ProtocolError or UnicodeDecodeError for records that are neither.
    """
    raw = value or b""
    if raw[:1] == envelope.VERSION_FRAME:
        return envelope.decode_record(raw, IngestClaim)
    return IngestClaim(
        kind=CLAIM, request_id=(key or b"").decode(), ingestor_id=raw.decode(), attempt=0
    )


class ClaimLedger:
    """Holder per request_id, in partition order (pure bookkeeping, clock passed in)."""

    def __init__(self, capacity: int = 100_000) -> None:
        self._held: OrderedDict[str, Holding] = OrderedDict()
        self._open: dict[str, Holding] = {}  # not done and takeover-able: what `expired` scans
        self._capacity = capacity
        self.position = 0  # every offset below this has been read

    def apply(self, offset: int, claim: IngestClaim, timestamp_ms: int, now: float) -> None:
        if claim.kind == CLAIM:
            self._claim(claim, timestamp_ms, now)
        elif claim.kind == HEARTBEAT:
            for request_id in claim.in_flight:
                held = self._open.get(request_id)
                if held is not None and held.owner == claim.ingestor_id:
                    held.seen_at = max(held.seen_at, now)
        elif claim.kind == DONE:
            held = self._held.get(claim.request_id)
            if held is not None:
                held.done, held.request = True, None
                self._open.pop(claim.request_id, None)
        self.advance(offset + 1)

    def _claim(self, claim: IngestClaim, timestamp_ms: int, now: float) -> None:
        request_id = claim.request_id
        if not request_id:
            return
        request = claim.request if claim.HasField("request") else None
        held = self._held.get(request_id)
        if held is None:  # first claim, or a takeover whose first claim is older than we read
            held = Holding(claim.ingestor_id, claim.attempt, request, now, timestamp_ms)
            self._held[request_id] = held
            if request is not None:
                self._open[request_id] = held
            while len(self._held) > self._capacity:
                old_id, _ = self._held.popitem(last=False)
                self._open.pop(old_id, None)
        elif not held.done and claim.attempt == held.attempt + 1:  # the first takeover claim
            held.owner, held.attempt, held.seen_at = claim.ingestor_id, claim.attempt, now
            held.request = request or held.request
            if held.request is not None:
                self._open[request_id] = held

    def advance(self, position: int) -> None:
        self.position = max(self.position, position)

    def holding(self, request_id: str) -> Holding | None:
        return self._held.get(request_id)

    def winner(self, request_id: str) -> str | None:
        held = self._held.get(request_id)
        return None if held is None else held.owner

    def expired(self, now: float, after_s: float, mine: frozenset[str]) -> list[Takeover]:
        """Open requests whose holder was silent for `after_s`, except those in `mine`."""
        return [
            Takeover(request_id, held.attempt + 1, held.request)
            for request_id, held in self._open.items()
            if held.request is not None and now - held.seen_at >= after_s and request_id not in mine
        ]

    def prune(self, older_than_ms: int) -> int:
        """Forget claims older than the cut-off (they arrive in time order); how many."""
        dropped = 0
        while self._held:
            request_id, held = next(iter(self._held.items()))
            if held.timestamp_ms >= older_than_ms:
                break
            self._held.popitem(last=False)
            self._open.pop(request_id, None)
            dropped += 1
        return dropped

    def __len__(self) -> int:
        return len(self._held)


@dataclass
class ClaimStats:
    takeovers_claimed: int = 0  # takeover claims this ingestor appended
    takeovers_won: int = 0
    heartbeats: int = 0
    publish_failures: int = 0


class Claims:
    """Decides, per request_id, whether this ingestor fetches it; keeps its claims alive.

    `publish(key, value)` appends a record to the claims partition and returns
    its offset; `on_records` is fed what the partition tail reads.
    """

    def __init__(
        self,
        ingestor_id: str,
        publish: Callable[[str, bytes], Awaitable[int]],
        wait_timeout_s: float,
        *,
        heartbeat_s: float = 1.0,
        takeover_after_s: float = 4.0,
        ledger: ClaimLedger | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ingestor_id = ingestor_id
        self._publish = publish
        self._wait_timeout_s = wait_timeout_s
        self.heartbeat_s = heartbeat_s
        self.takeover_after_s = takeover_after_s
        self.ledger = ledger or ClaimLedger()
        self._clock = clock
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self.running: set[str] = set()  # request_ids this ingestor fetches: heartbeated
        self._trying: set[str] = set()  # takeover claims awaiting their verdict
        self._next_beat = -math.inf  # the first scan heartbeats
        self.stats = ClaimStats()

    def on_records(self, records: Sequence[ClaimRecord]) -> None:
        """Feed records read from the claims partition (called on the event loop)."""
        now = self._clock()
        for record in records:
            try:
                claim = decode_claim(record.key, record.value)
            except (ProtocolError, UnicodeDecodeError) as exc:
                log.warning("claims record at offset %d ignored: %s", record.offset, exc)
                self.ledger.advance(record.offset + 1)
                continue
            self.ledger.apply(record.offset, claim, record.timestamp_ms, now)
        position = self.ledger.position
        still: list[tuple[int, asyncio.Future[None]]] = []
        for offset, future in self._waiters:
            if offset < position:
                if not future.done():
                    future.set_result(None)
            else:
                still.append((offset, future))
        self._waiters = still

    async def claim(self, request: DataRequest) -> bool:
        """True if this ingestor should fetch `request` (then it is `running` here)."""
        # legacy_sync answers go to the relay over this ingestor's DEALER: not taken over.
        payload = None if request.legacy_sync else request
        return await self._claim(request.request_id, 0, payload)

    async def _claim(self, request_id: str, attempt: int, request: DataRequest | None) -> bool:
        record = IngestClaim(
            kind=CLAIM,
            ingestor_id=self.ingestor_id,
            request_id=request_id,
            attempt=attempt,
            sent_at_ms=int(time.time() * 1000),
        )
        if request is not None:
            record.request.CopyFrom(request)
        try:
            async with asyncio.timeout(self._wait_timeout_s):
                offset = await self._publish(request_id, envelope.encode_record(record))
                if offset >= self.ledger.position:
                    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                    self._waiters.append((offset, future))
                    await future
        except TimeoutError:
            log.warning("request %s: no claim verdict in time; fetching anyway", request_id)
            return self._won(request_id)
        except Exception as exc:
            log.warning("request %s: claim failed (%s); fetching anyway", request_id, exc)
            return self._won(request_id)
        held = self.ledger.holding(request_id)
        if held is None:  # our own claim fell out of a full ledger: cannot happen in practice
            return self._won(request_id)
        if held.owner == self.ingestor_id and held.attempt == attempt:
            return self._won(request_id)
        return False

    def _won(self, request_id: str) -> bool:
        self.running.add(request_id)
        return True

    async def done(self, request_id: str) -> None:
        """The request's final marker was delivered: tell the others, stop heartbeating it."""
        self.running.discard(request_id)
        record = IngestClaim(
            kind=DONE,
            ingestor_id=self.ingestor_id,
            request_id=request_id,
            sent_at_ms=int(time.time() * 1000),
        )
        await self._append(request_id, record, "done")

    def abandon(self, request_id: str) -> None:
        """Stop heartbeating a request that did not finish (its final marker was not delivered)."""
        self.running.discard(request_id)

    async def heartbeat(self) -> None:
        if not self.running:
            return
        record = IngestClaim(
            kind=HEARTBEAT,
            ingestor_id=self.ingestor_id,
            in_flight=sorted(self.running),
            sent_at_ms=int(time.time() * 1000),
        )
        if await self._append(self.ingestor_id, record, "heartbeat"):
            self.stats.heartbeats += 1

    async def _append(self, key: str, record: IngestClaim, what: str) -> bool:
        try:
            async with asyncio.timeout(self._wait_timeout_s):
                await self._publish(key, envelope.encode_record(record))
        except Exception as exc:  # Kafka trouble: at worst another ingestor fetches it again
            self.stats.publish_failures += 1
            reason = (
                f"no delivery report within {self._wait_timeout_s:g} s"
                if isinstance(exc, TimeoutError)
                else exc
            )
            log.warning("claims %s for %s not delivered: %s", what, key, reason)
            return False
        return True

    async def run(
        self,
        on_takeover: Callable[[DataRequest, int], None],
        serves: Callable[[DataRequest], bool] = lambda _request: True,
    ) -> None:
        """`scan` every quarter of the shorter period, its work in the background, until
        cancelled."""
        tick = min(self.heartbeat_s, self.takeover_after_s) / 4  # scans only open requests
        tasks: set[asyncio.Task[None]] = set()
        try:
            while True:
                for work in self.scan(on_takeover, serves):
                    self._spawn(tasks, work)
                await asyncio.sleep(tick)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def scan(
        self,
        on_takeover: Callable[[DataRequest, int], None],
        serves: Callable[[DataRequest], bool] = lambda _request: True,
    ) -> list[Coroutine[Any, Any, None]]:
        """One look at the clock: a heartbeat if one is due, a takeover claim for each
        silent holder's request this ingestor `serves` (its exchanges), the ones won
        handed to `on_takeover`. Returns that work for the caller to run: `run` in the
        background, a test to completion after moving its clock."""
        now = self._clock()
        work: list[Coroutine[Any, Any, None]] = []
        if now >= self._next_beat:
            self._next_beat = now + self.heartbeat_s
            work.append(self.heartbeat())
        mine = frozenset(self.running | self._trying)
        for takeover in self.ledger.expired(now, self.takeover_after_s, mine):
            if not serves(takeover.request):
                continue
            self._trying.add(takeover.request_id)
            work.append(self._take_over(takeover, on_takeover))
        return work

    @staticmethod
    def _spawn(tasks: set[asyncio.Task[None]], coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _take_over(
        self, takeover: Takeover, on_takeover: Callable[[DataRequest, int], None]
    ) -> None:
        held = self.ledger.holding(takeover.request_id)
        log.warning(
            "request %s: holder %s silent for %.1f s; claiming attempt %d",
            takeover.request_id,
            held.owner if held else "?",
            self.takeover_after_s,
            takeover.attempt,
        )
        self.stats.takeovers_claimed += 1
        try:
            won = await self._claim(takeover.request_id, takeover.attempt, takeover.request)
        finally:
            self._trying.discard(takeover.request_id)
        if won:
            self.stats.takeovers_won += 1
            log.warning(
                "request %s: taken over (attempt %d)", takeover.request_id, takeover.attempt
            )
            on_takeover(takeover.request, takeover.attempt)
