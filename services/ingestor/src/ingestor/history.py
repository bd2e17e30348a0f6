"""Historical requests, from the relay's copy to the claim's DONE.

`HistoryJobs` owns every historical request of this ingestor: drops repeats
(the copy a second relay publishes), claims it (claims.py) while its first
pages are fetched, runs it (`run_history_job`: pages -> OHLCBatch records ->
Kafka, final marker once all are delivered; `legacy_sync` requests answered
inline instead, legacy.py), marks the claim DONE, takes over the requests of a
silent holder and gives up on one whose holders kept dying. Exchange and Kafka
producer are injected (`pages.CandleSource`, `RecordSink`: fakes in tests,
`exchanges.ExchangeAdapter` and `kafka_sink.KafkaSink` in production).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ingestor.candles import BatchBuilder, ExchangeGaps, FetchPlan, candle_slots, metadata_for
from ingestor.coverage import NO_COVERAGE, CoverageSource, fetch_plans
from ingestor.errors import PeriodNotServedError, RequestFailedError
from ingestor.exchange_calls import FetchEnv
from ingestor.legacy import legacy_response
from ingestor.pages import (
    CandleSource,
    check_bars_request,
    iter_answers_concurrently,
    plan_request,
)
from ingestor.stats import IngestorStats
from mdproto import ProtocolError
from mdproto.error_codes import ABANDONED, INTERNAL, KAFKA_DELIVERY, UNSUPPORTED_PERIOD
from mdproto.messages import DataRequest, DataResponse, OHLCBatch, Status
from mdproto.recent import RecentKeys
from mdproto.topics import is_valid_id, parse_ticker

if TYPE_CHECKING:
    from ingestor.claims import Claims
    from ingestor.config import HistorySettings
    from ingestor.exchanges import ExchangeAdapter

log = logging.getLogger(__name__)

REPEATS_REMEMBERED = 50_000  # request_ids: a second relay's copy arrives within seconds


class RecordSink(Protocol):
    async def send_batch(self, key: str, record: OHLCBatch) -> Awaitable[object]:
        """Queue a record; the returned awaitable completes on delivery or raises."""
        ...


class ClaimLostError(Exception):
    """Another ingestor's claim won while this one was already planning or fetching."""


@dataclass(frozen=True, slots=True)
class JobOutcome:
    request_id: str
    status: int
    rows: int
    batches: int
    expected_gaps: int
    error_code: str = ""
    reason: str = ""
    delivered: bool = True  # the final marker reached Kafka
    claimed: bool = True  # False: another ingestor won the claim; nothing was written
    stages: str = ""  # where the time went ("coverage 12 ms, first page 30 ms, ..."), for the log


class StageClock:
    """Milliseconds between the named points of one request, for its log line."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._start = clock()
        self._marks: list[tuple[str, float]] = []

    def mark(self, name: str) -> None:
        self._marks.append((name, self._clock()))

    def __str__(self) -> str:
        return ", ".join(f"{name} {(at - self._start) * 1000:.0f} ms" for name, at in self._marks)


# --- one request's Kafka write ------------------------------------------------------


async def _settle(deliveries: list[Awaitable[object]]) -> str | None:
    """Wait for every delivery; the first error message, or None if all arrived."""
    results = await asyncio.gather(*deliveries, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            return str(result) or type(result).__name__
    return None


async def _send_final(sink: RecordSink, key: str, final: OHLCBatch) -> bool:
    try:
        delivery = await sink.send_batch(key, final)
        await delivery
    except Exception as exc:
        meta = final.metadata
        log.error(
            "request %s: final marker (%s) not delivered: %s",
            meta.request_id,
            Status.Name(meta.status),
            exc,
        )
        return False
    return True


async def write_error_marker(
    request: DataRequest, sink: RecordSink, *, ingestor_id: str, error_code: str, reason: str
) -> bool:
    """A lone ERROR final marker for a request that will not be fetched; True if delivered."""
    final = BatchBuilder(metadata_for(request, ingestor_id), 1).fail(reason, error_code)
    return await _send_final(sink, request.ticker, final)


class _Write:
    """The records of one request, written once its claim is won (`admitted`)."""

    def __init__(
        self,
        request: DataRequest,
        sink: RecordSink,
        builder: BatchBuilder,
        claim: Awaitable[bool] | None,
        from_trades: bool = False,
    ) -> None:
        self.request = request
        self.from_trades = from_trades
        self.sink = sink
        self.builder = builder
        self.clock = StageClock()
        self.deliveries: list[Awaitable[object]] = []
        self.plan: FetchPlan | None = None
        self.first_open: int | None = None
        self.weighed = ExchangeGaps()
        self._claim = claim
        self._claim_won = claim is None

    async def admitted(self) -> None:
        """Return once this ingestor holds the request; ClaimLostError if another does."""
        if self._claim_won:
            return
        assert self._claim is not None
        if not await self._claim:
            raise ClaimLostError
        self._claim_won = True
        self.clock.mark("claim won")

    async def send(self, record: OHLCBatch) -> None:
        await self.admitted()
        self.deliveries.append(await self.sink.send_batch(self.request.ticker, record))

    def slots(self) -> int:  # the integrity report's denominator, also for a failed fetch
        return 0 if self.plan is None else candle_slots(self.plan, self.first_open)

    def gaps(self, complete: bool = False) -> int:  # what the answers so far say had no trades
        return self.weighed.count(self.first_open, complete)

    async def rows(
        self, source: CandleSource | None, env: FetchEnv, stored: CoverageSource
    ) -> OHLCBatch:
        """Fetch and write the rows; the final marker to send (an ERROR one on failure).

        ClaimLostError goes through: the caller answers it.
        """
        request, builder, clock = self.request, self.builder, self.clock
        try:
            if request.bars:
                return self._bars(source)
            try:
                symbol, self.plan = plan_request(request, source, env)
            except PeriodNotServedError as exc:
                if not self.from_trades:
                    raise
                # The pipeline builds the bars from recorded trades (ADR 0015).
                return builder.from_trades(f"bars from recorded trades: {exc.reason}")
            assert source is not None  # plan_request refuses a request no exchange serves
            skip_storage = request.refetch or self.plan.empty
            held = (
                [] if skip_storage else await stored.stored(request.ticker, request.period_seconds)
            )
            clock.mark("coverage")
            parts, origin = fetch_plans(self.plan, held)
            builder.set_source(origin)
            for part in parts:  # the whole plan, or the pieces storage does not hold
                answers = iter_answers_concurrently(source, symbol, part, env, self.admitted)
                async for answer in answers:
                    self.weighed.add(answer)
                    page = answer.accepted
                    if not page:
                        continue
                    if self.first_open is None:
                        self.first_open = page[0].open_time_ms
                        clock.mark("first page")
                    for record in builder.add(page):
                        await self.send(record)
            for record in builder.flush():
                await self.send(record)
            clock.mark("last page")
            failure = await _settle(self.deliveries)
            clock.mark("rows delivered")
            if failure is None:
                return builder.final(self.gaps(complete=True), self.slots())
            reason = f"Kafka delivery failed: {failure}"
            return builder.fail(reason, KAFKA_DELIVERY, self.gaps(complete=True), self.slots())
        except ClaimLostError:
            raise
        except RequestFailedError as exc:
            await _settle(self.deliveries)
            return builder.fail(exc.reason, exc.error_code, self.gaps(), self.slots())
        except Exception as exc:
            log.exception("request %s failed unexpectedly", request.request_id)
            await _settle(self.deliveries)
            reason = f"internal error: {type(exc).__name__}: {exc}"
            return builder.fail(reason, INTERNAL, self.gaps(), self.slots())

    def _bars(self, source: CandleSource | None) -> OHLCBatch:
        """Tick or volume bars: a lone SOURCE_TRADES marker, the pipeline builds them
        from recorded trades (ADR 0015). Bad requests and unserved exchanges fail first."""
        check_bars_request(self.request, source)
        if not self.from_trades:
            reason = "bars from recorded trades are off here (history.bars_from_trades)"
            raise RequestFailedError(UNSUPPORTED_PERIOD, reason)
        return self.builder.from_trades(f"{self.request.bars} bars from recorded trades")

    async def final(self, final: OHLCBatch) -> tuple[OHLCBatch, bool]:
        """Send the final marker; the marker sent last, and whether it was delivered."""
        key = self.request.ticker
        delivered = await _send_final(self.sink, key, final)
        self.clock.mark("final delivered")
        if not delivered and final.metadata.status != Status.ERROR:
            # The rows arrived but the marker did not: try to tell the pipeline it failed.
            reason = "Kafka delivery of the final marker failed"
            final = self.builder.fail(
                reason, KAFKA_DELIVERY, final.metadata.expected_gaps, self.slots()
            )
            delivered = await _send_final(self.sink, key, final)
        return final, delivered


async def run_history_job(
    request: DataRequest,
    source: CandleSource | None,
    sink: RecordSink,
    *,
    ingestor_id: str,
    batch_size: int,
    env: FetchEnv,
    stored: CoverageSource = NO_COVERAGE,
    claim: Awaitable[bool] | None = None,
    from_trades: bool = False,
) -> JobOutcome:
    """Fetch [start, end) and write the request's OHLCBatch records, ending with a final marker.

    `source` is the exchange serving the ticker (None: none does, an ERROR marker).
    What `stored` holds complete is not fetched again (unless the request says
    `refetch`): the marker says where the answer came from, and the pipeline
    counts the rows in Iceberg.

    `from_trades`: a period the exchange does not serve is answered by a lone OK
    final marker of source SOURCE_TRADES (the pipeline builds the bars from recorded
    trades, docs/adr/0015) instead of an ERROR ``unsupported_period`` one.

    `claim` (this ingestor's claim verdict, still being decided) is awaited
    before the first record is written: the coverage read and the first pages
    overlap the claim, and a lost claim writes nothing (`claimed=False`).

    The final marker is only sent once every data record has been delivered;
    a delivery failure turns it into an ERROR marker (code kafka_delivery).
    """
    write = _Write(
        request,
        sink,
        BatchBuilder(metadata_for(request, ingestor_id), batch_size),
        claim,
        from_trades,
    )
    try:
        final = await write.rows(source, env, stored)
        await write.admitted()  # nothing written yet without it (no rows, or a failure)
    except ClaimLostError:
        return JobOutcome(request.request_id, Status.ERROR, 0, 0, 0, delivered=False, claimed=False)
    final, delivered = await write.final(final)
    meta = final.metadata
    return JobOutcome(
        request_id=request.request_id,
        status=meta.status,
        rows=meta.total_rows,
        batches=meta.total_batches,
        expected_gaps=meta.expected_gaps,
        error_code=meta.error_code,
        reason=meta.reason,
        delivered=delivered,
        stages=str(write.clock),
    )


# --- every historical request of this ingestor --------------------------------------


class HistoryJobs:
    """Takes historical requests, claims them, runs them, and ends their claims.

    `exchanges` maps a work prefix (`BINANCE:`) to its adapter, `env_for` gives an
    adapter's `FetchEnv` (health-observed), `respond` sends a legacy answer to the
    relays. `stopping()` true: requests taken over are left to the next ingestor.
    """

    def __init__(
        self,
        ingestor_id: str,
        exchanges: Mapping[str, ExchangeAdapter],
        sink: RecordSink,
        *,
        settings: HistorySettings,
        env_for: Callable[[ExchangeAdapter], FetchEnv],
        respond: Callable[[DataResponse], Awaitable[object]],
        claims: Claims | None,
        max_takeovers: int,
        stored: CoverageSource,
        stats: IngestorStats,
        stopping: Callable[[], bool],
    ) -> None:
        self.ingestor_id = ingestor_id
        self.batch_size = settings.batch_size  # CONFIG_UPDATE may change it
        self._exchanges = exchanges
        self._sink = sink
        self._legacy_max_candles = settings.legacy_max_candles
        self._bars_from_trades = settings.bars_from_trades
        self._env_for = env_for
        self._respond = respond
        self._claims = claims
        self._max_takeovers = max_takeovers
        self._stored = stored
        self._stats = stats
        self._stopping = stopping
        self._seen = RecentKeys[str](REPEATS_REMEMBERED)
        self._semaphore = asyncio.Semaphore(settings.max_concurrent)
        self._jobs: set[asyncio.Task[None]] = set()

    @property
    def in_flight(self) -> int:
        """Requests started and not finished (waiting ones included)."""
        return len(self._jobs)

    def on_request(self, request: DataRequest) -> None:
        """A HISTORICAL request from a relay."""
        if not is_valid_id(request.request_id):
            log.warning("historical request with invalid request_id %r ignored", request.request_id)
            return
        if not self._seen.first_time(request.request_id):
            self._stats.skipped_repeat += 1
            log.info("request %s already handled here; repeat ignored", request.request_id)
            return
        self._start(request)

    def serves(self, request: DataRequest) -> bool:
        """Whether one of this ingestor's exchanges serves the request (takeovers)."""
        return self._exchange_for(request) is not None

    def on_takeover(self, request: DataRequest, attempt: int) -> None:
        """Won a takeover claim (the holder went silent): fetch the whole range again."""
        if self._stopping():  # not heartbeated, so the next ingestor takes it over
            assert self._claims is not None
            self._claims.abandon(request.request_id)
            return
        self._stats.taken_over += 1
        self._seen.first_time(request.request_id)
        self._start(request, attempt)

    async def drain(self, grace_s: float) -> None:
        """Let running requests finish for up to `grace_s`, then cancel the rest."""
        if not self._jobs:
            return
        _, pending = await asyncio.wait(self._jobs, timeout=grace_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def _exchange_for(self, request: DataRequest) -> ExchangeAdapter | None:
        try:
            return self._exchanges.get(parse_ticker(request.ticker).prefix)
        except ProtocolError:
            return None  # still answered: an ERROR beats a client timeout

    def _start(self, request: DataRequest, attempt: int = 0) -> None:
        """attempt 0: a request from the relay, to claim; n: a takeover already won."""
        task = asyncio.create_task(self._run(request, attempt), name=request.request_id)
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)

    async def _run(self, request: DataRequest, attempt: int) -> None:
        claims = self._claims
        verdict: asyncio.Task[bool] | None = None
        if claims is not None and attempt == 0:
            # Decided while the job reads coverage and fetches its first pages; the job
            # writes nothing before it (legacy answers, sent in one go, wait for it).
            verdict = asyncio.create_task(claims.claim(request))
        try:
            if attempt > self._max_takeovers:
                delivered = await self._give_up(request, attempt)
            elif request.legacy_sync:
                delivered = await self._answer_inline(request, verdict)
            else:
                delivered = await self._fetch(request, verdict)
        finally:  # no longer heartbeated; without a DONE (cancelled, undelivered) it is taken over
            if verdict is not None and not verdict.done():
                verdict.cancel()
            if claims is not None:
                claims.abandon(request.request_id)
        if claims is not None and delivered:
            await claims.done(request.request_id)

    def _skipped(self, request: DataRequest) -> bool:
        self._stats.skipped_claimed += 1
        log.info("request %s claimed by another ingestor; skipped", request.request_id)
        return False

    async def _give_up(self, request: DataRequest, attempt: int) -> bool:
        """Every holder so far died mid-fetch: end the request with an ERROR, not another try."""
        reason = f"{attempt} ingestors in a row stopped while fetching it (claims.max_takeovers)"
        log.error("request %s abandoned: %s", request.request_id, reason)
        self._stats.outcomes[("ERROR", ABANDONED)] += 1
        return await write_error_marker(
            request, self._sink, ingestor_id=self.ingestor_id, error_code=ABANDONED, reason=reason
        )

    def _source(self, request: DataRequest) -> tuple[ExchangeAdapter | None, FetchEnv]:
        exchange = self._exchange_for(request)
        return exchange, FetchEnv() if exchange is None else self._env_for(exchange)

    async def _fetch(self, request: DataRequest, claim: asyncio.Task[bool] | None) -> bool:
        """Fetch and write one request; True once its final marker was delivered."""
        async with self._semaphore:
            exchange, env = self._source(request)
            outcome = await run_history_job(
                request,
                exchange,
                self._sink,
                ingestor_id=self.ingestor_id,
                batch_size=self.batch_size,
                env=env,
                stored=self._stored,
                claim=claim,
                from_trades=self._bars_from_trades,
            )
        if not outcome.claimed:
            return self._skipped(request)
        self._stats.history_jobs += 1
        self._stats.rows += outcome.rows
        status = Status.Name(Status.ValueType(outcome.status))
        self._stats.outcomes[(status, outcome.error_code)] += 1
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

    async def _answer_inline(self, request: DataRequest, claim: asyncio.Task[bool] | None) -> bool:
        """A legacy_sync request: candles in a DataResponse to the relays, nothing to Kafka."""
        if claim is not None and not await claim:
            return self._skipped(request)
        async with self._semaphore:
            exchange, env = self._source(request)
            self._stats.legacy_jobs += 1
            response = await legacy_response(
                request,
                exchange,
                env,
                ingestor_id=self.ingestor_id,
                max_candles=self._legacy_max_candles,
            )
            await self._respond(response)
        log.info(
            "legacy request %s answered: status %d, %d candles",
            request.request_id,
            response.status,
            len(response.candles),
        )
        return True
