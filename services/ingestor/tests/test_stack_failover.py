"""Active/active relays (docs/protocol.md "Failover and chaining") with real processes.

    pipeline-like PUB (sequenced ticks, ~1,000/s) <- relay A, relay B (two `relay` processes)
    ingestor (real: Kafka, exchange simulator)   -> SUB/DEALER to both relays
    mdclient Client                              -> SUB on both, REQ to A first

Relay A is killed with SIGKILL while ticks flow. The client's live stream must
show every sequence number once, in order (the copy through B covers A's loss,
the second copy of each message is dropped); a history request forwarded by A
just before it died and resent by the client (same request_id) when A went
silent, and a new one submitted during the outage, are each fetched exactly
once. The Spark pipeline is not part of this test (too heavy for a unit stack
run): "completes" means the ingestor's final marker in Kafka, which is what the
pipeline's notification follows; the notification's own duplicate (one per
relay) is dropped by the SDK by its sequence number (test-client tests).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import zmq

from infra.platform.metrics import PIPELINE_SERVES_HISTORY, metric_sample
from infra.testing import free_port
from ingestor.app import Ingestor
from ingestor.claims import decode_claim
from mdclient import Client
from mdclient.config import ClientSettings
from mdclient.dispatch import SequenceEvent
from mdproto import envelope, topics
from mdproto.messages import (
    IngestClaim,
    NotifyPattern,
    PipelineStatus,
    Status,
    SubmitHistoricalRequest,
    SubmitResponse,
    Tick,
)

pytestmark = pytest.mark.stack

MIN = 60_000
TICKER = "KRAKEN:BTC/USD"  # no ingestor serves KRAKEN here: the ticks are the fake pipeline's
TICK_TOPIC = f"{TICKER}|tick"
RELAY_CONFIG = Path(__file__).resolve().parents[2] / "relay" / "config.yaml"


class RelayProcess:
    """The `relay` console script on free loopback ports, logging to a file."""

    def __init__(self, name: str, pipeline: str, log_dir: Path) -> None:
        keys = ("client_request", "market_data_pub", "ingestor_work", "ingestor_response")
        self.ports = {k: free_port() for k in (*keys, "ingestor_control", "metrics")}
        env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
        env.update({f"RELAY_{k.upper()}_PORT": str(p) for k, p in self.ports.items()})
        env.update(
            CONFIG_PATH=str(RELAY_CONFIG),
            RELAY_BIND_ADDRESS="tcp://127.0.0.1",
            RELAY_METRICS_HOST="127.0.0.1",
            RELAY_FLINK_MARKET_DATA_ENDPOINT=pipeline,
            LOG_LEVEL="INFO",
            PYTHONUNBUFFERED="1",
        )
        self.log = log_dir / f"relay-{name}.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [str(Path(sys.executable).parent / "relay")], env=env, stdout=out, stderr=out
            )

    def endpoint(self, port: str) -> str:
        return f"tcp://127.0.0.1:{self.ports[port]}"

    def metric(self, name: str, labels: str = "") -> float | None:
        """One sample from /metrics (None while the relay does not answer)."""
        return metric_sample(f"http://127.0.0.1:{self.ports['metrics']}/metrics", name + labels)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


class TickPublisher:
    """The pipeline's role: an XPUB bound, ticks numbered 1, 2, 3... at `rate` per second,
    and its heartbeat (the relays refuse history without one)."""

    def __init__(self, rate: float = 1000.0) -> None:
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.sock = self.ctx.socket(zmq.XPUB)
        self.sock.linger = 0
        self.sock.sndhwm = 0
        self.sock.setsockopt(zmq.XPUB_VERBOSE, 1)  # one subscribe per relay
        self.endpoint = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"
        self.rate = rate
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def wait_subscribers(self, count: int, timeout_s: float = 20.0) -> None:
        seen = 0
        deadline = time.monotonic() + timeout_s
        while seen < count:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sock.poll(int(left * 1000)):
                raise AssertionError(f"{seen} of {count} relays subscribed to {TICK_TOPIC}")
            seen += self.sock.recv() == b"\x01" + TICK_TOPIC.encode()

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        epoch = time.time_ns()
        next_at = next_beat = time.monotonic()
        beat = PipelineStatus(interval_ms=500, history=True, triggers=True)
        while not self._stop.is_set():
            if time.monotonic() >= next_beat:
                self.sock.send_multipart(envelope.encode_pub(topics.PIPELINE_STATUS, beat))
                next_beat += 0.5
            self.sent += 1
            tick = Tick(ticker=TICKER, trade_id=str(self.sent), price=1.0, amount=1.0)
            tick.sequence, tick.publisher_epoch = self.sent, epoch
            self.sock.send_multipart(envelope.encode_pub(TICK_TOPIC, tick))
            next_at += 1 / self.rate
            time.sleep(max(0.0, next_at - time.monotonic()))  # pacing, not synchronisation

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        if not self.ctx.closed:
            self.ctx.destroy(linger=0)


class Relays:
    """What `harness.settings` reads: the ingestor's relay endpoints, both relays listed."""

    def __init__(self, *relays: RelayProcess) -> None:
        self.relays = relays

    @property
    def endpoints(self) -> dict[str, str]:
        return {
            f"relay_{socket}_endpoint": ",".join(
                r.endpoint(f"ingestor_{socket}") for r in self.relays
            )
            for socket in ("work", "control", "response")
        }


def submit(request_id: str, start: int, count: int) -> SubmitHistoricalRequest:
    return SubmitHistoricalRequest(
        request_id=request_id,
        client_id="failover-client",
        ticker="BINANCE:BTC/USDT",
        period_seconds=60,
        start_time_ms=start,
        end_time_ms=start + count * MIN,
        notify=NotifyPattern.NOTIFY_PER_CLIENT,
    )


def ask(endpoint: str, request: SubmitHistoricalRequest) -> SubmitResponse:
    """One round trip on a plain REQ (the client's first try, whose relay then dies)."""
    with zmq.Context() as ctx, ctx.socket(zmq.REQ) as sock:
        sock.linger = 0
        sock.connect(endpoint)
        sock.send_multipart(envelope.encode(request))
        assert sock.poll(10_000), f"no answer from {endpoint}"
        return envelope.decode(sock.recv_multipart(), SubmitResponse)


async def until(condition: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(condition):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def test_killing_one_of_two_relays_loses_nothing_and_fetches_once(
    harness: Any, run_ingestor: Any, tmp_path: Path
) -> None:
    sim = harness.sim
    start = (sim.now_ms() // MIN - 2000) * MIN
    first, during = submit("failover-1", start, 900), submit("failover-2", start + 1000 * MIN, 900)
    publisher = TickPublisher()
    relay_a = RelayProcess("a", publisher.endpoint, tmp_path)
    relay_b = RelayProcess("b", publisher.endpoint, tmp_path)
    received: list[tuple[int, float]] = []  # (sequence, monotonic time) as delivered
    events: list[SequenceEvent] = []
    figures: dict[str, float] = {}

    async def scenario() -> tuple[Ingestor, Any, dict[str, SubmitResponse]]:
        ingestor = Ingestor(harness.settings(Relays(relay_a, relay_b), ingestor_id="ing-aa"))
        task = await run_ingestor(ingestor)
        client: Client | None = None
        try:
            served = 'relay_exchange_served{prefix="BINANCE:"}'
            for r in (relay_a, relay_b):  # each one routes BINANCE: (ingestor alive on both)
                await until(
                    lambda r=r: r.metric(served) == 1,
                    f"{r.log.name} to see the ingestor",
                )
            settings = ClientSettings(
                request_endpoint=f"{relay_a.endpoint('client_request')},"
                f"{relay_b.endpoint('client_request')}",
                market_data_endpoint=f"{relay_a.endpoint('market_data_pub')},"
                f"{relay_b.endpoint('market_data_pub')}",
                failover_timeout_s=2.0,
                connect_timeout_s=15.0,
            )
            client = await asyncio.to_thread(Client, settings=settings)
            stream = client.live(
                TICKER,
                callback=lambda tick: received.append((tick.sequence, time.monotonic())),
                on_sequence=events.append,
            )
            await asyncio.to_thread(publisher.wait_subscribers, 2)
            await until(lambda: client is not None and client.relays_connected == 2, "2 links")
            publisher.start()
            await until(lambda: len(received) >= 500, "ticks through both relays")
            for r in (relay_a, relay_b):  # the publisher's heartbeat: history is accepted
                await until(
                    lambda r=r: r.metric(PIPELINE_SERVES_HISTORY) == 1, f"{r.log.name} to hear it"
                )

            acks = {"a": await asyncio.to_thread(ask, relay_a.endpoint("client_request"), first)}
            await until(lambda: ingestor.intake is not None and ingestor.intake.stats.requests >= 1,
                        "the ingestor to get the request from relay A")  # fmt: skip
            relay_a.kill()
            killed_at = time.monotonic()
            # The client never saw A's answer: it resends the same request; A is silent.
            frames = envelope.encode(first)
            reply = await asyncio.to_thread(client.request, frames, 30.0)
            figures["resend_s"] = time.monotonic() - killed_at
            acks["resent"] = envelope.decode(reply, SubmitResponse)
            reply = await asyncio.to_thread(client.request, envelope.encode(during), 30.0)
            acks["during"] = envelope.decode(reply, SubmitResponse)
            figures["relays_connected_after"] = client.relays_connected
            figures["failovers"] = client.request_failovers
            count_then = len(received)
            await until(lambda: len(received) >= count_then + 1000, "ticks through relay B")
            publisher.close()
            await until(lambda: received[-1][0] == publisher.sent, "the last tick", 10)
            figures["duplicates"] = stream.duplicates
            gaps = [
                b[1] - a[1]
                for a, b in itertools.pairwise(received)
                if killed_at - 0.5 <= b[1] <= killed_at + 3
            ]
            figures["live_gap_at_kill_s"] = max(gaps)
            await until(lambda: ingestor.stats.skipped_repeat >= 1, "B's copy to be ignored")
            return ingestor, stream, acks
        finally:
            if client is not None:
                await asyncio.to_thread(client.close)
            await ingestor.stop()
            await task

    try:
        ingestor, _stream, acks = asyncio.run(scenario())
        batches = {
            r.request_id: harness.batches_until_final(ingestor.settings, r.request_id)
            for r in (first, during)
        }

        def both_done(records: list[tuple[bytes | None, bytes]]) -> bool:
            done = {c.request_id for c in claims_of(records) if c.kind == IngestClaim.DONE}
            return {first.request_id, during.request_id} <= done

        claims = claims_of(
            harness.read_topic(harness.bootstrap, ingestor.settings.kafka.topic_claims, both_done)
        )
    finally:
        publisher.close()
        for r in (relay_a, relay_b):
            r.kill()
    print(f"\nfailover figures: {figures}")

    # Live: every number once, in order, through the kill; the second copies dropped.
    sequences = [s for s, _ in received]
    assert sequences == list(range(sequences[0], publisher.sent + 1))
    assert [e for e in events if e.kind in ("gap", "restart")] == []
    assert figures["duplicates"] > 0  # both relays delivered: copies were there to drop
    assert figures["live_gap_at_kill_s"] < 2.0  # the aim for failover time
    assert figures["relays_connected_after"] == 1
    # Requests: A refuses connections (dead) -> the same frames to B at once, not after
    # failover_timeout_s (that is for a silent relay: test-client tests); then B directly.
    assert {k: a.status for k, a in acks.items()} == dict.fromkeys(acks, Status.OK)
    assert figures["failovers"] == 1
    assert figures["resend_s"] < 2.0
    # Exactly once: one claim, one fetch, one set of records per request_id.
    for request_id, written in batches.items():
        finals = [b for b in written if b.is_final]
        assert len(finals) == 1 and finals[0].metadata.status == Status.OK, request_id
        assert finals[0].metadata.total_rows == 900
        assert [b.sequence for b in written] == list(range(len(written))), request_id
        assert [c.request_id for c in claims if c.kind == IngestClaim.CLAIM].count(request_id) == 1
    assert ingestor.stats.skipped_repeat >= 1  # relay B's copy of the first request
    klines = [e for e in sim.stats()["log"] if e["path"] == "/api/v3/klines"]
    assert len(klines) == 2  # one page per request, never fetched twice


def claims_of(records: list[tuple[bytes | None, bytes]]) -> list[IngestClaim]:
    return [decode_claim(k, v) for k, v in records]
