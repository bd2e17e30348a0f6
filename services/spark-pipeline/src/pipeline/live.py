"""Live path in Spark: ``market.ticks`` -> Iceberg ``ticks`` and candles (PUB + ``ohlc``).

Separate queries, so none waits for another's commits: ``ticks-persist`` (MERGE
into ``ticks``, the deduplicated trades), ``candles-update`` (changed candles
published with ``closed=false``, a preview), ``candles-close`` (each window once
-> ``closed=true`` and ``ohlc``; ``live.close_mode``: ``event`` closes on the
ticker's event time or an idle timeout, per-ticker state in
``pipeline.candle_close``, and amends a candle a late trade changed;
``watermark`` reads ``ticks`` and closes after the watermark), and
``ticks-publish`` only with ``live.publisher: spark``. Open/close by trade time
(oracle: tests/oracles/candle_oracle.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from mdproto import topics
from mdproto.messages import OHLC
from pipeline import candle_close, records
from pipeline.config import LiveConfig, Settings
from pipeline.lake import Lake
from pipeline.pub_server import Publisher
from pipeline.session import FAST_POOL
from pipeline.streams import QueryStarter, kafka_source, start_query
from pipeline.tick_publisher import RecentKeys

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from pipeline.faults import CrashPoint

log = logging.getLogger(__name__)

CANDLE_COLUMNS = (
    "ticker",
    "exchange",
    "symbol",
    "period_seconds",
    "open_time",
    "open",
    "high",
    "low",
    "close",
    "volume",
    "trade_count",
)


def decoded_ticks(kafka: DataFrame) -> DataFrame:
    """Kafka rows -> valid tick rows (``records.TICK_SCHEMA``), decoded in Python workers."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return kafka.select("value", "timestamp").mapInArrow(
        records.kafka_ticks_to_rows, from_arrow_schema(records.TICK_SCHEMA)
    )


def candles(ticks: DataFrame, periods: Sequence[int], watermark_s: float) -> DataFrame:
    """Streaming candles, one row per (ticker, period, window), for every period.

    One aggregation per period, unioned. No deduplication operator here: in
    Spark 4.0.4 a union of aggregations behind a stateful deduplication never
    evicts (nor, in append mode, emits) the longer windows, so the closing query
    reads trades that are already unique (the ``ticks`` table).
    """
    from pyspark.sql import functions as sf

    watermarked = ticks.withWatermark("trade_time", f"{round(watermark_s * 1000)} milliseconds")
    order = sf.struct("trade_time", sf.length("trade_id"), "trade_id")
    frames = []
    for period in periods:
        frames.append(
            watermarked.groupBy(
                "ticker", "exchange", "symbol", sf.window("trade_time", f"{period} seconds")
            )
            .agg(
                sf.min_by("price", order).alias("open"),
                sf.max("price").alias("high"),
                sf.min("price").alias("low"),
                sf.max_by("price", order).alias("close"),
                sf.sum("amount").alias("volume"),
                sf.count(sf.lit(1)).alias("trade_count"),
            )
            .select(
                "ticker",
                "exchange",
                "symbol",
                sf.lit(period).cast("int").alias("period_seconds"),
                sf.col("window.start").alias("open_time"),
                *CANDLE_COLUMNS[5:],  # open ... trade_count
            )
        )
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    return result


def ohlc_messages(rows: pa.Table, *, closed: bool) -> list[tuple[str, OHLC]]:
    """(topic, OHLC) for candle rows with an ``open_time_ms`` (and optional ``correction``)."""
    out: list[tuple[str, OHLC]] = []
    cols: dict[str, list[Any]] = {name: rows.column(name).to_pylist() for name in rows.schema.names}
    corrections = cols.get("correction") or [False] * rows.num_rows
    for i in range(rows.num_rows):
        ticker = cols["ticker"][i]
        period = cols["period_seconds"][i]
        out.append(
            (
                topics.ohlc_topic(ticker, period),
                OHLC(
                    ticker=ticker,
                    period_seconds=period,
                    open_time_ms=cols["open_time_ms"][i],
                    open=cols["open"][i],
                    high=cols["high"][i],
                    low=cols["low"][i],
                    close=cols["close"][i],
                    volume=cols["volume"][i],
                    trade_count=cols["trade_count"][i],
                    closed=closed,
                    correction=bool(corrections[i]),
                ),
            )
        )
    return out


def _with_open_time_ms(candle_rows: pa.Table) -> pa.Table:
    ms = pc.cast(candle_rows["open_time"], pa.timestamp("ms", tz="UTC")).cast(pa.int64())
    return candle_rows.append_column("open_time_ms", ms)


class TickPublisher:
    """ticks-publish (``live.publisher: spark``): decode on the driver and publish."""

    def __init__(self, publisher: Publisher, recent: int = 200_000) -> None:
        self._publisher = publisher
        self._recent = RecentKeys(recent)
        self.published = 0

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        kafka = batch_df.select("value", "partition", "offset").toArrow()
        decoded = records.decode_ticks(kafka)
        records.log_rejects(f"ticks batch {batch_id}", decoded.rejects)
        fresh = [t for t in decoded.ticks if self._recent.first_time((t.ticker, t.trade_id))]
        self.published += self._publisher.publish_many(
            (topics.tick_topic(t.ticker), t) for t in fresh
        )


class TickPersister:
    """ticks-persist: decode on executors, MERGE new (ticker, trade_id) into ``ticks``."""

    def __init__(self, lake: Lake, crash_point: CrashPoint) -> None:
        self._lake = lake
        self._crash_point = crash_point

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        from pyspark.sql import functions as sf

        started = time.monotonic()
        ticks = decoded_ticks(batch_df).dropDuplicates(["ticker", "trade_id"]).persist()
        try:
            stats = ticks.agg(
                sf.count(sf.lit(1)).alias("n"),
                sf.unix_millis(sf.min("trade_time")).alias("lo"),
                sf.unix_millis(sf.max("trade_time")).alias("hi"),
            ).toArrow()
            n = stats["n"][0].as_py()
            if not n:
                return
            self._lake.merge_ticks(ticks, stats["lo"][0].as_py(), stats["hi"][0].as_py())
            self._crash_point("live-after-ticks-commit")
        finally:
            ticks.unpersist()
        log.info(
            "ticks-persist batch %d: %d unique ticks merged in %.0f ms",
            batch_id,
            n,
            (time.monotonic() - started) * 1000,
        )


class CandleUpdatePublisher:
    """candles-update: publish every changed window as ``OHLC(closed=false)``."""

    def __init__(self, publisher: Publisher) -> None:
        self._publisher = publisher

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        rows = _collect_candles(batch_df)
        if rows.num_rows:
            self._publisher.publish_many(ohlc_messages(rows, closed=False))


class CandleCloser:
    """candles-close: MERGE closed windows into ``ohlc``, then publish ``closed=true``."""

    def __init__(self, lake: Lake, publisher: Publisher, crash_point: CrashPoint) -> None:
        self._lake = lake
        self._publisher = publisher
        self._crash_point = crash_point

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        rows = _collect_candles(batch_df)
        if rows.num_rows == 0:
            return
        table = _live_ohlc_rows(rows)
        session = batch_df.sparkSession
        bounds = pc.min_max(rows["open_time_ms"])
        frame = session.createDataFrame(table)
        self._lake.merge_live_candles(frame, bounds["min"].as_py(), bounds["max"].as_py())
        self._crash_point("live-after-candles-commit")
        self._publisher.publish_many(ohlc_messages(rows, closed=True))
        log.info(
            "candles-close batch %d: %d closed candles committed and published in %.0f ms",
            batch_id,
            rows.num_rows,
            (time.monotonic() - started) * 1000,
        )


def event_closed_candles(ticks: DataFrame, live: LiveConfig) -> DataFrame:
    """Closed and corrected candles (``candle_close.OUTPUT_SCHEMA``), per-ticker state.

    Processing-time timeouts make Spark run a batch every trigger even without
    data: that is what closes the window of a ticker that went quiet.
    """
    from pyspark.sql import functions as sf

    cfg = candle_close.Closing(tuple(live.periods), live.watermark_s, live.close_idle_s)
    return (
        ticks.select(
            *candle_close.INPUT_COLUMNS[:-1], sf.unix_micros("trade_time").alias("trade_us")
        )
        .groupBy("ticker")
        .applyInPandasWithState(
            candle_close.close_candles(cfg),
            candle_close.OUTPUT_SCHEMA,
            candle_close.STATE_SCHEMA,
            "update",
            "ProcessingTimeTimeout",
        )
    )


class EventCandleCloser:
    """candles-close (``close_mode: event``): publish closed/corrected candles, then MERGE.

    Published first: the ``ohlc`` commit (~0.5-1.5 s here) would otherwise be most
    of the latency. A driver killed in between replays the batch: the same rows
    (Spark restores the previous state and the batch's processing time) are
    published again, identical, and committed (an amending MERGE, so a replay or
    a correction of a live candle updates it; an exchange candle always wins).
    """

    def __init__(self, lake: Lake, publisher: Publisher, crash_point: CrashPoint) -> None:
        self._lake = lake
        self._publisher = publisher
        self._crash_point = crash_point

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        rows = batch_df.toArrow()
        if rows.num_rows == 0:
            return
        us = pc.multiply(rows["open_time_ms"], pa.scalar(1000, pa.int64()))
        rows = rows.append_column("open_time", us.cast(records.UTC_US))
        self._publisher.publish_many(ohlc_messages(rows, closed=True))
        published_ms = (time.monotonic() - started) * 1000
        bounds = pc.min_max(rows["open_time_ms"])
        frame = batch_df.sparkSession.createDataFrame(_live_ohlc_rows(rows))
        self._lake.merge_live_candles(
            frame, bounds["min"].as_py(), bounds["max"].as_py(), amend=True
        )
        self._crash_point("live-after-candles-commit")
        corrections = pc.sum(rows["correction"].cast(pa.int64())).as_py() or 0
        log.info(
            "candles-close batch %d: %d closed candles (%d corrections) published in %.0f ms, "
            "committed in %.0f ms",
            batch_id,
            rows.num_rows,
            corrections,
            published_ms,
            (time.monotonic() - started) * 1000,
        )


def _collect_candles(batch_df: DataFrame) -> pa.Table:
    return _with_open_time_ms(batch_df.select(*CANDLE_COLUMNS).toArrow())


def _live_ohlc_rows(rows: pa.Table) -> pa.Table:
    n = rows.num_rows
    now_us = time.time_ns() // 1000
    columns: dict[str, pa.Array | pa.ChunkedArray] = {name: rows[name] for name in CANDLE_COLUMNS}
    columns["source"] = pa.array([records.SOURCE_LIVE] * n, pa.string())
    columns["request_id"] = pa.nulls(n, pa.string())
    columns["ingested_at"] = pa.array([now_us] * n, pa.int64()).cast(records.UTC_US)
    for name in records.OPTIONAL_VOLUMES:  # what an exchange reports; not ours to guess
        columns[name] = pa.nulls(n, pa.float64())
    table = pa.table(columns)
    return table.select(records.OHLC_SCHEMA.names).cast(records.OHLC_SCHEMA)


def iceberg_ticks(spark: SparkSession, table: str) -> DataFrame:
    """The ``ticks`` table as a stream of appended trades (MERGE inserts are appends).

    Snapshots that delete or overwrite (retention, maintenance) are skipped, not
    fatal; compactions ("replace") are always skipped by Iceberg.
    """
    return (
        spark.readStream.format("iceberg")
        .option("streaming-skip-delete-snapshots", "true")
        .option("streaming-skip-overwrite-snapshots", "true")
        .load(table)
        .select("ticker", "exchange", "symbol", "trade_id", "price", "amount", "trade_time")
    )


def starters(
    spark: SparkSession,
    settings: Settings,
    lake: Lake,
    publisher: Publisher,
    crash_point: CrashPoint | None = None,
) -> dict[str, QueryStarter]:
    """The live queries by name, each as the function that starts it (app.py restarts a
    failed one from its checkpoint with it)."""
    live = settings.live
    crash = crash_point or (lambda _: None)  # production: no crash points

    def kafka() -> DataFrame:
        topic = settings.kafka.topic_ticks
        return kafka_source(spark, settings, topic, live.max_offsets_per_trigger)

    def ticks_publish() -> StreamingQuery:
        return start_query(
            kafka(),
            name="ticks-publish",
            settings=settings,
            function=TickPublisher(publisher),
            trigger_s=live.publish_trigger_s,
            pool=FAST_POOL,
        )

    def ticks_persist() -> StreamingQuery:
        return start_query(
            kafka(),
            name="ticks-persist",
            settings=settings,
            function=TickPersister(lake, crash),
            trigger_s=live.persist_trigger_s,
        )

    def candles_update() -> StreamingQuery:
        return start_query(
            candles(decoded_ticks(kafka()), live.periods, live.watermark_s),
            name="candles-update",
            settings=settings,
            function=CandleUpdatePublisher(publisher),
            trigger_s=live.candle_update_trigger_s,
            output_mode="update",
        )

    def candles_close_event() -> StreamingQuery:
        return start_query(
            event_closed_candles(decoded_ticks(kafka()), live),
            name="candles-close",
            settings=settings,
            function=EventCandleCloser(lake, publisher, crash),
            trigger_s=live.candle_close_trigger_s,
            output_mode="update",
            checkpoint="candles-close-event",
        )

    def candles_close_watermark() -> StreamingQuery:
        return start_query(
            candles(iceberg_ticks(spark, lake.names.ticks), live.periods, live.watermark_s),
            name="candles-close",
            settings=settings,
            function=CandleCloser(lake, publisher, crash),
            trigger_s=live.candle_close_trigger_s,
            output_mode="append",
        )

    queries: dict[str, QueryStarter] = {}
    if live.publisher == "spark":
        queries["ticks-publish"] = ticks_publish
    queries["ticks-persist"] = ticks_persist
    queries["candles-update"] = candles_update
    queries["candles-close"] = (
        candles_close_event if live.close_mode == "event" else candles_close_watermark
    )
    return queries
