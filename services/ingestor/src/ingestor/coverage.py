"""Which parts of a history request are already stored, complete, in Iceberg.

Why here: the ingestor is the only part that would touch the exchange, and it
already receives every request; the relay stays stateless (spec 001) and the
pipeline learns the outcome only after the fetch. So the ingestor plans: it
reads the pipeline's `market.requests` table (one row per notified request,
written in the commit that made the rows visible), keeps the ranges earlier
requests answered completely, and fetches only what is left.

A stored request covers `[start, covered_end)` of its (ticker, period) when it
ended OK with an integrity report saying nothing was missing
(`expected_candles > 0`, `missing_candles == 0`). `covered_end` is the end of
its last closed slot (`first slot + expected_candles * period`): the part that
was still open when it was fetched is not covered, so the recent edge is
always fetched again. Weekly and longer candles (phase not on the epoch grid)
are never planned from storage.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from ingestor.candles import FetchPlan
from mdproto.messages import HistorySource
from mdproto.tables import Requests

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.catalog import Catalog
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table

log = logging.getLogger(__name__)
#: How long `IcebergCoverage.warm` waits for the table to exist (a fresh platform).
WARM_WITHIN_S = 120.0
#: A ticker no request has: the warm-up's scan reads the table and finds nothing.
WARM_TICKER = "WARMUP:WARM/UP"

WEEK_S = 7 * 24 * 3600
#: The `market.requests` columns `stored_span` reads.
_READ = (
    Requests.STATUS,
    Requests.PERIOD_SECONDS,
    Requests.START_TIME_MS,
    Requests.END_TIME_MS,
    Requests.EXPECTED_CANDLES,
    Requests.MISSING_CANDLES,
)
#: What `StoredRows` keeps of each data file: the rows `stored_span` may count, by ticker.
_KEPT = (Requests.TICKER, *_READ)


@dataclass(frozen=True, slots=True, order=True)
class Span:
    """Half-open `[start_ms, end_ms)`."""

    start_ms: int
    end_ms: int


def first_slot(start_ms: int, period_ms: int) -> int:
    return -(-start_ms // period_ms) * period_ms


def stored_span(row: Mapping[str, Any]) -> Span | None:
    """What one `market.requests` row proves is stored, or None."""
    period_s = int(row.get(Requests.PERIOD_SECONDS) or 0)
    expected = int(row.get(Requests.EXPECTED_CANDLES) or 0)
    if row.get(Requests.STATUS) != "OK" or not 0 < period_s < WEEK_S or expected <= 0:
        return None
    if int(row.get(Requests.MISSING_CANDLES) or 0) != 0:
        return None
    start = int(row.get(Requests.START_TIME_MS) or 0)
    period_ms = period_s * 1000
    first = first_slot(start, period_ms)
    end = min(int(row.get(Requests.END_TIME_MS) or 0), first + expected * period_ms)
    return Span(start, end) if end > start else None


def merge(spans: Iterable[Span]) -> list[Span]:
    """Union of spans, sorted, touching ones joined."""
    merged: list[Span] = []
    for span in sorted(spans):
        if merged and span.start_ms <= merged[-1].end_ms:
            last = merged[-1]
            merged[-1] = Span(last.start_ms, max(last.end_ms, span.end_ms))
        else:
            merged.append(span)
    return merged


def missing(start_ms: int, end_ms: int, covered: Sequence[Span], period_ms: int) -> list[Span]:
    """The parts of `[start_ms, end_ms)` no covered span holds, on the candle grid.

    Each piece is widened to whole candle slots, so a candle that straddles a
    covered span's edge is fetched rather than lost.
    """
    pieces: list[Span] = []
    cursor = start_ms
    for span in merge(covered):
        if span.end_ms <= cursor or span.start_ms >= end_ms:
            continue
        if span.start_ms > cursor:
            pieces.append(Span(cursor, span.start_ms))
        cursor = max(cursor, span.end_ms)
    if cursor < end_ms:
        pieces.append(Span(cursor, end_ms))
    grid = [
        Span(s.start_ms // period_ms * period_ms, min(end_ms, first_slot(s.end_ms, period_ms)))
        for s in pieces
    ]
    return merge(Span(max(start_ms, s.start_ms), s.end_ms) for s in grid if s.end_ms > s.start_ms)


def fetch_plans(plan: FetchPlan, stored: Sequence[Span]) -> tuple[list[FetchPlan], int]:
    """(the parts of `plan` to fetch, the answer's HistorySource)."""
    if plan.empty or not stored:
        return [plan], HistorySource.SOURCE_EXCHANGE
    spans = missing(plan.start_ms, plan.end_ms, stored, plan.period_ms)
    parts = [replace(plan, start_ms=s.start_ms, end_ms=s.end_ms) for s in spans]
    if not parts:
        return [], HistorySource.SOURCE_STORAGE
    if len(parts) == 1 and (parts[0].start_ms, parts[0].end_ms) == (plan.start_ms, plan.end_ms):
        return [plan], HistorySource.SOURCE_EXCHANGE
    return parts, HistorySource.SOURCE_STORAGE_AND_EXCHANGE


class CoverageSource(Protocol):
    """Stored, complete spans of one (ticker, period)."""

    async def stored(self, ticker: str, period_seconds: int) -> list[Span]: ...


class NoCoverage:
    """Coverage planning off: everything is fetched."""

    async def stored(self, ticker: str, period_seconds: int) -> list[Span]:
        return []


NO_COVERAGE = NoCoverage()


class CoverageUnknownError(Exception):
    """`market.requests` holds something `StoredRows` cannot read as it is (delete files):
    nothing is planned from storage."""


class StoredRows:
    """The rows of `market.requests` that can prove a span stored, read once per file.

    Why: each answer is appended as a one-row data file with its own manifest, and a
    scan reads every manifest and every file of the ticker until upkeep compacts them
    (every 15 minutes): the coverage read grew with each request since the last
    compaction (docs/pipeline-benchmarks.md). Manifests and data files are immutable, so
    each is read once: a call reads the table's manifest list and only what is new.
    Files no longer in the current snapshot (compacted, expired) are forgotten.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._manifests: dict[str, tuple[DataFile, ...]] = {}
        self._files: dict[str, pa.Table] = {}
        self._schema_id: int | None = None

    def rows(self, table: Table, ticker: str, period_seconds: int) -> list[dict[str, Any]]:
        """The OK rows of (`ticker`, `period_seconds`) in `table`'s current snapshot."""
        import pyarrow.compute as pc

        with self._lock:
            stored = self._current(table)
        if stored is None or not stored.num_rows:
            return []
        mine = pc.and_(
            pc.equal(stored[Requests.TICKER], ticker),
            pc.equal(stored[Requests.PERIOD_SECONDS], period_seconds),
        )
        rows: list[dict[str, Any]] = stored.filter(mine).select(list(_READ)).to_pylist()
        return rows

    def _current(self, table: Table) -> pa.Table | None:
        import pyarrow as pa
        import pyarrow.compute as pc
        from pyiceberg.expressions import AlwaysTrue
        from pyiceberg.io.pyarrow import ArrowScan
        from pyiceberg.manifest import ManifestContent
        from pyiceberg.table import FileScanTask

        snapshot = table.current_snapshot()
        if snapshot is None:
            return None
        schema = table.schema()
        if schema.schema_id != self._schema_id:  # files are read as this schema projects them
            self._schema_id, self._files = schema.schema_id, {}
        manifests = snapshot.manifests(table.io)
        files: list[DataFile] = []
        for manifest in manifests:
            if manifest.content != ManifestContent.DATA:
                raise CoverageUnknownError(
                    f"{table.name()} has delete files ({manifest.manifest_path}): "
                    "rows may be deleted, read whole only by a scan"
                )
            path = manifest.manifest_path
            if path not in self._manifests:
                live = manifest.fetch_manifest_entry(table.io, discard_deleted=True)
                self._manifests[path] = tuple(entry.data_file for entry in live)
            files += self._manifests[path]
        scan = ArrowScan(table.metadata, table.io, schema.select(*_KEPT), AlwaysTrue())
        for data_file in files:
            if data_file.file_path not in self._files:
                rows = scan.to_table([FileScanTask(data_file)])
                self._files[data_file.file_path] = rows.filter(
                    pc.equal(rows[Requests.STATUS], "OK")
                )
        current = {f.file_path for f in files}
        self._files = {k: v for k, v in self._files.items() if k in current}
        listed = {m.manifest_path for m in manifests}
        self._manifests = {k: v for k, v in self._manifests.items() if k in listed}
        return pa.concat_tables([self._files[f.file_path] for f in files]) if files else None


class IcebergCoverage:
    """Reads `market.requests` through the REST catalog (pyiceberg, off the event loop).

    A read that fails (catalog down, no table yet) plans nothing from storage:
    the request is fetched whole, as before; it is logged, never an error.
    """

    def __init__(self, properties: Mapping[str, str], table: str, catalog_name: str) -> None:
        self._properties = dict(properties)
        self._table = table
        self._catalog_name = catalog_name
        self._catalog: Catalog | None = None
        self._lock = threading.Lock()
        self._stored = StoredRows()

    async def stored(self, ticker: str, period_seconds: int) -> list[Span]:
        try:
            rows = await asyncio.to_thread(self._read, ticker, period_seconds)
        except Exception as exc:
            log.warning(
                "coverage of %s %ss unknown (%s): fetching it all", ticker, period_seconds, exc
            )
            return []
        return merge(span for row in rows if (span := stored_span(row)) is not None)

    async def warm(self, within_s: float = WARM_WITHIN_S) -> bool:
        """Open the catalog and read the table once ahead of the first request; True
        once read.

        A first read pays ~1-2 s for pyiceberg's import and the catalog, and reads every
        file of the table (`StoredRows`). On a fresh platform the table appears only
        when the pipeline creates it: tried every second until then, for at most
        ``within_s`` (0: one try).
        """
        deadline = time.monotonic() + within_s
        while True:
            try:
                if await asyncio.to_thread(self._read_once):
                    return True
            except Exception as exc:  # the first request retries, and logs what fails
                log.info("coverage table not read yet: %s", exc)
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(1.0)

    def _read_once(self) -> bool:
        """One read (of a ticker with no rows: every file is read into `StoredRows`);
        False while the table does not exist."""
        table = self._table_or_none()
        if table is not None:
            self._rows(table, WARM_TICKER, 60)
        return table is not None

    def _read(self, ticker: str, period_seconds: int) -> list[dict[str, Any]]:
        table = self._table_or_none()
        return [] if table is None else self._rows(table, ticker, period_seconds)

    def _table_or_none(self) -> Table | None:
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self._load().load_table(self._table)
        except NoSuchTableError:
            return None  # nothing was ever notified

    def _rows(self, table: Table, ticker: str, period_seconds: int) -> list[dict[str, Any]]:
        if Requests.EXPECTED_CANDLES not in {f.name for f in table.schema().fields}:
            return []  # a table from before the integrity report: nothing is provably complete
        return self._stored.rows(table, ticker, period_seconds)

    def _load(self) -> Catalog:
        from pyiceberg.catalog import load_catalog

        with self._lock:
            if self._catalog is None:
                self._catalog = load_catalog(self._catalog_name, **self._properties)
            return self._catalog
