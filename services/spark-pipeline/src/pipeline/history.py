"""History path: ``market.ohlc.batches`` -> Iceberg ``ohlc`` -> HistoryReadyNotification.

Per micro-batch, on the driver (foreachBatch):

1. decode the OHLCBatch records (rows, final markers, rejects);
2. MERGE the rows into ``ohlc`` (one commit); for a final marker that asks for
   bars from recorded trades (a period the exchange does not serve), aggregate
   ``ticks`` on Spark's executors and MERGE those bars too (`trade_bars`);
3. for the final markers: look up ``requests``, record the new ones (second
   commit), then hand them to the notifier, which publishes them. A request
   answered wholly from storage may have been notified already, as its marker
   reached Kafka (`stored_answers`): it is only recorded (`notifier`).

A request's row count comes from the rows its records brought
(`history_notices.AcceptedRows`); only answers from storage, and requests
whose records this process did not all see, are counted in ``ohlc`` at the
new snapshot, and that count runs alongside the ``requests`` lookup. The
lookup reads the table only for ids it may hold (`known_requests`, read as the
sink starts): a new request, the usual case, needs no Spark query. Until that
read is done every id is looked up, so a batch Spark replays finds its rows.

A request's records share a Kafka key, hence a partition, so when its final
marker is processed every row it announced is in this or an earlier (already
committed) micro-batch. If the driver dies anywhere, Spark replays the batch:
step 2 is idempotent, step 3 re-publishes only what this same batch recorded
and this process has not sent (see `history_notices.plan`): a batch whose
checkpoint commit failed after its publish is replayed silently.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from mdproto import envelope
from mdproto.messages import OHLC, OHLCBatch, Status
from pipeline import count_bars, history_notices, records, trade_bars
from pipeline.config import Settings
from pipeline.known_requests import KnownRequests
from pipeline.lake import Lake
from pipeline.notifier import EARLY_BATCH, HistoryNotifier
from pipeline.records import log_rejects
from pipeline.streams import QueryIdentity, kafka_source, start_query

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from pipeline.faults import CrashPoint

log = logging.getLogger(__name__)
QUERY_NAME = "history"
KAFKA_COLUMNS = ("key", "value", "partition", "offset", "timestamp")


class HistorySink:
    """The foreachBatch function of the history query."""

    def __init__(
        self,
        lake: Lake,
        notifier: HistoryNotifier,
        identity: QueryIdentity,
        crash_point: CrashPoint,
        pool: Executor | None = None,
    ) -> None:
        self._lake = lake
        self._identity = identity
        self._crash_point = crash_point
        self._pool = pool or ThreadPoolExecutor(max_workers=2, thread_name_prefix="history-lookup")
        self._accepted = history_notices.AcceptedRows()
        self._known = KnownRequests()
        self._notifier = notifier
        self._notifier.follow(self._known)
        self._loading: Future[None] | None = None
        self._load_known()

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        laps = Laps()
        session = batch_df.sparkSession
        kafka = batch_df.select(*KAFKA_COLUMNS).toArrow()
        if kafka.num_rows == 0:
            return
        laps.lap("fetch")
        decoded = records.decode_history(kafka, now_ms=_now_ms())
        log_rejects(f"history batch {batch_id}", decoded.rejects)
        laps.lap("decode")
        # The requests lookup does not depend on the candle write: overlap the two.
        ids = sorted({m.request_id for m in decoded.finals})
        to_read = self._known.to_look_up(ids)
        lookup = self._pool.submit(self._lake.find_requests, session, to_read) if to_read else None
        written = self._lake.write_history(session, decoded.candles)
        self._crash_point("history-after-ohlc-commit")
        self._accepted.add(decoded.accepted)
        laps.lap(written.how)
        bars = self._bars_from_trades(session, decoded.finals)
        if bars:
            laps.lap(f"bars from trades {len(bars)}")
        # The snapshot the notifications name: the append's own, unless bars from trades
        # were MERGEd into ``ohlc`` after it (or no append ran): then the current one.
        snapshot = None if bars else written.snapshot_id
        plan = history_notices.Plan()
        if ids:
            # What the stored-answers path published already is only recorded here.
            early = self._notifier.take(ids)
            try:
                plan = self._complete(
                    session, decoded.finals, lookup, batch_id, laps, early, bars, snapshot
                )
            except BaseException:
                self._notifier.finish(ids, recorded=False)
                raise
            self._notifier.finish(ids, recorded=True)
            self._accepted.forget(ids)
        self._load_known()
        log.info(
            "history batch %d: %d records, %d candles (%d duplicates), %d final markers -> "
            "%d notified (%d again after a restart, %d duplicates skipped, %d notified early, "
            "%d sent before the batch failed); "
            "%s; %s since the newest record reached Kafka",
            batch_id,
            decoded.records,
            decoded.candles.num_rows,
            decoded.duplicate_rows,
            len(decoded.finals),
            len(plan.publish),
            len(plan.republished),
            len(plan.duplicates),
            len(plan.notified_early),
            len(plan.sent_before),
            laps,
            _age(kafka),
        )

    def _load_known(self) -> None:
        """Read the ids in ``requests`` once, as the sink starts (again after a batch if
        that read failed): from then on a new request needs no lookup, and stored
        answers can be notified early (`stored_answers`)."""
        loading = self._loading
        if loading is not None:
            if not loading.done() or loading.exception() is None:
                return
            log.warning("reading the ids in requests failed: %s", loading.exception())

        def load() -> None:
            self._known.loaded(self._lake.request_ids())

        self._loading = self._pool.submit(load)

    def _bars_from_trades(
        self, session: SparkSession, finals: list[records.FinalMarker]
    ) -> dict[str, trade_bars.BarReport]:
        """Each from-trades request's bars, built and stored before the notification's
        snapshot is read (a replayed batch builds them again: the MERGE changes nothing)."""
        out: dict[str, trade_bars.BarReport] = {}
        for marker in history_notices.from_trades(finals):
            assert marker.metadata is not None
            t0 = time.monotonic()
            meta = marker.metadata
            # Tick or volume bars (``bars`` set) have their own table; time bars go to ohlc.
            build = count_bars.answer if meta.bars else trade_bars.answer
            report = build(self._lake, session, meta, marker.request_id)
            out[marker.request_id] = report
            log.info(
                "request %s: %d bars of %s from trades in %.0f ms (%s)",
                marker.request_id,
                report.row_count,
                meta.bars or f"{meta.period_seconds} s",
                (time.monotonic() - t0) * 1000,
                report.reason,
            )
        return out

    def _complete(
        self,
        session: SparkSession,
        finals: list[records.FinalMarker],
        lookup: Future[dict[str, history_notices.CompletedRequest]] | None,
        batch_id: int,
        laps: Laps,
        early: dict[str, history_notices.CompletedRequest],
        bars: dict[str, trade_bars.BarReport] | None = None,
        snapshot_id: int | None = None,
    ) -> history_notices.Plan:
        names = self._lake.names
        finals = [m for m in finals if m.request_id not in early]

        def plan_for(existing: dict[str, history_notices.CompletedRequest]) -> history_notices.Plan:
            return history_notices.plan(
                finals,
                existing,
                iceberg_table=names.ohlc_for_clients,
                snapshot_id=snapshot,
                completed_at_ms=completed_at,
                query_id=self._identity.get(),
                batch_id=batch_id,
                sent=sent,
            )

        snapshot = snapshot_id if snapshot_id is not None else self._lake.snapshot_id(names.ohlc)
        completed_at = _now_ms()
        # These ids are the query's (`take`): no other path sends one before our publish.
        sent = self._notifier.sent([m.request_id for m in finals])
        found = history_notices.known_counts(finals, self._accepted)
        # Counted before the lookup says which requests are new: a duplicate's count is wasted.
        to_count = [
            r
            for r in plan_for({}).record
            if history_notices.needs_count(r)
            and r.request_id not in found
            and r.request_id not in (bars or {})
        ]
        counting = (
            self._pool.submit(self._lake.count_request_rows, session, snapshot, to_count)
            if to_count
            else None
        )
        plan = plan_for(lookup.result() if lookup is not None else {})
        laps.lap("lookup" if lookup is not None else "lookup (known)")
        if counting is not None:
            found |= counting.result()
            laps.lap(f"count {len(to_count)}")
        plan = history_notices.apply_counts(plan, found)
        plan = history_notices.apply_bars(plan, bars or {})
        # Published already: recorded under this query, never published again.
        query_id = self._identity.get()
        plan.record += [replace(r, query_id=query_id, batch_id=EARLY_BATCH) for r in early.values()]
        plan.notified_early += early
        try:
            self._lake.record_requests(session, plan.record)
        except Exception:
            self._known.write_failed()  # it may have landed: look the table up from now on
            raise
        self._known.added(r.request_id for r in plan.record)
        self._crash_point("history-after-requests-commit")
        laps.lap("record")
        self._notifier.notify_recorded(plan.publish)
        self._crash_point("history-after-publish")
        laps.lap("publish")
        for request in plan.publish:
            log.info(
                "notified %s on %s: %s, %d rows, snapshot %d",
                request.request_id,
                request.notification_topic,
                Status.Name(request.status),  # type: ignore[arg-type]
                request.row_count,
                request.snapshot_id,
            )
        for request_id in plan.duplicates:
            log.info("request %s was already notified: skipped", request_id)
        for request_id in plan.sent_before:
            log.info("request %s was notified before this batch failed: not again", request_id)
        return plan


class Laps:
    """Step durations of one micro-batch, for the progress line."""

    def __init__(self) -> None:
        self._start = self._last = time.monotonic()
        self._laps: list[tuple[str, float]] = []

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self._laps.append((name, now - self._last))
        self._last = now

    def __str__(self) -> str:
        steps = ", ".join(f"{name} {seconds * 1000:.0f} ms" for name, seconds in self._laps)
        return f"{steps}, total {(self._last - self._start) * 1000:.0f} ms"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _age(kafka: pa.Table) -> str:
    newest = pc.max(kafka["timestamp"]).as_py()
    if newest is None:
        return "?"
    return f"{time.time() - newest.timestamp():.2f} s"


def warm_up_candles() -> pa.Table:
    """One synthetic candle, encoded and decoded as an ingestor's would be."""
    candle = OHLC(
        ticker="WARMUP:WARM/UP", period_seconds=60, open_time_ms=60_000, open=1, high=1, low=1,
        close=1,
    )  # fmt: skip
    value = envelope.encode_record(OHLCBatch(request_id="warm-up", rows=[candle]))
    return records.decode_history(pa.table({"value": pa.array([value], pa.binary())})).candles


def warm_up(lake: Lake) -> None:
    """The history path's decode and ``ohlc`` write once, on a scratch table
    (`Lake.warm_up`), so the first real answer finds warm code."""
    laps = Laps()
    candles = warm_up_candles()
    laps.lap("decode")
    lake.warm_up(candles, laps.lap)
    log.info("history path warmed up: %s", laps)


def start(
    spark: SparkSession,
    settings: Settings,
    lake: Lake,
    notifier: HistoryNotifier,
    crash_point: CrashPoint | None = None,
) -> StreamingQuery:
    source = kafka_source(
        spark,
        settings,
        settings.kafka.topic_ohlc_batches,
        settings.history.max_offsets_per_trigger,
    )
    identity = QueryIdentity()
    return start_query(
        source,
        name=QUERY_NAME,
        settings=settings,
        function=HistorySink(lake, notifier, identity, crash_point or (lambda _: None)),
        trigger_s=settings.history.trigger_s,
        identity=identity,
    )
