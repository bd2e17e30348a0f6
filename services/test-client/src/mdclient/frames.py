"""The candle frame every read returns, and the Iceberg reader that fills it.

Columns: ticker, period_seconds, open_time (UTC, microseconds), open, high,
low, close, volume, trade_count; sorted by open_time. Built from OHLC
messages (legacy replies) or read from Iceberg; pure conversions first, then
`IcebergReader`, the adapter (also for the `market.requests`, `market.markets`,
`market.book_snapshots`, `market.book_deltas` and `market.gaps` rows, the `market.ticks` summary of
`mdclient.recording`, mostly from the table's manifests, and the trades of
`mdclient.trades`, whole or a group of overlapping files at a time).

The reader goes through the REST catalog and is the only pyiceberg importer,
lazily: importing this module needs pyarrow only. The candle scan is filtered
on the natural key columns (ticker, period_seconds and the half-open open_time
range) so Iceberg prunes files by partition and column statistics, and is
pinned to the notification's snapshot when it names one: the rows the
pipeline announced, even if more commits follow.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from mdclient.errors import StorageError
from mdproto.error_codes import (
    CATALOG_UNAVAILABLE,
    LOAD_FAILED,
    NO_TABLE,
    SCAN_FAILED,
    SNAPSHOT_GONE,
)
from mdproto.messages import OHLC
from mdproto.tables import (
    BookSnapshots,
    Gaps,
    Markets,
    Ohlc,
    Requests,
    Ticks,
    TradeBars,
    arrow_schema,
)

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.schema import Schema
    from pyiceberg.table import DataScan, FileScanTask, Table

log = logging.getLogger(__name__)

#: The candle frame: these ``market.ohlc`` columns (mdproto.tables.Ohlc), any of them
#: nullable (a legacy reply's candle may lack a trade count).
SCHEMA = pa.schema(
    f.with_nullable(True)
    for f in arrow_schema(
        Ohlc.SCHEMA,
        (
            Ohlc.TICKER,
            Ohlc.PERIOD_SECONDS,
            Ohlc.OPEN_TIME,
            Ohlc.OPEN,
            Ohlc.HIGH,
            Ohlc.LOW,
            Ohlc.CLOSE,
            Ohlc.VOLUME,
            Ohlc.TRADE_COUNT,
        ),
    )
)
COLUMNS: tuple[str, ...] = tuple(SCHEMA.names)


def empty_candles() -> pa.Table:
    return SCHEMA.empty_table()


def empty_trade_bars() -> pa.Table:
    """No tick or volume bars, in ``market.trade_bars``'s columns."""
    return arrow_schema(TradeBars.SCHEMA).empty_table()


def candles_from_ohlc(rows: Iterable[OHLC]) -> pa.Table:
    """Legacy `Response.candles` -> the candle frame."""
    items = list(rows)
    table = pa.table(
        {
            Ohlc.TICKER: [r.ticker for r in items],
            Ohlc.PERIOD_SECONDS: [r.period_seconds for r in items],
            Ohlc.OPEN_TIME: [r.open_time_ms * 1000 for r in items],
            Ohlc.OPEN: [r.open for r in items],
            Ohlc.HIGH: [r.high for r in items],
            Ohlc.LOW: [r.low for r in items],
            Ohlc.CLOSE: [r.close for r in items],
            Ohlc.VOLUME: [r.volume for r in items],
            Ohlc.TRADE_COUNT: [r.trade_count if r.HasField("trade_count") else None for r in items],
        },
        schema=SCHEMA,
    )
    return sort_candles(table)


def normalise(table: pa.Table) -> pa.Table:
    """Any table with the candle columns -> exactly SCHEMA, sorted (Iceberg types vary)."""
    missing = [name for name in COLUMNS if name not in table.column_names]
    if missing:
        raise ValueError(f"candle table lacks columns {missing}")
    return sort_candles(table.select(list(COLUMNS)).cast(SCHEMA))


def sort_candles(table: pa.Table) -> pa.Table:
    if table.num_rows < 2:
        return table
    return table.take(pc.sort_indices(table, sort_keys=[(Ohlc.OPEN_TIME, "ascending")]))


def closed_ohlc(table: pa.Table) -> list[OHLC]:
    """Candle frame -> `OHLC(closed=True)` messages (stored candles are closed)."""
    micros = table.column(Ohlc.OPEN_TIME).cast(pa.int64()).to_pylist()
    rows = table.drop_columns([Ohlc.OPEN_TIME]).to_pylist()
    return [
        OHLC(
            open_time_ms=us // 1000,
            closed=True,
            **{k: v for k, v in row.items() if v is not None},
        )
        for us, row in zip(micros, rows, strict=True)
    ]


def ohlc_filter(ticker: str, period_seconds: int, start_ms: int, end_ms: int) -> BooleanExpression:
    """Row filter for [start_ms, end_ms); open_time is timestamptz in microseconds."""
    from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, LessThan

    return And(
        _predicate(EqualTo, Ohlc.TICKER, ticker),
        _predicate(EqualTo, Ohlc.PERIOD_SECONDS, period_seconds),
        _predicate(GreaterThanOrEqual, Ohlc.OPEN_TIME, start_ms * 1000),
        _predicate(LessThan, Ohlc.OPEN_TIME, end_ms * 1000),
    )


def _predicate(cls: Any, column: str, value: object) -> BooleanExpression:
    """pyiceberg's pydantic predicates hide their (term, literal) __init__ from mypy."""
    result: BooleanExpression = cls(column, value)
    return result


def _equal(column: str, value: object) -> BooleanExpression:
    from pyiceberg.expressions import EqualTo

    return _predicate(EqualTo, column, value)


def _starts_with(column: str, prefix: str) -> BooleanExpression:
    from pyiceberg.expressions import StartsWith

    return _predicate(StartsWith, column, prefix)


def _file_pieces(
    table: Table, tasks: Iterable[FileScanTask]
) -> tuple[list[dict[str, Any]], list[FileScanTask]]:
    """The `recording.file_piece` of each ``market.ticks`` file its manifest entry tells
    exactly (no delete files, a ticker partition, trade_time bounds), and the others."""
    from pyiceberg.transforms import IdentityTransform

    from mdclient.recording import file_piece

    schema = table.schema()
    ticker_id = schema.find_field(Ticks.TICKER).field_id
    bound = _time_bound(schema, Ticks.TRADE_TIME)
    ticker_at = {  # spec_id -> position of identity(ticker) in a file's partition
        spec_id: next(
            (
                i
                for i, f in enumerate(spec.fields)
                if f.source_id == ticker_id and isinstance(f.transform, IdentityTransform)
            ),
            None,
        )
        for spec_id, spec in table.specs().items()
    }

    exact: list[dict[str, Any]] = []
    rest: list[FileScanTask] = []
    for task in tasks:
        data = task.file
        at = ticker_at.get(data.spec_id)
        ticker = data.partition[at] if at is not None and not task.delete_files else None
        piece = file_piece(
            ticker, data.record_count, bound(data.lower_bounds), bound(data.upper_bounds)
        )
        if piece is None:
            rest.append(task)
        else:
            exact.append(piece)
    return exact, rest


def _time_bound(schema: Schema, column: str) -> Callable[[dict[int, bytes] | None], int | None]:
    """A data file's lower or upper bound of the timestamp `column` (epoch µs) from its
    manifest entry's ``lower_bounds``/``upper_bounds``; None where the entry has none."""
    from pyiceberg.conversions import from_bytes

    field = schema.find_field(column)

    def bound(bounds: dict[int, bytes] | None) -> int | None:
        raw = (bounds or {}).get(field.field_id)
        return None if raw is None else int(from_bytes(field.field_type, raw))  # type: ignore[arg-type]

    return bound


def overlap_groups(spans: Sequence[tuple[int | None, int | None]]) -> list[list[int]]:
    """Indexes of `spans` (a file's first and last time; None: unknown) in groups whose
    spans overlap, the groups in time order and disjoint: reading one group after the
    other, each sorted, gives rows in time order with one group in memory at a time.
    A span with an unknown end overlaps everything before or after it."""
    lowest, highest = -(2**63), 2**63 - 1
    order = sorted(
        range(len(spans)),
        key=lambda i: (lowest if spans[i][0] is None else spans[i][0], i),
    )
    groups: list[list[int]] = []
    reach = lowest
    for i in order:
        first, last = spans[i]
        start = lowest if first is None else first
        end = highest if last is None else last
        if groups and start <= reach:
            groups[-1].append(i)
            reach = max(reach, end)
        else:
            groups.append([i])
            reach = end
    return groups


@contextlib.contextmanager
def _scan_failed(what: str) -> Iterator[None]:
    """Any failure of pyiceberg or S3 inside as StorageError `scan_failed`, naming `what`."""
    try:
        yield
    except Exception as exc:
        raise StorageError(f"{what} failed: {exc}", error_code=SCAN_FAILED) from exc


def _read_tasks(scan: DataScan, tasks: list[FileScanTask]) -> pa.Table:
    """The scan's rows of these files only (their delete files applied)."""
    from pyiceberg.io.pyarrow import ArrowScan

    return ArrowScan(
        scan.table_metadata, scan.io, scan.projection(), scan.row_filter, scan.case_sensitive
    ).to_table(tasks)


_T = TypeVar("_T")

#: File groups of a trade read in flight while the consumer works on the current one.
TRADE_GROUPS_AHEAD = 2


def read_ahead(reads: Iterable[Callable[[], _T]], depth: int) -> Iterator[_T]:
    """Each read's result in order, with up to `depth` of the next reads running on
    threads meanwhile (pyarrow's decoding and S3 release the GIL), so file groups that
    follow one another download in parallel as a whole scan's files do. At most
    ``depth + 1`` results are held at once. A read's error is raised at its place,
    after the results before it; closing the iterator cancels the reads not started
    and waits for the running ones."""
    if depth < 1:
        yield from (read() for read in reads)
        return
    pending: deque[Future[_T]] = deque()
    pool = ThreadPoolExecutor(max_workers=depth, thread_name_prefix="mdclient-read")
    try:
        for read in reads:
            pending.append(pool.submit(read))
            if len(pending) > depth:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


class IcebergReader:
    """Lazily connects to the catalog on first read; safe to share between threads."""

    def __init__(self, properties: dict[str, str], *, catalog_name: str = "rest") -> None:
        self._properties = dict(properties)
        self._catalog_name = catalog_name
        self._catalog: Catalog | None = None
        self._lock = threading.Lock()

    def catalog(self) -> Catalog:
        with self._lock:
            if self._catalog is None:
                from pyiceberg.catalog import load_catalog

                uri = self._properties.get("uri", "?")
                try:
                    self._catalog = load_catalog(self._catalog_name, **self._properties)
                except Exception as exc:
                    raise StorageError(
                        f"cannot open Iceberg REST catalog at {uri}: {exc}",
                        error_code=CATALOG_UNAVAILABLE,
                    ) from exc
            return self._catalog

    def read_ohlc(
        self,
        table_name: str,
        ticker: str,
        period_seconds: int,
        start_ms: int,
        end_ms: int,
        *,
        snapshot_id: int | None = None,
    ) -> pa.Table:
        """The candle frame (SCHEMA) for the range, sorted by open_time; at `snapshot_id`
        if given (StorageError `snapshot_gone` once table upkeep expired it)."""
        scan_args: dict[str, Any] = {
            "row_filter": ohlc_filter(ticker, period_seconds, start_ms, end_ms),
            "selected_fields": COLUMNS,
        }
        return normalise(self._scan_at(table_name, ticker, scan_args, snapshot_id))

    def _scan_at(
        self, table_name: str, ticker: str, scan_args: dict[str, Any], snapshot_id: int | None
    ) -> pa.Table:
        """Scan `table_name` at `snapshot_id` if given (StorageError `snapshot_gone` once
        table upkeep expired it), else at the current snapshot."""
        table = self._table(table_name)
        if snapshot_id:
            if table.snapshot_by_id(snapshot_id) is None:
                raise StorageError(
                    f"snapshot {snapshot_id} of {table_name} is gone (expired by table upkeep)",
                    error_code=SNAPSHOT_GONE,
                )
            scan_args = {**scan_args, "snapshot_id": snapshot_id}
        try:
            arrow: pa.Table = table.scan(**scan_args).to_arrow()
        except Exception as exc:
            raise StorageError(
                f"reading {table_name} for {ticker} failed: {exc}", error_code=SCAN_FAILED
            ) from exc
        return arrow

    def read_trade_bars(
        self,
        table_name: str,
        ticker: str,
        bars: str,
        start_ms: int,
        end_ms: int,
        *,
        snapshot_id: int | None = None,
    ) -> pa.Table:
        """Tick or volume bars of a request (``market.trade_bars``): those counted from
        `start_ms` whose last trade is before `end_ms`, sorted by ``seq``."""
        from pyiceberg.expressions import And, EqualTo, LessThan

        row_filter = And(
            _predicate(EqualTo, TradeBars.TICKER, ticker),
            _predicate(EqualTo, TradeBars.BARS, bars),
            _predicate(EqualTo, TradeBars.ANCHOR_TIME, start_ms * 1000),
            _predicate(LessThan, TradeBars.CLOSE_TIME, end_ms * 1000),
        )
        arrow = self._scan_at(table_name, ticker, {"row_filter": row_filter}, snapshot_id)
        arrow = arrow.cast(arrow_schema(TradeBars.SCHEMA))
        return arrow.take(pc.sort_indices(arrow, sort_keys=[(TradeBars.SEQ, "ascending")]))

    def read_request(self, table_name: str, request_id: str) -> dict[str, Any] | None:
        """The `market.requests` row of `request_id`, or None (no outcome recorded yet)."""
        try:
            table = self._table(table_name)
        except StorageError as exc:
            if exc.error_code == NO_TABLE:  # nothing was ever notified: still pending
                return None
            raise
        try:
            rows = table.scan(row_filter=_equal(Requests.REQUEST_ID, request_id)).to_arrow()
        except Exception as exc:
            raise StorageError(
                f"reading {table_name} for request {request_id} failed: {exc}",
                error_code=SCAN_FAILED,
            ) from exc
        found: list[dict[str, Any]] = rows.to_pylist()
        # One row per request_id (the pipeline MERGEs on it); the latest wins all the same.
        return max(found, key=lambda r: r.get(Requests.COMPLETED_AT) or 0, default=None)

    def read_markets(self, table_name: str, exchange: str) -> pa.Table:
        """One exchange's rows of the markets table (docs/protocol.md), sorted by ticker."""
        table = self._table(
            table_name,
            missing="the pipeline creates it at start and fills it from the Kafka topic "
            "market.markets, which the ingestors write",
        )
        try:
            arrow = table.scan(row_filter=_equal(Markets.EXCHANGE, exchange)).to_arrow()
        except Exception as exc:
            raise StorageError(
                f"reading {table_name} for {exchange} failed: {exc}", error_code=SCAN_FAILED
            ) from exc
        return arrow.sort_by(Markets.TICKER)

    def holds(self, table_name: str, column: str, value: str) -> bool:
        """Whether any data file of the table may hold a row with `column` == `value`
        (a replay's unknown-ticker check): planned from the manifests and file
        statistics, no row read. False for a table that does not exist yet."""
        try:
            table = self._table(table_name)
        except StorageError as exc:
            if exc.error_code == NO_TABLE:
                return False
            raise
        with _scan_failed(f"planning the read of {table_name} for {value}"):
            tasks = table.scan(row_filter=_equal(column, value)).plan_files()
            return any(True for _ in tasks)

    def read_book_rows(
        self,
        table_name: str,
        ticker: str,
        time_column: str,
        lo_ms: int,
        hi_ms: int,
        columns: Sequence[str],
    ) -> pa.Table:
        """The rows of `ticker` in a book table (``book_snapshots``, ``book_deltas``) whose
        `time_column` lies in [lo_ms, hi_ms], `columns` only, in file order
        (`mdclient.book_history` orders them): the filter prunes to the ticker's partition
        and the range's days, then files by their time statistics."""
        from pyiceberg.expressions import And, GreaterThanOrEqual, LessThanOrEqual

        table = self._table(
            table_name,
            missing="the pipeline creates it at start and fills it from the Kafka topic "
            "market.book, which the ingestors write",
        )
        row_filter = And(
            _equal(BookSnapshots.TICKER, ticker),
            _predicate(GreaterThanOrEqual, time_column, lo_ms * 1000),
            _predicate(LessThanOrEqual, time_column, hi_ms * 1000),
        )
        with _scan_failed(f"reading {table_name} for {ticker}"):
            return table.scan(row_filter=row_filter, selected_fields=tuple(columns)).to_arrow()

    def read_tick_pieces(
        self, table_name: str, exchange: str | None, *, ticker: str | None = None
    ) -> pa.Table:
        """``market.ticks`` of `exchange` (None: all), or of one `ticker`, as
        `recording.PIECES`: a data file without delete files, of one ticker and one UTC
        day, from its manifest entry alone; the other files' (ticker, trade_time) read and
        grouped. Costs the file count, not the trade count, on a table the pipeline writes
        and compacts by partition."""
        from mdclient.recording import TICK_COLUMNS, pieces_from_files, pieces_from_trades

        table = self._table(
            table_name,
            missing="the pipeline creates it at start and stores the trades of every live "
            "feed and recorded market in it",
        )
        row_filter = (
            _equal(Ticks.TICKER, ticker)
            if ticker
            else _starts_with(Ticks.TICKER, f"{exchange}:")
            if exchange
            else None
        )
        scan = (
            table.scan(row_filter=row_filter, selected_fields=TICK_COLUMNS)
            if row_filter is not None
            else table.scan(selected_fields=TICK_COLUMNS)
        )
        try:
            exact, rest = _file_pieces(table, scan.plan_files())
            read = pieces_from_trades(_read_tasks(scan, rest)) if rest else None
        except Exception as exc:
            raise StorageError(
                f"reading {table_name} failed: {exc}", error_code=SCAN_FAILED
            ) from exc
        pieces = pieces_from_files(exact)
        return pieces if read is None else pa.concat_tables([pieces, read])

    def read_gaps(
        self, table_name: str, exchange: str | None, *, ticker: str | None = None
    ) -> pa.Table:
        """``market.gaps`` rows of `exchange` (None: all), or of one `ticker`,
        `recording.GAP_COLUMNS` only."""
        from mdclient.recording import GAP_COLUMNS

        table = self._table(
            table_name,
            missing="the pipeline creates it at start (a pipeline with the recording) and "
            "fills it from the TradeGap records of the Kafka topic market.recording",
        )
        scan_args: dict[str, Any] = {"selected_fields": GAP_COLUMNS}
        if ticker:
            scan_args["row_filter"] = _equal(Gaps.TICKER, ticker)
        elif exchange:
            scan_args["row_filter"] = _starts_with(Gaps.TICKER, f"{exchange}:")
        try:
            return table.scan(**scan_args).to_arrow()
        except Exception as exc:
            raise StorageError(
                f"reading {table_name} failed: {exc}", error_code=SCAN_FAILED
            ) from exc

    def read_trades(
        self, table_name: str, ticker: str, start_ms: int, end_ms: int, columns: Sequence[str]
    ) -> pa.Table:
        """The ``market.ticks`` rows of `ticker` in [start_ms, end_ms), `columns` only, in
        file order (`mdclient.trades` sorts): the filter prunes to the ticker's partition
        and the range's days, then files by their trade_time statistics."""
        scan = self._trade_scan(table_name, ticker, start_ms, end_ms, columns)
        with _scan_failed(f"reading {table_name} for {ticker}"):
            return scan.to_arrow()

    def trade_groups(
        self,
        table_name: str,
        ticker: str,
        start_ms: int,
        end_ms: int,
        columns: Sequence[str],
        *,
        ahead: int = TRADE_GROUPS_AHEAD,
    ) -> Iterator[pa.Table]:
        """`read_trades` in pieces for a range larger than memory: the scan is planned once
        (one snapshot), its files grouped where their trade_time spans overlap
        (`overlap_groups`), and the groups' rows yielded in time order, read `ahead`
        groups in advance (`read_ahead`). A group is about a day of the ticker; at
        most ``ahead + 1`` are in memory at a time."""
        scan = self._trade_scan(table_name, ticker, start_ms, end_ms, columns)
        with _scan_failed(f"planning the read of {table_name} for {ticker}"):
            tasks = list(scan.plan_files())
            bound = _time_bound(scan.table_metadata.schema(), Ticks.TRADE_TIME)
            spans = [(bound(t.file.lower_bounds), bound(t.file.upper_bounds)) for t in tasks]

        def read(group: list[int]) -> pa.Table:
            with _scan_failed(f"reading {table_name} for {ticker}"):
                return _read_tasks(scan, [tasks[i] for i in group])

        reads = (functools.partial(read, group) for group in overlap_groups(spans))
        yield from read_ahead(reads, ahead)

    def _trade_scan(
        self, table_name: str, ticker: str, start_ms: int, end_ms: int, columns: Sequence[str]
    ) -> DataScan:
        from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan

        table = self._table(
            table_name,
            missing="the pipeline creates it at start and stores the trades of every live "
            "feed and recorded market in it",
        )
        row_filter = And(
            _equal(Ticks.TICKER, ticker),
            _predicate(GreaterThanOrEqual, Ticks.TRADE_TIME, start_ms * 1000),
            _predicate(LessThan, Ticks.TRADE_TIME, end_ms * 1000),
        )
        return table.scan(row_filter=row_filter, selected_fields=tuple(columns))

    def _table(self, table_name: str, missing: str = "") -> Table:
        """`missing`: who creates the table, for the error when it does not exist yet."""
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        try:
            return self.catalog().load_table(table_name)
        except StorageError:
            raise
        except (NoSuchTableError, NoSuchNamespaceError) as exc:
            reason = (
                f"Iceberg table {table_name} does not exist yet: {missing}"
                if missing
                else (f"no Iceberg table {table_name}")
            )
            raise StorageError(reason, error_code=NO_TABLE) from exc
        except Exception as exc:
            raise StorageError(
                f"cannot load Iceberg table {table_name}: {exc}", error_code=LOAD_FAILED
            ) from exc
