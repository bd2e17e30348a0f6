"""What a client sees when the exchange goes down or the ingestor hangs: a real relay,
a real ingestor (in-process, then a process that gets SIGSTOP), the simulator and Kafka.

The measured times are printed (pytest -s) and quoted in docs/protocol.md
("Ingestor liveness and the exchange breaker").
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
import zmq

from ingestor.app import Ingestor
from mdproto import envelope
from mdproto.messages import OHLCRequest, Response, Status, SubmitHistoricalRequest, SubmitResponse
from relay import Relay, RelaySettings

pytestmark = pytest.mark.stack

MIN = 60_000
PREFIX = {"prefix": "BINANCE:"}


class RelayForTest:
    """A real relay on ephemeral loopback ports, its loop in a thread, plus a REQ client."""

    def __init__(self) -> None:
        settings = RelaySettings(
            bind_address="tcp://127.0.0.1",
            client_request_port=0,
            market_data_pub_port=0,
            ingestor_work_port=0,
            ingestor_response_port=0,
            ingestor_control_port=0,
            metrics_port=0,
            flink_market_data_endpoint="tcp://127.0.0.1:9",  # no pipeline in these tests,
            pipeline_heartbeat_timeout_s=0,  # so no heartbeat to require
        )
        self.relay = Relay(settings)
        self.bound = self.relay.start()
        self._thread = threading.Thread(target=self.relay.run, name="relay-loop", daemon=True)
        self._thread.start()
        self._ctx = zmq.Context()
        self._client = self._ctx.socket(zmq.REQ)
        self._client.linger = 0
        self._client.connect(self.bound.client_request)

    @property
    def endpoints(self) -> dict[str, str]:
        """The ingestor's settings for this relay (what `harness.settings` reads)."""
        return {
            "relay_work_endpoint": self.bound.ingestor_work,
            "relay_control_endpoint": self.bound.ingestor_control,
            "relay_response_endpoint": self.bound.ingestor_response,
        }

    def sample(self, name: str) -> float:
        return self.relay.metrics.sample(name, PREFIX)

    def ask(self, message: Any, reply: type[Any]) -> Any:
        self._client.send_multipart(envelope.encode(message))
        assert self._client.poll(5000), "the relay did not answer within 5 s"
        return envelope.decode(self._client.recv_multipart(), reply)

    def close(self) -> None:
        self._ctx.destroy(linger=0)
        self.relay.stop()
        self._thread.join(10)
        self.relay.close()


def submit(request_id: str, start_ms: int) -> SubmitHistoricalRequest:
    return SubmitHistoricalRequest(
        request_id=request_id,
        client_id="c1",
        ticker="BINANCE:BTC/USDT",
        period_seconds=60,
        start_time_ms=start_ms,
        end_time_ms=start_ms + 10 * MIN,
    )


def until(condition: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Poll `condition` every 50 ms; the seconds it took. Fails after `timeout_s`."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.05)
    return time.monotonic() - start


@contextmanager
def running_relay() -> Iterator[RelayForTest]:
    relay = RelayForTest()
    try:
        yield relay
    finally:
        relay.close()


def test_client_is_refused_while_the_exchange_is_down_and_served_after_recovery(
    harness: Any, run_ingestor: Any
) -> None:
    """Default health settings and the default first retry delays (0.5 s, 1 s): one
    request's third failed call opens the breaker; with no request left in flight,
    only the probe (every 3 s) can see the recovery."""
    sim = harness.sim
    start = (sim.now_ms() // MIN - 30) * MIN
    figures: dict[str, float] = {}

    async def scenario(relay: RelayForTest) -> None:
        settings = harness.settings(
            relay, retry={"base_delay_s": 0.5, "max_delay_s": 2.0, "max_attempts": 3}
        )
        assert settings.health.failure_threshold == 3  # the defaults are what is measured
        ingestor = Ingestor(settings)
        task = await run_ingestor(ingestor)
        try:
            await asyncio.to_thread(
                until,
                lambda: relay.sample("relay_ingestors_alive") == 1,
                15,
                "the relay hears the ingestor's IngestorStatus",
            )
            ok = await asyncio.to_thread(relay.ask, submit("before", start), SubmitResponse)
            assert ok.status == Status.OK
            await asyncio.to_thread(
                until,
                lambda: ingestor.stats.outcomes[("OK", "")] == 1 and not ingestor.jobs_in_flight,
                30,
                "the first request is done",
            )

            sim.add_fault("unavailable", count=1_000_000, exchange="binance")
            first = await asyncio.to_thread(relay.ask, submit("first-down", start), SubmitResponse)
            assert first.status == Status.OK  # nothing has failed yet: this one is taken
            figures["open_s"] = await asyncio.to_thread(
                until,
                lambda: relay.sample("relay_exchange_breaker_open") == 1,
                15,
                "the breaker opens",
            )
            refused = await asyncio.to_thread(relay.ask, submit("refused", start), SubmitResponse)
            assert (refused.status, refused.error_code) == (
                Status.REJECTED,
                "exchange_unavailable",
            )
            assert "exchange BINANCE is failing" in refused.reason
            assert settings.ingestor_id in refused.reason
            assert "exchange_unavailable" in refused.reason
            legacy = OHLCRequest(
                request_id="legacy-down",
                ticker="BINANCE:BTC/USDT",
                period_seconds=60,
                start_time_ms=start,
                end_time_ms=start + 10 * MIN,
            )
            refusal = await asyncio.to_thread(relay.ask, legacy, Response)
            assert (refusal.status, refusal.error_code) == (Status.REJECTED, "exchange_unavailable")
            assert not ingestor.health.healthy("BINANCE")
            await asyncio.to_thread(
                until, lambda: ingestor.jobs_in_flight == 0, 15, "the failing request gives up"
            )
            assert ingestor.stats.outcomes[("ERROR", "exchange_unavailable")] == 1

            sim.clear_faults()
            tries = iter(range(1000))

            def accepted() -> bool:
                reply = relay.ask(submit(f"up-{next(tries)}", start), SubmitResponse)
                return reply.status == Status.OK

            figures["close_s"] = await asyncio.to_thread(until, accepted, 15, "the breaker closes")
            assert figures["open_s"] < 4.0, figures
            assert figures["close_s"] < settings.health.probe_interval_s + 2.0, figures
            assert relay.sample("relay_exchange_breaker_open") == 0
        finally:
            sim.clear_faults()
            await ingestor.stop()
            await task

    with running_relay() as relay:
        asyncio.run(scenario(relay))
    print(f"\nbreaker figures: {figures}")


def test_a_stopped_ingestor_process_is_refused_within_seconds(harness: Any, tmp_path: Path) -> None:
    """SIGSTOP: the process keeps its TCP connections, and answers nothing. Default
    status interval (2 s): refused no later than 3 intervals after its last status."""
    sim = harness.sim
    start = (sim.now_ms() // MIN - 30) * MIN
    with running_relay() as relay:
        settings = harness.settings(relay)
        assert settings.health.status_interval_ms == 2000
        config = tmp_path / "ingestor.yaml"
        config.write_text(yaml.safe_dump(settings.model_dump(mode="json")))
        env = {**os.environ, "CONFIG_PATH": str(config), "LOG_LEVEL": "WARNING"}
        proc = subprocess.Popen([sys.executable, "-m", "ingestor"], env=env)
        try:
            until(
                lambda: relay.sample("relay_ingestors_alive") == 1,
                180,  # its start: a CI run under load took 66 s to import and connect
                "the ingestor process reports to the relay",
            )
            assert relay.ask(submit("before", start), SubmitResponse).status == Status.OK
            os.kill(proc.pid, signal.SIGSTOP)
            replies: list[SubmitResponse] = []

            def refused() -> bool:
                replies.append(relay.ask(submit(f"r{len(replies)}", start), SubmitResponse))
                return replies[-1].status != Status.OK

            stopped_s = until(refused, 15, "the hung ingestor is noticed")
            assert (replies[-1].status, replies[-1].error_code) == (Status.REJECTED, "no_ingestor")
            assert stopped_s <= 3 * 2.0 + 1.0, stopped_s
            os.kill(proc.pid, signal.SIGCONT)
            resumed_s = until(
                lambda: relay.ask(submit("after", start), SubmitResponse).status == Status.OK,
                15,
                "the resumed ingestor is served again",
            )
        finally:
            os.kill(proc.pid, signal.SIGCONT)
            proc.terminate()
            proc.wait(30)
    print(f"\nSIGSTOP figures: refused after {stopped_s:.2f} s, served {resumed_s:.2f} s "
          f"after SIGCONT; reason: {replies[-1].reason}")  # fmt: skip


def test_an_ingestor_that_cannot_reach_kafka_gets_its_exchange_refused_with_why(
    harness: Any, run_ingestor: Any
) -> None:
    """Nothing it fetched would reach the pipeline: the relay refuses the exchange
    `kafka_unavailable` (its IngestorStatus says why) instead of an OK and a timeout."""
    from infra.testing import free_port

    figures: dict[str, float] = {}

    async def scenario(relay: RelayForTest) -> None:
        settings = harness.settings(
            relay,
            kafka={"bootstrap_servers": f"127.0.0.1:{free_port()}", "ensure_topics": False},
            claims={"enabled": False},
        )
        ingestor = Ingestor(settings)
        task = await run_ingestor(ingestor)
        try:
            started = time.monotonic()

            def refused() -> bool:
                reply = relay.ask(submit("no-kafka", 0), SubmitResponse)
                return reply.error_code == "kafka_unavailable"

            await asyncio.to_thread(until, refused, 15, "the relay refuses kafka_unavailable")
            figures["refused_after_start_s"] = time.monotonic() - started
            reply = await asyncio.to_thread(relay.ask, submit("again", 0), SubmitResponse)
            assert reply.status == Status.REJECTED
            assert settings.ingestor_id in reply.reason and "brokers are down" in reply.reason
            assert ingestor.sink is not None and ingestor.sink.problem is not None
        finally:
            await ingestor.stop()
            await task

    with running_relay() as relay:
        asyncio.run(scenario(relay))
    print(f"\nkafka figures: {figures}")
