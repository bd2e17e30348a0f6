"""One way per write: the rule, the typed commit errors, and the one fallback (a failed
append commit followed by the MERGE), with a fake Spark session and catalog."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.exceptions import (
    CommitFailedException,
    CommitStateUnknownException,
    ValidationException,
)

from mdproto.tables import Ohlc, Ticks
from pipeline.executor_writes import Stored
from pipeline.lake import Lake, TableNames, Written
from pipeline.write_paths import (
    CommitConflictError,
    CommitStateUnknownError,
    WritePath,
    WriteRule,
    commit_error,
    java_commit_error,
)

NAMES = TableNames("lake", "market")


def test_the_rule_appends_absent_keys_on_the_driver_up_to_the_threshold() -> None:
    rule = WriteRule(driver_append_max_rows=1000)
    assert rule.choose(1, keys_absent=True) == "driver-append"
    assert rule.choose(1000, keys_absent=True) == "driver-append"
    assert rule.choose(1001, keys_absent=True) == "spark-append"
    assert rule.choose(1, keys_absent=False) == "spark-merge"
    assert WriteRule(driver_append_max_rows=0).choose(1, keys_absent=True) == "spark-append"


def test_the_rule_merges_on_the_driver_where_the_writer_can_up_to_the_threshold() -> None:
    rule = WriteRule(driver_append_max_rows=1000)
    assert rule.choose(1000, keys_absent=False, merges_on_driver=True) == "driver-merge"
    assert rule.choose(1001, keys_absent=False, merges_on_driver=True) == "spark-merge"
    assert rule.choose(1, keys_absent=False, merges_on_driver=False) == "spark-merge"
    assert rule.choose(1, keys_absent=True, merges_on_driver=True) == "driver-append"
    off = WriteRule(driver_append_max_rows=0)
    assert off.choose(1, keys_absent=False, merges_on_driver=True) == "spark-merge"


def test_the_rule_decodes_a_kafka_batch_on_the_executors_from_its_record_count() -> None:
    rule = WriteRule(executor_append_min_records=1000)
    assert rule.decode_on(0) == "driver"
    assert rule.decode_on(999) == "driver"
    assert rule.decode_on(1000) == "executors"
    assert rule.decode_on(5_000_000) == "executors"
    assert WriteRule(executor_append_min_records=0).decode_on(5_000_000) == "driver"  # off


@dataclass
class JavaThrowable:
    """What py4j shows of a Java exception: its class and its cause."""

    name: str
    cause: JavaThrowable | None = None

    def getClass(self) -> Any:  # noqa: N802 (Java API)
        name = self.name
        return type("JavaClass", (), {"getName": lambda _self: name})()

    def getCause(self) -> JavaThrowable | None:  # noqa: N802 (Java API)
        return self.cause

    def getMessage(self) -> str:  # noqa: N802 (Java API)
        return "whatever the text says"


def test_commit_errors_are_named_by_class_not_by_message_text() -> None:
    assert isinstance(commit_error(CommitFailedException("409")), CommitConflictError)
    assert isinstance(commit_error(CommitStateUnknownException("503")), CommitStateUnknownError)
    # pyiceberg's retry of a delete that finds another writer's rows in its range.
    assert isinstance(commit_error(ValidationException("added files")), CommitConflictError)
    # A message that mentions a conflict is not one.
    assert commit_error(RuntimeError("CommitFailedException: conflicting files")) is None
    wrapped = JavaThrowable(
        "org.apache.spark.SparkException",
        JavaThrowable("org.apache.iceberg.exceptions.ValidationException"),
    )
    assert isinstance(java_commit_error(wrapped), CommitConflictError)
    unknown = JavaThrowable("org.apache.iceberg.exceptions.CommitStateUnknownException")
    assert isinstance(java_commit_error(unknown), CommitStateUnknownError)
    assert java_commit_error(JavaThrowable("java.io.IOException")) is None


class FakeScan:
    def __init__(self, rows: pa.Table) -> None:
        self._rows = rows

    def to_arrow(self) -> pa.Table:
        return self._rows


@dataclass
class FakeTables:
    """pyiceberg's client as `Lake` uses it: tables that hold nothing, an append that
    fails with ``fail`` (if set)."""

    fail: BaseException | None = None
    appended: list[tuple[str, int]] = field(default_factory=list)
    loads: int = 0

    def load(self, identifier: str) -> Any:
        self.loads += 1
        empty = pa.table({Ticks.TICKER: pa.array([], pa.string()), Ticks.TRADE_ID: []})
        return type("T", (), {"scan": lambda _self, **_kw: FakeScan(empty)})()

    def append(self, identifier: str, rows: pa.Table, loaded: Any = None) -> int:
        if loaded is None:
            self.load(identifier)
        if self.fail is not None:
            raise self.fail
        self.appended.append((identifier, rows.num_rows))
        return 100 + len(self.appended)  # the snapshot the commit made


@dataclass
class FakeSession:
    """The Spark calls of a MERGE (a temp view and a statement) and of a Spark append."""

    statements: list[str] = field(default_factory=list)
    spark_appends: list[str] = field(default_factory=list)

    def createDataFrame(self, rows: pa.Table) -> Any:  # noqa: N802 (Spark API)
        session = self

        class Frame:
            def createOrReplaceTempView(self, view: str) -> None:  # noqa: N802
                pass

            def writeTo(self, target: str) -> Any:  # noqa: N802
                return type("W", (), {"append": lambda _s: session.spark_appends.append(target)})()

        return Frame()

    def sql(self, statement: str) -> None:
        self.statements.append(statement)

    @property
    def catalog(self) -> Any:
        return type("C", (), {"dropTempView": lambda _self, _view: None})()


def _candles(n: int) -> pa.Table:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    return pa.table(
        {
            Ohlc.TICKER: ["BINANCE:BTC/USDT"] * n,
            Ohlc.PERIOD_SECONDS: pa.array([60] * n, pa.int32()),
            Ohlc.OPEN_TIME: pa.array(
                [t0.timestamp() * 1_000_000 + i * 60_000_000 for i in range(n)], pa.int64()
            ).cast(pa.timestamp("us", tz="UTC")),
        }
    )


def _lake(tables: FakeTables, rule: WriteRule) -> tuple[Lake, list[tuple[str, WritePath]]]:
    reported: list[tuple[str, WritePath]] = []
    lake = Lake(
        None,  # type: ignore[arg-type]  # its own session: a write uses the one it is given
        NAMES,
        tables,  # type: ignore[arg-type]
        rule=rule,
        report=lambda table, path: reported.append((table, path)),
    )
    return lake, reported


def test_each_write_goes_the_way_the_rule_says_and_is_counted() -> None:
    tables, session = FakeTables(), FakeSession()
    lake, reported = _lake(tables, WriteRule(driver_append_max_rows=2))
    # The driver's append names its snapshot; Spark's does not (the caller reads it).
    assert lake.write_history(session, _candles(2)) == Written("append", 101)  # type: ignore[arg-type]
    assert lake.write_history(session, _candles(3)) == Written("append")  # type: ignore[arg-type]
    assert tables.appended == [("market.ohlc", 2)]
    assert tables.loads == 2  # one per write: the append commits on the table read before it
    assert session.spark_appends == ["lake.market.ohlc"]
    assert session.statements == []
    assert reported == [("ohlc", "driver-append"), ("ohlc", "spark-append")]


@pytest.mark.parametrize(
    "failure", [CommitFailedException("409 conflict"), CommitStateUnknownException("502")]
)
def test_an_append_whose_commit_failed_is_followed_by_the_merge(failure: Exception) -> None:
    """Landed or not (a conflict: not; an unknown state: maybe), the MERGE is right."""
    tables, session = FakeTables(fail=failure), FakeSession()
    lake, reported = _lake(tables, WriteRule())
    assert lake.write_history(session, _candles(3)) == Written("merge")  # type: ignore[arg-type]
    [statement] = session.statements
    assert statement.startswith("MERGE INTO lake.market.ohlc")
    assert reported == [("ohlc", "append-then-merge")]


def test_any_other_append_failure_fails_the_write_with_no_other_engine() -> None:
    tables, session = FakeTables(fail=OSError("S3 unreachable")), FakeSession()
    lake, reported = _lake(tables, WriteRule())
    with pytest.raises(OSError, match="S3 unreachable"):
        lake.write_history(session, _candles(3))  # type: ignore[arg-type]
    assert session.statements == [] and session.spark_appends == []
    assert reported == []


@dataclass
class FakeTicksLake:
    """`Lake` as ticks-persist uses it: the rule, and the two ways to store a batch."""

    rule: WriteRule
    ways: list[str] = field(default_factory=list)

    def write_kafka_ticks(self, session: Any, kafka: Any) -> Stored:
        self.ways.append("executors")
        return Stored(7, "executor-append 7")

    def write_ticks(self, session: Any, ticks: pa.Table) -> str:
        self.ways.append(f"driver {ticks.num_rows}")
        return f"append {ticks.num_rows}"


@dataclass
class FakeKafkaBatch:
    """A micro-batch DataFrame: its rows reach Python only through ``toArrow``."""

    rows: pa.Table
    collected: int = 0
    sparkSession: Any = None  # noqa: N815 (Spark API)

    def select(self, *_columns: str) -> FakeKafkaBatch:
        return self

    def toArrow(self) -> pa.Table:  # noqa: N802 (Spark API)
        self.collected += 1
        return self.rows


def test_ticks_persist_decodes_a_batch_where_its_record_count_says(build: Any) -> None:
    """The count comes from the offsets (here: by batch id); a large batch never reaches
    the driver's Python, a small one is decoded there."""
    from mdproto import envelope
    from pipeline.live import TickPersister

    values = [envelope.encode_record(build.tick(i, 100.0, build.T0)) for i in range(3)]
    lake = FakeTicksLake(WriteRule(executor_append_min_records=100))
    points: list[str] = []
    counts = {0: 100, 1: 99, 2: 0}
    persist = TickPersister(lake, points.append, counts.__getitem__)  # type: ignore[arg-type]

    large, small = (
        FakeKafkaBatch(build.kafka_table(values)),
        FakeKafkaBatch(build.kafka_table(values)),
    )
    persist(large, 0)  # type: ignore[arg-type]
    persist(small, 1)  # type: ignore[arg-type]

    assert lake.ways == ["executors", "driver 3"]
    assert (large.collected, small.collected) == (0, 1)
    assert points == ["live-after-ticks-commit"] * 2
    off = FakeTicksLake(WriteRule(executor_append_min_records=100))
    TickPersister(off, points.append)(FakeKafkaBatch(build.kafka_table(values)), 2)  # type: ignore[arg-type]
    assert off.ways == ["driver 3"]  # no offset log read: every batch on the driver


@dataclass
class FakeBooksLake:
    """`Lake` as book-store uses it: the rule, and the two ways to store a batch."""

    rule: WriteRule
    ways: list[str] = field(default_factory=list)

    def write_kafka_books(self, session: Any, kafka: Any) -> tuple[Stored, Stored]:
        self.ways.append("executors")
        return Stored(2, "executor-append 2"), Stored(5, "executor-append 5")

    def merge_book_snapshots(self, session: Any, rows: pa.Table) -> str:
        self.ways.append(f"driver snapshots {rows.num_rows}")
        return f"append {rows.num_rows}"

    def merge_book_deltas(self, session: Any, rows: pa.Table) -> str:
        self.ways.append(f"driver deltas {rows.num_rows}")
        return f"append {rows.num_rows}"


def test_book_store_decodes_a_batch_where_its_record_count_says(
    build: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """As ticks-persist: a large batch never reaches the driver's Python, a small one is
    decoded there, snapshots stored before deltas; each then reaches its crash point."""
    from mdproto import envelope
    from mdproto.messages import BookDelta, BookSnapshot
    from pipeline.live import BookStore

    values = [
        envelope.encode_record(BookSnapshot(ticker=build.TICKER, exchange_time_ms=build.T0)),
        envelope.encode_record(BookDelta(ticker=build.TICKER, exchange_time_ms=build.T0 + 1)),
        envelope.encode_record(BookDelta(ticker=build.TICKER, exchange_time_ms=build.T0 + 2)),
    ]
    lake = FakeBooksLake(WriteRule(executor_append_min_records=100))
    points: list[str] = []
    counts = {0: 100, 1: 99}
    store = BookStore(lake, points.append, counts.__getitem__)  # type: ignore[arg-type]
    large, small = (
        FakeKafkaBatch(build.kafka_table(values)),
        FakeKafkaBatch(build.kafka_table(values)),
    )

    with caplog.at_level("INFO"):
        store(large, 0)  # type: ignore[arg-type]
        store(small, 1)  # type: ignore[arg-type]

    assert lake.ways == ["executors", "driver snapshots 1", "driver deltas 2"]
    assert (large.collected, small.collected) == (0, 1)
    assert points == ["live-after-books-commit"] * 2
    assert (
        "book-store batch 0: 2 book snapshots (executor-append 2), 5 deltas (executor-append 5)"
        in caplog.text
    )
    assert "book-store batch 1: 1 book snapshots (append 1), 2 deltas (append 2)" in caplog.text
    off = FakeBooksLake(WriteRule(executor_append_min_records=100))
    BookStore(off, points.append)(FakeKafkaBatch(build.kafka_table(values)), 2)  # type: ignore[arg-type]
    assert off.ways == ["driver snapshots 1", "driver deltas 2"]  # no offset log read
