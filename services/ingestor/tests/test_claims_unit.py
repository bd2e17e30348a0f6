"""Claims decided from a shared, totally ordered log (an in-memory stand-in for the partition),
and takeover of a request whose holder went silent."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ingestor.claims import CLAIM, DONE, HEARTBEAT, ClaimLedger, Claims, decode_claim
from ingestor.history import write_error_marker
from mdproto.error_codes import ABANDONED
from mdproto.messages import DataRequest, IngestClaim, Status


@dataclass(frozen=True)
class Rec:
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int = 0


class SharedLog:
    """One partition: appends get increasing offsets; readers are fed after a delay."""

    def __init__(self) -> None:
        self.records: list[Rec] = []
        self.readers: list[Claims] = []

    def publisher(self, lag_s: float | None = 0.0):  # type: ignore[no-untyped-def]
        """Appends; readers get the record `lag_s` later, or before it returns (None)."""

        async def publish(key: str, value: bytes) -> int:
            rec = Rec(len(self.records), key.encode(), value, 1000)
            self.records.append(rec)
            if lag_s is None:
                self._fan_out(rec)
            else:
                asyncio.get_running_loop().call_later(lag_s, self._fan_out, rec)
            return rec.offset

        return publish

    def _fan_out(self, rec: Rec) -> None:
        for reader in self.readers:
            reader.on_records([rec])

    def kinds(self) -> list[tuple[str, int]]:
        out = []
        for rec in self.records:
            claim = decode_claim(rec.key, rec.value)
            out.append((IngestClaim.Kind.Name(claim.kind), claim.attempt))
        return out


def req(request_id: str) -> DataRequest:
    return DataRequest(
        request_id=request_id,
        kind=DataRequest.HISTORICAL,
        ticker="BINANCE:BTC/USDT",
        period_seconds=60,
        start_time_ms=0,
        end_time_ms=60_000,
    )


def claim(ingestor: str, request_id: str, attempt: int = 0, *, payload: bool = True) -> IngestClaim:
    record = IngestClaim(kind=CLAIM, ingestor_id=ingestor, request_id=request_id, attempt=attempt)
    if payload:
        record.request.CopyFrom(req(request_id))
    return record


def beat(ingestor: str, *request_ids: str) -> IngestClaim:
    return IngestClaim(kind=HEARTBEAT, ingestor_id=ingestor, in_flight=list(request_ids))


def done(ingestor: str, request_id: str) -> IngestClaim:
    return IngestClaim(kind=DONE, ingestor_id=ingestor, request_id=request_id)


def test_ledger_keeps_the_first_claim_per_request() -> None:
    ledger = ClaimLedger()
    ledger.apply(5, claim("b", "r1"), 0, 0.0)
    ledger.apply(7, claim("a", "r1"), 0, 0.0)
    ledger.apply(8, claim("a", "r2"), 0, 0.0)
    assert ledger.winner("r1") == "b" and ledger.winner("r2") == "a"
    assert ledger.winner("r3") is None
    assert ledger.position == 9


def test_ledger_is_bounded_and_prunes_by_age() -> None:
    ledger = ClaimLedger(capacity=2)
    for i, rid in enumerate(["a", "b", "c"]):
        ledger.apply(i, claim("x", rid), i * 100, 0.0)
    assert len(ledger) == 2 and ledger.winner("a") is None
    assert ledger.prune(older_than_ms=200) == 1
    assert ledger.winner("c") == "x"


def test_exactly_one_of_two_claimants_wins() -> None:
    async def scenario() -> tuple[bool, bool]:
        log = SharedLog()
        a = Claims("ing-a", log.publisher(0.01), wait_timeout_s=5)
        b = Claims("ing-b", log.publisher(0.02), wait_timeout_s=5)
        log.readers = [a, b]
        return tuple(await asyncio.gather(a.claim(req("req")), b.claim(req("req"))))  # type: ignore[return-value]

    results = asyncio.run(scenario())
    assert sorted(results) == [False, True]


def test_every_request_has_exactly_one_winner_among_three() -> None:
    async def scenario() -> list[list[bool]]:
        log = SharedLog()
        claims = [Claims(f"ing-{i}", log.publisher(0.001 * i), wait_timeout_s=5) for i in range(3)]
        log.readers = claims
        out = []
        for n in range(20):
            out.append(list(await asyncio.gather(*(c.claim(req(f"req-{n}")) for c in claims))))
        return out

    for verdicts in asyncio.run(scenario()):
        assert verdicts.count(True) == 1


def test_no_verdict_in_time_means_fetch_anyway() -> None:
    async def scenario() -> bool:
        async def publish(key: str, value: bytes) -> int:
            return 0  # the reader never sees it

        return await Claims("ing", publish, wait_timeout_s=0.05).claim(req("req"))

    assert asyncio.run(scenario()) is True


def test_a_failing_claim_log_means_fetch_anyway() -> None:
    async def scenario() -> bool:
        async def publish(key: str, value: bytes) -> int:
            raise RuntimeError("kafka down")

        return await Claims("ing", publish, wait_timeout_s=1).claim(req("req"))

    assert asyncio.run(scenario()) is True


def test_undecodable_records_are_skipped_but_advance_the_position() -> None:
    claims = Claims("ing", lambda r, i: None, wait_timeout_s=1)  # type: ignore[arg-type,return-value]
    claims.on_records([Rec(0, b"r", b"\xff"), Rec(1, None, None), Rec(2, b"r", b"\x01\x20\xff")])
    assert claims.ledger.position == 3 and len(claims.ledger) == 0


# --- takeover bookkeeping (pure: the clock is an argument) -------------------


def test_an_old_style_claim_is_a_first_claim_that_is_never_taken_over() -> None:
    ledger = ClaimLedger()
    ledger.apply(0, decode_claim(b"r1", b"old-ingestor"), 0, now=0.0)
    assert ledger.winner("r1") == "old-ingestor"
    assert ledger.expired(now=1e9, after_s=4, mine=frozenset()) == []


def test_a_silent_holder_expires_and_heartbeats_of_its_own_requests_keep_it_alive() -> None:
    ledger = ClaimLedger()
    ledger.apply(0, claim("a", "r1"), 0, now=0.0)
    ledger.apply(1, claim("a", "r2"), 0, now=0.0)
    ledger.apply(2, beat("a", "r1"), 0, now=3.0)
    ledger.apply(3, beat("b", "r2"), 0, now=3.0)  # not the holder of r2: no proof of life
    [expired] = ledger.expired(now=4.0, after_s=4, mine=frozenset())
    assert (expired.request_id, expired.attempt) == ("r2", 1)
    assert expired.request == req("r2")
    assert {t.request_id for t in ledger.expired(now=7.0, after_s=4, mine=frozenset())} == {
        "r1",
        "r2",
    }
    assert ledger.expired(now=7.0, after_s=4, mine=frozenset({"r1", "r2"})) == []


def test_the_first_takeover_claim_for_the_next_attempt_wins() -> None:
    ledger = ClaimLedger()
    ledger.apply(0, claim("a", "r1"), 0, now=0.0)
    ledger.apply(1, claim("b", "r1", attempt=1), 0, now=5.0)
    ledger.apply(2, claim("c", "r1", attempt=1), 0, now=5.0)  # same attempt, later: loses
    ledger.apply(3, claim("c", "r1", attempt=3), 0, now=5.0)  # skips an attempt: ignored
    held = ledger.holding("r1")
    assert held is not None and (held.owner, held.attempt) == ("b", 1)
    ledger.apply(4, beat("a", "r1"), 0, now=8.0)  # the old holder woke up: it no longer holds r1
    assert ledger.expired(now=9.0, after_s=4, mine=frozenset())[0].attempt == 2
    ledger.apply(5, claim("c", "r1", attempt=2), 0, now=9.0)
    assert ledger.winner("r1") == "c"


def test_done_closes_a_request_for_good() -> None:
    ledger = ClaimLedger()
    ledger.apply(0, claim("a", "r1"), 0, now=0.0)
    ledger.apply(1, done("a", "r1"), 0, now=1.0)
    assert ledger.expired(now=100.0, after_s=4, mine=frozenset()) == []
    ledger.apply(2, claim("b", "r1", attempt=1), 0, now=100.0)  # too late: ignored
    held = ledger.holding("r1")
    assert held is not None and held.done and held.owner == "a" and held.request is None


def test_a_takeover_of_a_request_claimed_before_our_lookback_is_adopted() -> None:
    ledger = ClaimLedger()
    ledger.apply(0, claim("b", "r1", attempt=2), 0, now=0.0)
    assert ledger.winner("r1") == "b"
    assert ledger.expired(now=4.0, after_s=4, mine=frozenset())[0].attempt == 3


def test_requests_without_a_payload_are_never_taken_over() -> None:
    ledger = ClaimLedger()
    ledger.apply(0, claim("a", "legacy-sync", payload=False), 0, now=0.0)
    assert ledger.expired(now=100.0, after_s=4, mine=frozenset()) == []


def test_the_claim_record_carries_the_request() -> None:
    async def scenario() -> None:
        log = SharedLog()
        a = Claims("ing-a", log.publisher(), wait_timeout_s=5)
        log.readers = [a]
        assert await a.claim(req("r1"))
        assert a.running == {"r1"}

    asyncio.run(scenario())


# --- takeover end to end over the in-memory log (a fake clock, scanned by hand) -----


class FakeClock:
    """Seconds that pass only when a test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def node(name: str, log: SharedLog, clock: FakeClock) -> Claims:
    """A claims node whose records reach every reader before `publish` returns."""
    return Claims(name, log.publisher(None), 5, heartbeat_s=1.0, takeover_after_s=4.0, clock=clock)


Started = list[tuple[str, str, int]]


async def scan_for(nodes: list[Claims], clock: FakeClock, seconds: int, started: Started) -> None:
    """Let `seconds` pass a second at a time, every node scanning (and finishing the work
    the scan gave it) at each: what `run` does, without waiting for a real clock."""
    for _ in range(seconds):
        clock.now += 1.0
        await scan_once(nodes, started)


async def scan_once(
    nodes: list[Claims], started: Started, serves: Callable[[DataRequest], bool] = lambda _r: True
) -> None:
    def on_takeover(n: Claims) -> Callable[[DataRequest, int], None]:
        return lambda r, attempt: started.append((n.ingestor_id, r.request_id, attempt))

    await asyncio.gather(*(w for n in nodes for w in n.scan(on_takeover(n), serves)))


def test_a_dead_winner_is_taken_over_once_by_one_of_the_others() -> None:
    async def scenario() -> tuple[Started, Started, SharedLog, str]:
        clock, log = FakeClock(), SharedLog()
        nodes = [node(f"ing-{i}", log, clock) for i in range(3)]
        log.readers = list(nodes)
        verdicts = await asyncio.gather(*(n.claim(req("r1")) for n in nodes))
        assert verdicts.count(True) == 1
        winner = nodes[verdicts.index(True)]
        log.readers.remove(winner)  # the winner dies: no heartbeat, no done
        others = [n for n in nodes if n is not winner]
        early: Started = []
        await scan_for(others, clock, 3, early)  # 3 s of silence: not yet
        started: Started = []
        await scan_for(others, clock, 1, started)  # 4 s (takeover_after_s): taken over
        await scan_for(others, clock, 12, started)  # three more takeover periods
        return early, started, log, winner.ingestor_id

    early, started, log, dead = asyncio.run(scenario())
    assert early == []
    [(taker, request_id, attempt)] = started  # both others tried, exactly one won
    assert request_id == "r1" and attempt == 1
    assert taker != dead
    assert log.kinds().count(("CLAIM", 1)) == 2
    # The taker keeps it alive: nobody claimed attempt 2 during the rest of the run.
    assert ("CLAIM", 2) not in log.kinds()
    assert ("HEARTBEAT", 0) in log.kinds()


def test_a_live_winner_is_not_taken_over_and_done_ends_the_heartbeats() -> None:
    async def scenario() -> tuple[Started, SharedLog]:
        clock, log = FakeClock(), SharedLog()
        a, b = node("ing-a", log, clock), node("ing-b", log, clock)
        log.readers = [a, b]
        assert await a.claim(req("r1"))
        assert not await b.claim(req("r1"))
        started: Started = []
        await scan_for([a, b], clock, 12, started)  # 3 x takeover_after_s: a's heartbeats keep r1
        beats = sum(1 for kind, _ in log.kinds() if kind == "HEARTBEAT")
        assert beats == 12  # one a second
        await a.done("r1")
        await scan_for([a, b], clock, 12, started)  # done: no more heartbeats, no takeover
        assert sum(1 for kind, _ in log.kinds() if kind == "HEARTBEAT") == beats
        return started, log

    started, log = asyncio.run(scenario())
    assert started == []
    assert ("CLAIM", 1) not in log.kinds() and ("DONE", 0) in log.kinds()


def test_only_requests_of_served_exchanges_are_taken_over() -> None:
    async def scenario() -> tuple[Started, Started]:
        clock, log = FakeClock(), SharedLog()
        a, b = node("ing-a", log, clock), node("ing-b", log, clock)
        log.readers = [a, b]
        assert await a.claim(req("r1"))
        log.readers = [b]  # a dies
        clock.now += 12.0  # silent for 3 x takeover_after_s
        unserved: Started = []
        await scan_once([b], unserved, serves=lambda _r: False)
        served: Started = []
        await scan_once([b], served)  # the same moment, had b served the exchange
        return unserved, served

    unserved, served = asyncio.run(scenario())
    assert unserved == []
    assert served == [("ing-b", "r1", 1)]


def test_run_scans_at_once_and_hands_a_takeover_on() -> None:
    """`run` is `scan` on a timer: its first pass happens as it starts."""

    async def scenario() -> tuple[DataRequest, int]:
        clock, log = FakeClock(), SharedLog()
        a, b = node("ing-a", log, clock), node("ing-b", log, clock)
        log.readers = [a, b]
        assert await a.claim(req("r1"))
        log.readers = [b]  # a dies
        clock.now += 4.0
        taken: asyncio.Future[tuple[DataRequest, int]] = asyncio.get_running_loop().create_future()
        run = asyncio.create_task(b.run(lambda r, at: taken.set_result((r, at))))
        try:
            return await asyncio.wait_for(taken, 10)
        finally:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)

    request, attempt = asyncio.run(scenario())
    assert (request.request_id, attempt) == ("r1", 1)


def test_an_abandoned_request_gets_a_lone_error_marker(fakes: Any) -> None:
    sink = fakes.FakeSink()
    delivered = asyncio.run(
        write_error_marker(
            req("r1"), sink, ingestor_id="ing-c", error_code=ABANDONED, reason="4 holders died"
        )
    )
    [(key, marker)] = sink.batches
    assert delivered and key == "BINANCE:BTC/USDT"
    assert marker.is_final and marker.sequence == 0 and not marker.rows
    meta = marker.metadata
    assert (meta.status, meta.error_code, meta.reason) == (
        Status.ERROR,
        "abandoned",
        "4 holders died",
    )
    assert meta.request_id == "r1" and meta.ingestor_id == "ing-c"
