"""The platform's readiness samples are what the relay exports, read over HTTP."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import generate_latest

from infra.platform.metrics import INGESTOR_SUBSCRIBED, PIPELINE_SERVES_HISTORY, metric_sample
from relay.metrics import RelayMetrics


@pytest.fixture
def relay_page() -> Iterator[tuple[RelayMetrics, str]]:
    """A relay's metrics registry served on a loopback port, as the relay serves it."""
    metrics = RelayMetrics()

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = generate_latest(metrics.registry)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield metrics, f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()


def test_the_readiness_samples_follow_the_relay_gauges(
    relay_page: tuple[RelayMetrics, str],
) -> None:
    metrics, url = relay_page
    metrics.pipeline_serving.labels(work="history").set(0)
    metrics.ingestor_subscriptions.labels(socket="work").set(0)
    assert metric_sample(url, PIPELINE_SERVES_HISTORY) == 0
    assert metric_sample(url, INGESTOR_SUBSCRIBED) == 0
    metrics.pipeline_serving.labels(work="history").set(1)
    metrics.ingestor_subscriptions.labels(socket="work").set(2)
    assert metric_sample(url, PIPELINE_SERVES_HISTORY) == 1
    assert metric_sample(url, INGESTOR_SUBSCRIBED) == 2


def test_a_missing_sample_or_service_reads_none(relay_page: tuple[RelayMetrics, str]) -> None:
    _, url = relay_page
    assert metric_sample(url, PIPELINE_SERVES_HISTORY) is None  # no label set yet
    closed = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = closed.server_address[1]
    closed.server_close()
    assert metric_sample(f"http://127.0.0.1:{port}/metrics", PIPELINE_SERVES_HISTORY) is None
