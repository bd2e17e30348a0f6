"""Legacy sync replies, two ingestors on one exchange, takeover of an orphaned claim, and the
real console script."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from infra.exchange_sim import expected_klines
from ingestor.app import Ingestor
from ingestor.claims import decode_claim
from mdproto import envelope
from mdproto.messages import DataRequest, IngestClaim, OHLCBatch, Status

pytestmark = pytest.mark.stack

MIN = 60_000


def history(request_id: str, start: int, count: int, **extra: Any) -> DataRequest:
    fields: dict[str, Any] = {
        "request_id": request_id,
        "kind": DataRequest.HISTORICAL,
        "ticker": "BINANCE:BTC/USDT",
        "period_seconds": 60,
        "start_time_ms": start,
        "end_time_ms": start + count * MIN,
    }
    fields.update(extra)
    return DataRequest(**fields)


def test_legacy_request_is_answered_inline_through_the_dealer(
    harness: Any, run_ingestor: Any
) -> None:
    sim = harness.sim
    start = (sim.now_ms() // MIN - 2000) * MIN

    async def scenario() -> tuple[bytes, Any, Any, Any]:
        relay = harness.FakeRelay()
        settings = harness.settings(relay)
        ingestor = Ingestor(settings)
        task = await run_ingestor(ingestor)
        try:
            await relay.wait_subscribed()
            await relay.publish(history("legacy-1", start, 1500, legacy_sync=True, limit=1200))
            identity, response = await relay.recv_response()
            await relay.publish(
                history("legacy-2", start, 10, legacy_sync=True, ticker="BINANCE:NOPE/USDT")
            )
            _, failed = await relay.recv_response()
            return identity, response, failed, (settings, ingestor)
        finally:
            await ingestor.stop()
            await task
            relay.close()

    identity, response, failed, (settings, ingestor) = asyncio.run(scenario())
    assert identity == settings.ingestor_id.encode()
    assert response.request_id == "legacy-1" and response.status == Status.OK
    assert response.ingestor_id == settings.ingestor_id
    expected = expected_klines("BTC/USDT", "1m", start, start + 1200 * MIN - 1, model=sim.model)
    got = [(c.open_time_ms, c.open, c.high, c.low, c.close, c.volume) for c in response.candles]
    assert got == [tuple(k.ohlcv()) for k in expected]  # limit honoured: the first 1200
    assert failed.request_id == "legacy-2" and failed.status == Status.ERROR
    assert "bad_symbol" in failed.reason
    assert ingestor.stats.legacy_jobs == 2 and ingestor.stats.history_jobs == 0
    assert ingestor.sink is not None and ingestor.sink.stats.produced < 20  # markets only


def test_two_ingestors_one_exchange_fetch_each_request_once(
    harness: Any, run_ingestor: Any
) -> None:
    sim = harness.sim
    start = (sim.now_ms() // MIN - 1000) * MIN
    requests = [history(f"dup-{i}", start + i * MIN, 900) for i in range(4)]

    async def scenario() -> tuple[list[Ingestor], dict[str, list[Any]]]:
        relay = harness.FakeRelay()
        shared = "pair"
        a = Ingestor(harness.settings(relay, suffix=shared, ingestor_id="ing-a"))
        b = Ingestor(harness.settings(relay, suffix=shared, ingestor_id="ing-b"))
        tasks = [await run_ingestor(a), await run_ingestor(b)]
        try:
            await relay.wait_subscribed(ingestors=2)
            for r in requests:
                await relay.publish(r)
            await relay.publish(requests[0])  # a re-delivery of the same request
            results = {
                r.request_id: await asyncio.to_thread(
                    harness.batches_until_final, a.settings, r.request_id
                )
                for r in requests
            }
            async with asyncio.timeout(20):  # the losers' verdicts: poll their counters
                while a.stats.skipped_claimed + b.stats.skipped_claimed < len(requests):  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            return [a, b], results
        finally:
            for ing in (a, b):
                await ing.stop()
            for t in tasks:
                await t
            relay.close()

    (a, b), results = asyncio.run(scenario())
    assert a.stats.history_jobs + b.stats.history_jobs == len(requests)
    assert a.stats.skipped_claimed + b.stats.skipped_claimed == len(requests)
    assert a.stats.skipped_repeat == b.stats.skipped_repeat == 1
    for request_id, batches in results.items():
        finals = [x for x in batches if x.is_final]
        assert len(finals) == 1, request_id
        assert finals[0].metadata.status == Status.OK and finals[0].metadata.total_rows == 900
        writers = {x.metadata.ingestor_id for x in batches if x.HasField("metadata")}
        assert len(writers) == 1 and writers <= {"ing-a", "ing-b"}
        assert [x.sequence for x in batches] == [0, 1, 2]  # one set of records, no duplicates
    klines_calls = [e for e in sim.stats()["log"] if e["path"] == "/api/v3/klines"]
    # One page each by the winner; the claim is decided while the first page is fetched,
    # so a loser may have asked for that page too, never for more.
    assert len(requests) <= len(klines_calls) <= 2 * len(requests)


def orphan_claim(bootstrap: str, topic: str, request: DataRequest, attempt: int) -> None:
    """A claim by an ingestor that died at once: no heartbeat, no DONE ever follows."""
    from confluent_kafka import Producer

    claim = IngestClaim(
        kind=IngestClaim.CLAIM,
        ingestor_id="ing-dead",
        request_id=request.request_id,
        attempt=attempt,
        request=request,
    )
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(
        topic, key=request.request_id.encode(), value=envelope.encode_record(claim), partition=0
    )
    assert producer.flush(10) == 0


def takeover_scenario(
    harness: Any, run_ingestor: Any, request: DataRequest, attempt: int
) -> tuple[list[OHLCBatch], float, Ingestor, list[IngestClaim]]:
    """An orphaned claim at `attempt`, one live ingestor that never got the request from
    the relay: what it writes, how long after the claim, and the claims log."""

    async def scenario() -> tuple[list[OHLCBatch], float, Ingestor]:
        relay = harness.FakeRelay()
        ing = Ingestor(harness.settings(relay, ingestor_id="ing-live"))
        task = await run_ingestor(ing)
        try:
            topic = ing.settings.kafka.topic_claims
            await asyncio.to_thread(orphan_claim, harness.bootstrap, topic, request, attempt)
            claimed_at = time.monotonic()
            batches = await asyncio.to_thread(
                harness.batches_until_final, ing.settings, request.request_id
            )
            return batches, time.monotonic() - claimed_at, ing
        finally:
            await ing.stop()
            await task
            relay.close()

    batches, elapsed, ing = asyncio.run(scenario())

    def claims_of(records: list[tuple[bytes | None, bytes]]) -> list[IngestClaim]:
        return [decode_claim(k, v) for k, v in records]

    def done_seen(records: list[tuple[bytes | None, bytes]]) -> bool:
        return any(c.kind == IngestClaim.DONE for c in claims_of(records))

    log = harness.read_topic(harness.bootstrap, ing.settings.kafka.topic_claims, done_seen, 30)
    return batches, elapsed, ing, claims_of(log)


def test_an_orphaned_claim_is_taken_over_and_fetched_in_full(
    harness: Any, run_ingestor: Any
) -> None:
    start = (harness.sim.now_ms() // MIN - 3000) * MIN
    request = history("orphan-1", start, 900)
    batches, elapsed, ing, claims = takeover_scenario(harness, run_ingestor, request, 0)
    final = batches[-1]
    assert final.is_final and final.metadata.status == Status.OK
    assert final.metadata.total_rows == 900
    assert {b.metadata.ingestor_id for b in batches if b.HasField("metadata")} == {"ing-live"}
    assert ing.stats.taken_over == 1
    assert ing.claims is not None and ing.claims.stats.takeovers_claimed == 1
    # Claimed again once the holder was silent for takeover_after_s (4 s), not before.
    assert ing.settings.claims.takeover_after_s <= elapsed < 15
    kinds = [(IngestClaim.Kind.Name(c.kind), c.ingestor_id, c.attempt) for c in claims]
    assert kinds[0] == ("CLAIM", "ing-dead", 0)
    assert ("CLAIM", "ing-live", 1) in kinds and ("DONE", "ing-live", 0) in kinds


def test_a_request_whose_holders_kept_dying_ends_in_an_abandoned_error(
    harness: Any, run_ingestor: Any
) -> None:
    start = (harness.sim.now_ms() // MIN - 3000) * MIN
    request = history("orphan-2", start, 900)
    max_takeovers = 3  # the default
    batches, _, ing, claims = takeover_scenario(harness, run_ingestor, request, max_takeovers)
    [marker] = batches  # no rows: a lone ERROR marker
    assert marker.is_final and marker.metadata.status == Status.ERROR
    assert marker.metadata.error_code == "abandoned"
    assert ing.settings.claims.max_takeovers == max_takeovers
    assert ing.stats.history_jobs == 0  # nothing fetched
    assert any(c.kind == IngestClaim.CLAIM and c.attempt == max_takeovers + 1 for c in claims)


def test_a_winner_stopped_gracefully_finishes_its_request_without_a_takeover(
    harness: Any, run_ingestor: Any
) -> None:
    """SIGTERM (stop) mid-fetch: the winner keeps heartbeating while it finishes within the
    shutdown grace, appends DONE, and the other ingestor never claims the request again."""
    sim = harness.sim
    sim.add_fault("slow", count=3, delay=2.0, path="/api/v3/klines")  # > takeover_after_s
    start = (sim.now_ms() // MIN - 4000) * MIN
    request = history("graceful-1", start, 2500)  # 3 pages

    async def scenario() -> tuple[Ingestor, Ingestor, list[OHLCBatch]]:
        relay = harness.FakeRelay()
        a = Ingestor(harness.settings(relay, suffix="graceful", ingestor_id="ing-a"))
        b = Ingestor(harness.settings(relay, suffix="graceful", ingestor_id="ing-b"))
        tasks = {a: await run_ingestor(a), b: await run_ingestor(b)}
        try:
            await relay.wait_subscribed(ingestors=2)
            await relay.publish(request)
            async with asyncio.timeout(20):  # the loser's verdict names the winner
                while a.stats.skipped_claimed + b.stats.skipped_claimed == 0:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            winner, other = (b, a) if a.stats.skipped_claimed else (a, b)
            await winner.stop()
            await tasks.pop(winner)  # returns once its job finished (grace 10 s)
            batches = await asyncio.to_thread(
                harness.batches_until_final, winner.settings, request.request_id
            )
            return winner, other, batches
        finally:
            for ing, task in tasks.items():
                await ing.stop()
                await task
            relay.close()

    winner, other, batches = asyncio.run(scenario())
    assert batches[-1].is_final and batches[-1].metadata.status == Status.OK
    assert batches[-1].metadata.ingestor_id == winner.ingestor_id
    assert other.stats.taken_over == 0

    def done_seen(records: list[tuple[bytes | None, bytes]]) -> bool:
        return any(decode_claim(k, v).kind == IngestClaim.DONE for k, v in records)

    topic = winner.settings.kafka.topic_claims
    claims = [
        decode_claim(k, v) for k, v in harness.read_topic(harness.bootstrap, topic, done_seen)
    ]
    assert [c.attempt for c in claims if c.kind == IngestClaim.CLAIM] == [0, 0]  # no takeover
    assert any(c.kind == IngestClaim.HEARTBEAT for c in claims)


def test_console_script_serves_a_request_and_stops_on_sigterm(harness: Any, tmp_path: Path) -> None:
    sim = harness.sim
    script = Path(sys.executable).with_name("ingestor")
    assert script.exists(), "pip install -e services/ingestor"
    start = (sim.now_ms() // MIN - 100) * MIN

    async def scenario() -> tuple[list[Any], int, str]:
        relay = harness.FakeRelay()
        settings = harness.settings(relay, ingestor_id="ing-cli")
        config = tmp_path / "ingestor.yaml"
        config.write_text(settings.model_dump_json())  # JSON is YAML
        env = {**os.environ, "CONFIG_PATH": str(config), "LOG_LEVEL": "INFO"}
        env["INGESTOR_HISTORY__BATCH_SIZE"] = "7"  # env overrides the file
        proc = await asyncio.create_subprocess_exec(
            str(script), env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        try:
            await relay.wait_subscribed(timeout_s=60)
            await relay.publish(history("cli-1", start, 50))
            batches = await asyncio.to_thread(harness.batches_until_final, settings, "cli-1")
            proc.send_signal(signal.SIGTERM)
            out, _ = await asyncio.wait_for(proc.communicate(), 30)
            assert proc.returncode is not None
            return batches, proc.returncode, out.decode()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            relay.close()

    batches, code, output = asyncio.run(scenario())
    assert code == 0, output
    assert batches[-1].metadata.status == Status.OK and batches[-1].metadata.total_rows == 50
    assert batches[-1].metadata.total_batches == 8  # batch size 7 from the environment
    assert batches[0].metadata.ingestor_id == "ing-cli"
    assert "ready" in output and "cli-1" in output
