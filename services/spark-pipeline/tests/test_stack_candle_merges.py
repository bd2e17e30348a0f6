"""Exchange candles over stored ones, merged on the driver (`candle_merges`, pyiceberg's
delete and append in one commit) and by Spark's MERGE (`lake.merge_history_candles`),
each on its own ``ohlc`` of the real catalog: the same rows either way."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from prometheus_client import CollectorRegistry

from infra.localstack import LocalStack
from mdproto.tables import Ohlc
from pipeline import records
from pipeline.arrow_appends import ArrowAppends
from pipeline.lake import Lake, TableNames, merge_history_candles
from pipeline.metrics import IcebergWrites
from pipeline.write_paths import WriteRule

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.stack, pytest.mark.spark, pytest.mark.heavy(seconds=60)]

STORED = 10  # minutes 0-9 stored live; the exchange answers minutes 0-14
INCOMPLETE, CHANGED = 3, 5  # stored minutes the exchange replaces; the rest it leaves alone


class CommitBetween(ArrowAppends):
    """The pipeline's pyiceberg client, with ``between()`` run after a driver merge has
    read its range and before it commits."""

    def __init__(self, name: str, properties: dict[str, str]) -> None:
        super().__init__(name, properties)
        self.between: Callable[[], None] = lambda: None

    def replace(
        self, identifier: str, rows: pa.Table, deleted: Any, loaded: Table | None = None
    ) -> int:
        self.between()
        return super().replace(identifier, rows, deleted, loaded)


class Written:
    """A `Lake` on a fresh namespace, its write metric and a reader of its ``ohlc``."""

    def __init__(self, stack: LocalStack, spark: SparkSession, tools: Any, rule: WriteRule):
        e = stack.endpoints
        names = TableNames(e.catalog_name, f"merges_{uuid.uuid4().hex[:8]}")
        self.registry = CollectorRegistry()
        self.tables = tables = CommitBetween(e.catalog_name, e.pyiceberg_catalog_properties())
        self.lake = Lake(spark, names, tables, rule=rule, report=IcebergWrites(self.registry))
        self.lake.ensure_tables()
        self.reader = tools.Lake(e, names.namespace)
        self.tools = tools

    def writes(self) -> dict[str, float]:
        """``pipeline_iceberg_writes_total`` of ``ohlc`` by path (counted ones only)."""
        return dict(self.tools.iceberg_writes(self.registry))

    def rows(self) -> list[tuple[Any, ...]]:
        """Every ``ohlc`` row but ``ingested_at`` (set per write), sorted."""
        kept = [c.name for c in Ohlc.SCHEMA.columns if c.name != Ohlc.INGESTED_AT]
        return sorted(tuple(r[c] for c in kept) for r in self.reader.rows("ohlc"))

    def snapshots(self) -> int:
        return len(self.reader.table("ohlc").snapshots())


def exchange(build: Any) -> pa.Table:
    rows = [build.candle(i) for i in range(15)]
    return records.decode_history(build.kafka_table(build.request_records("r-1", rows))).candles


def live(candles: pa.Table) -> pa.Table:
    """The first ``STORED`` minutes as the live engine stored them: equal to the exchange's
    but for one candle's close and one flagged incomplete (a feed gap)."""
    stored = candles.slice(0, STORED)
    close = stored[Ohlc.CLOSE].to_pylist()
    close[CHANGED] += 0.5
    incomplete = [i == INCOMPLETE for i in range(STORED)]
    return relabel(stored, close=close, incomplete=incomplete)


def relabel(candles: pa.Table, **columns: list[Any]) -> pa.Table:
    """``candles`` as live ones (``source`` "live"), ``columns`` replaced."""
    columns = {Ohlc.SOURCE: ["live"] * candles.num_rows, **columns}
    for name, values in columns.items():
        i = candles.schema.get_field_index(name)
        field = candles.schema.field(i)
        candles = candles.set_column(i, field, pa.array(values, field.type))
    return candles


@pytest.mark.parametrize("replay", [False, True])
def test_the_driver_merge_leaves_the_rows_sparks_merge_leaves(
    local_stack: LocalStack, spark: SparkSession, tools: Any, build: Any, replay: bool
) -> None:
    driver = Written(local_stack, spark, tools, WriteRule())
    on_spark = Written(local_stack, spark, tools, WriteRule(driver_append_max_rows=0))
    candles = exchange(build)
    snapshots = []
    for side in (driver, on_spark):
        side.lake.write_live(spark, live(candles))
        side.lake.write_history(spark, candles)
        snapshots.append(side.snapshots())
        if replay:  # a replayed batch: every key stored with the same values
            side.lake.write_history(spark, candles)

    assert driver.rows() == on_spark.rows()
    assert on_spark.writes() == {"spark-append": 1, "spark-merge": 2 if replay else 1}
    assert driver.writes() == {"driver-append": 1, "driver-merge": 2 if replay else 1}
    assert driver.snapshots() == snapshots[0]  # a replay changes nothing: no commit
    by_minute = {(r[Ohlc.OPEN_TIME], r[Ohlc.SOURCE]) for r in driver.reader.rows("ohlc")}
    sources = [s for _, s in sorted(by_minute)]
    replaced = {INCOMPLETE, CHANGED} | set(range(STORED, 15))
    assert sources == ["history" if i in replaced else "live" for i in range(15)]


def test_a_merge_over_a_spark_merged_table_reads_its_position_deletes(
    local_stack: LocalStack, spark: SparkSession, tools: Any, build: Any
) -> None:
    """Spark's MERGE writes position deletes (``ohlc`` is merge-on-read); a driver merge
    rewriting those files applies them first, so no replaced row comes back."""
    driver = Written(local_stack, spark, tools, WriteRule())
    candles = exchange(build)
    driver.lake.write_live(spark, live(candles))
    driver.lake._write(  # a Spark MERGE, as before this process's driver merges
        spark, driver.lake.names.ohlc, "history", candles, False, _spark_merge(driver, candles)
    )
    moved = candles.set_column(
        candles.schema.get_field_index(Ohlc.CLOSE),
        Ohlc.CLOSE,
        pc.add(candles[Ohlc.CLOSE], 1.0),
    )
    assert driver.lake.write_history(spark, moved).how == "merge"

    stored = driver.reader.rows("ohlc")
    assert len(stored) == 15
    assert sorted(r[Ohlc.CLOSE] for r in stored) == sorted(moved[Ohlc.CLOSE].to_pylist())


def _spark_merge(side: Written, candles: pa.Table) -> Any:
    ms = candles[Ohlc.OPEN_TIME].cast(pa.timestamp("ms", tz="UTC")).cast(pa.int64())
    lo, hi = pc.min(ms).as_py(), pc.max(ms).as_py()
    return lambda view: merge_history_candles(side.lake.names.ohlc, view, lo, hi)


def test_another_writers_candle_in_the_range_before_the_commit_falls_back_to_sparks_merge(
    local_stack: LocalStack, spark: SparkSession, tools: Any, build: Any
) -> None:
    """The merge read the range without it: pyiceberg's retry of the refused commit finds
    the new file in the delete's range (ValidationException), and Spark's MERGE, right
    whatever landed, stores every key once."""
    driver = Written(local_stack, spark, tools, WriteRule())
    candles = exchange(build)
    driver.lake.write_live(spark, live(candles))
    late = relabel(candles.slice(STORED + 2, 1))  # minute 12: live, equal to the exchange's

    def other_writer_commits() -> None:
        driver.reader.table("ohlc").append(late)
        spark.catalog.refreshTable(driver.lake.names.ohlc)  # the test session caches

    driver.tables.between = other_writer_commits
    assert driver.lake.write_history(spark, candles).how == "merge"

    assert driver.writes() == {"driver-append": 1, "append-then-merge": 1}
    stored = sorted(
        (r[Ohlc.OPEN_TIME], r[Ohlc.SOURCE], r[Ohlc.CLOSE]) for r in driver.reader.rows("ohlc")
    )
    replaced = {INCOMPLETE, CHANGED} | set(range(STORED, 15)) - {STORED + 2}
    assert [source for _, source, _ in stored] == [
        "history" if i in replaced else "live" for i in range(15)
    ]
    assert [close for _, _, close in stored] == candles[Ohlc.CLOSE].to_pylist()


def test_the_driver_merge_of_live_candles_leaves_the_rows_sparks_merge_leaves(
    local_stack: LocalStack, spark: SparkSession, tools: Any, build: Any
) -> None:
    """Minutes 0-4 from the exchange, 5-9 live (6 counting more trades, 7 incomplete);
    then live candles of minutes 0-14, every close moved (a gap's rebuild, a replay)."""
    driver = Written(local_stack, spark, tools, WriteRule())
    on_spark = Written(local_stack, spark, tools, WriteRule(driver_append_max_rows=0))
    candles = exchange(build)
    stored_live = relabel(
        candles.slice(5, 5),
        trade_count=[7, 100, 7, 7, 7],
        incomplete=[False, False, True, False, False],
    )
    closes = pc.add(candles[Ohlc.CLOSE], 1.0).to_pylist()
    batch = relabel(candles, close=closes, incomplete=[False] * 15, trade_count=[7] * 15)
    for side in (driver, on_spark):
        side.lake.write_history(spark, candles.slice(0, 5))
        side.lake.write_live(spark, stored_live)
        side.lake.write_live(spark, batch)

    assert driver.rows() == on_spark.rows()
    assert on_spark.writes() == {"spark-append": 2, "spark-merge": 1}
    assert driver.writes() == {"driver-append": 2, "driver-merge": 1}
    rows = driver.reader.rows("ohlc")
    stored = sorted((r[Ohlc.OPEN_TIME], r[Ohlc.SOURCE], r[Ohlc.TRADE_COUNT]) for r in rows)
    assert [(source, trades) for _, source, trades in stored] == [
        *[("history", 7)] * 5,
        ("live", 7),
        ("live", 100),  # the fuller view stays
        *[("live", 7)] * 8,
    ]


def test_a_file_crossing_the_ranges_edge_keeps_its_rows_outside_it(
    local_stack: LocalStack, spark: SparkSession, tools: Any, build: Any
) -> None:
    """Live minutes 0-9 in one data file, the exchange's 5-14: the delete of the range
    rewrites that file, and minutes 0-4 stay as the live engine stored them."""
    driver = Written(local_stack, spark, tools, WriteRule())
    on_spark = Written(local_stack, spark, tools, WriteRule(driver_append_max_rows=0))
    candles = exchange(build)
    for side in (driver, on_spark):
        side.lake.write_live(spark, live(candles))
        side.lake.write_history(spark, candles.slice(5))

    assert driver.rows() == on_spark.rows()
    assert driver.writes() == {"driver-append": 1, "driver-merge": 1}
    rows = driver.reader.rows("ohlc")
    sources = [s for _, s in sorted((r[Ohlc.OPEN_TIME], r[Ohlc.SOURCE]) for r in rows)]
    replaced = {CHANGED} | set(range(STORED, 15))
    assert sources == ["history" if i in replaced else "live" for i in range(15)]
    assert [s for i, s in enumerate(sources) if i < 5] == ["live"] * 5
