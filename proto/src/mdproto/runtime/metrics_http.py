"""The one observability convention: `GET /metrics` and `GET /healthz` on every service.

Each service owns a Prometheus registry and a health callable; this serves both
from a daemon thread, so a scrape never waits on the service's own loop. The
same operator-facing port can take `POST` commands (`commands`), never offered
on a client-facing socket. Needs the `metrics` extra (prometheus-client).
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)


#: An operator command: (query parameters, request body) -> (HTTP status, JSON answer).
Command = Callable[[dict[str, str], bytes], tuple[int, dict[str, Any]]]


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
        commands: dict[str, Command] | None = None,
    ) -> None:
        self._server = ThreadingHTTPServer((host, port), _handler(registry, health, commands or {}))
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
    registry: CollectorRegistry, health: Callable[[], Health], commands: dict[str, Command]
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            path, _, query = self.path.partition("?")
            command = commands.get(path)
            if command is None:
                self._send(404, "text/plain", b"no such command\n")
                return
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(min(length, 64 * 1024))
            params = {k: v[-1] for k, v in urllib.parse.parse_qs(query).items()}
            try:
                code, answer = command(params, body)
            except Exception as exc:  # a bug in a command is a 500 with a reason, not a hang
                log.exception("operator command %s failed", path)
                code, answer = 500, {"error": f"{type(exc).__name__}: {exc}"}
            self._send(code, "application/json", json.dumps(answer).encode())

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
