"""The relay's Prometheus metrics (served by mdproto.runtime.metrics_http).

Each relay owns its registry (several relays can run in one test process).
Forwarding counts come from libzmq's proxy (STATISTICS, polled every
`stats_interval_s`) because the data path never touches Python; they count
frames, not messages. libzmq does not report PUB/XPUB high-water-mark drops;
the only drops the relay can observe are replies refused by the client ROUTER
(ROUTER_MANDATORY), counted in relay_reply_failures_total.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, ProcessCollector
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from relay.sockets import ProxyStats

log = logging.getLogger(__name__)

#: Gauge ``{work}``: 1 while the pipeline's heartbeat says it serves that work. The
#: platform's readiness signal (infra.platform.metrics builds its sample from this).
PIPELINE_SERVING = "relay_pipeline_serving"
#: Gauge ``{socket}``: distinct ingestor subscription prefixes on the work/control socket.
INGESTOR_SUBSCRIPTIONS = "relay_ingestor_subscriptions"


class _ProxyCollector(Collector):
    """Exposes the latest STATISTICS snapshot as counters."""

    def __init__(self) -> None:
        self.stats = ProxyStats()

    def collect(self) -> Iterator[CounterMetricFamily]:
        frames = CounterMetricFamily(
            "relay_proxy_frames",
            "Frames forwarded by the market-data proxy (a data message is 3 frames)",
            labels=["direction"],
        )
        size = CounterMetricFamily(
            "relay_proxy_bytes", "Bytes forwarded by the market-data proxy", labels=["direction"]
        )
        stats = self.stats
        frames.add_metric(["downstream"], stats.downstream_frames)
        frames.add_metric(["upstream"], stats.upstream_frames)
        size.add_metric(["downstream"], stats.downstream_bytes)
        size.add_metric(["upstream"], stats.upstream_bytes)
        yield frames
        yield size


class RelayMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        ProcessCollector(registry=r)
        self._proxy = _ProxyCollector()
        r.register(self._proxy)
        self._market_exchanges: set[str] = set()
        self.requests = Counter(
            "relay_requests", "Client requests by type and outcome", ["type", "outcome"], registry=r
        )
        self.rejections = Counter(
            "relay_rejections",
            "Rejected or failed client requests by type and error_code",
            ["type", "error_code"],
            registry=r,
        )
        self.bad_frames = Counter(
            "relay_bad_frames",
            "Frames that did not decode, by socket and error_code",
            ["socket", "error_code"],
            registry=r,
        )
        self.rate_limited = Counter(
            "relay_rate_limited", "Client requests refused by the per-client rate limit", registry=r
        )
        self.reply_failures = Counter(
            "relay_reply_failures",
            "Replies the client ROUTER could not send (unreachable peer or HWM)",
            ["reason"],
            registry=r,
        )
        self.published = Counter(
            "relay_published",
            "Messages published to ingestors, by kind",
            ["kind"],
            registry=r,
        )
        self.unrouted = Counter(
            "relay_unrouted_work",
            "Work published while no ingestor was subscribed to its exchange prefix",
            ["prefix"],
            registry=r,
        )
        self.legacy_pending = Gauge(
            "relay_legacy_pending", "Legacy requests waiting for an ingestor", registry=r
        )
        self.legacy_responses = Counter(
            "relay_legacy_responses",
            "Ingestor DataResponses by outcome (matched a waiting client or not)",
            ["outcome"],
            registry=r,
        )
        self.legacy_timeouts = Counter(
            "relay_legacy_timeouts", "Legacy requests answered with TIMEOUT", registry=r
        )
        self.subscribed_topics = Gauge(
            "relay_subscribed_topics", "Distinct topics clients subscribe to on :5558", registry=r
        )
        self.subscription_events = Counter(
            "relay_subscription_events",
            "Topic subscribe/unsubscribe edges seen on :5558",
            ["event"],
            registry=r,
        )
        self.live_tickers = Gauge(
            "relay_live_tickers", "Tickers with live data requested (incl. grace)", registry=r
        )
        self.ingestor_subscriptions = Gauge(
            INGESTOR_SUBSCRIPTIONS,
            "Distinct subscription prefixes of ingestors, by socket",
            ["socket"],
            registry=r,
        )
        self.exchange_served = Gauge(
            "relay_exchange_served",
            "1 while an ingestor subscribes to the exchange's work prefix and (if any of its "
            "ingestors sends IngestorStatus) one of them is alive",
            ["prefix"],
            registry=r,
        )
        self.breaker_open = Gauge(
            "relay_exchange_breaker_open",
            "1 while every live ingestor of the exchange reports it unhealthy (requests refused)",
            ["prefix"],
            registry=r,
        )
        self.ingestors_alive = Gauge(
            "relay_ingestors_alive",
            "Ingestors reporting the exchange whose last IngestorStatus is recent enough",
            ["prefix"],
            registry=r,
        )
        self.ingestor_statuses = Counter(
            "relay_ingestor_statuses", "IngestorStatus heartbeats received on :5556", registry=r
        )
        self.upstream_connected = Gauge(
            "relay_upstream_connected",
            "Upstreams (pipeline, parent relays) the XSUB is connected to",
            registry=r,
        )
        self.pipeline_serving = Gauge(
            PIPELINE_SERVING,
            "1 while the pipeline's heartbeat is fresh and says it serves this kind of work "
            "(history, triggers); else such requests are refused pipeline_unavailable",
            ["work"],
            registry=r,
        )
        self.pipeline_heartbeats = Counter(
            "relay_pipeline_heartbeats", "PipelineStatus heartbeats received", registry=r
        )
        self.pipeline_down_reports = Counter(
            "relay_pipeline_down_reports",
            "PipelineStatus (history and triggers false, with the reason) this relay "
            "published on PIPELINE:status in place of the pipeline's overdue heartbeat",
            registry=r,
        )
        self.ingestor_down_reports = Counter(
            "relay_ingestor_down_reports",
            "ExchangeServing with served false this relay published on "
            "INGESTORS:{exchange}|status (no live ingestor left), by prefix",
            ["prefix"],
            registry=r,
        )
        self.live_engines_connected = Gauge(
            "relay_live_engines_connected",
            "Extra live engines whose XPUB is connected to the bound engines port (ADR 0014)",
            registry=r,
        )
        self.upstream_disconnects = Counter(
            "relay_upstream_disconnects", "Times the pipeline connection was lost", registry=r
        )
        self.market_data_connections = Gauge(
            "relay_market_data_connections", "Client connections on :5558", registry=r
        )
        self.feed_statuses = Counter(
            "relay_feed_status",
            "FeedStatus messages published on {ticker}|status, by state and source "
            "(ingestor, relay = refused period, replay = to a new subscriber, repeat, dropped)",
            ["state", "source"],
            registry=r,
        )
        self.known_markets = Gauge(
            "relay_known_markets",
            "Markets listed in market.markets per exchange (state: all or active); symbols "
            "of an exchange with none are not checked",
            ["exchange", "state"],
            registry=r,
        )
        self.auth_failures = Counter(
            "relay_auth_failures",
            "CURVE handshakes refused on the client sockets (key not on the allow-list), "
            "by socket (requests, market_data)",
            ["socket"],
            registry=r,
        )
        self.trigger_sink_errors = Counter(
            "relay_trigger_sink_errors", "CEP triggers the sink could not store", registry=r
        )

    def set_known_markets(self, counts: dict[str, tuple[int, int]]) -> None:
        """Per exchange (markets, active) from a new snapshot; a vanished exchange is 0."""
        gone = {exchange: (0, 0) for exchange in self._market_exchanges - counts.keys()}
        for exchange, (known, active) in {**counts, **gone}.items():
            self.known_markets.labels(exchange, "all").set(known)
            self.known_markets.labels(exchange, "active").set(active)
        self._market_exchanges = set(counts)

    def set_proxy_stats(self, stats: ProxyStats) -> None:
        self._proxy.stats = stats

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float:
        """Current value of one sample (0 when absent), for health output and tests."""
        return self.registry.get_sample_value(name, labels or {}) or 0.0
