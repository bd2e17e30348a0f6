"""Large Kafka micro-batches written by Spark's executors (ADR 0021): ``ticks-persist``'s
trades, ``book-store``'s snapshots and deltas.

    Kafka micro-batch            executors: mapInArrow(`decode_partition`) with the
      -> valid rows                table's decode of `records`, in Python workers
      -> one row per key           a shuffle by ticker: the last copy in Kafka order wins
      -> cached                    job 1 brings its count, time range, tickers
      -> LEFT ANTI JOIN            the stored keys of those tickers in that range
      -> Spark's Iceberg append    job 2; the driver commits

Why: on the driver path every record passes through one Python process (Arrow
from the JVM, the decode, the stored keys, pyiceberg's Parquet): one core's worth,
whatever the cluster. Here the driver plans, receives the few numbers of job 1 and
commits; the work is spread over the executors' cores. Which batches come here is
`write_paths.WriteRule.decode_on`, by the record count of the offsets.

What differs per table is data: its decode (`Decoder`: `TICKS`, `BOOKS`), its key
and its time column (`mdproto.tables`, `records.BookPart`). Every such table is
partitioned by ticker first. `decode_partition` runs in the executors' Python
workers: it is what they import (`session.ship_python_packages` gives them
`pipeline` and `mdproto` off this host).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from mdproto.tables import TableSchema, Ticks
from pipeline import records

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

#: The column every table written here is partitioned by first: its shuffle's key.
TICKER = Ticks.TICKER
#: Where each decoded row was in Kafka: the order in which the last copy of a key wins.
KAFKA_ORDER = (records.KAFKA_PARTITION, records.KAFKA_OFFSET)

#: A decode of `records`: Kafka rows -> rows (each with its Kafka partition and offset)
#: in Kafka order, copies kept, and the rejects.
Decode = Callable[[pa.RecordBatch], tuple[pa.Table, list[records.Reject]]]


@dataclass(frozen=True, slots=True)
class Decoder:
    """What the executors run on a topic's records: ``decode``, the layout of its rows,
    and the name its rejects are logged under."""

    decode: Decode
    schema: pa.Schema
    context: str


TICKS = Decoder(records.kafka_ticks_rows, records.TICK_ROWS_SCHEMA, "ticks-persist on an executor")
BOOKS = Decoder(records.kafka_book_rows, records.BOOK_ROWS_SCHEMA, "book-store on an executor")


def decode_partition(
    batches: Iterable[pa.RecordBatch], decode: Decode, context: str
) -> Iterator[pa.RecordBatch]:
    """mapInArrow's function (with ``decode`` and ``context`` bound): Kafka rows -> rows.
    A reject is logged by the worker (its stderr is the executor's log); the record
    stays in Kafka."""
    for batch in batches:
        rows, rejects = decode(batch)
        records.log_rejects(context, rejects)
        yield from rows.to_batches()


def spark_type(schema: pa.Schema) -> StructType:
    """Spark's type of rows of ``schema`` (pyspark's own Arrow mapping; a non-null field
    stays non-null, as the tables' required columns need)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


def decoded(kafka: DataFrame, decoder: Decoder) -> DataFrame:
    """The rows ``decoder`` makes of a Kafka micro-batch (``value``, ``timestamp``,
    ``partition``, ``offset``), decoded by the executors' Python workers."""
    function = functools.partial(decode_partition, decode=decoder.decode, context=decoder.context)
    return kafka.mapInArrow(function, spark_type(decoder.schema))


def copies_possible(key: Iterable[str]) -> bool:
    """Whether two rows of one micro-batch can share ``key``: not when it holds the Kafka
    partition and offset (one record, one row), as a book delta's does."""
    return not set(KAFKA_ORDER) <= set(key)


def unique(rows: DataFrame, table: TableSchema) -> DataFrame:
    """``rows`` (with `KAFKA_ORDER`) as ``table``'s columns, one row per key: the last
    in Kafka order, as `records.dedupe_last` keeps on the driver."""
    from pyspark.sql import Window
    from pyspark.sql import functions as sf

    # One shuffle, by ticker: a window's key starts with it, and each write task then
    # holds whole tickers, one file per ticker and day (not one per task as well).
    rows = rows.repartition(TICKER)
    if copies_possible(table.key):
        last = Window.partitionBy(*table.key).orderBy(*(sf.col(c).desc() for c in KAFKA_ORDER))
        ranked = rows.withColumn("_copy", sf.row_number().over(last))
        rows = ranked.where(sf.col("_copy") == 1)
    return rows.select(*table.names)


def unique_ticks(kafka: DataFrame) -> DataFrame:
    """The valid ticks of a Kafka micro-batch, one row per (ticker, trade_id): the last
    in Kafka order, as `records.kafka_ticks_table` keeps on the driver."""
    return unique(decoded(kafka, TICKS), Ticks.SCHEMA)


def book_part(books: DataFrame, part: records.BookPart) -> DataFrame:
    """``part``'s rows of the decoded book rows (`BOOKS`), one per key: the split
    `records.book_part` makes on the driver, here on the executors."""
    from pyspark.sql import functions as sf

    mine = books.where(sf.col(records.BOOK_IS_DELTA) == sf.lit(part.deltas))
    return unique(mine.withColumnRenamed(records.BOOK_TIME, part.time_column), part.table)


@dataclass(frozen=True, slots=True)
class Stored:
    """What one batch stored in one table: its unique rows, how ("append N",
    "executor-append N", "merge", "none") and the ms of each step, in order (the log
    line's and `bench/write_paths.py`'s)."""

    unique: int
    how: str
    steps_ms: tuple[tuple[str, float], ...] = ()

    def steps(self) -> str:
        return ", ".join(f"{name} {ms:.0f}" for name, ms in self.steps_ms)


@dataclass(frozen=True, slots=True)
class Span:
    """What job 1 brings to the driver: how many unique rows, their time range (µs since
    the epoch) and their tickers."""

    rows: int
    lo_us: int
    hi_us: int
    tickers: tuple[str, ...]

    @property
    def ms_range(self) -> tuple[int, int]:
        """The ms range ``[lo, hi]`` that holds every row's time (a MERGE's bounds)."""
        return self.lo_us // 1000, -(-self.hi_us // 1000)


def span_of(rows: DataFrame, time_column: str) -> Span:
    """Count ``rows`` and take the range of their ``time_column`` and their tickers (one
    Spark job)."""
    from pyspark.sql import functions as sf

    at = sf.unix_micros(sf.col(time_column))
    row = rows.agg(
        sf.count(sf.lit(1)).alias("rows"),
        sf.min(at).alias("lo"),
        sf.max(at).alias("hi"),
        sf.collect_set(TICKER).alias("tickers"),
    ).first()
    assert row is not None
    if not row["rows"]:
        return Span(0, 0, 0, ())
    return Span(int(row["rows"]), int(row["lo"]), int(row["hi"]), tuple(sorted(row["tickers"])))


def unstored(
    session: SparkSession,
    rows: DataFrame,
    target: str,
    span: Span,
    table: TableSchema,
    time_column: str,
) -> DataFrame:
    """The ``rows`` whose key (``table``'s) ``target`` does not hold: a LEFT ANTI JOIN
    with the keys stored for the span's tickers and ``time_column`` range (Iceberg
    prunes the other files)."""
    from pyspark.sql import functions as sf

    key = list(table.key)
    stored = (
        session.table(target)
        .where(
            sf.col(TICKER).isin(list(span.tickers))
            & sf.col(time_column).between(
                sf.timestamp_micros(sf.lit(span.lo_us)), sf.timestamp_micros(sf.lit(span.hi_us))
            )
        )
        .select(*key)
    )
    return rows.join(stored, on=key, how="left_anti")


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
