"""The relay: sockets wired to the pure modules by one event loop.

    clients REQ/DEALER -> ROUTER :5559 -> validation -> SubmitResponse / CEPTriggerAck
        |-> DataRequest{HISTORICAL}, topic "BINANCE:" -> XPUB :5555 -> ingestors
        |   (symbols checked against market.markets: MarketDirectory, its own thread)
        |-> CEPTriggerRequest -> TriggerSink (Kafka cep.triggers; LIST answered from it)
        |       '-> tickers with triggers stay live (LiveSubscriptions.pin)
        '-> OHLCRequest -> pending map + DataRequest{legacy_sync} -> XPUB :5555
    ingestors DEALER -> ROUTER :5556 -> DataResponse -> pending map -> Response to the client
                                     |-> IngestorStatus -> Liveness (no_ingestor, breaker)
                                     '-> FeedStatus -> last per ticker -> tap -> {ticker}|status
    pipeline PUB :5557 <- XSUB <== libzmq proxy thread ==> XPUB :5558 <- clients SUB
        '-> subscription tap (inproc XPUB the XSUB also feeds) -> LiveSubscriptions
            |-> DataRequest{REALTIME} -> XPUB :5555 (start, refresh, ingestor joined)
            |-> FeedStatus{REFUSED} on `{ticker}|status` (a period the pipeline does not serve)
            '-> IngestorControl{CANCEL_REALTIME} -> XPUB :5560 (after the grace period)

Only the legacy flow keeps per-request state (feed statuses keep one last value
per live ticker, feedstatus.py). The loop never raises on input:
whatever arrives is answered (where the peer's socket needs an answer),
counted and logged.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import queue
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeAlias

import zmq
from google.protobuf.message import Message

from mdproto import envelope
from mdproto.errors import ProtocolError
from mdproto.messages import (
    CEPTriggerAck,
    CEPTriggerRequest,
    DataRequest,
    DataResponse,
    FeedStatus,
    IngestorControl,
    IngestorStatus,
    OHLCRequest,
    Response,
    Status,
    SubmitHistoricalRequest,
    SubmitResponse,
)
from mdproto.rules import BAD_SYMBOL
from mdproto.runtime.metrics_http import Health, MetricsServer
from mdproto.topics import parse_market_topic, status_topic
from relay import curve, sockets
from relay.config import RelaySettings
from relay.feedstatus import StatusBoard, state_name, status_ticker
from relay.legacy import Admission, PendingRequests, response_from, timeout_response
from relay.liveness import BadStatusError, Liveness, State, Verdict
from relay.markets import MarketDirectory
from relay.metrics import RelayMetrics
from relay.proxy import MarketDataProxy, ProxyStats, parse_subscription
from relay.ratelimit import TokenBuckets
from relay.sockets import Endpoints, Socket, WakeupSocket
from relay.subscriptions import Action, Announce, LiveSubscriptions
from relay.triggers import LoggingTriggerSink, TriggerSink, TriggerSinkError
from relay.validation import Policy, Rejection, check_legacy, check_submit, check_trigger

log = logging.getLogger(__name__)

RATE_LIMITED = "rate_limited"
CONFIG_UPDATE_PATH = "/control/config-update"
INTERNAL = "internal"
SINK_ERROR = "sink_error"
UNEXPECTED_TYPE = "unexpected_type"
_BATCH = 256  # messages taken from one socket per loop turn, so none starves the rest
_PUBLISHED_KIND = {"start": "realtime_start", "refresh": "realtime_refresh"}

Handler: TypeAlias = Callable[[list[bytes], float], None]


class _LogThrottle:
    """At most one log line per key per second; counts the ones it swallowed."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def __call__(self, key: str, now: float) -> str | None:
        """None: stay quiet; else a suffix for the line about suppressed repeats."""
        if now - self._last.get(key, -math.inf) < 1.0:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return None
        self._last[key] = now
        skipped = self._suppressed.pop(key, 0)
        return f" ({skipped} similar suppressed)" if skipped else ""


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
        self._wall_ms = wall_ms
        self._new_id = new_id
        self.metrics = m = RelayMetrics()
        self._sink: TriggerSink = trigger_sink or _default_sink(s, m)
        self.markets = _default_markets(s, m)  # market.markets reader; None without Kafka
        self._symbols = self.markets.check if self.markets is not None else None
        self._pinned: set[str] = set()  # tickers kept live because they have triggers
        # Label lookups cost more than the increment: bind the hot ones once.
        self._accepted = {k: m.requests.labels(k, "accepted") for k in ("submit", "legacy", "cep")}
        self._published = {
            k: m.published.labels(k)
            for k in ("historical", "legacy", "realtime_start", "realtime_refresh", "realtime_join")
        }
        self._policy = Policy.of(s.known_exchanges, s.max_candles_per_request, s.max_future_ms)
        self._pending = PendingRequests(s.max_pending_requests, s.request_timeout_s)
        self._buckets = TokenBuckets(
            s.client_rate_limit, s.client_rate_burst, s.max_tracked_clients
        )
        now = clock()
        self._live = LiveSubscriptions(
            grace=s.realtime_grace_s,
            refresh=s.realtime_refresh_s,
            known_exchanges=s.known_exchanges,
            new_id=new_id,
            now=now,
            live_periods=s.live_periods,
        )
        self._status = StatusBoard(live_periods=s.live_periods, repeat_s=s.status_repeat_s, now=now)
        self._ingestor_subs: dict[str, set[str]] = {"work": set(), "control": set()}
        self._liveness = Liveness(expiry_intervals=s.ingestor_expiry_intervals)
        self._routing: dict[str, State] = {}  # last state per prefix, logged on change
        for exchange in s.known_exchanges:  # 0 until an ingestor serves it: alertable
            m.exchange_served.labels(f"{exchange}:").set(0)
        self._market_connections = 0
        self._throttle = _LogThrottle()
        self._wakeup = WakeupSocket()
        # Operator commands arrive on HTTP threads; only the loop touches sockets.
        self._operator: queue.SimpleQueue[tuple[str, IngestorControl]] = queue.SimpleQueue()
        self._stopping = False
        self._loop_beat = now
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
            # Monitors go on before any peer can connect (no event is missed) and
            # before the sockets move to the proxy thread.
            self._market_monitor: Socket = self._market.get_monitor_socket(
                zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED
            )
            self._upstream_monitor: Socket = self._upstream.get_monitor_socket(
                zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
            )
            self._proxy = MarketDataProxy(ctx, self._upstream, self._market)
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
                upstream=s.flink_market_data_endpoint,
            )
            self._upstream.connect(s.flink_market_data_endpoint)
            self._proxy.start()
            start_sink = getattr(self._sink, "start", None)
            if start_sink is not None:
                start_sink()
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
            "upstream %s; metrics %s; exchanges %s",
            self.endpoints.client_request,
            self.endpoints.ingestor_work,
            self.endpoints.ingestor_response,
            self.endpoints.ingestor_control,
            self.endpoints.market_data,
            self.endpoints.upstream,
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
        details = {
            "proxy_alive": proxy_alive,
            "loop_age_s": round(loop_age, 3),
            "upstream_connected": bool(m.sample("relay_upstream_connected")),
            "subscribed_topics": int(m.sample("relay_subscribed_topics")),
            "live_tickers": int(m.sample("relay_live_tickers")),
            "legacy_pending": int(m.sample("relay_legacy_pending")),
        }
        zap_ok = self._auth is None or self._auth.alive  # dead ZAP: every handshake stalls
        if self._auth is not None:
            details["zap_alive"] = zap_ok
        return Health(proxy_alive and zap_ok and loop_age < 5.0 + self._s.stats_interval_s, details)

    # --- the loop ---------------------------------------------------------------

    def run(self) -> None:
        """Serve until stop(). Call start() first."""
        handlers: dict[Socket, Handler] = {
            self._client: self._on_client,
            self._responses: self._on_ingestor_response,
            self._proxy.events: self._on_market_subscription,
            self._proxy.control: self._on_proxy_stats,
            self._work: self._on_work_subscription,
            self._control: self._on_control_subscription,
            self._upstream_monitor: self._on_upstream_event,
            self._market_monitor: self._on_market_event,
        }
        poller = zmq.Poller()
        for sock in handlers:
            poller.register(sock, zmq.POLLIN)
        poller.register(self._wakeup.fileno(), zmq.POLLIN)
        next_stats = self._clock()
        while not self._stopping:
            now = self._clock()
            deadline = min(self._next_deadline(), next_stats, now + 1.0)
            ready = dict(poller.poll(math.ceil(max(0.0, deadline - now) * 1000)))
            for sock, handler in handlers.items():
                if sock in ready:
                    self._drain(sock, handler)
            if self._wakeup.fileno() in ready:
                self._wakeup.drain()
                self._send_operator_controls()
            now = self._clock()
            self._expire_legacy(now)
            self._apply(self._live.due(now))
            for status in self._status.due(now):
                self._publish_status(status, "repeat")
            if now >= next_stats:
                self._sync_trigger_tickers(now)
                self._refresh_routing(now)
            if now >= next_stats and self._proxy.alive:
                self._proxy.request_stats()
                next_stats = now + self._s.stats_interval_s
            self._loop_beat = now
        log.info("relay loop finished")

    def _next_deadline(self) -> float:
        deadlines = [self._pending.next_deadline(), self._status.next_deadline()]
        return min([self._live.next_deadline(), *(d for d in deadlines if d is not None)])

    def _drain(self, sock: Socket, handler: Handler) -> None:
        for _ in range(_BATCH):
            frames = sockets.recv_frames(sock)
            if frames is None:
                return
            try:
                handler(frames, self._clock())
            except Exception:  # a bug must not take the relay down; it is logged in full
                log.exception("unexpected error handling a message; continuing")
            if not sockets.readable(sock):
                return

    # --- client requests (:5559) ---------------------------------------------

    def _on_client(self, frames: list[bytes], now: float) -> None:
        try:
            route, body = envelope.split_routed(frames)
        except ProtocolError as exc:  # a ROUTER always prepends an identity: not expected
            self._bad_frame("client", exc, now)
            return
        try:
            reply = self._handle_request(route, body, now)
        except Exception:
            log.exception("unexpected error handling a client request")
            reply = Response(status=Status.ERROR, reason="internal error", error_code=INTERNAL)
        if reply is not None:
            self._reply(route, reply, now)

    def _handle_request(self, route: list[bytes], body: list[bytes], now: float) -> Message | None:
        """The immediate reply to one request, or None when it comes later (legacy)."""
        try:
            message: Message | None = envelope.decode(body, max_payload=self._s.max_request_payload)
            error: ProtocolError | None = None
        except ProtocolError as exc:
            message, error = None, exc
        allowed, first_refusal = self._buckets.take(route[0], now)
        if not allowed:
            self.metrics.rate_limited.inc()
            if first_refusal:
                log.warning(
                    "client %s exceeds %g requests/s: refusing",
                    route[0].hex(),
                    self._s.client_rate_limit,
                )
            return _refusal(message, RATE_LIMITED, "too many requests from this client; slow down")
        if isinstance(message, SubmitHistoricalRequest):
            return self._submit(message, now)
        if isinstance(message, OHLCRequest):
            return self._legacy_request(route, message, now)
        if isinstance(message, CEPTriggerRequest):
            return self._trigger(message, now)
        if error is None:
            assert message is not None
            error = ProtocolError(
                UNEXPECTED_TYPE, f"{message.DESCRIPTOR.name} is not a request the relay accepts"
            )
        self._bad_frame("client", error, now)
        return Response(status=Status.ERROR, reason=error.reason, error_code=error.code)

    def _submit(self, req: SubmitHistoricalRequest, now: float) -> SubmitResponse:
        outcome = check_submit(
            req, self._policy, self._wall_ms(), self._new_id, symbols=self._symbols
        )
        if outcome.work is None:
            self._rejected(
                "submit", req.request_id, outcome.reply.error_code, outcome.reply.reason, now
            )
            return outcome.reply
        unserved = self._unserved(outcome.work.topic, now)
        if unserved is not None:  # refused now, not an OK followed by minutes of silence
            self._rejected("submit", req.request_id, unserved.error_code, unserved.reason, now)
            return SubmitResponse(
                request_id=outcome.reply.request_id,
                status=Status.REJECTED,
                reason=unserved.reason,
                error_code=unserved.error_code,
            )
        self._accepted["submit"].inc()
        self._publish_work(outcome.work.topic, outcome.work.request, "historical", now)
        return outcome.reply

    def _served(self, topic: str) -> bool:
        """An ingestor subscribes to a prefix of `topic` on the work socket right now."""
        return any(topic.startswith(p) for p in self._ingestor_subs["work"])

    def _unserved(self, topic: str, now: float) -> Verdict | None:
        """Why no ingestor can take work published on `topic` now (no_ingestor,
        exchange_unavailable), or None if one can (relay.liveness has the rule)."""
        verdict = self._liveness.verdict(topic, self._served(topic), now)
        return None if verdict.state is State.SERVED else verdict

    def _trigger(self, req: CEPTriggerRequest, now: float) -> CEPTriggerAck:
        outcome = check_trigger(req, self._policy, self._wall_ms(), symbols=self._symbols)
        if not outcome.accepted:
            self._rejected(
                "cep", req.trigger_id, outcome.reply.error_code, outcome.reply.reason, now
            )
            return outcome.reply
        try:
            if req.action == CEPTriggerRequest.LIST:
                listed = self._sink.list(req.client_id, self._wall_ms())
            else:
                self._sink.submit(req)
        except TriggerSinkError as exc:
            if req.action != CEPTriggerRequest.LIST:  # the metric counts records not stored
                self.metrics.trigger_sink_errors.inc()
            log.error("CEP trigger %s not handled: %s", req.trigger_id or req.client_id, exc)
            self.metrics.rejections.labels("cep", SINK_ERROR).inc()
            return CEPTriggerAck(
                trigger_id=req.trigger_id,
                status=Status.ERROR,
                reason=str(exc),
                error_code=SINK_ERROR,
            )
        self._accepted["cep"].inc()
        if req.action == CEPTriggerRequest.LIST:
            outcome.reply.triggers.extend(listed)
        elif req.action == CEPTriggerRequest.REGISTER:
            self._sync_trigger_tickers(now)  # start its live data now, not at the next sync
        return outcome.reply

    def _sync_trigger_tickers(self, now: float) -> None:
        """Keep tickers with triggers live (the ingestor must stream them for the pipeline
        to evaluate), and let them go once their last trigger is gone."""
        tickers = getattr(self._sink, "tickers", None)
        if tickers is None:
            return
        wanted: set[str] = tickers()
        if wanted == self._pinned:
            return
        for ticker in sorted(wanted - self._pinned):
            self._apply(self._live.pin(ticker, now))
        for ticker in sorted(self._pinned - wanted):
            self._apply(self._live.unpin(ticker, now))
        self._pinned = wanted

    def _rejected(self, kind: str, request_id: str, code: str, reason: str, now: float) -> None:
        self.metrics.requests.labels(kind, "rejected").inc()
        self.metrics.rejections.labels(kind, code).inc()
        suffix = self._throttle(f"reject:{kind}:{code}", now)
        if suffix is not None:
            log.info("rejected %s request %r: %s: %s%s", kind, request_id, code, reason, suffix)

    # --- legacy synchronous flow -----------------------------------------------

    def _legacy_request(self, route: list[bytes], req: OHLCRequest, now: float) -> Response | None:
        log.info("Client request routing: legacy OHLCRequest request_id=%s", req.request_id or "-")
        checked = check_legacy(
            req, self._policy, self._wall_ms(), self._new_id, symbols=self._symbols
        )
        if isinstance(checked, Rejection):
            self._rejected("legacy", req.request_id, checked.error_code, checked.reason, now)
            return _legacy_refusal(req.request_id, checked.error_code, checked.reason)
        request_id = checked.request.request_id
        unserved = self._unserved(checked.topic, now)
        if unserved is not None:
            self._rejected("legacy", request_id, unserved.error_code, unserved.reason, now)
            return _legacy_refusal(request_id, unserved.error_code, unserved.reason)
        admission = self._pending.add(request_id, route, now)
        if admission is not Admission.ADDED:
            reason = (
                f"{self._s.max_pending_requests} legacy requests already waiting"
                if admission is Admission.FULL
                else f"request {request_id} is already waiting for an answer"
            )
            self._rejected("legacy", request_id, admission.value, reason, now)
            return _legacy_refusal(request_id, admission.value, reason)
        self._accepted["legacy"].inc()
        self.metrics.legacy_pending.set(len(self._pending))
        self._publish_work(checked.topic, checked.request, "legacy", now)
        return None

    def _on_ingestor_response(self, frames: list[bytes], now: float) -> None:
        try:
            _route, body = envelope.split_routed(frames)
            data = envelope.decode(body, max_payload=self._s.ingestor_max_payload)
            if isinstance(data, IngestorStatus):
                self._on_ingestor_status(data, now)
                return
            if isinstance(data, FeedStatus):
                self._on_feed_status(data, now)
                return
            if not isinstance(data, DataResponse):
                raise ProtocolError(
                    UNEXPECTED_TYPE, f"{data.DESCRIPTOR.name} is not sent to the relay on :5556"
                )
        except ProtocolError as exc:
            self._bad_frame("ingestor", exc, now)
            return
        log.info(
            "Received response from ingestor: request_id=%s, status=%s, candles=%d, ingestor=%s",
            data.request_id,
            Status.Name(data.status) if data.status in Status.values() else data.status,
            len(data.candles),
            data.ingestor_id or "-",
        )
        pending = self._pending.resolve(data.request_id)
        if pending is None:
            self.metrics.legacy_responses.labels("unmatched").inc()
            log.info("no client waits for request_id=%s (late or answered)", data.request_id)
            return
        self.metrics.legacy_responses.labels("matched").inc()
        self.metrics.legacy_pending.set(len(self._pending))
        if self._reply(pending.route, response_from(data), now):
            log.info("Sent response to client: request_id=%s", data.request_id)

    # --- ingestor liveness and exchange health (IngestorStatus on :5556) --------------

    def _on_ingestor_status(self, status: IngestorStatus, now: float) -> None:
        try:
            self._liveness.status(status, now)
        except BadStatusError as exc:
            self._bad_frame("ingestor", ProtocolError("bad_status", str(exc)), now)
            return
        self.metrics.ingestor_statuses.inc()
        self._refresh_routing(now)  # a health change opens or closes a breaker at once

    def _refresh_routing(self, now: float) -> None:
        """Gauges per exchange prefix, and one log line whenever a prefix changes state."""
        for ingestor_id in self._liveness.forget_dead(now):
            log.info("ingestor %s silent for an hour: forgotten", ingestor_id)
        m = self.metrics
        prefixes = self._liveness.prefixes | self._ingestor_subs["work"] | set(self._routing)
        for prefix in sorted(prefixes):
            verdict = self._liveness.verdict(prefix, self._served(prefix), now)
            m.exchange_served.labels(prefix).set(verdict.state is not State.UNSERVED)
            m.breaker_open.labels(prefix).set(verdict.state is State.BREAKER_OPEN)
            m.ingestors_alive.labels(prefix).set(verdict.alive)
            before = self._routing.get(prefix, State.UNSERVED)
            if verdict.state is before:
                continue
            self._routing[prefix] = verdict.state
            if verdict.state is State.SERVED:
                log.info("%s served (%d live ingestors report status)", prefix, verdict.alive)
            else:
                log.warning("%s refused from now on: %s: %s", prefix, verdict.error_code,
                            verdict.reason)  # fmt: skip

    def _expire_legacy(self, now: float) -> None:
        expired = self._pending.expire(now)
        if expired:
            self.metrics.legacy_pending.set(len(self._pending))
        for pending in expired:
            self.metrics.legacy_timeouts.inc()
            log.warning(
                "Request timed out: request_id=%s (pending requests: %d)",
                pending.request_id,
                len(self._pending),
            )
            self._reply(pending.route, timeout_response(pending, self._s.request_timeout_s), now)

    # --- replies and work ---------------------------------------------------------

    def _reply(self, route: list[bytes], message: Message, now: float) -> bool:
        try:
            sockets.send_frames(self._client, envelope.encode_routed(route, message))
            return True
        except zmq.Again:
            reason = "hwm"
        except zmq.ZMQError as exc:
            reason = "unreachable" if exc.errno == errno.EHOSTUNREACH else "error"
        self.metrics.reply_failures.labels(reason).inc()
        suffix = self._throttle(f"reply:{reason}", now)
        if suffix is not None:
            log.warning("reply to client %s dropped: %s%s", route[0].hex(), reason, suffix)
        return False

    def _publish_work(self, topic: str, request: DataRequest, kind: str, now: float) -> None:
        sockets.send_frames(self._work, envelope.encode_pub(topic, request))
        self._published[kind].inc()
        if not self._served(topic):  # live announcements: history and legacy were refused
            self.metrics.unrouted.labels(topic).inc()
            suffix = self._throttle(f"unrouted:{topic}", now)
            if suffix is not None:
                log.warning("no ingestor is subscribed to %s: request lost%s", topic, suffix)
        if kind in ("historical", "legacy"):
            log.info(
                "Forwarded request to ingestors: prefix=%s, request_id=%s, kind=%s",
                topic,
                request.request_id,
                kind,
            )

    # --- live subscriptions ---------------------------------------------------------

    def _on_market_subscription(self, frames: list[bytes], now: float) -> None:
        event = parse_subscription(frames)
        if event is None:
            return
        subscribe, topic = event
        self.metrics.subscription_events.labels("subscribe" if subscribe else "unsubscribe").inc()
        log.debug("%s %r", "subscribe" if subscribe else "unsubscribe", topic)
        if subscribe:
            self._status_on_subscribe(topic)
            self._apply(self._live.subscribed(topic, now))
        else:
            self._status.unsubscribed(topic)
            self._apply(self._live.unsubscribed(topic, now))
        self.metrics.subscribed_topics.set(self._live.topic_count)

    def _apply(self, actions: list[Action]) -> None:
        for action in actions:
            if not isinstance(action, Announce) or action.why == "start":
                self._status.forget(action.ticker)  # a new feed, or none: old state is moot
            if isinstance(action, Announce):
                request = DataRequest(
                    request_id=action.request_id,
                    kind=DataRequest.REALTIME,
                    ticker=action.ticker,
                    submitted_at_ms=self._wall_ms(),
                )
                self._work.send_multipart(envelope.encode_pub(action.prefix, request), zmq.NOBLOCK)
                self.metrics.published.labels(
                    _PUBLISHED_KIND.get(action.why, "realtime_join")
                ).inc()
                level = logging.DEBUG if action.why == "refresh" else logging.INFO
                log.log(
                    level,
                    "live data %s: %s (request_id=%s)",
                    action.why,
                    action.ticker,
                    action.request_id,
                )
            else:
                control = IngestorControl(
                    action=IngestorControl.CANCEL_REALTIME,
                    ticker=action.ticker,
                    request_id=action.request_id,
                    issued_at_ms=self._wall_ms(),
                )
                self._control.send_multipart(
                    envelope.encode_pub(action.prefix, control), zmq.NOBLOCK
                )
                self.metrics.published.labels("cancel_realtime").inc()
                log.info("live data cancelled: %s (no subscriber left)", action.ticker)
        if actions:
            self.metrics.live_tickers.set(len(self._live.live_tickers))

    # --- live feed statuses (`{ticker}|status`) --------------------------------------

    def _on_feed_status(self, status: FeedStatus, now: float) -> None:
        """An ingestor reports a feed's state: keep it (live tickers only) and publish it."""
        live = self._live.is_live(status.ticker)
        self._status.record(status, live=live)
        healthy = status.state in (FeedStatus.STARTED, FeedStatus.RECOVERED)
        log.log(
            logging.INFO if healthy else logging.WARNING,
            "live feed %s %s%s (ingestor %s)%s",
            status.ticker,
            state_name(status),
            f": {status.error_code}: {status.reason}" if status.error_code else "",
            status.ingestor_id or "-",
            "" if live else "; the ticker is not live here",
        )
        self._publish_status(status, "ingestor")

    def _status_on_subscribe(self, topic: str) -> None:
        """Refuse an unsupported candle period or an unknown symbol; tell a `{ticker}|status`
        subscriber the state."""
        refusal = self._status.refuse(topic, self._wall_ms())
        if refusal is not None:
            log.info("live subscription %r refused: %s", topic, refusal.reason)
            self._publish_status(refusal, "relay")
        market = parse_market_topic(topic)
        problem = self.check_symbol(market.ticker) if market is not None else None
        if market is not None and problem is not None:
            # The ingestor would say the same after a round trip to the exchange.
            log.info("live subscription %r: %s", topic, problem)
            failed = FeedStatus(
                ticker=market.ticker,
                state=FeedStatus.FAILED,
                error_code=BAD_SYMBOL,
                reason=problem,
                at_ms=self._wall_ms(),
            )
            self._publish_status(failed, "relay")
        ticker = status_ticker(topic)
        for status in self._status.latest(ticker) if ticker else []:
            self._publish_status(status, "replay")

    def _publish_status(self, status: FeedStatus, source: str) -> None:
        sent = self._proxy.publish(envelope.encode_pub(status_topic(status.ticker), status))
        self.metrics.feed_statuses.labels(state_name(status), source if sent else "dropped").inc()

    # --- operator commands (HTTP, the metrics port; never a client socket) ----------

    def config_update(self, exchange: str, config: dict[str, str]) -> str | None:
        """Queue IngestorControl{CONFIG_UPDATE} for an exchange's ingestors (any thread).

        Returns why it cannot be delivered, or None once it is queued for the loop.
        """
        prefix = f"{exchange.upper()}:"
        if not config or not all(isinstance(v, str) for v in config.values()):
            return "the body must be a non-empty JSON object of string values"
        if prefix not in self._ingestor_subs["control"]:
            return f"no ingestor of {prefix.rstrip(':')} listens for control messages"
        control = IngestorControl(
            action=IngestorControl.CONFIG_UPDATE, config=config, issued_at_ms=self._wall_ms()
        )
        self._operator.put((prefix, control))
        self._wakeup.wake()
        return None

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

    def _send_operator_controls(self) -> None:
        while not self._operator.empty():
            prefix, control = self._operator.get_nowait()
            self._control.send_multipart(envelope.encode_pub(prefix, control), zmq.NOBLOCK)
            self.metrics.published.labels("config_update").inc()
            log.info("CONFIG_UPDATE to %s ingestors: %s", prefix, dict(control.config))

    def _on_work_subscription(self, frames: list[bytes], now: float) -> None:
        event = self._ingestor_subscription("work", frames)
        if event is not None and event[0]:
            self._apply(self._live.ingestor_joined(event[1]))

    def _on_control_subscription(self, frames: list[bytes], now: float) -> None:
        self._ingestor_subscription("control", frames)

    def _ingestor_subscription(self, socket: str, frames: list[bytes]) -> tuple[bool, str] | None:
        """Track ingestor subscriptions (XPUB_VERBOSE: every subscribe, the last unsubscribe)."""
        event = parse_subscription(frames)
        if event is None:
            return None
        subscribe, prefix = event
        subs = self._ingestor_subs[socket]
        if subscribe:
            subs.add(prefix)
        else:
            subs.discard(prefix)
        log.info("ingestor %s %s %r", "subscribed to" if subscribe else "left", socket, prefix)
        self.metrics.ingestor_subscriptions.labels(socket).set(len(subs))
        if socket == "work":
            if not subscribe:
                self._liveness.unsubscribed(prefix)
            self._refresh_routing(self._clock())
        return event

    # --- proxy statistics and socket monitors ------------------------------------------

    def _on_proxy_stats(self, frames: list[bytes], now: float) -> None:
        stats = ProxyStats.parse(frames)
        if stats is not None:
            self.metrics.set_proxy_stats(stats)

    def _on_upstream_event(self, frames: list[bytes], now: float) -> None:
        event = sockets.monitor_event(frames)
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.metrics.upstream_connected.set(1)
            log.info("connected to the pipeline at %s", self._s.flink_market_data_endpoint)
        elif event == zmq.EVENT_DISCONNECTED:
            self.metrics.upstream_connected.set(0)
            self.metrics.upstream_disconnects.inc()
            log.warning(
                "pipeline connection %s lost; reconnecting (subscriptions are resent)",
                self._s.flink_market_data_endpoint,
            )

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


def _default_sink(settings: RelaySettings, metrics: RelayMetrics) -> TriggerSink:
    """Kafka when configured (delivery failures counted), else the logging sink."""
    k = settings.kafka
    if not k.bootstrap_servers:
        return LoggingTriggerSink()
    from relay.trigger_kafka import KafkaTriggerSink

    return KafkaTriggerSink(
        k.bootstrap_servers,
        k.topic_cep_triggers,
        on_error=metrics.trigger_sink_errors.inc,
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


def _refusal(message: Message | None, code: str, reason: str) -> Message:
    """A refusal in the reply type the client's request expects."""
    if isinstance(message, SubmitHistoricalRequest):
        return SubmitResponse(
            request_id=message.request_id, status=Status.REJECTED, reason=reason, error_code=code
        )
    if isinstance(message, CEPTriggerRequest):
        return CEPTriggerAck(
            trigger_id=message.trigger_id, status=Status.REJECTED, reason=reason, error_code=code
        )
    request_id = message.request_id if isinstance(message, OHLCRequest) else ""
    return _legacy_refusal(request_id, code, reason)


def _legacy_refusal(request_id: str, code: str, reason: str) -> Response:
    return Response(request_id=request_id, status=Status.REJECTED, reason=reason, error_code=code)
