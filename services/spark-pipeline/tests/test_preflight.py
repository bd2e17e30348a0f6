"""Startup checks fail fast and name the endpoint (no stack needed: dead ports, tiny HTTP)."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator

import pytest

from pipeline import preflight
from pipeline.config import Settings


def _dead_port() -> int:
    """A port nothing listens on (bound then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def http_server() -> Iterator[tuple[str, dict[str, int]]]:
    """An HTTP server answering every GET with the status in ``state['status']``."""
    state = {"status": 200, "hits": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state["hits"] += 1
            self.send_response(state["status"])
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", state
    server.shutdown()
    server.server_close()


def test_unreachable_kafka_names_the_bootstrap() -> None:
    bootstrap = f"127.0.0.1:{_dead_port()}"
    with pytest.raises(preflight.StartupError, match=f"Kafka is unreachable at {bootstrap}"):
        preflight.check_kafka(bootstrap, 1.0, ["market.ticks"])


def test_unreachable_catalog_names_the_uri() -> None:
    uri = f"http://127.0.0.1:{_dead_port()}"
    with pytest.raises(preflight.StartupError, match=f"catalog is unreachable at {uri}"):
        preflight.check_catalog(uri, "s3://w/", 1.0)


def test_catalog_must_answer_its_config_endpoint(http_server: tuple[str, dict[str, int]]) -> None:
    uri, state = http_server
    preflight.check_catalog(uri, "s3://w/", 2.0)
    state["status"] = 503
    with pytest.raises(preflight.StartupError, match="answered HTTP 503"):
        preflight.check_catalog(uri, "s3://w/", 2.0)


def test_s3_any_http_answer_is_reachable(http_server: tuple[str, dict[str, int]]) -> None:
    uri, state = http_server
    state["status"] = 403
    preflight.check_s3(uri, 2.0)
    assert state["hits"] == 1
    dead = f"http://127.0.0.1:{_dead_port()}"
    with pytest.raises(preflight.StartupError, match=f"S3 store is unreachable at {dead}"):
        preflight.check_s3(dead, 1.0)


def test_check_all_stops_at_kafka_first() -> None:
    bootstrap = f"127.0.0.1:{_dead_port()}"
    settings = Settings.model_validate(
        {"kafka": {"bootstrap": bootstrap, "connect_timeout_s": 1.0}}
    )
    with pytest.raises(preflight.StartupError, match=r"kafka\.bootstrap"):
        preflight.check_all(settings)
