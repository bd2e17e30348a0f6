"""`make run`'s supervision on real processes: a relay killed with SIGKILL, or frozen
with SIGSTOP (a hang: its liveness probe fails), is brought back by `supervise` alone,
and then answers clients again.

The relay stands for every component: a crash of the pipeline or the ingestor goes
through the same `supervise` -> `Platform.restart` -> `LocalStack.up` path, and the
relay restarts in seconds where Spark takes minutes on two shared cores.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq

from infra.localstack import Ports, StackConfig
from infra.localstack.components import Component
from infra.localstack.endpoints import StackEndpoints
from infra.platform.__main__ import supervise
from infra.platform.config import PlatformConfig, ServicePorts
from infra.platform.services import Relay
from infra.platform.supervisor import Platform
from mdproto import envelope
from mdproto.messages import Status, SubmitHistoricalRequest, SubmitResponse

pytestmark = pytest.mark.stack


class RelayPlatform(Platform):
    """The stack and the relay: the platform's phases, without Spark and the clients."""

    def _services(self, config: StackConfig, endpoints: StackEndpoints) -> list[Component]:
        return [Relay(config, endpoints, self.config)]

    def _relay_clients(self, config: StackConfig, endpoints: StackEndpoints) -> list[Component]:
        return []


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[Platform]:
    config = PlatformConfig(
        data_dir=tmp_path,
        ports=ServicePorts.free(),
        start_timeout_s=300,
        liveness_period_s=1,  # a hang noticed in seconds, not the default 20-35 s
        liveness_failures=3,
    )
    stack_config = StackConfig(data_dir=tmp_path, ports=Ports.free())
    with RelayPlatform(config, stack_config=stack_config, use_simulator=True) as running:
        yield running


def submit(endpoint: str) -> SubmitResponse:
    """One history request to the relay, as a client sends it."""
    request = SubmitHistoricalRequest(
        request_id="after-restart",
        client_id="c1",
        ticker="BINANCE:BTC/USDT",
        period_seconds=60,
        start_time_ms=1_700_000_000_000,
        end_time_ms=1_700_000_600_000,
    )
    with zmq.Context() as ctx, ctx.socket(zmq.REQ) as sock:
        sock.linger = 0
        sock.connect(endpoint)
        sock.send_multipart(envelope.encode(request))
        assert sock.poll(10_000), "the relay did not answer within 10 s"
        return envelope.decode(sock.recv_multipart(), SubmitResponse)


def relay_pid(platform: Platform) -> int | None:
    return next(
        (s.pid for s in platform.status() if s.name == "relay" and s.state == "running"), None
    )


def supervised(platform: Platform, fault: Callable[[], object]) -> tuple[list[str], float]:
    """Run `supervise` as `make run` does while `fault` breaks the relay; what it said,
    and the seconds from the fault until it said the relay is ready again."""
    said: list[str] = []
    back = threading.Event()

    def say(msg: str) -> None:
        said.append(msg)
        if msg == "[platform] relay is ready again":
            back.set()

    stop = threading.Event()
    ended: list[str] = []
    loop = threading.Thread(
        target=lambda: ended.append(supervise(platform, stop, say=say, poll_s=0.2)),
        name="supervise",
    )
    loop.start()
    try:
        fault()
        t0 = time.monotonic()
        assert back.wait(120), f"the relay is not back within 120 s; said: {said}"
        took = time.monotonic() - t0
    finally:
        stop.set()
        loop.join(60)
    assert ended == [""], "the supervisor stops when asked, not before"
    return said, took


def test_a_killed_relay_is_restarted_by_the_supervisor_and_serves_again(
    platform: Platform,
) -> None:
    killed = relay_pid(platform)
    said, took = supervised(platform, lambda: platform.kill("relay"))

    assert said[0].startswith("[platform] relay died (killed by SIGKILL); last lines of ")
    assert str(platform.config.data_dir / "logs" / "relay.log") in said[0]
    assert "  | " in said[0]  # the log tail, indented
    assert said[1] == "[platform] restarting relay (crash 1 within 300 s; at 3 the platform stops)"
    assert relay_pid(platform) not in (None, killed)
    no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with no_proxy.open(f"{platform.endpoints.relay_metrics}/healthz", timeout=5) as r:
        assert r.status == 200
    reply = submit(platform.endpoints.request)  # no pipeline here: refused, with the reason
    assert (reply.status, reply.error_code) == (Status.REJECTED, "pipeline_unavailable")
    print(f"relay back {took:.1f} s after its SIGKILL")


def test_a_frozen_relay_is_restarted_by_the_supervisor_and_counted_as_a_crash(
    platform: Platform,
) -> None:
    frozen = relay_pid(platform)
    assert frozen is not None
    try:  # SIGSTOP: alive, its sockets open, mute
        said, took = supervised(platform, lambda: platform.send_signal("relay", signal.SIGSTOP))
    finally:
        with contextlib.suppress(ProcessLookupError):  # not restarted: let `down` stop it
            os.killpg(frozen, signal.SIGCONT)

    log = platform.config.data_dir / "logs" / "relay.log"
    hung = "[platform] relay is hung (/healthz unanswered 3 times in a row over "
    assert said[0].startswith(hung)
    assert f"); killed it; last lines of {log}:" in said[0]
    assert "  | " in said[0]  # the log tail, indented
    assert said[1] == "[platform] restarting relay (crash 1 within 300 s; at 3 the platform stops)"
    assert relay_pid(platform) not in (None, frozen)
    reply = submit(platform.endpoints.request)  # it answers again (no pipeline: a refusal)
    assert (reply.status, reply.error_code) == (Status.REJECTED, "pipeline_unavailable")
    print(f"relay back {took:.1f} s after its SIGSTOP")
