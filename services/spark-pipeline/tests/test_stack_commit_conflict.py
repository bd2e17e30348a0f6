"""A real commit conflict on the stack: another writer commits to ``ohlc`` between a driver
append's load and its commit, so the append commits on stale metadata and the REST
catalog refuses it (HTTP 409, pyiceberg's ``CommitFailedException``). `Lake._write`'s one
fallback then MERGEs (docs/adr/0017); the unit tests fake the refusal, these do not.

pyiceberg retries a refused append itself: it reloads the table, puts the append on top
of the new snapshot and commits again, up to the table's ``commit.retry.num-retries``
(``Transaction.commit_transaction``; 20 on the pipeline's tables, `COMMIT_RETRY_PROPERTIES`).
One concurrent commit therefore never reaches `Lake` (the last test): the fallback runs
once the retries are spent. The conflict tests set the table's retries to 0, so the first
refusal is the last one.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from prometheus_client import CollectorRegistry
from pyiceberg.exceptions import CommitFailedException

from infra.localstack import LocalStack
from pipeline import records
from pipeline.arrow_appends import ArrowAppends
from pipeline.lake import Lake, TableNames
from pipeline.metrics import IcebergWrites

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.stack, pytest.mark.spark, pytest.mark.heavy(seconds=60)]


class CommitBetween(ArrowAppends):
    """The pipeline's pyiceberg client, with ``between()`` run after an append has loaded
    its table and before it commits; keeps what the append raised."""

    def __init__(self, name: str, properties: dict[str, str]) -> None:
        super().__init__(name, properties)
        self.between: Callable[[], None] = lambda: None
        self.raised: list[BaseException] = []

    def append(self, identifier: str, rows: pa.Table, loaded: Table | None = None) -> int:
        table = self.load(identifier) if loaded is None else loaded
        self.between()
        try:
            return super().append(identifier, rows, table)
        except BaseException as exc:
            self.raised.append(exc)
            raise


@dataclass
class Stack:
    """A `Lake` on fresh tables, the other writer, and the write metric's registry."""

    lake: Lake
    tables: CommitBetween
    other: Any  # conftest's Lake: its own pyiceberg catalog connection
    registry: CollectorRegistry
    tools: Any

    def writes(self) -> dict[str, float]:
        """``pipeline_iceberg_writes_total`` of ``ohlc`` by path (counted ones only)."""
        return dict(self.tools.iceberg_writes(self.registry))

    def stored(self) -> list[tuple[int, float]]:
        """Every ``ohlc`` row, read back through the catalog (`minutes`)."""
        return minutes(self.other.rows("ohlc"))


@pytest.fixture
def stack(local_stack: LocalStack, spark: SparkSession, tools: Any) -> Stack:
    e = local_stack.endpoints
    names = TableNames(e.catalog_name, f"conflict_{uuid.uuid4().hex[:8]}")
    tables = CommitBetween(e.catalog_name, e.pyiceberg_catalog_properties())
    registry = CollectorRegistry()
    lake = Lake(spark, names, tables, report=IcebergWrites(registry))
    lake.ensure_tables()
    return Stack(lake, tables, tools.Lake(e, names.namespace), registry, tools)


def candles(build: Any, indices: range) -> pa.Table:
    """``ohlc`` rows of `build.candle` i for i in ``indices``, as the history query decodes
    them from an ingestor's records."""
    rows = [build.candle(i) for i in indices]
    values = build.request_records(f"r-{indices.start}", rows)
    return records.decode_history(build.kafka_table(values)).candles


def minutes(rows: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(open_time ms, close) of each row, in order: a key stored twice shows twice."""
    return sorted((int(r["open_time"].timestamp() * 1000), r["close"]) for r in rows)


def other_writer_commits(stack: Stack, spark: SparkSession, rows: pa.Table) -> None:
    stack.other.table("ohlc").append(rows)
    # The pipeline's session reads table metadata fresh (``cache-enabled: false``,
    # session.spark_conf); the test session caches it, so its MERGE would scan the
    # snapshot Spark saw at CREATE TABLE.
    spark.catalog.refreshTable(stack.lake.names.ohlc)


def no_commit_retries(stack: Stack) -> None:
    """As when pyiceberg's retries are spent: the catalog's refusal reaches `Lake`."""
    stack.other.table("ohlc").transaction().set_properties(
        {"commit.retry.num-retries": "0"}
    ).commit_transaction()


def test_an_append_refused_for_another_writers_commit_is_merged_and_stores_every_row_once(
    stack: Stack, spark: SparkSession, build: Any
) -> None:
    batch, theirs = candles(build, range(0, 10)), candles(build, range(10, 15))
    no_commit_retries(stack)
    stack.tables.between = lambda: other_writer_commits(stack, spark, theirs)

    assert stack.lake.write_history(spark, batch).how == "merge"

    [refused] = stack.tables.raised
    assert isinstance(refused, CommitFailedException)  # the catalog's 409
    assert stack.writes() == {"append-then-merge": 1}
    assert stack.stored() == sorted(minutes(batch.to_pylist()) + minutes(theirs.to_pylist()))


def test_an_append_refused_after_another_writer_stored_its_rows_leaves_each_key_once(
    stack: Stack, spark: SparkSession, build: Any
) -> None:
    """Their rows are the batch's own (stored first by another copy of the write): the
    MERGE finds every key stored and adds none."""
    batch = candles(build, range(0, 10))
    no_commit_retries(stack)
    stack.tables.between = lambda: other_writer_commits(stack, spark, batch)

    assert stack.lake.write_history(spark, batch).how == "merge"

    [refused] = stack.tables.raised
    assert isinstance(refused, CommitFailedException)
    assert stack.writes() == {"append-then-merge": 1}
    assert stack.stored() == minutes(batch.to_pylist())


def test_one_concurrent_commit_is_absorbed_by_pyicebergs_retry_and_stays_a_driver_append(
    stack: Stack, spark: SparkSession, build: Any
) -> None:
    batch, theirs = candles(build, range(0, 10)), candles(build, range(10, 15))
    stack.tables.between = lambda: other_writer_commits(stack, spark, theirs)

    assert stack.lake.write_history(spark, batch).how == "append"

    assert stack.tables.raised == []
    # Loaded first, committed second: refused once, then put on top of their snapshot.
    snapshots = stack.other.table("ohlc").snapshots()
    assert [s.summary["added-records"] for s in snapshots] == ["5", "10"]
    assert stack.writes() == {"driver-append": 1}
    assert stack.stored() == sorted(minutes(batch.to_pylist()) + minutes(theirs.to_pylist()))
