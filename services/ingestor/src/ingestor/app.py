"""Wiring. Reads like the README's flow diagram:

exchanges (ccxt, load_markets) -> Kafka producer -> Market records (markets.py)
-> claims tail -> live feeds -> work intake (SUB :5555, SUB :5560)
     DataRequest HISTORICAL  -> history.HistoryJobs: claim -> pages -> OHLCBatch records -> done
     silent claim holder     -> takeover claim -> pages -> OHLCBatch records -> done
     DataRequest legacy_sync -> claim -> pages -> DataResponse (DEALER :5556)
     DataRequest REALTIME    -> live.LiveFeeds: start feed / refresh lease -> Tick records
     DataRequest BOOK        -> books.BookFeeds: start book feed / refresh lease
                                  -> BookSnapshot/BookDelta records (Kafka)
                                  '-> FeedStatus (started, lost, failed...) (DEALER :5556)
     IngestorControl         -> cancel feed / apply config + republish markets
recording.exchanges -> recorder.Recorder per exchange: Kafka group slots -> recorded feeds
     (live.LiveFeeds.record, books.BookFeeds.record) -> gaps -> repair.repair_gap -> Ticks
every exchange call -> health.HealthMonitor -> IngestorStatus (DEALER :5556) every interval
Kafka all brokers down / a delivery failed --'   and on change (kafka_error: kafka_unavailable)
                                 '-> probes of unhealthy exchanges, and of Kafka while it fails
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Mapping
from contextlib import suppress
from typing import Any

from google.protobuf.message import Message

from ingestor.books import BookFeeds
from ingestor.claims import Claims
from ingestor.clock import wall_clock_ms
from ingestor.config import Settings, credentials_for, runtime_update
from ingestor.coverage import NO_COVERAGE, CoverageSource, IcebergCoverage
from ingestor.exchange_calls import FetchEnv
from ingestor.exchanges import ExchangeAdapter
from ingestor.health import HealthBook, HealthMonitor
from ingestor.history import HistoryJobs
from ingestor.kafka_sink import KafkaSink, PartitionTail
from ingestor.live import LiveFeeds
from ingestor.markets import MarketPublisher
from ingestor.recorder import Recorder, recorders_universe
from ingestor.retry import RetryPolicy
from ingestor.stats import IngestorStats
from ingestor.venues.base import TickersUnsupportedError
from ingestor.work import LegacyResponder, WorkIntake, new_context
from mdproto import contracts
from mdproto.messages import DataRequest, IngestorControl
from mdproto.runtime.kafka import TopicSpec, spec

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_S = 10.0
#: How long the start waits for the first read of the coverage table before saying ready.
COVERAGE_WARM_WAIT_S = 10.0


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
        self._tasks: set[asyncio.Task[Any]] = set()
        self._ready = asyncio.Event()
        self.markets_ready = asyncio.Event()  # the first Market records were written
        self._stopping = asyncio.Event()
        self.sink: KafkaSink | None = None
        self.feeds: LiveFeeds | None = None
        self.books: BookFeeds | None = None
        self.intake: WorkIntake | None = None
        self.jobs: HistoryJobs | None = None
        self.markets: MarketPublisher | None = None
        self.recorders: dict[str, Recorder] = {}  # by exchange prefix, "BINANCE:"
        self._claims: Claims | None = None
        self._claims_task: asyncio.Task[None] | None = None
        self._tail: PartitionTail | None = None
        self._responder: LegacyResponder | None = None
        self._coverage = _coverage(settings)
        self.health = HealthBook((), settings.health.failure_threshold)
        self._monitor: HealthMonitor | None = None
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
        return 0 if self.jobs is None else self.jobs.in_flight

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
            monitor = self._open_exchanges()
            self.sink = KafkaSink(s.kafka, self.ingestor_id, monitor.changed)
            await self.sink.start(self._topics_to_ensure() if s.kafka.ensure_topics else ())
            self.markets = MarketPublisher(
                list(self._adapters.values()), self.sink, self._env, self.stats, self.markets_ready
            )
            self._spawn(self.markets.first(), "markets-initial")
            if isinstance(self._coverage, IcebergCoverage):
                await self._warm_coverage(self._coverage)
            if s.claims.enabled:
                self._claims = await self._open_claims()
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
            self._start_recording()
            if s.market_metadata.refresh_s > 0:
                self._spawn(
                    self.markets.refresh_every(s.market_metadata.refresh_s), "markets-refresh"
                )
            self._responder = LegacyResponder(
                context, s.relays("response"), self.ingestor_id, s.zmq_heartbeat_ivl_ms
            )
            self.jobs = HistoryJobs(
                self.ingestor_id,
                self._by_prefix,
                self.sink,
                settings=s.history,
                env_for=self._env,
                respond=self._responder.send,
                claims=self._claims,
                max_takeovers=s.claims.max_takeovers,
                stored=self._coverage,
                stats=self.stats,
                stopping=lambda: self.stopping,
            )
            if self._claims is not None:
                # Not in _tasks: it outlives them at shutdown, heartbeating the jobs that finish.
                self._claims_task = asyncio.create_task(
                    self._claims.run(self.jobs.on_takeover, self.jobs.serves), name="claims"
                )
                self._claims_task.add_done_callback(self._task_done)
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
                self._spawn(monitor.report(self._responder, self.sink), "status")
            self._spawn(monitor.probe_unhealthy(self.sink), "health-probes")
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

    def _open_exchanges(self) -> HealthMonitor:
        for exchange_id, cfg in self.settings.served().items():
            if exchange_id not in self._adapters:
                self._adapters[exchange_id] = ExchangeAdapter(
                    exchange_id, cfg, credentials_for(exchange_id)
                )
        self._by_prefix = {a.prefix + ":": a for a in self._adapters.values()}
        h = self.settings.health
        self.health = HealthBook((a.prefix for a in self._adapters.values()), h.failure_threshold)
        self._monitor = HealthMonitor(
            self.health,
            {a.prefix: a for a in self._adapters.values()},
            ingestor_id=self.ingestor_id,
            status_interval_ms=h.status_interval_ms,
            probe_interval_s=h.probe_interval_s,
        )
        return self._monitor

    def _topics_to_ensure(self) -> list[TopicSpec]:
        k = self.settings.kafka
        return [
            spec(contracts.KAFKA_OHLC_BATCHES, k.topic_ohlc_batches),
            spec(contracts.KAFKA_TICKS, k.topic_ticks),
            spec(contracts.KAFKA_BOOK, k.topic_book),
            spec(contracts.KAFKA_MARKETS, k.topic_markets),
            spec(contracts.KAFKA_INGEST_CLAIMS, k.topic_claims),
            spec(contracts.KAFKA_RECORDING, k.topic_recording),
        ]

    async def _open_claims(self) -> Claims:
        """Claims reading the claims partition from `lookback_s` ago."""
        assert self.sink is not None
        sink, topic = self.sink, self.settings.kafka.topic_claims

        async def publish(key: str, value: bytes) -> int:
            return await sink.deliver(topic, key, value, partition=0)

        c = self.settings.claims
        claims = Claims(
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
            claims.on_records,
        )
        await self._tail.start(wall_clock_ms() - int(c.lookback_s * 1000))
        claims.ledger.advance(self._tail.start_offset)
        return claims

    def _start_recording(self) -> None:
        """A Recorder per served exchange that the `recording` section names."""
        assert self.sink is not None and self.feeds is not None and self.books is not None
        s = self.settings
        for exchange_id, wanted in s.recording.exchanges.items():
            adapter = self._adapters.get(exchange_id)
            if adapter is None:
                log.info(
                    "recording: %s is not served here; its recorders are elsewhere", exchange_id
                )
                continue
            if wanted.top is not None and adapter.venue.tickers_unsupported:
                # Refused at start, not a recorder that fails later in the background.
                raise TickersUnsupportedError(exchange_id, adapter.venue.tickers_unsupported)
            recorder = Recorder(
                adapter,
                wanted,
                s.recording,
                feeds=self.feeds,
                books=self.books,
                sink=self.sink,
                env=self._env,
                ingestor_id=self.ingestor_id,
                bootstrap=s.kafka.bootstrap_servers,
                topic=s.kafka.topic_recording,
            )
            self.recorders[adapter.prefix + ":"] = recorder
            self._spawn(recorder.run(), f"recorder-{adapter.prefix}")
        self.feeds.recorded_anywhere = recorders_universe(self.recorders)
        self.books.recorded_anywhere = self.feeds.recorded_anywhere

    def _env(self, adapter: ExchangeAdapter) -> FetchEnv:
        monitor = self._monitor
        assert monitor is not None
        return FetchEnv(
            policy=self.settings.retry.policy(),
            page_limit=adapter.page_limit,
            bounded_pages=adapter.bounded_pages,
            page_concurrency=self.settings.history.page_concurrency,
            venue=adapter.venue,
            observe=lambda fault: monitor.observe(adapter.prefix, fault),
        )

    # --- messages from the relays -------------------------------------------

    def _on_request(self, request: DataRequest) -> None:
        if request.kind == DataRequest.REALTIME:
            assert self.feeds is not None
            self.feeds.request(request.ticker)
        elif request.kind == DataRequest.BOOK:
            assert self.books is not None
            self.books.request(request.ticker)
        elif request.kind == DataRequest.HISTORICAL:
            assert self.jobs is not None
            self.jobs.on_request(request)
        else:
            log.warning("request %r has no kind; ignored", request.request_id)

    def _on_control(self, control: IngestorControl) -> None:
        assert self.feeds is not None and self.jobs is not None and self.markets is not None
        if control.action == IngestorControl.CANCEL_REALTIME:
            self._spawn(self.feeds.cancel(control.ticker), f"cancel-{control.ticker}")
        elif control.action == IngestorControl.CANCEL_BOOK:
            assert self.books is not None
            self._spawn(self.books.cancel(control.ticker), f"cancel-book-{control.ticker}")
        elif control.action == IngestorControl.CONFIG_UPDATE:
            update = runtime_update(control.config)
            if update.batch_size is not None:
                self.jobs.batch_size = update.batch_size
            if update.realtime_lease_s is not None:
                self.feeds.set_lease(update.realtime_lease_s)
            if update.log_level is not None:
                logging.getLogger().setLevel(update.log_level)
            self._spawn(self.markets.publish(reload=True), "markets-refresh-now")
        else:
            log.warning("control action %d unknown; ignored", control.action)

    def _post_to_relay(self, message: Message) -> None:
        """A message for the relay's :5556 (FeedStatus); dropped before the DEALER exists."""
        if self._responder is not None:
            self._responder.post(message)

    async def _warm_coverage(self, coverage: IcebergCoverage) -> None:
        """Read the coverage table once before saying ready (a first request would wait
        for pyiceberg's import and first scan, ~0.9 s); on until it exists, if it does
        not yet (the pipeline creates it), in the background."""
        try:
            read = await asyncio.wait_for(coverage.warm(within_s=0), COVERAGE_WARM_WAIT_S)
        except TimeoutError:
            read = False  # the catalog is slow: ready anyway, the first request reads it
        if not read:
            self._spawn(coverage.warm(), "coverage-warm")

    # --- background tasks and shutdown --------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
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
        if self.jobs is not None:  # still heartbeated, so nobody takes them over meanwhile
            await self.jobs.drain(SHUTDOWN_GRACE_S)
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
