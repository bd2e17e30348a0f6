"""Iceberg adapter: runs `tables` DDL/MERGEs through Spark and reads snapshot ids.

Every write is an idempotent MERGE, so a conflicting concurrent commit (history
and live candles both write ``ohlc``) is handled by running the MERGE again.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from pipeline import history_notices, tables
from pipeline.history_notices import CompletedRequest
from pipeline.records import OHLC_SCHEMA, TICK_SCHEMA
from pipeline.tables import TableNames

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

_CONFLICT_MARKERS = (
    "CommitFailedException",
    "ValidationException",
    "conflicting files",
    "CommitStateUnknownException",
)


class SchemaMismatchError(RuntimeError):
    """An existing table lacks columns the pipeline writes."""


def _is_conflict(exc: Exception) -> bool:
    text = str(exc)
    return any(marker in text for marker in _CONFLICT_MARKERS)


class Lake:
    def __init__(self, spark: SparkSession, names: TableNames, *, retries: int = 5) -> None:
        self._spark = spark
        self.names = names
        self._retries = retries
        #: Held by every writer of ``ohlc`` in this process (history and live candles).
        self.ohlc_lock = threading.Lock()

    # -- setup -------------------------------------------------------------------

    def ensure_tables(self) -> None:
        """Create the namespace and tables if missing; fail clearly on a foreign schema."""
        for statement in tables.ddl(self.names):
            self._spark.sql(statement)
        expected = {
            self.names.ohlc: OHLC_SCHEMA.names,
            self.names.ticks: TICK_SCHEMA.names,
            self.names.requests: history_notices.REQUESTS_SCHEMA.names,
            self.names.markets: tables.MARKET_COLUMNS,
        }
        evolving = {  # tables from before these columns get them (older rows read null)
            self.names.requests: history_notices.ADDED_COLUMNS,  # the integrity report
            self.names.ohlc: tables.OHLC_ADDED_COLUMNS,  # what exchanges report beyond OHLCV
        }
        for table, added in evolving.items():
            have = set(self._spark.table(table).columns)
            new = {c: t for c, t in added.items() if c not in have}
            if new:
                log.info("adding columns %s to %s", sorted(new), table)
                self._spark.sql(tables.add_columns(table, new))
                self._spark.catalog.refreshTable(table)
        for table, columns in expected.items():
            have = set(self._spark.table(table).columns)
            missing = [c for c in columns if c not in have]
            if missing:
                raise SchemaMismatchError(
                    f"Iceberg table {table} exists without columns {missing}: "
                    "migrate it or point catalog.namespace elsewhere"
                )

    # -- writes ------------------------------------------------------------------

    def write_history(self, session: SparkSession, candles: pa.Table) -> str:
        """Write exchange candles (unique per key) to ``ohlc``; returns "append" or "merge".

        Most requests cover a range with no rows yet; there a plain append is the
        same as the MERGE and ~3x cheaper. Whether the range is empty is checked
        under the lock every ``ohlc`` writer of this process holds, so no candle
        can land in the range between the check and the append.
        """
        if candles.num_rows == 0:
            return "none"
        frame = session.createDataFrame(candles)
        with self.ohlc_lock:
            ranges = _ranges(candles)
            occupied = not session.sql(tables.select_any_ohlc(self.names.ohlc, ranges)).isEmpty()
            if not occupied:
                frame.writeTo(self.names.ohlc).append()
                return "append"
            lo = min(r.lo_ms for r in ranges)
            hi = max(r.hi_ms for r in ranges)
            view = _view_name("history")
            frame.createOrReplaceTempView(view)
            try:
                self._run(session, tables.merge_history_candles(self.names.ohlc, view, lo, hi))
            finally:
                session.catalog.dropTempView(view)
            return "merge"

    def merge_live_candles(
        self, candles: DataFrame, lo_ms: int, hi_ms: int, *, amend: bool = False
    ) -> None:
        view = _view_name("live")
        candles.createOrReplaceTempView(view)
        try:
            statement = tables.merge_live_candles(self.names.ohlc, view, lo_ms, hi_ms, amend=amend)
            with self.ohlc_lock:
                self._run(candles.sparkSession, statement)
        finally:
            candles.sparkSession.catalog.dropTempView(view)

    def merge_ticks(self, ticks: DataFrame, lo_ms: int, hi_ms: int) -> None:
        view = _view_name("ticks")
        ticks.createOrReplaceTempView(view)
        try:
            self._run(ticks.sparkSession, tables.merge_ticks(self.names.ticks, view, lo_ms, hi_ms))
        finally:
            ticks.sparkSession.catalog.dropTempView(view)

    def merge_markets(self, session: SparkSession, rows: pa.Table, deleted: Sequence[str]) -> None:
        """Upsert Market rows (``markets.MARKETS_SCHEMA``) and delete ``deleted`` tickers."""
        flags = pa.array([False] * rows.num_rows + [True] * len(deleted))
        gone = pa.table({"ticker": pa.array(list(deleted), pa.string())})
        source = pa.concat_tables([rows, gone], promote_options="default")
        source = source.append_column("deleted", flags)
        view = _view_name("markets")
        session.createDataFrame(source).createOrReplaceTempView(view)
        try:
            self._run(session, tables.merge_markets(self.names.markets, view))
        finally:
            session.catalog.dropTempView(view)

    def record_requests(self, session: SparkSession, requests: Sequence[CompletedRequest]) -> None:
        """Append requests that `find_requests` did not find.

        The history query is the table's only writer and runs one batch at a time,
        so lookup-then-append cannot race; a replayed batch finds its own rows.
        """
        if not requests:
            return
        session.createDataFrame(history_notices.to_table(requests)).writeTo(
            self.names.requests
        ).append()

    # -- reads -------------------------------------------------------------------

    def find_requests(
        self, session: SparkSession, request_ids: Sequence[str]
    ) -> dict[str, CompletedRequest]:
        if not request_ids:
            return {}
        rows = session.sql(tables.select_requests(self.names.requests, request_ids)).toArrow()
        return history_notices.from_table(rows)

    def count_request_rows(
        self, session: SparkSession, snapshot_id: int, requests: Sequence[CompletedRequest]
    ) -> dict[str, int]:
        """Rows each request's client will find in ``ohlc`` at ``snapshot_id``."""
        ranges = [
            (
                r.request_id,
                tables.SeriesRange(r.ticker, r.period_seconds, r.start_time_ms, r.end_time_ms),
            )
            for r in requests
        ]
        if not ranges or snapshot_id == 0:
            return {r.request_id: 0 for r in requests}
        sql = tables.count_request_rows(self.names.ohlc, snapshot_id, ranges)
        rows = session.sql(sql).toArrow().to_pylist()
        return {row["request_id"]: int(row["n"]) for row in rows}

    def snapshot_id(self, table: str) -> int:
        """Current snapshot of ``table`` (0 if none), read fresh from the catalog."""
        spark = self._spark
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        jtable = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(
            spark._jsparkSession, table
        )
        snapshot = jtable.currentSnapshot()
        return 0 if snapshot is None else int(snapshot.snapshotId())

    # -- internals ---------------------------------------------------------------

    def _run(self, session: SparkSession, statement: str) -> None:
        for attempt in range(1, self._retries + 1):
            try:
                session.sql(statement)
                return
            except Exception as exc:
                if attempt == self._retries or not _is_conflict(exc):
                    raise
                log.warning("commit conflict (attempt %d), retrying the MERGE: %s", attempt, exc)
                time.sleep(0.1 * attempt)


def _view_name(kind: str) -> str:
    # Temp views are per session, but be safe against concurrent batches of one query.
    return f"pipeline_src_{kind}_{uuid.uuid4().hex[:12]}"


def _ranges(candles: pa.Table) -> list[tables.SeriesRange]:
    """(ticker, period, first open_time, last open_time) of each series in ``candles``."""
    ms = pc.cast(candles["open_time"], pa.timestamp("ms", tz="UTC")).cast(pa.int64())
    keyed = pa.table(
        {"ticker": candles["ticker"], "period_seconds": candles["period_seconds"], "t": ms}
    )
    groups = keyed.group_by(["ticker", "period_seconds"]).aggregate([("t", "min"), ("t", "max")])
    return [
        tables.SeriesRange(row["ticker"], row["period_seconds"], row["t_min"], row["t_max"])
        for row in groups.to_pylist()
    ]
