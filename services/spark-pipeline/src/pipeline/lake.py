"""Iceberg: the tables, their DDL/MERGE statements, and running them through Spark.

The SQL builders are pure; `Lake` runs them (`Lake.merge_markets` runs `merge_markets`).
Every write is keyed on the natural key, so a re-run micro-batch never adds a row:
an append only of keys checked absent first (on the driver, ADR 0008), else a
merge (of candles on the driver, `candle_merges`; else Spark's MERGE); which engine
writes is one rule (`write_paths.WriteRule`, ADR 0017). A
MERGE that lost to a concurrent commit (history and live candles both write
``ohlc``) just runs again; its ON clause bounds the time column so Iceberg
prunes files before the join (partitioning: docs/adr/0004).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from mdproto import topics
from mdproto.tables import (
    BookDeltas,
    BookSnapshots,
    Column,
    ColumnType,
    Gaps,
    Markets,
    Ohlc,
    Partition,
    Requests,
    TableSchema,
    Ticks,
    TradeBars,
)
from pipeline import (
    candle_merges,
    driver_reads,
    executor_writes,
    history_notices,
    records,
    row_counts,
    trade_bars,
)
from pipeline.arrow_appends import ArrowAppends
from pipeline.candle_merges import OHLC_VALUE_COLUMNS
from pipeline.history_notices import CompletedRequest
from pipeline.restarts import failure_cause
from pipeline.write_paths import CommitError, WritePath, WriteRule, typed_commit_errors

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

#: Spark SQL's name of each Iceberg type (Spark's TIMESTAMP is Iceberg's timestamptz).
SQL_TYPES: dict[ColumnType, str] = {
    "string": "STRING",
    "int": "INT",
    "long": "BIGINT",
    "double": "DOUBLE",
    "boolean": "BOOLEAN",
    "timestamptz": "TIMESTAMP",
    "levels": "ARRAY<STRUCT<price: DOUBLE, amount: DOUBLE>>",
}


def added_columns(table: TableSchema) -> dict[str, str]:
    """``table``'s columns added after its first release, with their Spark SQL types:
    added to an older table at start (ALTER TABLE ADD COLUMNS: metadata only, old
    rows read null)."""
    return {name: SQL_TYPES[table.column(name).type] for name in table.added}


OHLC_ADDED_COLUMNS = added_columns(Ohlc.SCHEMA)  # exchanges' extra volumes, live notes
REQUESTS_ADDED_COLUMNS = added_columns(Requests.SCHEMA)  # the integrity report

#: Iceberg's own commit loop (refresh, re-apply, commit again) covers a commit the
#: catalog refused as a conflict (CommitFailedException, HTTP 409). History, live
#: candles, upkeep and their retries commit to the same tables, and when a ~20 s
#: catalog or S3 outage ends, every writer it held up commits at once: waits of
#: 0.1 s doubling to 5 s span 20 s by the 9th retry; after 60 s in all the batch
#: fails and app.py restarts the query. Iceberg never retries a 5xx or a lost
#: connection (the commit may have landed: CommitStateUnknownException): those
#: fail the batch too, and every writer survives its replay (README "Exactly once
#: per writer"). Set on existing tables at start (`Lake.ensure_tables`).
COMMIT_RETRY_PROPERTIES = {
    "commit.retry.num-retries": "20",
    "commit.retry.min-wait-ms": "100",
    "commit.retry.max-wait-ms": "5000",
    "commit.retry.total-timeout-ms": "60000",
}

_COMMON_PROPERTIES = {
    "format-version": "2",
    # Replays and overlapping requests usually change nothing: merge-on-read writes
    # nothing for unchanged matches, where copy-on-write rewrites every matched file.
    "write.merge.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.delete.mode": "merge-on-read",
    # Writers keep one file open per partition instead of shuffling rows by
    # partition first: a 43,200-candle append takes ~0.4 s instead of ~0.9 s.
    "write.distribution-mode": "none",
    "write.spark.fanout.enabled": "true",
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "100",
    **COMMIT_RETRY_PROPERTIES,
}


@dataclass(frozen=True, slots=True)
class TableNames:
    """Fully qualified Spark identifiers (``catalog.namespace.table``)."""

    catalog: str
    namespace: str
    ohlc_table: str = "ohlc"
    ticks_table: str = "ticks"
    requests_table: str = "requests"
    markets_table: str = "markets"
    book_snapshots_table: str = "book_snapshots"
    gaps_table: str = "gaps"
    book_deltas_table: str = "book_deltas"
    trade_bars_table: str = "trade_bars"

    @property
    def namespace_id(self) -> str:
        return f"{self.catalog}.{self.namespace}"

    @property
    def ohlc(self) -> str:
        return f"{self.namespace_id}.{self.ohlc_table}"

    @property
    def ticks(self) -> str:
        return f"{self.namespace_id}.{self.ticks_table}"

    @property
    def trade_bars(self) -> str:
        return f"{self.namespace_id}.{self.trade_bars_table}"

    @property
    def requests(self) -> str:
        return f"{self.namespace_id}.{self.requests_table}"

    @property
    def markets(self) -> str:
        return f"{self.namespace_id}.{self.markets_table}"

    @property
    def book_snapshots(self) -> str:
        return f"{self.namespace_id}.{self.book_snapshots_table}"

    @property
    def gaps(self) -> str:
        return f"{self.namespace_id}.{self.gaps_table}"

    @property
    def book_deltas(self) -> str:
        return f"{self.namespace_id}.{self.book_deltas_table}"

    @property
    def ohlc_for_clients(self) -> str:
        """What notifications carry as ``iceberg_table``: ``namespace.table`` (no catalog)."""
        return f"{self.namespace}.{self.ohlc_table}"


def _properties(extra: dict[str, str] | None = None) -> str:
    return _properties_sql({**_COMMON_PROPERTIES, **(extra or {})}, ",\n  ")


def _properties_sql(props: dict[str, str], separator: str = ", ") -> str:
    return separator.join(f"'{k}' = '{v}'" for k, v in props.items())


def create_namespace(names: TableNames) -> str:
    return f"CREATE NAMESPACE IF NOT EXISTS {names.namespace_id}"


def _column_sql(column: Column) -> str:
    return f"{column.name} {SQL_TYPES[column.type]}{' NOT NULL' if column.required else ''}"


def _partition_sql(partition: Partition) -> str:
    column, transform = partition.column, partition.transform
    if transform == "identity":
        return column
    if transform.startswith("bucket["):
        return f"bucket({transform[len('bucket[') : -1]}, {column})"
    return f"{transform}s({column})"  # day -> days(...), month -> months(...)


def create_table(target: str, table: TableSchema) -> str:
    """Spark DDL for ``table`` (mdproto.tables) under the identifier ``target``."""
    columns = ",\n  ".join(_column_sql(c) for c in table.columns)
    partitions = ", ".join(_partition_sql(p) for p in table.partitioning)
    return f"""CREATE TABLE IF NOT EXISTS {target} (
  {columns})
USING iceberg
PARTITIONED BY ({partitions})
TBLPROPERTIES (
  {_properties()})"""


def create_ohlc(names: TableNames) -> str:
    return create_table(names.ohlc, Ohlc.SCHEMA)


def create_ticks(names: TableNames) -> str:
    return create_table(names.ticks, Ticks.SCHEMA)


def create_requests(names: TableNames) -> str:
    return create_table(names.requests, Requests.SCHEMA)


def set_properties(table: str, properties: dict[str, str]) -> str:
    return f"ALTER TABLE {table} SET TBLPROPERTIES ({_properties_sql(properties)})"


def properties_to_set(have: dict[str, str], want: dict[str, str]) -> dict[str, str]:
    """What an existing table lacks of ``want`` (an ALTER only when needed: each is a commit)."""
    return {k: v for k, v in want.items() if have.get(k) != v}


def add_columns(table: str, columns: dict[str, str]) -> str:
    """Schema evolution: Iceberg adds nullable columns without rewriting data."""
    listed = ", ".join(f"{name} {sql_type}" for name, sql_type in columns.items())
    return f"ALTER TABLE {table} ADD COLUMNS ({listed})"


def create_markets(names: TableNames) -> str:
    return create_table(names.markets, Markets.SCHEMA)


def create_book_snapshots(names: TableNames) -> str:
    return create_table(names.book_snapshots, BookSnapshots.SCHEMA)


def create_book_deltas(names: TableNames) -> str:
    return create_table(names.book_deltas, BookDeltas.SCHEMA)


def create_gaps(names: TableNames) -> str:
    return create_table(names.gaps, Gaps.SCHEMA)


def ddl(names: TableNames) -> list[str]:
    """Every statement a catalog without the pipeline's tables needs."""
    return setup_statements(names, {})


def pipeline_tables(names: TableNames) -> dict[str, TableSchema]:
    """Every table the pipeline writes, by Spark identifier."""
    return {
        names.ohlc: Ohlc.SCHEMA,
        names.ticks: Ticks.SCHEMA,
        names.requests: Requests.SCHEMA,
        names.markets: Markets.SCHEMA,
        names.book_snapshots: BookSnapshots.SCHEMA,
        names.book_deltas: BookDeltas.SCHEMA,
        names.gaps: Gaps.SCHEMA,
        names.trade_bars: TradeBars.SCHEMA,
    }


@dataclass(frozen=True, slots=True)
class TableState:
    """What the catalog holds of one table: its columns and properties."""

    columns: frozenset[str]
    properties: dict[str, str]


def setup_statements(names: TableNames, found: dict[str, TableState | None]) -> list[str]:
    """The DDL that brings the catalog to the pipeline's tables, and nothing more.

    Each statement is a Spark SQL round trip at start (a commit when it changes a
    table), so a restart on current tables runs none. ``found``: each table's state,
    None when it does not exist. A table without a column the pipeline writes that
    is not one it may add (``TableSchema.added``) is someone else's table.
    """
    tables = pipeline_tables(names)
    missing = [target for target in tables if found.get(target) is None]
    statements = [create_namespace(names)] if missing else []
    statements += [create_table(target, tables[target]) for target in missing]
    for target, schema in tables.items():
        state = found.get(target)
        if state is None:
            continue
        new = {c: t for c, t in added_columns(schema).items() if c not in state.columns}
        absent = [c for c in schema.names if c not in state.columns and c not in new]
        if absent:
            raise SchemaMismatchError(
                f"Iceberg table {target} exists without columns {absent}: "
                "migrate it or point catalog.namespace elsewhere"
            )
        if new:
            statements.append(add_columns(target, new))
        lacking = properties_to_set(state.properties, COMMIT_RETRY_PROPERTIES)
        if lacking:
            statements.append(set_properties(target, lacking))
    return statements


def timestamp_literal(ms: int) -> str:
    """A Spark SQL TIMESTAMP literal for epoch milliseconds (UTC)."""
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return f"TIMESTAMP '{moment.strftime('%Y-%m-%d %H:%M:%S.%f')}+00:00'"


def _time_bounds(column: str, lo_ms: int, hi_ms: int) -> str:
    return f"t.{column} >= {timestamp_literal(lo_ms)} AND t.{column} <= {timestamp_literal(hi_ms)}"


def _key_on(table: TableSchema) -> str:
    """A MERGE's match on ``table``'s natural key (target ``t``, source ``s``)."""
    return " AND ".join(f"t.{c} = s.{c}" for c in table.key)


def _ohlc_on(lo_ms: int, hi_ms: int) -> str:
    return f"{_key_on(Ohlc.SCHEMA)} AND {_time_bounds(Ohlc.OPEN_TIME, lo_ms, hi_ms)}"


def merge_history_candles(target: str, source_view: str, lo_ms: int, hi_ms: int) -> str:
    """Upsert exchange candles: insert new keys, update a key only if its values changed.

    The exchange is the authority: a later fetch replaces a candle that was still
    open when first fetched, or a live candle aggregated from our ticks, and always
    an ``incomplete`` live one (built across a feed gap), even with equal values.
    Unchanged rows (replays, a second ingestor) are left alone: no write at all.
    """
    values = " OR ".join(f"NOT (t.{c} <=> s.{c})" for c in OHLC_VALUE_COLUMNS)
    changed = f"{values} OR coalesce(t.incomplete, false)"
    return f"""MERGE INTO {target} t
USING {source_view} s
ON {_ohlc_on(lo_ms, hi_ms)}
WHEN MATCHED AND ({changed}) THEN UPDATE SET *
WHEN NOT MATCHED THEN INSERT *"""


def merge_live_candles(
    target: str, source_view: str, lo_ms: int, hi_ms: int, *, amend: bool = False
) -> str:
    """Insert closed live candles whose key is new: history (the exchange) wins.

    ``amend``: a stored *live* candle whose values or ``incomplete`` note differ is
    updated (a late trade's correction, a feed gap found after it closed, or a
    replay), unless it counts more trades than the new one: a window's trades only
    grow, so a candle of fewer is an older view, such as the live engine's candle over
    a gap stored after the gap's rebuild from every stored trade (`gap_rebuilds`). An
    exchange candle is still never touched.
    """
    changed = " OR ".join(f"NOT (t.{c} <=> s.{c})" for c in (*OHLC_VALUE_COLUMNS, "incomplete"))
    fuller = f"coalesce(s.{Ohlc.TRADE_COUNT} >= t.{Ohlc.TRADE_COUNT}, true)"
    update = (
        f"WHEN MATCHED AND t.source = 'live' AND ({changed}) AND {fuller} THEN UPDATE SET *\n"
        if amend
        else ""
    )
    return f"""MERGE INTO {target} t
USING {source_view} s
ON {_ohlc_on(lo_ms, hi_ms)}
{update}WHEN NOT MATCHED THEN INSERT *"""


def merge_trade_bars(target: str, source_view: str, lo_ms: int, hi_ms: int) -> str:
    """Upsert bars from recorded trades (`trade_bars`): new keys inserted; a stored bar
    from trades or a live candle whose values or ``incomplete`` note differ updated (the
    stored trades are the fuller record); an exchange candle never touched."""
    columns = (*OHLC_VALUE_COLUMNS, Ohlc.INCOMPLETE)
    changed = " OR ".join(f"NOT (t.{c} <=> s.{c})" for c in columns)
    sources = f"'{records.SOURCE_TRADES}', '{records.SOURCE_LIVE}'"
    return f"""MERGE INTO {target} t
USING {source_view} s
ON {_ohlc_on(lo_ms, hi_ms)}
WHEN MATCHED AND t.{Ohlc.SOURCE} IN ({sources}) AND ({changed}) THEN UPDATE SET *
WHEN NOT MATCHED THEN INSERT *"""


def merge_ticks(target: str, source_view: str, lo_ms: int, hi_ms: int) -> str:
    """Insert ticks whose (ticker, trade_id) is new within the batch's trade-time range."""
    return f"""MERGE INTO {target} t
USING {source_view} s
ON {_key_on(Ticks.SCHEMA)} AND {_time_bounds(Ticks.TRADE_TIME, lo_ms, hi_ms)}
WHEN NOT MATCHED THEN INSERT *"""


def merge_book_snapshots(target: str, source_view: str, lo_ms: int, hi_ms: int) -> str:
    """Insert snapshots whose key (ticker, snapshot_time, exchange_sequence, reset) is
    new within the batch's time range: a replayed micro-batch adds nothing."""
    return _insert_new(
        target, source_view, BookSnapshots.SCHEMA, BookSnapshots.SNAPSHOT_TIME, lo_ms, hi_ms
    )


def merge_book_deltas(target: str, source_view: str, lo_ms: int, hi_ms: int) -> str:
    """Insert deltas whose key (ticker, delta_time, kafka_partition, kafka_offset) is new
    within the batch's time range: a replayed micro-batch adds nothing."""
    return _insert_new(target, source_view, BookDeltas.SCHEMA, BookDeltas.DELTA_TIME, lo_ms, hi_ms)


def _insert_new(
    target: str, source_view: str, table: TableSchema, time_column: str, lo_ms: int, hi_ms: int
) -> str:
    """A MERGE inserting the rows whose key is new, the match bounded to [lo_ms, hi_ms] of
    `time_column` so Iceberg prunes files before the join."""
    return f"""MERGE INTO {target} t
USING {source_view} s
ON {_key_on(table)} AND {_time_bounds(time_column, lo_ms, hi_ms)}
WHEN NOT MATCHED THEN INSERT *"""


MARKET_COLUMNS = Markets.SCHEMA.names


def merge_markets(target: str, source_view: str) -> str:
    """Upsert the latest Market per ticker: a newer ``updated_at`` replaces the row (an
    older or equal one, e.g. a replayed batch, changes nothing); ``deleted`` source
    rows (tombstones) remove it."""
    updates = ", ".join(f"t.{c} = s.{c}" for c in MARKET_COLUMNS[1:])
    columns = ", ".join(MARKET_COLUMNS)
    values = ", ".join(f"s.{c}" for c in MARKET_COLUMNS)
    return f"""MERGE INTO {target} t
USING {source_view} s
ON {_key_on(Markets.SCHEMA)}
WHEN MATCHED AND s.deleted THEN DELETE
WHEN MATCHED AND (t.updated_at IS NULL OR s.updated_at > t.updated_at) THEN UPDATE SET {updates}
WHEN NOT MATCHED AND NOT s.deleted THEN INSERT ({columns}) VALUES ({values})"""


def merge_gaps(target: str, source_view: str) -> str:
    """Upsert the newest state per gap_id: a newer ``updated_at`` replaces the row (an equal
    one, e.g. a replayed batch, changes nothing). Tombstones never reach it: the table
    keeps a gap after compaction dropped its record."""
    return f"""MERGE INTO {target} t
USING {source_view} s
ON t.{Gaps.TICKER} = s.{Gaps.TICKER} AND {_key_on(Gaps.SCHEMA)}
WHEN MATCHED AND (t.updated_at IS NULL OR s.updated_at > t.updated_at) THEN UPDATE SET *
WHEN NOT MATCHED THEN INSERT *"""


def count_gaps_by_status(target: str) -> str:
    return f"SELECT {Gaps.STATUS} AS status, count(*) AS n FROM {target} GROUP BY {Gaps.STATUS}"


@dataclass(frozen=True, slots=True)
class SeriesRange:
    """One (ticker, period) series and the open_time range a write covers."""

    ticker: str
    period_seconds: int
    lo_ms: int
    hi_ms: int


def _id_list(request_ids: Sequence[str]) -> str:
    for rid in request_ids:
        if not topics.is_valid_id(rid):  # ids are [A-Za-z0-9_.-]: safe as SQL literals
            raise ValueError(f"request id {rid!r} is not a valid id")
    return ", ".join(f"'{rid}'" for rid in request_ids)


def select_requests(target: str, request_ids: Sequence[str]) -> str:
    return f"SELECT * FROM {target} WHERE request_id IN ({_id_list(request_ids)})"


def select_request_ids(target: str) -> str:
    return f"SELECT {Requests.REQUEST_ID} FROM {target}"


class SchemaMismatchError(RuntimeError):
    """An existing table lacks columns the pipeline writes."""


@dataclass(frozen=True, slots=True)
class KeyedTable:
    """A table its one writer appends only new keys to (``ticks``, the books): its Spark
    identifier, the kind its temp views are named by, its key and columns, the time
    column a batch's stored keys are read in, and the MERGE ``merge(target, view, lo_ms,
    hi_ms)`` that follows a failed commit."""

    target: str
    kind: str
    table: TableSchema
    time_column: str
    merge: Callable[[str, str, int, int], str]

    def merge_in(self, lo_ms: int, hi_ms: int) -> Callable[[str], str]:
        """The MERGE of a source view, bounded to ``[lo_ms, hi_ms]``."""
        return lambda view: self.merge(self.target, view, lo_ms, hi_ms)


def keyed_tables(names: TableNames) -> tuple[KeyedTable, KeyedTable, KeyedTable]:
    """``ticks``, ``book_snapshots`` and ``book_deltas`` as `KeyedTable`s."""
    snaps, deltas = records.BOOK_SNAPSHOTS, records.BOOK_DELTAS
    return (
        KeyedTable(names.ticks, "ticks", Ticks.SCHEMA, Ticks.TRADE_TIME, merge_ticks),
        KeyedTable(
            names.book_snapshots, "books", snaps.table, snaps.time_column, merge_book_snapshots
        ),
        KeyedTable(
            names.book_deltas, "deltas", deltas.table, deltas.time_column, merge_book_deltas
        ),
    )


#: Reports each write's table (short name) and the way it ran (metrics.iceberg_writes).
WriteReport = Callable[[str, WritePath], None]


@dataclass(frozen=True, slots=True)
class Written:
    """How a write of candles ran ("none", "append" or "merge") and, when the driver
    wrote them, the ``ohlc`` snapshot that holds them (None: read the current one)."""

    how: str
    snapshot_id: int | None = None


class Lake:
    def __init__(
        self,
        spark: SparkSession,
        names: TableNames,
        tables: ArrowAppends,
        *,
        rule: WriteRule | None = None,
        report: WriteReport | None = None,
        retries: int = 5,
    ) -> None:
        self._spark = spark
        self.names = names
        self._ticks, self._book_snapshots, self._book_deltas = keyed_tables(names)
        self._retries = retries
        #: pyiceberg's client of the same catalog: the reads before a write, the appends
        #: from the driver.
        self._tables = tables
        #: Which way each write runs (`WriteRule.choose`, docs/adr/0017).
        self._rule = rule or WriteRule()
        self._report = report
        #: Held by every writer of ``ohlc`` in this process (history and live candles).
        self.ohlc_lock = threading.Lock()

    @property
    def rule(self) -> WriteRule:
        """Which way each write runs, and where a ``ticks`` micro-batch is decoded."""
        return self._rule

    # -- setup -------------------------------------------------------------------

    def ensure_tables(self) -> None:
        """Create or evolve the namespace and tables as needed; fail clearly on a foreign
        schema. Read with pyiceberg (a catalog call per table, no Spark SQL analysis):
        on a restart, start-up runs no statement at all."""
        found = {target: self._table_state(target) for target in pipeline_tables(self.names)}
        statements = setup_statements(self.names, found)
        for statement in statements:
            log.info("table setup: %s", statement.splitlines()[0])
            self._spark.sql(statement)
        if statements:  # a table may have changed: no stale schema in Spark's cache
            for target in (t for t, state in found.items() if state is not None):
                self._spark.catalog.refreshTable(target)

    def warm_up(self, candles: pa.Table, lap: Callable[[str], None] = lambda _step: None) -> None:
        """Write ``candles`` the way a history answer is written, to a scratch copy of
        ``ohlc`` that is dropped after; ``lap`` is called after each step, named.

        Why: the first answer after a start paid ~4 s of cold code in its append
        (Spark's Arrow import, Iceberg's writer and S3 client, the JIT) where a warm
        one takes ~0.7 s; paid here, it is part of the start instead.
        """
        scratch = f"{self.names.catalog}.{self.names.namespace}.warmup_{uuid.uuid4().hex[:8]}"
        self._spark.sql(create_table(scratch, Ohlc.SCHEMA))
        lap("create")
        try:
            series = _series(_ranges(candles))
            loaded = self._tables.load(_identifier(scratch))
            driver_reads.stored_candles(loaded, series)
            lap("probe")
            path = self._rule.choose(candles.num_rows, keys_absent=True)
            self._append(self._spark, scratch, candles, path, loaded)
            lap("append")
            # The same read on a table holding a file: the Parquet reader's first use.
            driver_reads.stored_candles(self._tables.load(_identifier(scratch)), series)
            lap("read")
            # A Spark job whose rows come back as Arrow, as every micro-batch's fetch:
            # the executor's first task and the driver's Arrow collect, paid here.
            self._spark.range(1).toArrow()
            lap("job")
        finally:
            self._tables.purge(_identifier(scratch))
            lap("drop")

    def _table_state(self, table: str) -> TableState | None:
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        try:
            loaded = self._tables.load(_identifier(table))
        except (NoSuchTableError, NoSuchNamespaceError):
            return None
        return TableState(
            columns=frozenset(f.name for f in loaded.schema().fields),
            properties=dict(loaded.properties),
        )

    # -- writes ------------------------------------------------------------------

    def write_history(self, session: SparkSession, candles: pa.Table) -> Written:
        """Write exchange candles (unique per key) to ``ohlc``; how, and the snapshot made.
        Over stored candles the merge runs on the driver (`candle_merges`), as
        `write_live`'s, unless the batch is too large for it (`WriteRule.choose`)."""
        return self._append_or_merge(
            session, candles, "history", merge_history_candles, candle_merges.history_merge
        )

    def write_live(self, session: SparkSession, candles: pa.Table) -> str:
        """Write closed live candles (unique per key) to ``ohlc``: new keys inserted, a
        live row whose values differ amended, an exchange row never touched."""

        def merge(target: str, view: str, lo_ms: int, hi_ms: int) -> str:
            return merge_live_candles(target, view, lo_ms, hi_ms, amend=True)

        return self._append_or_merge(session, candles, "live", merge, candle_merges.live_merge).how

    def _append_or_merge(
        self,
        session: SparkSession,
        candles: pa.Table,
        kind: str,
        merge: Callable[[str, str, int, int], str],
        merged: Callable[[pa.Table, pa.Table], candle_merges.Merged] | None = None,
    ) -> Written:
        """Append when no candle of the rows' (ticker, period, time range) exists, else
        merge (on the driver with ``merged``, the twin of ``merge``); returns how
        ("none", "append" or "merge") and the snapshot a driver's write made.

        Most writes cover a range with no rows yet; there a plain append is the
        same as the MERGE and ~3x cheaper. Whether the range is empty is checked
        under the lock every ``ohlc`` writer of this process holds, so no candle
        can land in the range between the check and the append. A writer that can
        merge on the driver reads the range's stored candles at once (one pass over
        the table's manifests, the same as a probe's when the range is empty).
        """
        if candles.num_rows == 0:
            return Written("none")
        with self.ohlc_lock:
            ranges = _ranges(candles)
            series = _series(ranges)
            loaded = self._tables.load(_identifier(self.names.ohlc))
            if merged is None:
                empty = not driver_reads.any_candle_in(loaded, series)
            else:
                stored = self._stored_candles(loaded, series)
                empty = stored.num_rows == 0
            lo = min(r.lo_ms for r in ranges)
            hi = max(r.hi_ms for r in ranges)

            def merge_on_driver() -> int:
                assert merged is not None
                after = merged(candles, stored)
                if after.written == 0:  # nothing changes (a replay, or every stored one wins)
                    return int(loaded.metadata.current_snapshot_id or 0)
                wanted = driver_reads.candle_filter(series)
                return self._tables.replace(
                    _identifier(self.names.ohlc), after.rows, wanted, loaded
                )

            path, snapshot = self._write(
                session,
                self.names.ohlc,
                kind,
                candles,
                empty,
                lambda view: merge(self.names.ohlc, view, lo, hi),
                loaded,
                merge_on_driver if merged is not None else None,
            )
            if path in ("spark-merge", "append-then-merge"):
                return Written("merge")
            return Written("merge" if path == "driver-merge" else "append", snapshot)

    def _stored_candles(self, table: Table, series: list[tuple[str, int, int, int]]) -> pa.Table:
        """The candles ``table`` (``ohlc`` as just loaded) holds in ``series``' ranges: what
        a write that can merge on the driver reads first (`driver_reads.stored_candles`)."""
        return driver_reads.stored_candles(table, series)

    def write_ticks(self, session: SparkSession, ticks: pa.Table) -> str:
        """Store the ``TICK_SCHEMA`` rows (unique per key) whose (ticker, trade_id) is not
        stored yet; returns how: "append N" or "merge"."""
        return self._append_unstored(session, self._ticks, ticks)

    def write_kafka_ticks(self, session: SparkSession, kafka: DataFrame) -> executor_writes.Stored:
        """Store the new trades of a Kafka micro-batch (``value``, ``timestamp``,
        ``partition``, ``offset``) without bringing its rows to the driver: decoded,
        deduplicated, checked against the stored keys and appended by Spark's executors
        (`executor_writes`); how: "executor-append N" or "merge"."""
        return self._append_on_executors(session, self._ticks, executor_writes.unique_ticks(kafka))

    def write_kafka_books(
        self, session: SparkSession, kafka: DataFrame
    ) -> tuple[executor_writes.Stored, executor_writes.Stored]:
        """Store the new book snapshots, then the new deltas, of a ``market.book``
        micro-batch on Spark's executors, as `write_kafka_ticks` does trades; returns
        what each table stored. The records are fetched and decoded once (cached), then
        split into the two tables on the executors (`executor_writes.book_part`)."""
        books = executor_writes.decoded(kafka, executor_writes.BOOKS).persist()
        try:
            snapshots = executor_writes.book_part(books, records.BOOK_SNAPSHOTS)
            first = self._append_on_executors(session, self._book_snapshots, snapshots)
            deltas = executor_writes.book_part(books, records.BOOK_DELTAS)
            return first, self._append_on_executors(session, self._book_deltas, deltas)
        finally:
            books.unpersist()

    def _append_on_executors(
        self, session: SparkSession, keyed: KeyedTable, rows: DataFrame
    ) -> executor_writes.Stored:
        """Append the ``rows`` (one per key) whose key ``keyed`` does not hold, found and
        written by Spark's executors; the driver gets job 1's few numbers and commits. The
        one fallback is `_write`'s: a typed commit error -> the table's MERGE, the cached
        rows as its source.

        The table's one writer calls this, one batch at a time (as `_append_unstored`), so
        the keys the join reads cannot change before the append: a replayed batch
        appends nothing.
        """
        target = keyed.target
        rows = rows.persist()
        try:
            started = time.monotonic()
            span = executor_writes.span_of(rows, keyed.time_column)  # job 1: fetch, decode
            decoded = time.monotonic()
            if span.rows == 0:
                return executor_writes.Stored(0, "none")
            before = self.snapshot_id(target)
            path: WritePath = "executor-append"
            new = executor_writes.unstored(
                session, rows, target, span, keyed.table, keyed.time_column
            )
            try:
                with typed_commit_errors():  # job 2: the join and the files; commit here
                    new.writeTo(target).append()
            except CommitError as exc:
                log.warning("%s to %s: %s, MERGEing instead", path, target, failure_cause(exc))
                path = "append-then-merge"
                self._merge_frame(session, keyed.kind, rows, keyed.merge_in(*span.ms_range))
            self._reported(target, path)
            how = "merge"
            if path == "executor-append":
                loaded = self._tables.load(_identifier(target))
                how = f"{path} {executor_writes.appended_since(loaded, before)}"
            steps = (
                ("decode", (decoded - started) * 1000),
                ("write", (time.monotonic() - decoded) * 1000),
            )
            return executor_writes.Stored(span.rows, how, steps)
        finally:
            rows.unpersist()

    def _append_unstored(self, session: SparkSession, keyed: KeyedTable, rows: pa.Table) -> str:
        """Append the ``rows`` whose key ``keyed`` does not hold yet, by the keys stored in
        the batch's time range (`driver_reads.stored_keys`, on the driver: that range holds
        a batch's few files); how: "append N" or, after `_write`'s fallback, "merge".

        The table's one writer calls this, one batch at a time (``ticks``: ticks-persist;
        the books: book-store), so the keys read cannot change before the append: a
        replayed batch finds its own and appends nothing.
        """
        lo_ms, hi_ms = _time_range_ms(rows[keyed.time_column])
        loaded = self._tables.load(_identifier(keyed.target))
        tickers = pc.unique(rows[Ticks.TICKER]).to_pylist()  # every such table's
        key = keyed.table.key
        stored = driver_reads.stored_keys(loaded, key, keyed.time_column, tickers, lo_ms, hi_ms)
        new = driver_reads.unstored(rows, key, stored)
        if new.num_rows == 0:
            return "append 0"
        path, _ = self._write(
            session, keyed.target, keyed.kind, new, True, keyed.merge_in(lo_ms, hi_ms), loaded
        )
        return "merge" if path == "append-then-merge" else f"append {new.num_rows}"

    def write_trade_bars(
        self, session: SparkSession, select: str, bar_plan: trade_bars.BarPlan
    ) -> trade_bars.BarCounts:
        """MERGE the time bars ``select`` computes (`trade_bars.bars_sql`) into ``ohlc``."""
        window = bar_plan.trades_ms
        assert window is not None
        lo, hi = window[0], window[1] - bar_plan.period_ms  # open times

        def merge(view: str) -> None:
            with self.ohlc_lock:
                self._run(session, merge_trade_bars(self.names.ohlc, view, lo, hi))

        return self._merge_computed(session, select, Ohlc.INCOMPLETE, self.names.ohlc, merge)

    def write_count_bars(self, session: SparkSession, select: str) -> trade_bars.BarCounts:
        """MERGE the tick or volume bars ``select`` computes (`count_bars.bars_sql`) into
        ``trade_bars`` (the history query is its only writer)."""
        from pipeline.count_bars import merge_sql

        target = self.names.trade_bars

        def merge(view: str) -> None:
            self._run(session, merge_sql(target, view))

        return self._merge_computed(session, select, TradeBars.INCOMPLETE, target, merge)

    def _merge_computed(
        self,
        session: SparkSession,
        select: str,
        incomplete: str,
        target: str,
        merge: Callable[[str], None],
    ) -> trade_bars.BarCounts:
        """Bars computed by Spark SQL, MERGEd: the aggregation runs on the executors
        once (cached, counted, then `merge`'s source view); only the two counts come to
        the driver."""
        from pyspark.sql import functions as sf

        bars = session.sql(select).persist()
        try:
            row = bars.agg(
                sf.count(sf.lit(1)).alias("rows"),
                sf.count_if(sf.col(incomplete)).alias("incomplete"),
            ).first()
            assert row is not None
            counts = trade_bars.BarCounts(int(row["rows"]), int(row["incomplete"]))
            if counts.rows:
                view = _view_name("bars")
                bars.createOrReplaceTempView(view)
                try:
                    merge(view)
                    self._reported(target, "spark-merge")
                finally:
                    session.catalog.dropTempView(view)
            return counts
        finally:
            bars.unpersist()

    def recording(self, session: SparkSession, ticker: str) -> trade_bars.Recording:
        """The ticker's oldest and newest trade in ``ticks``."""
        row = session.sql(trade_bars.recording_sql(self.names.ticks, ticker)).first()
        if row is None or row["first_ms"] is None or row["last_ms"] is None:
            return trade_bars.Recording(None, None)
        return trade_bars.Recording(int(row["first_ms"]), int(row["last_ms"]))

    def unrepaired_gaps(self, session: SparkSession, ticker: str) -> list[trade_bars.GapSpan]:
        """The ticker's ``gaps`` rows not REPAIRED."""
        rows = session.sql(trade_bars.gaps_sql(self.names.gaps, ticker)).toArrow().to_pylist()
        return [trade_bars.GapSpan(r["status"], r["from_ms"], r["to_ms"]) for r in rows]

    def merge_book_snapshots(self, session: SparkSession, rows: pa.Table) -> str:
        """Store the ``BOOK_SNAPSHOT_SCHEMA`` rows not stored yet (a book-store query write):
        a replayed batch finds its keys and adds nothing. How: "append N" or "merge"."""
        return self._append_unstored(session, self._book_snapshots, rows)

    def merge_book_deltas(self, session: SparkSession, rows: pa.Table) -> str:
        """Store the ``BOOK_DELTA_SCHEMA`` rows not stored yet, the way snapshots are."""
        return self._append_unstored(session, self._book_deltas, rows)

    def merge_markets(self, session: SparkSession, rows: pa.Table, deleted: Sequence[str]) -> None:
        """Upsert Market rows (``markets.MARKETS_SCHEMA``) and delete ``deleted`` tickers."""
        flags = pa.array([False] * rows.num_rows + [True] * len(deleted))
        gone = pa.table({Markets.TICKER: pa.array(list(deleted), pa.string())})
        source = pa.concat_tables([rows, gone], promote_options="default")
        source = source.append_column("deleted", flags)
        target = self.names.markets
        self._write(session, target, "markets", source, False, lambda v: merge_markets(target, v))

    def merge_gaps(self, session: SparkSession, rows: pa.Table) -> None:
        """Upsert ``gaps.GAPS_SCHEMA`` rows, one per gap_id (the gaps query's only write)."""
        target = self.names.gaps
        self._write(session, target, "gaps", rows, False, lambda v: merge_gaps(target, v))

    def gaps_by_status(self, session: SparkSession) -> dict[str, int]:
        """Rows of ``gaps`` per status (a small table: one row per gap)."""
        rows = session.sql(count_gaps_by_status(self.names.gaps)).toArrow().to_pylist()
        return {str(r["status"]): int(r["n"]) for r in rows}

    def record_requests(self, session: SparkSession, requests: Sequence[CompletedRequest]) -> None:
        """Append requests that `find_requests` did not find.

        The history query is the table's only writer and runs one batch at a time,
        so lookup-then-append cannot race; a replayed batch finds its own rows.
        """
        if not requests:
            return
        rows = history_notices.to_table(requests)
        path = self._rule.choose(rows.num_rows, keys_absent=True)
        # No MERGE to follow a failed commit: the batch fails, and its replay finds the
        # rows that landed (`find_requests`).
        self._append(session, self.names.requests, rows, path)
        self._reported(self.names.requests, path)

    def _write(
        self,
        session: SparkSession,
        target: str,
        kind: str,
        rows: pa.Table,
        keys_absent: bool,
        merge: Callable[[str], str],
        loaded: Table | None = None,
        merge_on_driver: Callable[[], int] | None = None,
    ) -> tuple[WritePath, int | None]:
        """Write ``rows`` to ``target`` the one way `WriteRule.choose` says (``keys_absent``:
        none of their keys is stored); returns the way it ran and the snapshot a driver
        write made. ``loaded``: ``target`` as the caller read it just before;
        ``merge_on_driver``: the writer's merge computed and committed on the driver (the
        snapshot it made), if it has one. The one fallback: a driver merge or an append
        whose commit conflicted or whose state is unknown (typed,
        `write_paths.commit_error`) is followed by the MERGE ``merge(view)``, right
        whether the first commit landed or not."""
        path = self._rule.choose(
            rows.num_rows, keys_absent=keys_absent, merges_on_driver=merge_on_driver is not None
        )
        snapshot = None
        if path != "spark-merge":
            try:
                if path == "driver-merge":
                    assert merge_on_driver is not None
                    with typed_commit_errors():
                        snapshot = merge_on_driver()
                else:
                    snapshot = self._append(session, target, rows, path, loaded)
            except CommitError as exc:
                log.warning("%s to %s: %s, MERGEing instead", path, target, failure_cause(exc))
                path = "append-then-merge"
        if path in ("spark-merge", "append-then-merge"):
            self._merge(session, kind, rows, merge)
        self._reported(target, path)
        return path, snapshot

    def _append(
        self,
        session: SparkSession,
        target: str,
        rows: pa.Table,
        path: WritePath,
        loaded: Table | None = None,
    ) -> int | None:
        """One commit appending ``rows`` to ``target``, from the driver (pyiceberg: the
        snapshot it made; ``loaded``, the table just read, saves loading it again) or as
        a Spark job (None); a failed commit raised typed (`write_paths.typed_commit_errors`)."""
        with typed_commit_errors():
            if path == "driver-append":
                return self._tables.append(_identifier(target), rows, loaded)
            session.createDataFrame(rows).writeTo(target).append()
            return None

    def _reported(self, target: str, path: WritePath) -> None:
        if self._report is not None:
            self._report(target.rsplit(".", 1)[1], path)

    # -- reads -------------------------------------------------------------------

    def find_requests(
        self, session: SparkSession, request_ids: Sequence[str]
    ) -> dict[str, CompletedRequest]:
        if not request_ids:
            return {}
        rows = session.sql(select_requests(self.names.requests, request_ids)).toArrow()
        return history_notices.from_table(rows)

    def request_ids(self) -> list[str]:
        """Every request id in ``requests`` (`known_requests.KnownRequests`)."""
        rows = self._spark.sql(select_request_ids(self.names.requests)).toArrow()
        ids: list[str] = rows.column(Requests.REQUEST_ID).to_pylist()
        return ids

    def count_request_rows(
        self, session: SparkSession, snapshot_id: int, requests: Sequence[CompletedRequest]
    ) -> dict[str, int]:
        """Rows each request's client will find in ``ohlc`` at ``snapshot_id``."""
        ranges = [
            (
                r.request_id,
                SeriesRange(r.ticker, r.period_seconds, r.start_time_ms, r.end_time_ms),
            )
            for r in requests
        ]
        if not ranges or snapshot_id == 0:
            return {r.request_id: 0 for r in requests}
        table = self._tables.load(_identifier(self.names.ohlc))  # `row_counts`: no Spark job
        return {
            request_id: row_counts.count(
                table, snapshot_id, r.ticker, r.period_seconds, r.lo_ms, r.hi_ms
            )
            for request_id, r in ranges
        }

    def snapshot_id(self, table: str) -> int:
        """Current snapshot of ``table`` (0 if none), read fresh from the catalog."""
        snapshot = self._tables.load(_identifier(table)).current_snapshot()
        return 0 if snapshot is None else int(snapshot.snapshot_id)

    # -- internals ---------------------------------------------------------------

    def _merge(
        self, session: SparkSession, kind: str, rows: pa.Table, statement: Callable[[str], str]
    ) -> None:
        """Run the MERGE ``statement(view)`` with ``rows`` as the temp view ``view``."""
        self._merge_frame(session, kind, session.createDataFrame(rows), statement)

    def _merge_frame(
        self,
        session: SparkSession,
        kind: str,
        frame: DataFrame,
        statement: Callable[[str], str],
    ) -> None:
        """Run the MERGE ``statement(view)`` with ``frame`` as the temp view ``view``."""
        view = _view_name(kind)
        frame.createOrReplaceTempView(view)
        try:
            self._run(session, statement(view))
        finally:
            session.catalog.dropTempView(view)

    def _run(self, session: SparkSession, statement: str) -> None:
        """Run a MERGE; one that lost to a concurrent commit, or whose commit state is
        unknown, runs again (a MERGE is right whether its first run landed or not)."""
        for attempt in range(1, self._retries + 1):
            try:
                with typed_commit_errors():
                    session.sql(statement)
                return
            except CommitError as exc:
                if attempt == self._retries:
                    raise
                log.warning("%s (attempt %d), retrying the MERGE", failure_cause(exc), attempt)
                time.sleep(0.1 * attempt)


def _identifier(target: str) -> str:
    """pyiceberg's ``namespace.table`` of Spark's ``catalog.namespace.table``."""
    return target.split(".", 1)[1]


def _view_name(kind: str) -> str:
    # Temp views are per session, but be safe against concurrent batches of one query.
    return f"pipeline_src_{kind}_{uuid.uuid4().hex[:12]}"


def _time_range_ms(times: pa.ChunkedArray) -> tuple[int, int]:
    """The ms range ``[lo, hi]`` that holds every µs timestamp of ``times``."""
    bounds = pc.min_max(times.cast(pa.int64()))
    return bounds["min"].as_py() // 1000, -(-bounds["max"].as_py() // 1000)


def _series(ranges: Sequence[SeriesRange]) -> list[tuple[str, int, int, int]]:
    """(ticker, period, lo_ms, hi_ms) of each range: what `driver_reads` looks up."""
    return [(r.ticker, r.period_seconds, r.lo_ms, r.hi_ms) for r in ranges]


def _ranges(candles: pa.Table) -> list[SeriesRange]:
    """(ticker, period, first open_time, last open_time) of each series in ``candles``."""
    series = [Ohlc.TICKER, Ohlc.PERIOD_SECONDS]
    ms = pc.cast(candles[Ohlc.OPEN_TIME], pa.timestamp("ms", tz="UTC")).cast(pa.int64())
    keyed = candles.select(series).append_column("t", ms)
    groups = keyed.group_by(series).aggregate([("t", "min"), ("t", "max")])
    return [
        SeriesRange(row[Ohlc.TICKER], row[Ohlc.PERIOD_SECONDS], row["t_min"], row["t_max"])
        for row in groups.to_pylist()
    ]
