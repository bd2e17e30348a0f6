"""The one observability convention: `GET /metrics` and `GET /healthz` on every service.

Each service owns a Prometheus registry and a health callable; this serves both
from a daemon thread, so a scrape never waits on the service's own loop. Needs
the `metrics` extra (prometheus-client).
"""

from __future__ import annotations

import json
import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Health:
    """`ok` decides the status code (200/503); `details` are the JSON body's other fields."""

    ok: bool
    details: dict[str, Any] = field(default_factory=dict)


class MetricsServer:
    """GET /metrics (Prometheus text format) and GET /healthz (JSON; 503 when unhealthy)."""

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        health: Callable[[], Health],
        *,
        name: str = "metrics-http",
    ) -> None:
        self._server = ThreadingHTTPServer((host, port), _handler(registry, health))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def _serve(self) -> None:
        # Signals belong to the service's main thread (its clean shutdown), not to this one.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        self._server.serve_forever(poll_interval=0.5)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def _handler(
    registry: CollectorRegistry, health: Callable[[], Health]
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(registry))
            elif path in ("/healthz", "/health"):
                try:
                    state = health()
                except Exception as exc:  # a broken probe is an unhealthy service, not a 500
                    state = Health(False, {"error": f"{type(exc).__name__}: {exc}"})
                body = json.dumps({"status": "ok" if state.ok else "unhealthy", **state.details})
                self._send(200 if state.ok else 503, "application/json", body.encode())
            else:
                self._send(404, "text/plain", b"not found: try /metrics or /healthz\n")

        def _send(self, code: int, content_type: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("http: " + format, *args)

    return Handler
