"""The gateway's /metrics: a real aiohttp server and a real WebSocket client, a
scripted platform (no relay), scraped over HTTP from the operator port."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.request
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from gateway import metrics
from gateway.app import create_app
from gateway.config import GatewaySettings
from gateway.messages import HistoryParams, Topic
from mdclient import SubmitRejected
from mdproto.runtime.metrics_http import MetricsServer


class Handle:
    def close(self) -> None:
        pass


class ScriptedPlatform:
    """Live topics deliver what the test pushes; every history request is refused."""

    def __init__(self) -> None:
        self.deliver: Callable[[str], None] = lambda text: None
        self.opened = threading.Event()

    def open(
        self, topic: Topic, deliver: Callable[[str], None], fail: Callable[[str, str], None]
    ) -> Handle:
        self.deliver = deliver
        self.opened.set()
        return Handle()

    def history(self, params: HistoryParams, timeout_s: float) -> Any:
        raise SubmitRejected("no ingestor serves BINANCE", error_code="no_ingestor")


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("gateway_")
    }


def test_sessions_fan_out_drops_and_history_outcomes_are_scraped() -> None:
    platform = ScriptedPlatform()
    app = create_app(GatewaySettings(), upstream=platform)  # type: ignore[arg-type]
    server = MetricsServer("127.0.0.1", 0, metrics.registry(app), lambda: metrics.health(app))
    server.start()

    async def scenario() -> tuple[dict[Any, float], dict[Any, float], int]:
        async with TestServer(app, host="127.0.0.1") as web, aiohttp.ClientSession() as http:
            base = str(web.make_url(""))
            async with http.ws_connect(f"{base}/ws") as ws:
                await ws.send_str(json.dumps({"op": "subscribe", "topic": "BINANCE:BTC/USDT|tick"}))
                assert (await ws.receive_json(timeout=5))["type"] == "subscribed"
                for n in range(3):
                    platform.deliver(json.dumps({"type": "message", "n": n}))
                for _ in range(3):
                    assert (await ws.receive_json(timeout=5))["type"] == "message"
                body = {"ticker": "BINANCE:BTC/USDT", "period": 60, "start": 0, "end": 60_000}
                async with http.post(f"{base}/history", json=body) as resp:
                    refused = resp.status
                connected = await asyncio.to_thread(scrape, server.port)
            for _ in range(100):  # until the server's handler has seen the close
                after = await asyncio.to_thread(scrape, server.port)
                if after[("gateway_websocket_sessions", ())] == 0:
                    break
                await asyncio.sleep(0.05)
            return connected, after, refused

    connected, after, refused = asyncio.run(scenario())
    server.close()
    assert refused == 422
    assert connected[("gateway_websocket_sessions", ())] == 1
    assert connected[("gateway_websocket_sessions_accepted_total", ())] == 1
    assert connected[("gateway_upstream_topics", ())] == 1
    assert connected[("gateway_upstream_messages_total", ())] == 3
    assert connected[("gateway_client_frames_total", (("state", "sent"),))] == 4  # + subscribed
    assert connected[("gateway_client_frames_total", (("state", "dropped"),))] == 0
    assert connected[("gateway_history_requests_total", (("outcome", "no_ingestor"),))] == 1
    assert after[("gateway_websocket_sessions", ())] == 0
    assert after[("gateway_websocket_sessions_accepted_total", ())] == 1
