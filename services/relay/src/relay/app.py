"""The relay: sockets wired to the parts that handle them by one event loop.

    clients REQ/DEALER -> ROUTER :5559 -> ClientRequests (client_requests.py)
        |-> SubmitHistoricalRequest -> validation -> SubmitResponse at once
        |       '-> DataRequest{HISTORICAL}, topic "BINANCE:" -> Ingestors -> XPUB :5555
        |-> CEPTriggerRequest -> TriggerSink (Kafka cep.triggers; LIST answered from it)
        |       '-> CEPTriggerAck OK once Kafka has it (the delivery wakes the loop)
        |       '-> tickers with triggers stay live (LiveFeeds pins them)
        '-> OHLCRequest -> pending map + DataRequest{legacy_sync} -> XPUB :5555
    ingestors DEALER -> ROUTER :5556 -> DataResponse -> ClientRequests: Response to the client
                                     |-> IngestorStatus -> Ingestors (liveness, breaker)
                                     '-> FeedStatus -> LiveFeeds -> tap -> {ticker}|status
    ingestors SUB -> XPUB :5555/:5560 subscriptions -> Ingestors (who serves which exchange)
        '-> every second, per exchange served since start: ExchangeServing on
            `INGESTORS:{exchange}|status` (exchange_serving.py), for waiting clients
    pipeline PUB :5557 <- XSUB <== libzmq proxy thread ==> XPUB :5558 <- clients SUB
                      '<- SUB `PIPELINE:status` -> PipelineHeartbeats (pipeline_status.py):
                          no fresh heartbeat = history submits and triggers refused,
                          and a down report on `PIPELINE:status` for waiting clients
        '-> subscription tap (inproc XPUB the XSUB also feeds) -> LiveFeeds (live_feeds.py)
            |-> DataRequest{REALTIME} -> XPUB :5555 (start, refresh, ingestor joined)
            |-> FeedStatus{REFUSED} on `{ticker}|status` (a period the pipeline does not serve)
            '-> IngestorControl{CANCEL_REALTIME} -> XPUB :5560 (after the grace period)

This module owns the sockets, the loop and the lifecycle; ingestors.py,
client_requests.py and live_feeds.py turn messages into the pure modules'
decisions and back. Only the legacy flow keeps per-request state (feed
statuses keep one last value per live ticker). The loop never raises on input:
whatever arrives is answered (where the peer's socket needs an answer),
counted and logged.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeAlias

import zmq

from mdproto import envelope, topics
from mdproto.error_codes import BAD_STATUS, UNEXPECTED_TYPE
from mdproto.errors import ProtocolError
from mdproto.messages import DataResponse, FeedStatus, IngestorStatus
from mdproto.runtime.metrics_http import Health, MetricsServer
from relay import curve, sockets
from relay.client_requests import ClientRequests
from relay.config import RelaySettings
from relay.exchange_serving import ExchangeServingReports
from relay.ingestors import BadStatusError, Ingestors
from relay.live_feeds import LiveFeeds
from relay.log_throttle import LogThrottle
from relay.markets import MarketDirectory
from relay.metrics import RelayMetrics
from relay.pipeline_status import PipelineHeartbeats
from relay.sockets import Endpoints, MarketDataProxy, ProxyStats, Socket, WakeupSocket
from relay.triggers import NoTriggerStore, TriggerSink
from relay.upstream import UpstreamLinks

log = logging.getLogger(__name__)

CONFIG_UPDATE_PATH = "/control/config-update"
_BATCH = 256  # messages taken from one socket per loop turn, so none starves the rest
_POLLIN = int(zmq.POLLIN)

Handler: TypeAlias = Callable[[list[bytes], float], None]
BatchHandler: TypeAlias = Callable[[list[list[bytes]], float], None]


class Relay:
    def __init__(
        self,
        settings: RelaySettings,
        *,
        trigger_sink: TriggerSink | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        new_id: Callable[[], str] = lambda: uuid.uuid4().hex,
    ) -> None:
        s = self._s = settings
        problem = curve.exposure_problem(s.bind_address, s.published_host, s.curve_on)
        if problem is not None:
            raise curve.CurveConfigError(problem)
        self._auth = (
            curve.ClientAuth.from_files(
                s.curve_secret_key_file, s.curve_client_keys_dir, self._on_auth_refused
            )
            if s.curve_on
            else None
        )
        self._clock = clock
        self.metrics = m = RelayMetrics()
        self._sink: TriggerSink = trigger_sink or _default_sink(s)
        self.markets = _default_markets(s, m)  # market.markets reader; None without Kafka
        self._symbols = self.markets.check if self.markets is not None else None
        self._market_connections = 0
        self._live_engines = 0  # extra live engines connected to the engines port
        self._links = UpstreamLinks(s.upstreams)  # the pipeline and/or parent relays
        self._throttle = LogThrottle()
        self._wakeup = WakeupSocket()
        self._stopping = False
        self._loop_beat = now = clock()
        self._http: MetricsServer | None = None
        self.endpoints: Endpoints | None = None
        keys = self._auth.keys if self._auth else None
        ctx = self._ctx = zmq.Context()
        try:  # sockets exist from here on, so close() needs no guards; start() binds them
            self._client = sockets.client_router(ctx, s, keys)
            self._work = sockets.ingestor_xpub(ctx, s)
            self._responses = sockets.response_router(ctx, s)
            self._control = sockets.ingestor_xpub(ctx, s)
            self._market = sockets.market_xpub(ctx, s, keys)
            self._upstream = sockets.upstream_xsub(ctx, s)
            self._heartbeat_sub = sockets.pipeline_status_sub(ctx, s, topics.PIPELINE_STATUS)
            # Monitors go on before any peer can connect (no event is missed) and
            # before the sockets move to the proxy thread.
            self._market_monitor: Socket = self._market.get_monitor_socket(
                zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED
            )
            self._upstream_monitor: Socket = self._upstream.get_monitor_socket(
                zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
            )
            self._proxy = MarketDataProxy(ctx, self._upstream, self._market)
            self._pipeline = PipelineHeartbeats(
                s.pipeline_heartbeat_timeout_s, m, now, publish=self._proxy.publish,
                wall_ms=wall_ms, report_interval_s=s.stats_interval_s,
            )  # fmt: skip
            self._ingestors = Ingestors(
                s, m, self._throttle, self._work, self._control,
                clock=clock, wall_ms=wall_ms, wake=self._wakeup.wake,
            )  # fmt: skip
            self._serving = ExchangeServingReports(
                m, self._proxy.publish, wall_ms=wall_ms, report_interval_s=s.stats_interval_s
            )
            self._live = LiveFeeds(
                s, m, self._ingestors, self._proxy, check_symbol=self.check_symbol,
                trigger_tickers=self._sink.tickers,
                wall_ms=wall_ms, new_id=new_id, now=now,
            )  # fmt: skip
            self._requests = ClientRequests(
                s, m, self._throttle, self._client, self._ingestors, self._live, self._sink,
                self._pipeline, symbols=self._symbols, wall_ms=wall_ms, new_id=new_id,
                bad_frame=self._bad_frame, wake=self._wakeup.wake,
            )  # fmt: skip
        except BaseException:
            ctx.destroy(linger=0)
            raise

    # --- lifecycle ------------------------------------------------------------

    def start(self) -> Endpoints:
        """Bind everything and start the proxy thread; raises if a port is taken."""
        s = self._s
        try:
            if self._auth is not None:  # ZAP answers before a client socket can accept
                self._auth.start(self._ctx)
            self.endpoints = Endpoints(
                client_request=sockets.bind(self._client, s, s.client_request_port),
                ingestor_work=sockets.bind(self._work, s, s.ingestor_work_port),
                ingestor_response=sockets.bind(self._responses, s, s.ingestor_response_port),
                ingestor_control=sockets.bind(self._control, s, s.ingestor_control_port),
                market_data=sockets.bind(self._market, s, s.market_data_pub_port),
                upstream=self._links.describe(),
            )
            if s.engines_port is not None and s.flink_market_data_endpoint:
                engines = sockets.bind(self._upstream, s, s.engines_port)
                self.endpoints = dataclasses.replace(self.endpoints, engines=engines)
            for upstream in self._links.endpoints:
                self._upstream.connect(upstream)
                if self._pipeline.watch.enabled:  # else no heartbeat subscription goes up
                    self._heartbeat_sub.connect(upstream)
            self._proxy.start()
            self._sink.start()
            if self.markets is not None:
                self.markets.start()
            if s.metrics_port:
                self._http = MetricsServer(
                    s.metrics_host,
                    s.metrics_port,
                    self.metrics.registry,
                    self.health,
                    name="relay-metrics",
                    commands={CONFIG_UPDATE_PATH: self._config_update_command},
                )
                self._http.start()
        except BaseException:
            self.close()
            raise
        log.info(
            "relay listening: requests %s, work %s, responses %s, control %s, market data %s; "
            "upstream %s, engines %s; metrics %s; exchanges %s",
            self.endpoints.client_request,
            self.endpoints.ingestor_work,
            self.endpoints.ingestor_response,
            self.endpoints.ingestor_control,
            self.endpoints.market_data,
            self.endpoints.upstream,
            self.endpoints.engines or "not bound",
            f"http://{s.metrics_host}:{self.metrics_port}" if self._http else "off",
            ",".join(s.known_exchanges) or "any an ingestor serves",
        )
        if self._auth is not None:
            log.info(
                "CURVE on the client sockets: relay public key %s, %d client keys allowed (%s)",
                self._auth.public_key(),
                len(self._auth.allow_list),
                s.curve_client_keys_dir,
            )
        else:
            log.info("CURVE off: client sockets accept any peer in clear text (loopback only)")
        return self.endpoints

    def check_symbol(self, ticker: str, live: bool = True) -> str | None:
        """Why market metadata says `ticker` cannot be served, or None (any thread).

        None too while its exchange has no metadata (or without Kafka). `live`
        (the default, for live data) also refuses an inactive market."""
        return self._symbols(ticker, live) if self._symbols is not None else None

    @property
    def metrics_port(self) -> int:
        return self._http.port if self._http else 0

    def stop(self) -> None:
        """Ask the loop to finish (any thread, signal handlers included)."""
        self._stopping = True
        self._wakeup.wake()

    def close(self) -> None:
        """Stop the proxy thread, close every socket, stop the HTTP server."""
        self._proxy.stop()
        if self._auth is not None:
            self._auth.stop()
        if not self._ctx.closed:
            self._ctx.destroy(linger=0)
        if self._http is not None:
            self._http.close()
            self._http = None
        self._sink.close()
        if self.markets is not None:
            self.markets.close()
        self._wakeup.close()
        log.info("relay stopped")

    def health(self) -> Health:
        """Healthy while the proxy thread runs and the loop turns (called from HTTP threads)."""
        loop_age = self._clock() - self._loop_beat
        proxy_alive = self._proxy.alive
        m = self.metrics
        details: dict[str, Any] = {
            "proxy_alive": proxy_alive,
            "loop_age_s": round(loop_age, 3),
            "upstream_connected": bool(m.sample("relay_upstream_connected")),
            "subscribed_topics": int(m.sample("relay_subscribed_topics")),
            "live_tickers": int(m.sample("relay_live_tickers")),
            "legacy_pending": int(m.sample("relay_legacy_pending")),
        }
        if self._pipeline.watch.enabled:  # informative: the relay itself is fine without it
            details["pipeline_serving"] = {
                work.value: serving
                for work, serving in self._pipeline.watch.serving(self._clock()).items()
            }
        zap_ok = self._auth is None or self._auth.alive  # dead ZAP: every handshake stalls
        if self._auth is not None:
            details["zap_alive"] = zap_ok
        # A failing market-metadata reader retries by itself; meanwhile symbols go unchecked.
        markets_ok = self.markets is None or (self.markets.alive and self.markets.failure is None)
        if self.markets is not None:
            details["markets_reader"] = self.markets.failure or "following"
        loop_ok = loop_age < 5.0 + self._s.stats_interval_s
        return Health(proxy_alive and zap_ok and markets_ok and loop_ok, details)

    # --- the loop ---------------------------------------------------------------

    def run(self) -> None:
        """Serve until stop(). Call start() first."""
        each = self._each
        handlers: dict[Socket, BatchHandler] = {
            self._client: self._requests.on_batch,  # batched: see ClientRequests.on_batch
            self._responses: each(self._on_ingestor_message),
            self._proxy.events: each(self._live.on_subscription),
            self._proxy.control: each(self._on_proxy_stats),
            self._work: each(self._on_work_subscription),
            self._control: each(self._ingestors.on_control_subscription),
            self._upstream_monitor: each(self._on_upstream_event),
            self._market_monitor: each(self._on_market_event),
            self._heartbeat_sub: each(self._on_pipeline_status),
        }
        # zmq_poll straight on a list built once; it answers in this order (the
        # handler table's, the wake-up fd last): no dict of the answer to look up.
        items: list[tuple[Socket | int, int]] = [(sock, _POLLIN) for sock in handlers]
        items.append((self._wakeup.fileno(), _POLLIN))
        next_stats = self._clock()
        while not self._stopping:
            now = self._clock()
            deadline = min(self._next_deadline(), next_stats, now + 1.0)
            for sock, _events in zmq.zmq_poll(items, math.ceil(max(0.0, deadline - now) * 1000)):
                if isinstance(sock, int):  # the wake-up fd
                    self._wakeup.drain()
                    self._ingestors.send_operator_controls()
                    self._requests.send_stored_triggers(self._clock())
                else:
                    self._drain(sock, handlers[sock])
            now = self._clock()
            if now >= deadline:  # a deadline a handler just set is met by the next turn's poll
                self._requests.expire_legacy(now)
                self._live.due(now)
            if now >= next_stats:
                self._live.sync_trigger_tickers(now)
                self._ingestors.refresh_routing(now)
                # The pipeline's word first: a host frozen whole (pipeline and ingestor)
                # is reported as the pipeline, whose heartbeat is overdue first.
                self._pipeline.refresh(now)
                self._serving.refresh(self._ingestors.served_once_verdicts(now))
            if now >= next_stats and self._proxy.alive:
                self._proxy.request_stats()
                next_stats = now + self._s.stats_interval_s
            self._loop_beat = now
        log.info("relay loop finished")

    def _next_deadline(self) -> float:
        legacy = self._requests.next_deadline()
        live = self._live.next_deadline()
        return live if legacy is None else min(live, legacy)

    def _drain(self, sock: Socket, handler: BatchHandler) -> None:
        """What waits on `sock` (at most _BATCH messages), handed over in one call."""
        batch = sockets.recv_batch(sock, _BATCH)
        if not batch:
            return
        try:
            handler(batch, self._clock())
        except Exception:  # a bug must not take the relay down; it is logged in full
            log.exception("unexpected error handling a message; continuing")

    def _each(self, handler: Handler) -> BatchHandler:
        """A batch handler calling `handler` per message, each with its own time and guard."""

        def each(batch: list[list[bytes]], _now: float) -> None:
            for frames in batch:
                try:
                    handler(frames, self._clock())
                except Exception:  # a bug must not take the relay down; it is logged in full
                    log.exception("unexpected error handling a message; continuing")

        return each

    # --- what ingestors send (:5556) and subscribe to (:5555) ----------------------

    def _on_ingestor_message(self, frames: list[bytes], now: float) -> None:
        try:
            _route, body = envelope.split_routed(frames)
            data = envelope.decode(body, max_payload=self._s.ingestor_max_payload)
            if isinstance(data, IngestorStatus):
                self._ingestors.on_status(data, now)
            elif isinstance(data, FeedStatus):
                self._live.on_feed_status(data, now)
            elif isinstance(data, DataResponse):
                self._requests.on_legacy_response(data, now)
            else:
                raise ProtocolError(
                    UNEXPECTED_TYPE, f"{data.DESCRIPTOR.name} is not sent to the relay on :5556"
                )
        except ProtocolError as exc:
            self._bad_frame("ingestor", exc, now)
        except BadStatusError as exc:
            self._bad_frame("ingestor", ProtocolError(BAD_STATUS, str(exc)), now)

    def _on_pipeline_status(self, frames: list[bytes], now: float) -> None:
        try:
            self._pipeline.on_frames(frames, now)
        except ProtocolError as exc:
            self._bad_frame("pipeline", exc, now)

    def _on_work_subscription(self, frames: list[bytes], now: float) -> None:
        joined = self._ingestors.on_work_subscription(frames)
        if joined is not None:
            self._live.ingestor_joined(joined)

    # --- operator commands (HTTP, the metrics port; never a client socket) ----------

    def config_update(self, exchange: str, config: dict[str, str]) -> str | None:
        """Queue IngestorControl{CONFIG_UPDATE} for an exchange's ingestors (any thread).

        Returns why it cannot be delivered, or None once it is queued for the loop.
        """
        return self._ingestors.config_update(exchange, config)

    def _config_update_command(
        self, params: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, Any]]:
        try:
            config = json.loads(body or b"{}")
        except ValueError as exc:
            return 400, {"error": f"the body is not JSON: {exc}"}
        if not isinstance(config, dict):
            return 400, {"error": "the body must be a JSON object"}
        exchange = params.get("exchange", "")
        refused = self.config_update(exchange, config) if exchange else "?exchange= is missing"
        if refused is not None:
            return 409, {"error": refused}
        return 202, {"exchange": exchange.upper(), "keys": sorted(config)}

    # --- proxy statistics and socket monitors ------------------------------------------

    def _on_proxy_stats(self, frames: list[bytes], now: float) -> None:
        stats = ProxyStats.parse(frames)
        if stats is not None:
            self.metrics.set_proxy_stats(stats)

    def _on_upstream_event(self, frames: list[bytes], now: float) -> None:
        address = frames[-1].decode()
        if not self._links.is_upstream(address):
            # An extra live engine's XPUB on the bound engines port: not an upstream link.
            # (Its events name the port as the engine reached it, e.g. the container's
            # own address where the relay binds 0.0.0.0: never an upstream endpoint.)
            event = sockets.monitor_event(frames)
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._live_engines += 1
            elif event == zmq.EVENT_DISCONNECTED:
                self._live_engines = max(0, self._live_engines - 1)
            else:
                return
            self.metrics.live_engines_connected.set(self._live_engines)
            log.info("a live engine %s %s (%d connected)",
                     "connected to" if event == zmq.EVENT_HANDSHAKE_SUCCEEDED else "left",
                     address, self._live_engines)  # fmt: skip
            return
        change = self._links.on_event(sockets.monitor_event(frames), address)
        if change is None:
            return
        self.metrics.upstream_connected.set(change.connected)
        if change.up:
            log.info("connected to upstream %s (%d of %d)", change.endpoint, change.connected,
                     change.total)  # fmt: skip
        else:
            self.metrics.upstream_disconnects.inc()
            log.warning("upstream %s lost; reconnecting (subscriptions are resent)",
                        change.endpoint)  # fmt: skip

    def _on_market_event(self, frames: list[bytes], now: float) -> None:
        event = sockets.monitor_event(frames)
        if event == zmq.EVENT_ACCEPTED:
            self._market_connections += 1
        elif event == zmq.EVENT_DISCONNECTED:
            self._market_connections = max(0, self._market_connections - 1)
        self.metrics.market_data_connections.set(self._market_connections)

    def _on_auth_refused(self, domain: str, key: str, peer: str) -> None:
        """A CURVE handshake with a key not on the allow-list (ZAP thread)."""
        self.metrics.auth_failures.labels(domain).inc()
        suffix = self._throttle(f"auth:{domain}", self._clock())
        if suffix is not None:
            log.warning(
                "CURVE client key %s from %s refused on the %s socket: not in %s%s",
                key,
                peer or "?",
                domain,
                self._s.curve_client_keys_dir,
                suffix,
            )

    def _bad_frame(self, socket: str, exc: ProtocolError, now: float) -> None:
        self.metrics.bad_frames.labels(socket, exc.code).inc()
        suffix = self._throttle(f"bad:{socket}:{exc.code}", now)
        if suffix is not None:
            log.warning(
                "bad frames on the %s socket: %s: %s%s", socket, exc.code, exc.reason, suffix
            )


def _default_sink(settings: RelaySettings) -> TriggerSink:
    """Kafka when configured, else a sink that refuses every trigger request."""
    k = settings.kafka
    if not k.bootstrap_servers:
        return NoTriggerStore()
    from relay.trigger_kafka import KafkaTriggerSink

    return KafkaTriggerSink(
        k.bootstrap_servers,
        k.topic_cep_triggers,
        partitions=k.topic_partitions,
        replication=k.replication_factor,
    )


def _default_markets(settings: RelaySettings, metrics: RelayMetrics) -> MarketDirectory | None:
    """The market.markets reader when Kafka is configured, else None (no symbol checks)."""
    k = settings.kafka
    if not (k.bootstrap_servers and k.topic_markets):
        return None
    return MarketDirectory(
        k.bootstrap_servers,
        k.topic_markets,
        on_snapshot=lambda snapshot: metrics.set_known_markets(snapshot.counts()),
        partitions=k.topic_partitions,
        replication=k.replication_factor,
    )
