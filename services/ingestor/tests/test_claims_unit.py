"""Claims decided from a shared, totally ordered log (an in-memory stand-in for the partition)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ingestor.claims import ClaimLedger, Claims


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

    def publisher(self, lag_s: float = 0.0):  # type: ignore[no-untyped-def]
        async def publish(request_id: str, ingestor_id: str) -> int:
            rec = Rec(len(self.records), request_id.encode(), ingestor_id.encode(), 1000)
            self.records.append(rec)
            asyncio.get_running_loop().call_later(lag_s, self._fan_out, rec)
            return rec.offset

        return publish

    def _fan_out(self, rec: Rec) -> None:
        for reader in self.readers:
            reader.on_records([rec])


def test_ledger_keeps_the_first_claim_per_request() -> None:
    ledger = ClaimLedger()
    ledger.add(5, "r1", "b", 0)
    ledger.add(7, "r1", "a", 0)
    ledger.add(8, "r2", "a", 0)
    assert ledger.winner("r1") == "b" and ledger.winner("r2") == "a"
    assert ledger.winner("r3") is None
    assert ledger.position == 9


def test_ledger_is_bounded_and_prunes_by_age() -> None:
    ledger = ClaimLedger(capacity=2)
    for i, rid in enumerate(["a", "b", "c"]):
        ledger.add(i, rid, "x", i * 100)
    assert len(ledger) == 2 and ledger.winner("a") is None
    assert ledger.prune(older_than_ms=200) == 1
    assert ledger.winner("c") == "x"


def test_exactly_one_of_two_claimants_wins() -> None:
    async def scenario() -> tuple[bool, bool]:
        log = SharedLog()
        a = Claims("ing-a", log.publisher(0.01), wait_timeout_s=5)
        b = Claims("ing-b", log.publisher(0.02), wait_timeout_s=5)
        log.readers = [a, b]
        return tuple(await asyncio.gather(a.claim("req"), b.claim("req")))  # type: ignore[return-value]

    results = asyncio.run(scenario())
    assert sorted(results) == [False, True]


def test_every_request_has_exactly_one_winner_among_three() -> None:
    async def scenario() -> list[list[bool]]:
        log = SharedLog()
        claims = [Claims(f"ing-{i}", log.publisher(0.001 * i), wait_timeout_s=5) for i in range(3)]
        log.readers = claims
        out = []
        for n in range(20):
            out.append(list(await asyncio.gather(*(c.claim(f"req-{n}") for c in claims))))
        return out

    for verdicts in asyncio.run(scenario()):
        assert verdicts.count(True) == 1


def test_no_verdict_in_time_means_fetch_anyway() -> None:
    async def scenario() -> bool:
        async def publish(request_id: str, ingestor_id: str) -> int:
            return 0  # the reader never sees it

        return await Claims("ing", publish, wait_timeout_s=0.05).claim("req")

    assert asyncio.run(scenario()) is True


def test_a_failing_claim_log_means_fetch_anyway() -> None:
    async def scenario() -> bool:
        async def publish(request_id: str, ingestor_id: str) -> int:
            raise RuntimeError("kafka down")

        return await Claims("ing", publish, wait_timeout_s=1).claim("req")

    assert asyncio.run(scenario()) is True


def test_undecodable_records_are_skipped_but_advance_the_position() -> None:
    claims = Claims("ing", lambda r, i: None, wait_timeout_s=1)  # type: ignore[arg-type,return-value]
    claims.on_records([Rec(0, b"\xff", b"x"), Rec(1, None, None)])
    assert claims.ledger.position == 2 and len(claims.ledger) == 0
