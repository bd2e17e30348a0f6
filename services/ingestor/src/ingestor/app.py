"""Wiring. Reads like the README's flow diagram:

exchanges (ccxt, load_markets) -> Kafka producer -> Market records
-> claims tail -> live feeds -> work intake (SUB :5555, SUB :5560)
     DataRequest HISTORICAL  -> claim -> fetch pages -> OHLCBatch records (Kafka) -> done
     silent claim holder     -> takeover claim -> fetch pages -> OHLCBatch records -> done
     DataRequest legacy_sync -> claim -> fetch pages -> DataResponse (DEALER :5556)
     DataRequest REALTIME    -> start feed / refresh lease -> Tick records (Kafka)
     DataRequest BOOK        -> start book feed / refresh lease -> BookSnapshot/BookDelta (Kafka)
                                  '-> FeedStatus (started, lost, failed...) (DEALER :5556)
     IngestorControl         -> cancel feed / apply config + republish markets
every exchange call -> HealthBook -> IngestorStatus (DEALER :5556) every interval and on change
Kafka all brokers down / a delivery failed --'  (kafka_error: the relay refuses kafka_unavailable)
                                 '-> probes of unhealthy exchanges, and of Kafka while it fails
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import Message

from ingestor.books import BookFeeds
from ingestor.claims import Claims
from ingestor.config import Settings, credentials_for
from ingestor.coverage import NO_COVERAGE, CoverageSource, IcebergCoverage
from ingestor.exchanges import ExchangeAdapter
from ingestor.history import (
    ClaimLostError,
    FetchEnv,
    HealthBook,
    RequestFailedError,
    call_with_retry,
    run_history_job,
    wall_clock_ms,
    write_error_marker,
)
from ingestor.kafka_sink import KafkaSink, PartitionTail
from ingestor.legacy import legacy_response
from ingestor.live import LiveFeeds, RecentIds
from ingestor.markets import market_records
from ingestor.model import ExchangeCallError
from ingestor.retry import RetryPolicy
from ingestor.work import LegacyResponder, WorkIntake, new_context
from mdproto import ProtocolError, contracts
from mdproto.error_codes import ABANDONED
from mdproto.messages import DataRequest, IngestorControl, Status
from mdproto.runtime.kafka import TopicSpec, spec
from mdproto.topics import is_valid_id, parse_ticker

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_S = 10.0


@dataclass
class IngestorStats:
    history_jobs: int = 0  # historical requests this ingestor fetched
    legacy_jobs: int = 0
    skipped_claimed: int = 0  # another ingestor claimed them first
    skipped_repeat: int = 0  # already seen by this ingestor
    taken_over: int = 0  # requests this ingestor took over from a silent claim holder
    markets_published: int = 0
    rows: int = 0  # candles written for history requests
    # Finished history requests by (status name, error_code): bounded, unlike a per-request log.
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)


class Ingestor:
    """The whole service; `run()` until `stop()`. Tests drive it in-process."""

    def __init__(
        self, settings: Settings, adapters: Mapping[str, ExchangeAdapter] | None = None
    ) -> None:
        self.settings = settings
        self.ingestor_id = settings.ingestor_id
        self.stats = IngestorStats()
        self._adapters: dict[str, ExchangeAdapter] = dict(adapters or {})
        self._by_prefix: dict[str, ExchangeAdapter] = {}
        self._batch_size = settings.history.batch_size
        self._seen = RecentIds(50_000)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._jobs: set[asyncio.Task[Any]] = set()
        self._ready = asyncio.Event()
        self.markets_ready = asyncio.Event()  # the first Market records were written
        self._stopping = asyncio.Event()
        self.sink: KafkaSink | None = None
        self.feeds: LiveFeeds | None = None
        self.books: BookFeeds | None = None
        self.intake: WorkIntake | None = None
        self._claims: Claims | None = None
        self._claims_task: asyncio.Task[None] | None = None
        self._tail: PartitionTail | None = None
        self._responder: LegacyResponder | None = None
        self._semaphore = asyncio.Semaphore(settings.history.max_concurrent)
        self._coverage = _coverage(settings)
        self.health = HealthBook((), settings.health.failure_threshold)
        self._health_changed = asyncio.Event()
        #: Background tasks (status, work intake, probes...) that died of an exception.
        self.failed_tasks: list[str] = []

    async def wait_ready(self) -> None:
        await self._ready.wait()

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @property
    def jobs_in_flight(self) -> int:
        """History and legacy requests started and not finished (waiting ones included)."""
        return len(self._jobs)

    @property
    def claims(self) -> Claims | None:
        return self._claims

    @property
    def prefixes(self) -> list[str]:
        return list(self._by_prefix)

    def adapter(self, prefix: str) -> ExchangeAdapter:
        return self._by_prefix[prefix]

    async def run(self) -> None:
        s = self.settings
        context = new_context()
        try:
            self._open_exchanges()
            self.sink = KafkaSink(s.kafka, self.ingestor_id, self._health_changed.set)
            await self.sink.start(self._topics_to_ensure() if s.kafka.ensure_topics else ())
            self._spawn(self._initial_markets(), "markets-initial")
            if isinstance(self._coverage, IcebergCoverage):
                self._spawn(self._coverage.warm(), "coverage-warm")
            if s.claims.enabled:
                await self._start_claims()
            self.feeds = LiveFeeds(
                {a.prefix + ":": a for a in self._adapters.values() if a.settings.live},
                self.sink,
                lease_s=s.live.realtime_lease_s,
                dedupe_capacity=s.live.dedupe_capacity,
                reconnect=RetryPolicy(
                    base_delay_s=s.live.reconnect_base_s, max_delay_s=s.live.reconnect_max_s
                ),
                start_attempts=s.live.start_attempts,
                on_status=self._post_to_relay,
                ingestor_id=self.ingestor_id,
            )
            self._spawn(self.feeds.run_sweeper(s.live.sweep_interval_s), "lease-sweeper")
            self.books = BookFeeds(
                {a.prefix + ":": a for a in self._adapters.values() if a.settings.live},
                self.sink,
                depth=s.book.depth,
                store_interval_s=s.book.store_interval_s,
                lease_s=s.live.realtime_lease_s,
                reconnect=RetryPolicy(
                    base_delay_s=s.live.reconnect_base_s, max_delay_s=s.live.reconnect_max_s
                ),
                start_attempts=s.live.start_attempts,
                on_status=self._post_to_relay,
                ingestor_id=self.ingestor_id,
            )
            self._spawn(self.books.run_sweeper(s.live.sweep_interval_s), "book-lease-sweeper")
            if s.market_metadata.refresh_s > 0:
                self._spawn(self._refresh_markets_periodically(), "markets-refresh")
            self._responder = LegacyResponder(
                context, s.relays("response"), self.ingestor_id, s.zmq_heartbeat_ivl_ms
            )
            self.intake = WorkIntake(
                context,
                s.relays("work"),
                s.relays("control"),
                list(self._by_prefix),
                max_payload=s.max_payload_bytes,
                heartbeat_ivl_ms=s.zmq_heartbeat_ivl_ms,
            )
            self._spawn(self.intake.run(self._on_request, self._on_control), "work-intake")
            if s.health.status_interval_ms > 0:
                self._spawn(self._report_status(), "status")
            self._spawn(self._probe_unhealthy(), "health-probes")
            log.info(
                "ingestor %s ready: exchanges %s, work %s, control %s",
                self.ingestor_id,
                ", ".join(self._by_prefix),
                s.relay_work_endpoint,
                s.relay_control_endpoint,
            )
            self._ready.set()
            await self._stopping.wait()
        finally:
            await self._shutdown()
            context.term()

    async def stop(self) -> None:
        self._stopping.set()

    # --- start-up ---------------------------------------------------------

    def _open_exchanges(self) -> None:
        for exchange_id, cfg in self.settings.served().items():
            if exchange_id not in self._adapters:
                self._adapters[exchange_id] = ExchangeAdapter(
                    exchange_id, cfg, credentials_for(exchange_id)
                )
        self._by_prefix = {a.prefix + ":": a for a in self._adapters.values()}
        self.health = HealthBook(
            (a.prefix for a in self._adapters.values()), self.settings.health.failure_threshold
        )

    def _topics_to_ensure(self) -> list[TopicSpec]:
        k = self.settings.kafka
        return [
            spec(contracts.KAFKA_OHLC_BATCHES, k.topic_ohlc_batches),
            spec(contracts.KAFKA_TICKS, k.topic_ticks),
            spec(contracts.KAFKA_BOOK, k.topic_book),
            spec(contracts.KAFKA_MARKETS, k.topic_markets),
            spec(contracts.KAFKA_INGEST_CLAIMS, k.topic_claims),
        ]

    async def _start_claims(self) -> None:
        assert self.sink is not None
        sink, topic = self.sink, self.settings.kafka.topic_claims

        async def publish(key: str, value: bytes) -> int:
            return await sink.deliver(topic, key, value, partition=0)

        c = self.settings.claims
        self._claims = Claims(
            self.ingestor_id,
            publish,
            c.wait_timeout_s,
            heartbeat_s=c.heartbeat_s,
            takeover_after_s=c.takeover_after_s,
        )
        self._tail = PartitionTail(
            self.settings.kafka.bootstrap_servers,
            topic,
            0,
            f"ingestor-claims-{self.ingestor_id}",
            self._claims.on_records,
        )
        lookback_ms = int(self.settings.claims.lookback_s * 1000)
        await self._tail.start(wall_clock_ms() - lookback_ms)
        self._claims.ledger.advance(self._tail.start_offset)
        # Not in _tasks: it must outlive them at shutdown, heartbeating the jobs that finish.
        self._claims_task = asyncio.create_task(
            self._claims.run(self._on_takeover, lambda r: self._adapter_for(r) is not None),
            name="claims",
        )
        self._claims_task.add_done_callback(self._task_done)

    # --- market metadata --------------------------------------------------

    async def publish_markets(self, reload: bool) -> int:
        """Load markets and write a Market record per served market; how many."""
        assert self.sink is not None
        total = 0
        for adapter in self._adapters.values():
            env = self._env(adapter)
            try:
                await call_with_retry(
                    lambda a=adapter: a.load_markets(reload),  # type: ignore[misc]
                    env,
                    f"{adapter.exchange_id} load_markets",
                )
            except RequestFailedError as exc:
                log.error("markets of %s not loaded: %s", adapter.exchange_id, exc)
                continue
            records = market_records(
                adapter.prefix, adapter.markets(), adapter.settings.markets, wall_clock_ms()
            )
            deliveries = [await self.sink.send_market(r.ticker, r) for r in records]
            results = await asyncio.gather(*deliveries, return_exceptions=True)
            failed = sum(isinstance(r, BaseException) for r in results)
            if failed:
                log.error("%d of %d Market records not delivered", failed, len(records))
            total += len(records) - failed
            log.info("published %d markets of %s", len(records) - failed, adapter.exchange_id)
        self.stats.markets_published += total
        return total

    async def _initial_markets(self) -> None:
        """In the background: an unreachable exchange must not keep work intake down."""
        await self.publish_markets(reload=False)
        self.markets_ready.set()

    async def _refresh_markets_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.settings.market_metadata.refresh_s)
            await self.publish_markets(reload=True)

    # --- work -------------------------------------------------------------

    def _on_request(self, request: DataRequest) -> None:
        if request.kind == DataRequest.REALTIME:
            assert self.feeds is not None
            self.feeds.request(request.ticker)
            return
        if request.kind == DataRequest.BOOK:
            assert self.books is not None
            self.books.request(request.ticker)
            return
        if request.kind != DataRequest.HISTORICAL:
            log.warning("request %r has no kind; ignored", request.request_id)
            return
        if not is_valid_id(request.request_id):
            log.warning("historical request with invalid request_id %r ignored", request.request_id)
            return
        if not self._seen.add(request.request_id):
            self.stats.skipped_repeat += 1
            log.info("request %s already handled here; repeat ignored", request.request_id)
            return
        self._start_job(request)

    def _adapter_for(self, request: DataRequest) -> ExchangeAdapter | None:
        try:
            return self._by_prefix[parse_ticker(request.ticker).prefix]
        except (ProtocolError, KeyError):
            return None  # still answered: an ERROR marker beats a client timeout

    def _on_takeover(self, request: DataRequest, attempt: int) -> None:
        """Won a takeover claim (the holder went silent): fetch the whole range again."""
        if self.stopping:  # not heartbeated, so the next ingestor takes it over
            assert self._claims is not None
            self._claims.abandon(request.request_id)
            return
        self.stats.taken_over += 1
        self._seen.add(request.request_id)
        self._start_job(request, attempt)

    def _start_job(self, request: DataRequest, attempt: int = 0) -> None:
        """attempt 0: a request from the relay, to claim; n: a takeover already won."""
        job = self._historical(request, self._adapter_for(request), attempt)
        task = asyncio.create_task(job, name=request.request_id)
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)

    async def _historical(
        self, request: DataRequest, adapter: ExchangeAdapter | None, attempt: int
    ) -> None:
        claims = self._claims
        verdict: asyncio.Task[bool] | None = None
        if claims is not None and attempt == 0:
            # Decided while the job reads coverage and fetches its first pages; the job
            # writes nothing before it (legacy answers, sent in one go, wait for it here).
            verdict = asyncio.create_task(claims.claim(request))
            if request.legacy_sync and not await verdict:
                return self._skipped(request)
        try:
            if attempt > self.settings.claims.max_takeovers:
                delivered = await self._give_up(request, attempt)
            else:
                delivered = await self._fetch(request, adapter, verdict)
        except ClaimLostError:
            return self._skipped(request)
        finally:  # no longer heartbeated; without a DONE (cancelled, undelivered) it is taken over
            if verdict is not None and not verdict.done():
                verdict.cancel()
            if claims is not None:
                claims.abandon(request.request_id)
        if claims is not None and delivered:
            await claims.done(request.request_id)

    def _skipped(self, request: DataRequest) -> None:
        self.stats.skipped_claimed += 1
        log.info("request %s claimed by another ingestor; skipped", request.request_id)

    async def _give_up(self, request: DataRequest, attempt: int) -> bool:
        """Every holder so far died mid-fetch: end the request with an ERROR, not another try."""
        assert self.sink is not None
        reason = f"{attempt} ingestors in a row stopped while fetching it (claims.max_takeovers)"
        log.error("request %s abandoned: %s", request.request_id, reason)
        self.stats.outcomes[("ERROR", ABANDONED)] += 1
        return await write_error_marker(
            request, self.sink, ingestor_id=self.ingestor_id, error_code=ABANDONED, reason=reason
        )

    async def _fetch(
        self,
        request: DataRequest,
        adapter: ExchangeAdapter | None,
        claim: asyncio.Task[bool] | None = None,
    ) -> bool:
        """Fetch and write (or answer) one request; True once its final answer was delivered.

        ClaimLostError when `claim` (still running) says another ingestor won it.
        """
        async with self._semaphore:
            if adapter is None:
                adapter = next(iter(self._adapters.values()))  # plan_request reports the bad ticker
            env = self._env(adapter)
            if request.legacy_sync:
                await self._legacy(request, adapter, env)
                return True
            assert self.sink is not None
            outcome = await run_history_job(
                request,
                adapter,
                self.sink,
                ingestor_id=self.ingestor_id,
                batch_size=self._batch_size,
                env=env,
                stored=self._coverage,
                claim=claim,
            )
            if not outcome.claimed:
                raise ClaimLostError
            self.stats.history_jobs += 1
            self.stats.rows += outcome.rows
            status = Status.Name(Status.ValueType(outcome.status))
            self.stats.outcomes[(status, outcome.error_code)] += 1
            log.info(
                "request %s %s: %d rows in %d batches, %d gaps%s; %s",
                request.request_id,
                outcome.status,
                outcome.rows,
                outcome.batches,
                outcome.expected_gaps,
                f", {outcome.error_code}: {outcome.reason}" if outcome.error_code else "",
                outcome.stages,
            )
            return outcome.delivered

    async def _legacy(self, request: DataRequest, adapter: ExchangeAdapter, env: FetchEnv) -> None:
        assert self._responder is not None
        self.stats.legacy_jobs += 1
        response = await legacy_response(
            request,
            adapter,
            env,
            ingestor_id=self.ingestor_id,
            max_candles=self.settings.history.legacy_max_candles,
        )
        await self._responder.send(response)
        log.info(
            "legacy request %s answered: status %d, %d candles",
            request.request_id,
            response.status,
            len(response.candles),
        )

    def _on_control(self, control: IngestorControl) -> None:
        if control.action == IngestorControl.CANCEL_REALTIME:
            assert self.feeds is not None
            self._spawn(self.feeds.cancel(control.ticker), f"cancel-{control.ticker}")
        elif control.action == IngestorControl.CANCEL_BOOK:
            assert self.books is not None
            self._spawn(self.books.cancel(control.ticker), f"cancel-book-{control.ticker}")
        elif control.action == IngestorControl.CONFIG_UPDATE:
            self._apply_config(dict(control.config))
            self._spawn(self.publish_markets(reload=True), "markets-refresh-now")
        else:
            log.warning("control action %d unknown; ignored", control.action)

    def _apply_config(self, config: dict[str, str]) -> None:
        """Runtime keys: batch_size, realtime_lease_s (or its old name _secs), log_level."""
        for key, value in config.items():
            try:
                if key == "batch_size" and int(value) > 0:
                    self._batch_size = int(value)
                elif (
                    key in ("realtime_lease_s", "realtime_lease_secs")
                    and float(value) > 0
                    and self.feeds
                ):
                    self.feeds.set_lease(float(value))
                elif key == "log_level":
                    logging.getLogger().setLevel(value.upper())
                else:
                    log.warning("CONFIG_UPDATE key %r not applied", key)
                    continue
                log.info("CONFIG_UPDATE %s=%s applied", key, value)
            except ValueError:
                log.warning("CONFIG_UPDATE %s=%r is not a valid value", key, value)

    # --- exchange health and liveness (IngestorStatus to the relay) ----------

    def _observe(self, exchange: str, fault: ExchangeCallError | None) -> None:
        if not self.health.record(exchange, fault, time.monotonic()):
            return
        if self.health.healthy(exchange):
            log.info("exchange %s answers again: healthy", exchange)
        else:
            log.warning("exchange %s unhealthy: %s", exchange, self.health.describe(exchange))
        self._health_changed.set()  # the relay hears it now, not at the next interval

    async def _report_status(self) -> None:
        """IngestorStatus every `status_interval_ms`, and at once when health changes."""
        assert self._responder is not None
        interval_ms = self.settings.health.status_interval_ms
        while True:
            self._health_changed.clear()
            problem = self.sink.problem if self.sink is not None else None
            status = self.health.status(
                self.ingestor_id, wall_clock_ms(), interval_ms, kafka_error=problem or ""
            )
            await self._responder.send(status, timeout_s=interval_ms / 1000)
            with suppress(TimeoutError):
                async with asyncio.timeout(interval_ms / 1000):
                    await self._health_changed.wait()

    async def _probe_unhealthy(self) -> None:
        """Probe unhealthy exchanges, and Kafka when it took no record: the relay refuses
        their requests, so no client traffic would ever show that they recovered."""
        while True:
            await asyncio.sleep(self.settings.health.probe_interval_s)
            probes = [
                self._probe(self._by_prefix[f"{e}:"])
                for e in self.health.to_probe(time.monotonic())
            ]
            if self.sink is not None and self.sink.problem is not None:
                probes.append(self.sink.probe())
            await asyncio.gather(*probes)

    async def _probe(self, adapter: ExchangeAdapter) -> None:
        try:
            await adapter.probe()
        except ExchangeCallError as fault:
            log.info("probe of %s failed: %s", adapter.prefix, fault)
            self._observe(adapter.prefix, fault)
        else:
            self._observe(adapter.prefix, None)

    # --- helpers ----------------------------------------------------------

    def _post_to_relay(self, message: Message) -> None:
        """A message for the relay's :5556 (FeedStatus); dropped before the DEALER exists."""
        if self._responder is not None:
            self._responder.post(message)

    def _env(self, adapter: ExchangeAdapter) -> FetchEnv:
        return FetchEnv(
            policy=self.settings.retry.policy(),
            page_limit=adapter.page_limit,
            bounded_pages=adapter.bounded_pages,
            page_concurrency=self.settings.history.page_concurrency,
            venue=adapter.venue,
            observe=lambda fault: self._observe(adapter.prefix, fault),
        )

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.failed_tasks.append(task.get_name())  # /healthz turns unhealthy
            log.error("task %s failed", task.get_name(), exc_info=task.exception())

    async def _shutdown(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.intake is not None:
            self.intake.close()
        if self._jobs:
            _, pending = await asyncio.wait(self._jobs, timeout=SHUTDOWN_GRACE_S)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if self._claims_task is not None:
            self._claims_task.cancel()
            await asyncio.gather(self._claims_task, return_exceptions=True)
        if self.feeds is not None:
            await self.feeds.stop_all()
        if self.books is not None:
            await self.books.stop_all()
        if self._responder is not None:
            self._responder.close()
        if self._tail is not None:
            await self._tail.stop()
        if self.sink is not None:
            await self.sink.close()
        for adapter in self._adapters.values():
            with suppress(Exception):
                await adapter.close()


def _coverage(settings: Settings) -> CoverageSource:
    c = settings.coverage
    if not c.enabled:
        return NO_COVERAGE
    return IcebergCoverage(c.catalog.properties(), c.requests_table, c.catalog.name)
