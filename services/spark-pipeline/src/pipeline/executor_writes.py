"""A large ``ticks-persist`` micro-batch, written by Spark's executors (ADR 0021).

    Kafka micro-batch            executors: mapInArrow(`decode_partition`), in Python
      -> valid tick rows           workers, with `records.kafka_ticks_rows`
      -> one row per key           a shuffle by ticker: the last copy in Kafka order wins
      -> cached                    job 1 brings its count, time range, tickers
      -> LEFT ANTI JOIN            the stored keys of those tickers in that range
      -> Spark's Iceberg append    job 2; the driver commits

Why: on the driver path every record passes through one Python process (Arrow
from the JVM, the decode, the stored keys, pyiceberg's Parquet): one core's worth,
whatever the cluster. Here the driver plans, receives the few numbers of job 1 and
commits; the work is spread over the executors' cores. Which batches come here is
`write_paths.WriteRule.decode_on`, by the record count of the offsets.

`decode_partition` runs in the executors' Python workers: it is what they import
(`session.ship_python_packages` gives them `pipeline` and `mdproto` off this host).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from mdproto.tables import Ticks
from pipeline import records

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)


def decode_partition(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow's function: Kafka rows -> ``records.TICK_ROWS_SCHEMA`` rows. A reject is
    logged by the worker (its stderr is the executor's log); the record stays in Kafka."""
    for batch in batches:
        rows, rejects = records.kafka_ticks_rows(batch)
        records.log_rejects("ticks-persist on an executor", rejects)
        yield from rows.to_batches()


def tick_rows_type() -> StructType:
    """Spark's type of `decode_partition`'s rows (pyspark's own Arrow mapping)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(records.TICK_ROWS_SCHEMA)


def unique_ticks(kafka: DataFrame) -> DataFrame:
    """The valid ticks of a Kafka micro-batch (``value``, ``timestamp``, ``partition``,
    ``offset``), one row per (ticker, trade_id): the last in Kafka order, as
    `records.kafka_ticks_table` keeps on the driver."""
    from pyspark.sql import Window
    from pyspark.sql import functions as sf

    # One shuffle, by ticker: the window's key starts with it, and each write task then
    # holds whole tickers, one file per ticker and day (not one per task as well).
    rows = kafka.mapInArrow(decode_partition, tick_rows_type()).repartition(Ticks.TICKER)
    last = Window.partitionBy(*Ticks.SCHEMA.key).orderBy(
        sf.col(records.KAFKA_PARTITION).desc(), sf.col(records.KAFKA_OFFSET).desc()
    )
    ranked = rows.withColumn("_copy", sf.row_number().over(last))
    return ranked.where(sf.col("_copy") == 1).select(*records.TICK_SCHEMA.names)


@dataclass(frozen=True, slots=True)
class Stored:
    """What one ``ticks-persist`` batch stored: its unique ticks, how ("append N",
    "executor-append N", "merge", "none") and the ms of each step, in order (the log
    line's and `bench/write_paths.py`'s)."""

    unique: int
    how: str
    steps_ms: tuple[tuple[str, float], ...] = ()

    def steps(self) -> str:
        return ", ".join(f"{name} {ms:.0f}" for name, ms in self.steps_ms)


@dataclass(frozen=True, slots=True)
class Span:
    """What job 1 brings to the driver: how many unique ticks, their trade time range
    (µs since the epoch) and their tickers."""

    rows: int
    lo_us: int
    hi_us: int
    tickers: tuple[str, ...]

    @property
    def ms_range(self) -> tuple[int, int]:
        """The ms range ``[lo, hi]`` that holds every trade time (a MERGE's bounds)."""
        return self.lo_us // 1000, -(-self.hi_us // 1000)


def span_of(ticks: DataFrame) -> Span:
    """Count ``ticks`` and take their range and tickers (one Spark job)."""
    from pyspark.sql import functions as sf

    at = sf.unix_micros(sf.col(Ticks.TRADE_TIME))
    row = ticks.agg(
        sf.count(sf.lit(1)).alias("rows"),
        sf.min(at).alias("lo"),
        sf.max(at).alias("hi"),
        sf.collect_set(Ticks.TICKER).alias("tickers"),
    ).first()
    assert row is not None
    if not row["rows"]:
        return Span(0, 0, 0, ())
    return Span(int(row["rows"]), int(row["lo"]), int(row["hi"]), tuple(sorted(row["tickers"])))


def unstored(session: SparkSession, ticks: DataFrame, target: str, span: Span) -> DataFrame:
    """The ``ticks`` whose key ``target`` does not hold: a LEFT ANTI JOIN with the keys
    stored for the span's tickers and time range (Iceberg prunes the other files)."""
    from pyspark.sql import functions as sf

    key = list(Ticks.SCHEMA.key)
    stored = (
        session.table(target)
        .where(
            sf.col(Ticks.TICKER).isin(list(span.tickers))
            & sf.col(Ticks.TRADE_TIME).between(
                sf.timestamp_micros(sf.lit(span.lo_us)), sf.timestamp_micros(sf.lit(span.hi_us))
            )
        )
        .select(*key)
    )
    return ticks.join(stored, on=key, how="left_anti")


def appended_since(table: Table, snapshot_id: int) -> int:
    """Rows the appends committed to the loaded ``table`` after ``snapshot_id`` added (0:
    none). Why: Spark's append reports no count; the table's one writer reads it from
    the snapshots' summaries."""
    added = 0
    snapshot = table.current_snapshot()
    while snapshot is not None and snapshot.snapshot_id != snapshot_id:
        summary = snapshot.summary
        if summary is not None and summary.operation.value == "append":
            added += int(summary.get("added-records") or 0)
        parent = snapshot.parent_snapshot_id
        snapshot = None if parent is None else table.snapshot_by_id(parent)
    return added
