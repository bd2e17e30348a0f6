"""Live path in Spark: what must be durable, on slow triggers and without Python workers.

    market.ticks      -> ticks-persist (every live.persist_trigger_s): append the new
                         (ticker, trade_id) to ``ticks`` (stored keys read first)
    market.ohlc.live  -> candles-store (every live.store_trigger_s): MERGE closed
                         candles into ``ohlc`` (source live; a correction amends)
    market.book       -> book-store (every live.book_store_trigger_s): MERGE the
                         BookSnapshot records into ``book_snapshots`` and the
                         BookDelta records into ``book_deltas``

Publication (ticks, previews, closed candles) is the live engine's, in the PUB
process (``live_engine.py``): these queries only store. Both decode on the driver
(Arrow from the JVM, one pass in Python), so no ``pyspark.daemon`` worker runs
for them; a trigger without new records costs Spark an offset lookup only.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import pyarrow as pa

from pipeline import records
from pipeline.config import Settings
from pipeline.lake import Lake
from pipeline.streams import QueryStarter, kafka_source, start_query

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from pipeline.faults import CrashPoint

log = logging.getLogger(__name__)

KAFKA_COLUMNS = ("value", "timestamp", "partition", "offset")


class TickPersister:
    """ticks-persist: decode on the driver, append new (ticker, trade_id) to ``ticks``."""

    def __init__(self, lake: Lake, crash_point: CrashPoint) -> None:
        self._lake = lake
        self._crash_point = crash_point

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        ticks, rejects = records.kafka_ticks_table(batch_df.select(*KAFKA_COLUMNS).toArrow())
        records.log_rejects(f"ticks-persist batch {batch_id}", rejects)
        if ticks.num_rows == 0:
            return
        how = self._lake.write_ticks(batch_df.sparkSession, ticks)
        self._crash_point("live-after-ticks-commit")
        log.info(
            "ticks-persist batch %d: %d unique ticks stored (%s) in %.0f ms",
            batch_id,
            ticks.num_rows,
            how,
            (time.monotonic() - started) * 1000,
        )


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
    its deltas -> ``book_deltas``, both in each micro-batch.

    A past book is the newest stored snapshot at or before its time and the deltas
    after it (docs/protocol.md "Book history"). Deltas are stored after the snapshots:
    a batch that fails between the two is replayed whole, and both writes add only
    keys not stored yet (`Lake._append_unstored`).
    """

    def __init__(self, lake: Lake) -> None:
        self._lake = lake

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        rows = records.decode_book(batch_df.select(*KAFKA_COLUMNS).toArrow())
        records.log_rejects(f"book-store batch {batch_id}", rows.rejects)
        if rows.snapshots.num_rows:
            self._lake.merge_book_snapshots(batch_df.sparkSession, rows.snapshots)
        if rows.deltas.num_rows:
            self._lake.merge_book_deltas(batch_df.sparkSession, rows.deltas)
        if rows.snapshots.num_rows or rows.deltas.num_rows:
            log.info(
                "book-store batch %d: %d book snapshots, %d deltas stored in %.0f ms",
                batch_id,
                rows.snapshots.num_rows,
                rows.deltas.num_rows,
                (time.monotonic() - started) * 1000,
            )


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

    def kafka(topic: str) -> DataFrame:
        return kafka_source(spark, settings, topic, live.max_offsets_per_trigger)

    def ticks_persist() -> StreamingQuery:
        return start_query(
            kafka(k.topic_ticks),
            name="ticks-persist",
            settings=settings,
            function=TickPersister(lake, crash),
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
        return start_query(
            kafka(k.topic_book),
            name="book-store",
            settings=settings,
            function=BookStore(lake),
            trigger_s=live.book_store_trigger_s,
        )

    return {
        "ticks-persist": ticks_persist,
        "candles-store": candles_store,
        "book-store": book_store,
    }
