"""The real `relay` process: the spec's config file, env overrides, clean SIGTERM/SIGINT."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import zmq

from infra.localstack.config import free_ports
from mdproto import envelope, topics
from mdproto.messages import PipelineStatus, Status, SubmitHistoricalRequest, SubmitResponse

if TYPE_CHECKING:
    from conftest import FakePipeline

RELAY = Path(sys.executable).parent / "relay"
SPEC_CONFIG = """\
bind_address: "tcp://*"
client_request_port: 5559
market_data_pub_port: 5558
ingestor_work_port: 5555
ingestor_response_port: 5556
flink_market_data_endpoint: "tcp://flink-jobmanager:5557"
request_timeout_secs: 30
high_water_mark: 10000
"""
PORT_KEYS = [
    "CLIENT_REQUEST_PORT",
    "MARKET_DATA_PUB_PORT",
    "INGESTOR_WORK_PORT",
    "INGESTOR_RESPONSE_PORT",
    "INGESTOR_CONTROL_PORT",
    "METRICS_PORT",
]


@pytest.fixture
def relay_env(tmp_path: Path, pipeline: FakePipeline) -> dict[str, str]:
    """The spec's exact file as CONFIG_PATH; ports moved to free ones by env overrides."""
    config = tmp_path / "config.yaml"
    config.write_text(SPEC_CONFIG)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    env.update(
        CONFIG_PATH=str(config),
        LOG_LEVEL="INFO",
        RELAY_BIND_ADDRESS="tcp://127.0.0.1",
        RELAY_METRICS_HOST="127.0.0.1",
        RELAY_FLINK_MARKET_DATA_ENDPOINT=pipeline.endpoint,
    )
    for key, port in zip(PORT_KEYS, free_ports(len(PORT_KEYS)), strict=True):
        env[f"RELAY_{key}"] = str(port)
    return env


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _start(env: dict[str, str], processes: list[subprocess.Popen[str]]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [str(RELAY)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    processes.append(proc)
    return proc


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_real_process_serves_and_shuts_down_cleanly(
    relay_env: dict[str, str],
    pipeline: FakePipeline,
    processes: list[subprocess.Popen[str]],
    ctx: zmq.Context[zmq.Socket[bytes]],
    signum: signal.Signals,
) -> None:
    proc = _start(relay_env, processes)
    client = ctx.socket(zmq.REQ)
    client.linger = 0
    client.connect(f"tcp://127.0.0.1:{relay_env['RELAY_CLIENT_REQUEST_PORT']}")
    request = SubmitHistoricalRequest(
        request_id="cli-1",
        client_id="c1",
        ticker="BINANCE:BTC/USDT",
        period_seconds=60,
        start_time_ms=0,
        end_time_ms=3_600_000,
    )
    # An ingestor for BINANCE: without one the relay refuses the request (no_ingestor).
    ingestor = ctx.socket(zmq.SUB)
    ingestor.linger = 0
    ingestor.connect(f"tcp://127.0.0.1:{relay_env['RELAY_INGESTOR_WORK_PORT']}")
    ingestor.subscribe(b"BINANCE:")
    # And a pipeline heartbeat: without one it refuses it too (pipeline_unavailable).
    heartbeat = PipelineStatus(interval_ms=1000, history=True, triggers=True)
    deadline = time.monotonic() + 20
    while True:  # until the relay has bound, seen the ingestor subscribe and the heartbeat
        pipeline.poll_subscriptions()
        if topics.PIPELINE_STATUS in pipeline.subscriptions:
            pipeline.publish(topics.PIPELINE_STATUS, heartbeat)
        client.send_multipart(envelope.encode(request))  # queued until the relay has bound
        assert client.poll(20_000), "relay did not answer"
        reply = envelope.decode(client.recv_multipart(), SubmitResponse)
        waiting = reply.error_code in ("no_ingestor", "pipeline_unavailable")
        if not waiting or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert (reply.status, reply.request_id) == (Status.OK, "cli-1")
    sub = ctx.socket(zmq.SUB)
    sub.linger = 0
    sub.connect(f"tcp://127.0.0.1:{relay_env['RELAY_MARKET_DATA_PUB_PORT']}")
    sub.subscribe(b"RESPONSE:c1")
    pipeline.wait_subscribed("RESPONSE:c1")  # the proxy runs in the real process too

    proc.send_signal(signum)
    output, _ = proc.communicate(timeout=15)
    assert proc.returncode == 0, output
    assert f"{signum.name} received" in output
    assert "Forwarded request to ingestors: prefix=BINANCE:, request_id=cli-1" in output
    assert "shutdown complete" in output
    # No listener is left: the ports can be bound again at once (SO_REUSEADDR, as
    # libzmq does, tolerates the TIME_WAIT of the test's own connections).
    for key in PORT_KEYS:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", int(relay_env[f"RELAY_{key}"])))


def test_bad_config_exits_with_an_error(
    relay_env: dict[str, str], tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("client_request_prot: 5559\n")
    proc = _start({**relay_env, "CONFIG_PATH": str(bad)}, processes)
    output, _ = proc.communicate(timeout=15)
    assert proc.returncode == 2
    assert "client_request_prot" in output


def test_port_in_use_exits_with_an_error(
    relay_env: dict[str, str], processes: list[subprocess.Popen[str]]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", int(relay_env["RELAY_INGESTOR_WORK_PORT"])))
        taken.listen()
        proc = _start(relay_env, processes)
        output, _ = proc.communicate(timeout=15)
    assert proc.returncode == 1
    assert "failed to start" in output


@pytest.mark.parametrize(
    ("environ", "level"),
    [
        ({}, "INFO"),
        ({"RUST_LOG": "relay=debug"}, "DEBUG"),  # the spec's own variable and syntax
        ({"RUST_LOG": "warn"}, "WARNING"),
        ({"RUST_LOG": "zmq=trace,relay=error"}, "ERROR"),
        ({"RUST_LOG": "relay=info", "LOG_LEVEL": "debug"}, "DEBUG"),  # ours wins
        ({"RUST_LOG": "other=debug"}, "INFO"),  # nothing for the relay: the default, said so
    ],
)
def test_log_level_honours_the_specs_rust_log(environ: dict[str, str], level: str) -> None:
    from relay.cli import log_level

    got, source = log_level(environ)
    assert got == level
    if environ.get("RUST_LOG") == "other=debug":
        assert "names no level for relay" in source
