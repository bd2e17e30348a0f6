"""The relay's side toward the ingestors.

    work      XPUB :5555 -> DataRequest (history, legacy, live announcements)
    control   XPUB :5560 -> IngestorControl (CANCEL_REALTIME, operator CONFIG_UPDATE)
    heartbeat ROUTER :5556 <- IngestorStatus -> Liveness: served, no_ingestor, kafka_unavailable,
                                                breaker open

Both XPUBs are verbose, so the relay knows which prefixes an ingestor listens
to: work published where nobody listens is counted as lost, and an exchange is
only served while an ingestor subscribes to its prefix and (if its ingestors
send heartbeats) one of them is alive and healthy. `Ingestors` is the adapter
(loop thread only, except `config_update`, queued for the loop); `Liveness`,
below it, is that rule: pure, `now` passed in, unit-tested without sockets.
"""

from __future__ import annotations

import logging
import math
import queue
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum

import zmq

from mdproto import envelope
from mdproto.error_codes import EXCHANGE_UNAVAILABLE, KAFKA_UNAVAILABLE, NO_INGESTOR
from mdproto.messages import DataRequest, IngestorControl, IngestorStatus
from mdproto.runtime.zmq_frames import NOBLOCK, send_frames
from relay.config import RelaySettings
from relay.log_lines import HotLine
from relay.log_throttle import LogThrottle
from relay.metrics import RelayMetrics
from relay.sockets import Socket, parse_subscription
from relay.subscriptions import Announce, Cancel

log = logging.getLogger(__name__)
# The spec's line per forwarded request, off the loop when the relay's handler writes it.
_forwarded = HotLine(
    log, logging.INFO, "Forwarded request to ingestors: prefix=%s, request_id=%s, kind=%s"
)

_PUBLISHED_KIND = {"start": "realtime_start", "refresh": "realtime_refresh"}


class Ingestors:
    def __init__(
        self,
        settings: RelaySettings,
        metrics: RelayMetrics,
        throttle: LogThrottle,
        work: Socket,
        control: Socket,
        *,
        clock: Callable[[], float],
        wall_ms: Callable[[], int],
        wake: Callable[[], None],
    ) -> None:
        self._metrics = m = metrics
        self._throttle = throttle
        self._work = work
        self._control = control
        self._clock = clock
        self._wall_ms = wall_ms
        self._wake = wake
        # Label lookups cost more than the increment: bind the hot ones once.
        self._published = {
            k: m.published.labels(k)
            for k in ("historical", "legacy", "realtime_start", "realtime_refresh", "realtime_join")
        }
        self._subs: dict[str, set[str]] = {"work": set(), "control": set()}
        self._liveness = Liveness(expiry_intervals=settings.ingestor_expiry_intervals)
        self._routing: dict[str, State] = {}  # last state per prefix, logged on change
        # Prefixes served at some moment since start (a state only turns served on a status
        # or a subscription, both of which refresh the routing): relay.exchange_serving.
        self._served_once: set[str] = set()
        for exchange in settings.known_exchanges:  # 0 until an ingestor serves it: alertable
            m.exchange_served.labels(f"{exchange}:").set(0)
        # Operator commands arrive on HTTP threads; only the loop touches sockets.
        self._operator: queue.SimpleQueue[tuple[str, IngestorControl]] = queue.SimpleQueue()

    # --- can work be taken? ---------------------------------------------------------

    def served(self, topic: str) -> bool:
        """An ingestor subscribes to a prefix of `topic` on the work socket right now
        (work topics are exchange prefixes, which ingestors subscribe to as they are)."""
        subs = self._subs["work"]
        return topic in subs or any(topic.startswith(p) for p in subs)

    def unserved(self, topic: str, now: float) -> Verdict | None:
        """Why no ingestor can take work published on `topic` now (no_ingestor,
        exchange_unavailable), or None if one can (`Liveness` has the rule)."""
        verdict = self._liveness.verdict(topic, self.served(topic), now)
        return None if verdict.state is State.SERVED else verdict

    # --- work and control out ---------------------------------------------------------

    def publish_work(self, topic: str, request: DataRequest, kind: str, now: float) -> None:
        self.publish_batch(((topic, request),), kind, now)

    def publish_batch(
        self, works: Sequence[tuple[str, DataRequest]], kind: str, now: float
    ) -> None:
        """One DataRequest per (topic, request), in order, back to back: libzmq's I/O
        thread and the ingestor then wake once for the lot. Counted once, before the
        sends (a PUB send never fails: whoever receives one sees it counted); the
        spec's line per request, kept in one go."""
        self._published[kind].inc(len(works))
        work = self._work
        for topic, request in works:
            send_frames(work, envelope.encode_pub(topic, request), NOBLOCK)
        for topic, _request in works:
            if not self.served(topic):  # live announcements: history and legacy were refused
                self._metrics.unrouted.labels(topic).inc()
                suffix = self._throttle(f"unrouted:{topic}", now)
                if suffix is not None:
                    log.warning("no ingestor is subscribed to %s: request lost%s", topic, suffix)
        if kind in ("historical", "legacy"):
            _forwarded.each([(topic, request.request_id, kind) for topic, request in works])

    def announce(self, action: Announce) -> None:
        """DataRequest{REALTIME} (a book: {BOOK}): start a live feed, or refresh its lease."""
        book = action.kind == "book"
        request = DataRequest(
            request_id=action.request_id,
            kind=DataRequest.BOOK if book else DataRequest.REALTIME,
            ticker=action.ticker,
            submitted_at_ms=self._wall_ms(),
        )
        published = _PUBLISHED_KIND.get(action.why, "realtime_join")
        self._metrics.published.labels(
            published.replace("realtime", "book") if book else published
        ).inc()
        self._work.send_multipart(envelope.encode_pub(action.prefix, request), zmq.NOBLOCK)
        level = logging.DEBUG if action.why == "refresh" else logging.INFO
        log.log(
            level,
            "live %s %s: %s (request_id=%s)",
            action.kind,
            action.why,
            action.ticker,
            action.request_id,
        )

    def cancel(self, action: Cancel) -> None:
        """IngestorControl{CANCEL_REALTIME} (a book: CANCEL_BOOK): nobody wants the feed."""
        book = action.kind == "book"
        control = IngestorControl(
            action=IngestorControl.CANCEL_BOOK if book else IngestorControl.CANCEL_REALTIME,
            ticker=action.ticker,
            request_id=action.request_id,
            issued_at_ms=self._wall_ms(),
        )
        self._metrics.published.labels("cancel_book" if book else "cancel_realtime").inc()
        self._control.send_multipart(envelope.encode_pub(action.prefix, control), zmq.NOBLOCK)
        log.info("live %s cancelled: %s (no subscriber left)", action.kind, action.ticker)

    # --- operator commands (HTTP, the metrics port; never a client socket) ----------

    def config_update(self, exchange: str, config: dict[str, str]) -> str | None:
        """Queue IngestorControl{CONFIG_UPDATE} for an exchange's ingestors (any thread).

        Returns why it cannot be delivered, or None once it is queued for the loop.
        """
        prefix = f"{exchange.upper()}:"
        if not config or not all(isinstance(v, str) for v in config.values()):
            return "the body must be a non-empty JSON object of string values"
        if prefix not in self._subs["control"]:
            return f"no ingestor of {prefix.rstrip(':')} listens for control messages"
        control = IngestorControl(
            action=IngestorControl.CONFIG_UPDATE, config=config, issued_at_ms=self._wall_ms()
        )
        self._operator.put((prefix, control))
        self._wake()
        return None

    def send_operator_controls(self) -> None:
        while not self._operator.empty():
            prefix, control = self._operator.get_nowait()
            self._metrics.published.labels("config_update").inc()
            self._control.send_multipart(envelope.encode_pub(prefix, control), zmq.NOBLOCK)
            log.info("CONFIG_UPDATE to %s ingestors: %s", prefix, dict(control.config))

    # --- who listens (XPUB_VERBOSE: every subscribe, the last unsubscribe) -----------

    def on_work_subscription(self, frames: list[bytes]) -> str | None:
        """Track a work subscription; the prefix an ingestor just subscribed to, if any."""
        event = self._subscription("work", frames)
        return event[1] if event is not None and event[0] else None

    def on_control_subscription(self, frames: list[bytes], now: float) -> None:
        self._subscription("control", frames)

    def _subscription(self, socket: str, frames: list[bytes]) -> tuple[bool, str] | None:
        event = parse_subscription(frames)
        if event is None:
            return None
        subscribe, prefix = event
        subs = self._subs[socket]
        if subscribe:
            subs.add(prefix)
        else:
            subs.discard(prefix)
        log.info("ingestor %s %s %r", "subscribed to" if subscribe else "left", socket, prefix)
        self._metrics.ingestor_subscriptions.labels(socket).set(len(subs))
        if socket == "work":
            if not subscribe:
                self._liveness.unsubscribed(prefix)
            self.refresh_routing(self._clock())
        return event

    # --- liveness and exchange health (IngestorStatus on :5556) -----------------------

    def on_status(self, status: IngestorStatus, now: float) -> None:
        """Record a heartbeat; raises BadStatusError for one the relay cannot use."""
        self._liveness.status(status, now)
        self._metrics.ingestor_statuses.inc()
        self.refresh_routing(now)  # a health change opens or closes a breaker at once

    def verdicts(self, now: float) -> list[tuple[str, Verdict]]:
        """Every known prefix's verdict now."""
        prefixes = self._liveness.prefixes | self._subs["work"] | set(self._routing)
        return [
            (prefix, self._liveness.verdict(prefix, self.served(prefix), now))
            for prefix in sorted(prefixes)
        ]

    def served_once_verdicts(self, now: float) -> list[tuple[str, Verdict]]:
        """The verdict now of every prefix served at some moment since the relay started
        (relay.exchange_serving reports them: for any other this relay accepted nothing)."""
        return [(p, v) for p, v in self.verdicts(now) if p in self._served_once]

    def refresh_routing(self, now: float) -> None:
        """Gauges per exchange prefix, and one log line whenever a prefix changes state."""
        for ingestor_id in self._liveness.forget_dead(now):
            log.info("ingestor %s silent for an hour: forgotten", ingestor_id)
        m = self._metrics
        for prefix, verdict in self.verdicts(now):
            m.exchange_served.labels(prefix).set(verdict.state is not State.UNSERVED)
            m.breaker_open.labels(prefix).set(verdict.state is State.BREAKER_OPEN)
            m.ingestors_alive.labels(prefix).set(verdict.alive)
            if verdict.state is not State.UNSERVED:
                self._served_once.add(prefix)
            before = self._routing.get(prefix, State.UNSERVED)
            if verdict.state is before:
                continue
            self._routing[prefix] = verdict.state
            if verdict.state is State.SERVED:
                log.info("%s served (%d live ingestors report status)", prefix, verdict.alive)
            else:
                log.warning("%s refused from now on: %s: %s", prefix, verdict.error_code,
                            verdict.reason)  # fmt: skip


# --- liveness: can an exchange take work now? (pure: `now` is passed in) ------------

_EXCHANGE = re.compile(r"^[A-Z][A-Z0-9_]{0,31}$")
_MAX_EXCHANGES = 256  # per status: more is a broken sender, not a deployment
_MAX_REASON = 500  # of a kafka_error quoted in refusals
_MIN_INTERVAL_S = 0.1  # a smaller interval_ms would expire an ingestor between two loop turns
_MAX_VERDICTS = 1024  # kept verdicts (one per prefix asked about); all dropped beyond


class BadStatusError(ValueError):
    """An IngestorStatus the relay cannot use (empty id, bad exchange name...)."""


class State(Enum):
    SERVED = "served"
    UNSERVED = "unserved"
    CANNOT_STORE = "cannot_store"
    BREAKER_OPEN = "breaker_open"


@dataclass(frozen=True, slots=True)
class Verdict:
    state: State
    alive: int = 0  # live ingestors that report the exchange
    error_code: str = ""  # NO_INGESTOR, KAFKA_UNAVAILABLE or EXCHANGE_UNAVAILABLE
    reason: str = ""


@dataclass(frozen=True, slots=True)
class _Health:
    healthy: bool
    failures: int
    error_code: str
    reason: str


@dataclass(slots=True)
class _Ingestor:
    last_seen: float
    expiry_s: float
    exchanges: dict[str, _Health] = field(default_factory=dict)  # by work prefix "X:"
    kafka_error: str = ""  # it cannot write to Kafka: whatever it fetched would be lost

    def alive(self, now: float) -> bool:
        return now <= self.expires_at

    @property
    def expires_at(self) -> float:
        return self.last_seen + self.expiry_s


class Liveness:
    """Can an exchange take history work now? Ingestor subscriptions plus their heartbeats.

    A subscription on :5555 only proves that an ingestor's TCP connection is up: a
    hung process (SIGSTOP, a deadlock) keeps it, and an ingestor whose exchange is
    down keeps it too. So each ingestor also sends `IngestorStatus` on :5556 every
    `interval_ms`, listing the exchanges it serves and their health. The rule, per
    work prefix `X:` (docs/protocol.md, "Ingestor liveness"):

    - *unserved* (`no_ingestor`): no ingestor subscribes to `X:`; or some ingestor
      has reported `X` since the prefix was last subscribed, and none of those that
      did was heard from within `expiry_intervals` times its own `interval_ms`.
      An exchange no ingestor ever reported is judged by the subscription alone, so
      ingestors that send no status (older versions) keep working.
    - *cannot store* (`kafka_unavailable`): every live ingestor that reports `X`
      says it cannot write to Kafka (`kafka_error`); the reason carries it.
    - *breaker open* (`exchange_unavailable`): served, and every live ingestor that
      reports `X` and can write to Kafka says `healthy=false`; the reason carries
      the latest error.
    - else *served*.

    When the last subscription to `X:` goes away the heartbeat record of `X` is
    forgotten (every ingestor of it is gone). Pure: the caller passes `now`
    (monotonic seconds).
    """

    def __init__(self, *, expiry_intervals: float, forget_after_s: float = 3600.0) -> None:
        self._factor = expiry_intervals
        self._forget_after_s = forget_after_s
        self._ingestors: dict[str, _Ingestor] = {}
        self._reported: set[str] = set()  # prefixes some ingestor reported since subscribed
        # (prefix, subscribed) -> (verdict, asked at, when the first ingestor it counts expires).
        self._verdicts: dict[tuple[str, bool], tuple[Verdict, float, float]] = {}

    @property
    def prefixes(self) -> set[str]:
        """Every prefix an ingestor reported (for the metrics)."""
        return set(self._reported)

    def status(self, message: IngestorStatus, now: float) -> None:
        """Record one IngestorStatus; BadStatusError if it is unusable."""
        if not 0 < len(message.ingestor_id) <= 255:
            raise BadStatusError("IngestorStatus without an ingestor_id (or longer than 255)")
        if len(message.exchanges) > _MAX_EXCHANGES:
            raise BadStatusError(f"IngestorStatus lists {len(message.exchanges)} exchanges")
        exchanges: dict[str, _Health] = {}
        for e in message.exchanges:
            if not _EXCHANGE.match(e.exchange):
                raise BadStatusError(f"exchange name {e.exchange!r} is not like BINANCE")
            exchanges[f"{e.exchange}:"] = _Health(
                e.healthy, e.consecutive_failures, e.error_code, e.reason
            )
        interval_s = max(message.interval_ms / 1000.0, _MIN_INTERVAL_S)
        self._ingestors[message.ingestor_id] = _Ingestor(
            now, self._factor * interval_s, exchanges, message.kafka_error[:_MAX_REASON]
        )
        self._reported.update(exchanges)
        self._verdicts.clear()

    def unsubscribed(self, prefix: str) -> None:
        """No ingestor subscribes to `prefix` any more: forget who reported it."""
        self._reported.discard(prefix)
        self._verdicts.clear()

    def verdict(self, prefix: str, subscribed: bool, now: float) -> Verdict:
        """Whether work for `prefix` ("BINANCE:") can be served now, and if not why.

        Kept until it can change (the relay asks for every request): a status or an
        unsubscription clears what is kept, and time alone changes a verdict only when
        one of the live ingestors it counts expires."""
        key = (prefix, subscribed)
        kept = self._verdicts.get(key)
        if kept is not None and kept[1] <= now <= kept[2]:
            return kept[0]
        verdict, counted = self._judge(prefix, subscribed, now)
        if len(self._verdicts) >= _MAX_VERDICTS:  # prefixes come from requests: bounded
            self._verdicts.clear()
        if counted is not None:
            expires = min((ing.expires_at for ing in counted), default=math.inf)
            self._verdicts[key] = (verdict, now, expires)
        return verdict

    def _judge(
        self, prefix: str, subscribed: bool, now: float
    ) -> tuple[Verdict, list[_Ingestor] | None]:
        """The verdict, and the live ingestors it holds for (None: it is not to be kept)."""
        name = prefix.rstrip(":")
        if not subscribed:
            return Verdict(
                State.UNSERVED,
                0,
                NO_INGESTOR,
                f"no ingestor serves {name} right now (none is subscribed to its work "
                "queue); retry once one runs",
            ), []
        if prefix not in self._reported:  # no ingestor of it sends status: trust the subscription
            return Verdict(State.SERVED), []
        reporters = [(i, ing) for i, ing in self._ingestors.items() if prefix in ing.exchanges]
        alive = [(i, ing) for i, ing in reporters if ing.alive(now)]
        if not alive:
            silent = min((now - ing.last_seen for _, ing in reporters), default=None)
            heard = "long ago" if silent is None else f"{silent:.1f} s ago"
            return Verdict(
                State.UNSERVED,
                0,
                NO_INGESTOR,
                f"no ingestor of {name} is alive: the last status came {heard} (hung or cut "
                "off, while still subscribed); retry once one runs",
            ), None  # the reason says how long ago: not kept
        counted = [ing for _, ing in alive]
        storing = [(i, ing) for i, ing in alive if not ing.kafka_error]
        if not storing:
            ingestor_id, latest = max(alive, key=lambda pair: pair[1].last_seen)
            return Verdict(
                State.CANNOT_STORE,
                len(alive),
                KAFKA_UNAVAILABLE,
                f"no ingestor of {name} can write to Kafka, so nothing fetched would reach "
                f"the pipeline ({ingestor_id}: {latest.kafka_error}); retry once Kafka is back",
            ), counted
        alive = storing
        if all(not ing.exchanges[prefix].healthy for _, ing in alive):
            ingestor_id, latest = max(alive, key=lambda pair: pair[1].last_seen)
            health = latest.exchanges[prefix]
            return Verdict(
                State.BREAKER_OPEN,
                len(alive),
                EXCHANGE_UNAVAILABLE,
                f"exchange {name} is failing at every ingestor that serves it ({ingestor_id}: "
                f"{health.failures} failed calls in a row, last {health.error_code}: "
                f"{health.reason}); retry later",
            ), counted
        return Verdict(State.SERVED, len(alive)), counted

    def forget_dead(self, now: float) -> list[str]:
        """Drop ingestors silent for `forget_after_s` (bounded memory); their ids."""
        limit = self._forget_after_s
        gone = [i for i, ing in self._ingestors.items() if now - ing.last_seen > limit]
        for ingestor_id in gone:
            del self._ingestors[ingestor_id]
        if gone:
            self._verdicts.clear()
        return gone
