"""Live path in Spark: what must be durable, on slow triggers.

    market.ticks      -> ticks-persist (every live.persist_trigger_s): append the new
                         (ticker, trade_id) to ``ticks`` (stored keys read first); a
                         batch of catalog.executor_append_min_records or more
                         records is decoded and appended by the executors
    market.ohlc.live  -> candles-store (every live.store_trigger_s): MERGE closed
                         candles into ``ohlc`` (source live; a correction amends)
    market.book       -> book-store (every live.book_store_trigger_s): append the new
                         BookSnapshot records to ``book_snapshots``, then the new
                         BookDelta records to ``book_deltas`` (stored keys read
                         first); a large batch on the executors, as ticks

Publication (ticks, previews, closed candles) is the live engine's, in the PUB
process (``live_engine.py``): these queries only store. They decode on the driver
(Arrow from the JVM, one pass in Python), so no ``pyspark.daemon`` worker runs
for them, except a large ticks or books batch (ADR 0021); a trigger without new records
costs Spark an offset lookup only.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import pyarrow as pa

from pipeline import batch_offsets, records
from pipeline.blobs import Folder
from pipeline.config import Settings
from pipeline.executor_writes import Stored
from pipeline.lake import Lake
from pipeline.streams import QueryStarter, kafka_source, start_query

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from pipeline.faults import CrashPoint

log = logging.getLogger(__name__)

KAFKA_COLUMNS = ("value", "timestamp", "partition", "offset")


#: How many Kafka records a micro-batch holds, by batch id (`batch_offsets.batch_records`).
BatchRecords = Callable[[int], int]


class TickPersister:
    """ticks-persist: append new (ticker, trade_id) to ``ticks``, the batch decoded on the
    driver or, when its offsets say it is large, on the executors (`WriteRule.decode_on`,
    ADR 0021)."""

    def __init__(
        self, lake: Lake, crash_point: CrashPoint, batch_records: BatchRecords | None = None
    ) -> None:
        self._lake = lake
        self._crash_point = crash_point
        self._batch_records = batch_records  # None: every batch on the driver

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        kafka = batch_df.select(*KAFKA_COLUMNS)
        count = self._batch_records(batch_id) if self._batch_records is not None else 0
        if self._lake.rule.decode_on(count) == "executors":
            stored = self.on_executors(kafka)
        else:
            stored = self.on_driver(kafka, batch_id)
        if stored.unique == 0:
            return
        self._crash_point("live-after-ticks-commit")
        log.info(
            "ticks-persist batch %d: %d unique ticks stored (%s) in %.0f ms (%s)",
            batch_id,
            stored.unique,
            stored.how,
            (time.monotonic() - started) * 1000,
            stored.steps(),
        )

    def on_driver(self, kafka: DataFrame, batch_id: int) -> Stored:
        """Every record to the driver as Arrow, decoded there, the new ticks appended
        (`Lake.write_ticks`)."""
        started = time.monotonic()
        arrow = kafka.toArrow()
        collected = time.monotonic()
        ticks, rejects = records.kafka_ticks_table(arrow)
        del arrow  # the batch's records, no longer needed while the append runs
        records.log_rejects(f"ticks-persist batch {batch_id}", rejects)
        decoded = time.monotonic()
        if ticks.num_rows == 0:
            return Stored(0, "none")
        how = self._lake.write_ticks(kafka.sparkSession, ticks)
        steps = {"collect": collected - started, "decode": decoded - collected}
        steps["write"] = time.monotonic() - decoded
        return Stored(ticks.num_rows, how, tuple((k, v * 1000) for k, v in steps.items()))

    def on_executors(self, kafka: DataFrame) -> Stored:
        """Decoded and appended by Spark's executors (`Lake.write_kafka_ticks`)."""
        return self._lake.write_kafka_ticks(kafka.sparkSession, kafka)


class CandleStore:
    """candles-store: closed live candles from Kafka -> amending MERGE into ``ohlc``.

    A replay (a restarted query, or the live engine reading ticks again after a
    crash) brings the same candles: nothing differs, nothing is new. A correction
    comes after its candle in the ticker's partition, so the last copy wins.
    """

    def __init__(self, lake: Lake, crash_point: CrashPoint) -> None:
        self._lake = lake
        self._crash_point = crash_point

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        rows, rejects = records.decode_live_candles(batch_df.select(*KAFKA_COLUMNS).toArrow())
        records.log_rejects(f"candles-store batch {batch_id}", rejects)
        if rows.num_rows == 0:
            return
        how = self._lake.write_live(batch_df.sparkSession, live_ohlc_rows(rows))
        self._crash_point("live-after-candles-commit")
        log.info(
            "candles-store batch %d: %d closed candles committed (%s) in %.0f ms",
            batch_id,
            rows.num_rows,
            how,
            (time.monotonic() - started) * 1000,
        )


class BookStore:
    """book-store: the ingestor's snapshots (periodic and resets) -> ``book_snapshots``,
    its deltas -> ``book_deltas``, both in each micro-batch; decoded on the driver or,
    when its offsets say it is large, on the executors (`WriteRule.decode_on`, ADR 0021).

    A past book is the newest stored snapshot at or before its time and the deltas
    after it (docs/protocol.md "Book history"). Deltas are stored after the snapshots:
    a batch that fails between the two is replayed whole, and both writes add only
    keys not stored yet (`Lake._append_unstored`, `Lake._append_on_executors`).
    """

    def __init__(
        self, lake: Lake, crash_point: CrashPoint, batch_records: BatchRecords | None = None
    ) -> None:
        self._lake = lake
        self._crash_point = crash_point
        self._batch_records = batch_records  # None: every batch on the driver

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        kafka = batch_df.select(*KAFKA_COLUMNS)
        count = self._batch_records(batch_id) if self._batch_records is not None else 0
        if self._lake.rule.decode_on(count) == "executors":
            snapshots, deltas = self._lake.write_kafka_books(kafka.sparkSession, kafka)
        else:
            snapshots, deltas = self.on_driver(kafka, batch_id)
        if snapshots.unique == 0 and deltas.unique == 0:
            return
        self._crash_point("live-after-books-commit")
        log.info(
            "book-store batch %d: %d book snapshots (%s), %d deltas (%s) stored in %.0f ms "
            "(snapshots: %s; deltas: %s)",
            batch_id,
            snapshots.unique,
            snapshots.how,
            deltas.unique,
            deltas.how,
            (time.monotonic() - started) * 1000,
            snapshots.steps(),
            deltas.steps(),
        )

    def on_driver(self, kafka: DataFrame, batch_id: int) -> tuple[Stored, Stored]:
        """Every record to the driver as Arrow, decoded there, each table's new rows
        appended (`Lake.merge_book_snapshots`, then `Lake.merge_book_deltas`). The
        batch's collect and decode are counted among the snapshots' steps."""
        started = time.monotonic()
        arrow = kafka.toArrow()
        collected = time.monotonic()
        rows = records.decode_book(arrow)
        del arrow  # the batch's records, no longer needed while the appends run
        records.log_rejects(f"book-store batch {batch_id}", rows.rejects)
        decoded = time.monotonic()
        steps = [("collect", collected - started), ("decode", decoded - collected)]
        snapshots, deltas = Stored(0, "none", _ms(steps)), Stored(0, "none")
        if rows.snapshots.num_rows:
            how = self._lake.merge_book_snapshots(kafka.sparkSession, rows.snapshots)
            steps.append(("write", time.monotonic() - decoded))
            snapshots = Stored(rows.snapshots.num_rows, how, _ms(steps))
        if rows.deltas.num_rows:
            begun = time.monotonic()
            how = self._lake.merge_book_deltas(kafka.sparkSession, rows.deltas)
            deltas = Stored(rows.deltas.num_rows, how, _ms([("write", time.monotonic() - begun)]))
        return snapshots, deltas


def _ms(steps: list[tuple[str, float]]) -> tuple[tuple[str, float], ...]:
    """`Stored.steps_ms` of steps timed in seconds."""
    return tuple((name, seconds * 1000) for name, seconds in steps)


def offset_log_records(settings: Settings, query: str) -> BatchRecords | None:
    """The record count of ``query``'s micro-batches from its offset log; None when no
    batch may go to the executors (``catalog.executor_append_min_records`` 0)."""
    if not settings.catalog.executor_append_min_records:
        return None
    checkpoint = Folder.at(settings.checkpoint_for(query), settings.catalog)
    return functools.partial(batch_offsets.batch_records, checkpoint)


def live_ohlc_rows(rows: pa.Table) -> pa.Table:
    """Closed candle rows -> ``ohlc`` rows of source live (no exchange-only volumes), their
    ``incomplete`` note kept."""
    n = rows.num_rows
    now_us = time.time_ns() // 1000
    columns: dict[str, pa.Array | pa.ChunkedArray] = {
        name: rows[name] for name in records.OHLC_SCHEMA.names[:11]
    }
    columns["source"] = pa.array([records.SOURCE_LIVE] * n, pa.string())
    columns["request_id"] = pa.nulls(n, pa.string())
    columns["ingested_at"] = pa.array([now_us] * n, pa.int64()).cast(records.UTC_US)
    for name in records.OPTIONAL_VOLUMES:  # what an exchange reports; not ours to guess
        columns[name] = pa.nulls(n, pa.float64())
    columns["incomplete"] = rows["incomplete"]
    table = pa.table(columns)
    return table.select(records.OHLC_SCHEMA.names).cast(records.OHLC_SCHEMA)


def starters(
    spark: SparkSession,
    settings: Settings,
    lake: Lake,
    crash_point: CrashPoint | None = None,
) -> dict[str, QueryStarter]:
    """The live queries by name, each as the function that starts it (app.py restarts a
    failed one from its checkpoint with it)."""
    live, k = settings.live, settings.kafka
    crash = crash_point or (lambda _: None)  # production: no crash points

    def kafka(topic: str, most: int | None = live.max_offsets_per_trigger) -> DataFrame:
        return kafka_source(spark, settings, topic, most)

    def ticks_persist() -> StreamingQuery:
        return start_query(
            kafka(k.topic_ticks),
            name="ticks-persist",
            settings=settings,
            function=TickPersister(lake, crash, offset_log_records(settings, "ticks-persist")),
            trigger_s=live.persist_trigger_s,
        )

    def candles_store() -> StreamingQuery:
        return start_query(
            kafka(k.topic_live_candles),
            name="candles-store",
            settings=settings,
            function=CandleStore(lake, crash),
            trigger_s=live.store_trigger_s,
        )

    def book_store() -> StreamingQuery:
        most = live.book_store_max_records
        if live.max_offsets_per_trigger is not None:
            most = min(most, live.max_offsets_per_trigger)
        return start_query(
            kafka(k.topic_book, most),
            name="book-store",
            settings=settings,
            function=BookStore(lake, crash, offset_log_records(settings, "book-store")),
            trigger_s=live.book_store_trigger_s,
        )

    return {
        "ticks-persist": ticks_persist,
        "candles-store": candles_store,
        "book-store": book_store,
    }
