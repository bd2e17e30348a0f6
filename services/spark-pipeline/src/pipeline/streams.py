"""Kafka sources and query start-up shared by the history and live paths."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from pipeline.config import Settings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

BatchFunction = Callable[["DataFrame", int], None]
#: Starts one query: at start-up, and again after it failed (fresh sources and sinks, same
#: checkpoint; app.py keeps one per query).
QueryStarter = Callable[[], "StreamingQuery"]
#: How long the broker may hold a fetch of Spark's Kafka consumers (see `kafka_source`).
FETCH_MAX_WAIT_MS = 20


def kafka_source(
    spark: SparkSession,
    settings: Settings,
    topic: str,
    max_offsets: int | None,
    *,
    starting_offsets: str | None = None,
    fail_on_data_loss: bool | None = None,
    large_fetches: bool = True,
) -> DataFrame:
    """Spark's Kafka source on one topic: rows of key, value, partition, offset, timestamp.

    `starting_offsets` and `fail_on_data_loss` default to the `kafka` section's."""
    k = settings.kafka
    if fail_on_data_loss is None:
        fail_on_data_loss = k.fail_on_data_loss
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", k.bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", starting_offsets or k.starting_offsets)
        .option("failOnDataLoss", str(fail_on_data_loss).lower())
        # A task seeks its cached consumer to the batch's offsets; the fetch that consumer
        # pipelined after its last records is still parked at the broker for up to this
        # long (Kafka's default 500 ms), and the seek waits for it: every micro-batch's
        # fetch took 600 ms for a single record. Idle, nothing polls: no cost at rest.
        .option("kafka.fetch.max.wait.ms", str(FETCH_MAX_WAIT_MS))
    )
    if large_fetches:  # fewer, larger fetches: a year of 1-minute candles is ~40 MB of records
        reader = reader.option("kafka.max.partition.fetch.bytes", str(16 * 2**20))
        reader = reader.option("kafka.fetch.max.bytes", str(64 * 2**20))
    if max_offsets is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets))
    for key, value in k.options.items():
        reader = reader.option(key if key.startswith("kafka.") else f"kafka.{key}", value)
    return reader.load()


def trigger_interval(seconds: float) -> str:
    """Spark processingTime string; 0 runs micro-batches back to back."""
    return f"{round(seconds * 1000)} milliseconds"


class QueryIdentity:
    """The id of the query a foreachBatch function belongs to, known only after start().

    The id is stored in the checkpoint, so it is stable across restarts; the
    first batch may run before start() returns, hence the event.
    """

    def __init__(self) -> None:
        self._id = ""
        self._ready = threading.Event()

    def set(self, query_id: str) -> None:
        self._id = query_id
        self._ready.set()

    def get(self, timeout_s: float = 60.0) -> str:
        if not self._ready.wait(timeout_s):
            raise RuntimeError("query id not known: the query did not start")
        return self._id


def start_query(
    frame: DataFrame,
    *,
    name: str,
    settings: Settings,
    function: BatchFunction,
    trigger_s: float,
    output_mode: str = "append",
    identity: QueryIdentity | None = None,
    pool: str | None = None,
    checkpoint: str | None = None,
) -> StreamingQuery:
    """Start a foreachBatch query; ``pool`` is its FAIR scheduler pool (see session.py).

    The query's thread inherits the pool from the thread that starts it.
    ``checkpoint`` names its checkpoint directory (default: ``name``), for a query
    whose plan changed incompatibly under the same name.
    """
    context = frame.sparkSession.sparkContext
    context.setLocalProperty("spark.scheduler.pool", pool)  # type: ignore[arg-type]
    try:
        query = (
            frame.writeStream.queryName(name)
            .outputMode(output_mode)
            .foreachBatch(function)
            .option("checkpointLocation", settings.checkpoint_for(checkpoint or name))
            .trigger(processingTime=trigger_interval(trigger_s))
            .start()
        )
    finally:
        context.setLocalProperty("spark.scheduler.pool", None)  # type: ignore[arg-type]
    if identity is not None:
        identity.set(str(query.id))
    return query
