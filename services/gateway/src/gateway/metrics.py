"""Prometheus view of the gateway, read at scrape time (mdproto.runtime.metrics_http).

Like the other services, the counters are plain integers the hot path bumps
(gateway.hub.FanoutStats, the history outcomes in gateway.app); this collector
turns them into metric families when Prometheus asks. Served on its own operator
port (`metrics_port`), never on the client-facing one.
"""

from __future__ import annotations

from collections.abc import Iterator

from aiohttp import web
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.app import HISTORY_OUTCOMES, HUB
from mdproto.runtime.metrics_http import Health


class GatewayCollector(Collector):
    def __init__(self, app: web.Application) -> None:
        self._app = app

    def collect(self) -> Iterator[Metric]:
        hub = self._app.get(HUB)  # set once the application has started
        if hub is not None:
            s = hub.stats
            yield GaugeMetricFamily(
                "gateway_websocket_sessions", "WebSocket clients connected now", value=s.sessions
            )
            yield CounterMetricFamily(
                "gateway_websocket_sessions_accepted",
                "WebSocket clients accepted",
                value=s.sessions_total,
            )
            yield GaugeMetricFamily(
                "gateway_upstream_topics",
                "Topics subscribed on the platform (one per topic, shared by its clients)",
                value=hub.topic_count,
            )
            yield CounterMetricFamily(
                "gateway_upstream_messages",
                "Messages from the platform, before fan-out",
                value=s.upstream_messages,
            )
            frames = CounterMetricFamily(
                "gateway_client_frames",
                "Frames to WebSocket clients: sent, or dropped (a slow client's oldest)",
                labels=["state"],
            )
            frames.add_metric(["sent"], s.sent)
            frames.add_metric(["dropped"], s.dropped)
            yield frames
        history = CounterMetricFamily(
            "gateway_history_requests",
            "POST /history answers by outcome (ok, or the SDK's error_code)",
            labels=["outcome"],
        )
        for outcome, count in self._app[HISTORY_OUTCOMES].copy().items():
            history.add_metric([outcome], count)
        yield history


def registry(app: web.Application) -> CollectorRegistry:
    reg = CollectorRegistry()
    reg.register(GatewayCollector(app))
    ProcessCollector(registry=reg)
    return reg


def health(app: web.Application) -> Health:
    hub = app.get(HUB)
    if hub is None:
        return Health(False, {"status": "starting"})
    return Health(True, {"topics": hub.topic_count, "sessions": hub.stats.sessions})
