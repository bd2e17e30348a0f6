"""Compose's Kafka health check, run on this host against a real broker (the local
stack's): healthy when the broker answers ApiVersions, unhealthy when nothing listens
or what answers is not a Kafka broker."""

from __future__ import annotations

import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from infra.localstack import StackEndpoints
from infra.localstack.config import free_ports

pytestmark = pytest.mark.stack

COMPOSE_FILE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


def health_check(port: int) -> subprocess.CompletedProcess[bytes]:
    """The kafka service's healthcheck command, aimed at ``port`` on this host."""
    compose = yaml.safe_load(COMPOSE_FILE.read_text())
    kind, shell, flag, script = compose["services"]["kafka"]["healthcheck"]["test"]
    assert (kind, flag) == ("CMD", "-c")
    script = script.replace("$$", "$")  # compose's escape of a literal $
    assert "/dev/tcp/127.0.0.1/9092" in script
    script = script.replace("/dev/tcp/127.0.0.1/9092", f"/dev/tcp/127.0.0.1/{port}")
    return subprocess.run([shell, flag, script], capture_output=True, timeout=30)


@pytest.fixture
def not_kafka() -> Iterator[int]:
    """A port where a server answers every request with 16 bytes that are not Kafka's."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def answer() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(64)
            conn.sendall(b"HTTP/1.1 400 Bad")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    yield port
    server.close()


def test_a_broker_that_answers_is_healthy(stack_endpoints: StackEndpoints) -> None:
    port = int(stack_endpoints.kafka_bootstrap.rsplit(":", 1)[1])
    assert health_check(port).returncode == 0


def test_no_broker_is_unhealthy() -> None:
    [port] = free_ports(1)
    assert health_check(port).returncode != 0


def test_a_server_that_is_not_kafka_is_unhealthy(not_kafka: int) -> None:
    assert health_check(not_kafka).returncode != 0
