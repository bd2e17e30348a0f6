"""Issue 45 item 1: a history request already acknowledged when the pipeline hangs ends
in seconds with `pipeline_unavailable`, and a retry once it is back is answered.

A real relay (in this process) and the real `mdclient` CLI (a process of its own) face
a pipeline stand-in (e2e/pipeline_standin.py: the heartbeat, and an ingestor's
subscription) that is frozen with SIGSTOP. Nothing needs Kafka or Spark: the point is
the relay's down report and the SDK's reaction to it, with the process really frozen.
Bounds are generous deadlines on readiness, never timed assertions; the times
measured are printed (`pytest -s`).
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mdclient.exit_codes import ExitCode
from mdproto.error_codes import PIPELINE_UNAVAILABLE
from relay import Relay, RelaySettings

STANDIN = Path(__file__).with_name("pipeline_standin.py")
DEADLINE_S = 60.0  # generous: readiness and exits are awaited, not timed
ARGS = ["history", "BINANCE:BTC/USDT", "--start", "2026-11-20T00:00", "--end", "2026-11-20T01:00"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@dataclass
class Stack:
    relay: Relay
    standin: subprocess.Popen[str]
    lines: queue.Queue[str]

    def serving(self) -> bool:
        return bool(self.relay.health().details["pipeline_serving"]["history"])

    def next_line(self) -> str:
        return self.lines.get(timeout=DEADLINE_S)

    def cli(self) -> subprocess.Popen[str]:
        endpoints = self.relay.endpoints
        assert endpoints is not None
        env = {k: v for k, v in os.environ.items() if k != "CONFIG_PATH"}
        argv = [
            sys.executable, "-m", "mdclient", *ARGS, "--timeout", "120", "--attempts", "1",
            "--request-endpoint", endpoints.client_request,
            "--market-data-endpoint", endpoints.market_data,
        ]  # fmt: skip
        return subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)


@pytest.fixture
def stack() -> Iterator[Stack]:
    pub_port = free_port()
    settings = RelaySettings.loopback(
        f"tcp://127.0.0.1:{pub_port}", pipeline_heartbeat_timeout_s=5.0
    )
    relay = Relay(settings)
    endpoints = relay.start()
    loop = threading.Thread(target=relay.run, name="relay-loop", daemon=True)
    loop.start()
    standin = subprocess.Popen(
        [sys.executable, str(STANDIN), str(pub_port), endpoints.ingestor_work],
        stdout=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert standin.stdout is not None
        for line in standin.stdout:
            lines.put(line.strip())

    threading.Thread(target=read, name="standin-stdout", daemon=True).start()
    try:
        yield Stack(relay, standin, lines)
    finally:
        standin.send_signal(signal.SIGCONT)  # a stopped process does not die of SIGTERM
        standin.kill()
        standin.wait()
        relay.stop()
        loop.join(timeout=10)
        relay.close()


def test_a_request_in_flight_when_the_pipeline_freezes_ends_with_pipeline_unavailable(
    stack: Stack,
) -> None:
    assert stack.next_line() == "ready"
    wait_until(stack.serving, "the relay to hear the stand-in's heartbeat")

    # Acknowledged, and held by the stand-in: then it freezes.
    cli = stack.cli()
    held = stack.next_line()
    assert held.startswith("held "), held
    stack.standin.send_signal(signal.SIGSTOP)
    frozen_at = time.monotonic()
    _, err = cli.communicate(timeout=DEADLINE_S)
    ended_s = time.monotonic() - frozen_at
    assert cli.returncode == ExitCode.FAILED, err
    assert f"[{PIPELINE_UNAVAILABLE}]" in err and held.split()[1] in err, err
    assert "in flight" in err and "heartbeat" in err, err

    # Back: the same command, retried, is accepted and answered (NOT_FOUND: exit 6).
    stack.standin.send_signal(signal.SIGCONT)
    wait_until(stack.serving, "the relay to hear the stand-in again")
    retry = stack.cli()
    assert stack.next_line().startswith("answered ")
    _, retry_err = retry.communicate(timeout=DEADLINE_S)
    assert retry.returncode == ExitCode.NOT_FOUND, retry_err

    # The check: frozen 2 s before the submit. Accepted (the relay has not
    # noticed yet) or refused (it has): either way `pipeline_unavailable`.
    stack.standin.send_signal(signal.SIGSTOP)
    frozen_at = time.monotonic()
    time.sleep(2)  # the scenario's 2 s, not a synchronisation
    late = stack.cli()
    _, late_err = late.communicate(timeout=DEADLINE_S)
    late_s = time.monotonic() - frozen_at
    assert late.returncode in (ExitCode.REJECTED, ExitCode.FAILED), late_err
    assert f"[{PIPELINE_UNAVAILABLE}]" in late_err, late_err
    print(
        f"\nin flight: the CLI exited {ended_s:.1f} s after the freeze; frozen 2 s before "
        f"the submit: exited {late_s:.1f} s after the freeze (exit {late.returncode})"
    )
