"""Book history: the stored book of a ticker at any instant, and its top levels sampled over
a range (docs/protocol.md "Book history").

    Client.book_at / mdclient book --at / GET /book
      -> read_book_at:      the ticker's snapshots in [at - book_lookback_s, at], then its
                            deltas from the newest of them to `at` (two Iceberg scans)
    Client.book_samples / mdclient book-samples / GET /book/samples
      -> read_book_samples: the snapshots in [start - book_lookback_s, end), then the
                            deltas from the first book to `end` (two scans), stepped once
    both -> replay (pure): snapshots and deltas merged in order, applied to one
            `StoredBook` with `mdproto.book.OrderBook`'s rules

A snapshot replaces the book; a delta is applied when it follows the book
(`OrderBook.follows`: its ``exchange_prev_sequence`` is the book's sequence). A delta
whose sequence the book already has (the delta of the update a periodic snapshot
was taken at) is skipped. A delta that does not follow is a gap: the book stays as it
was before it, ``exact`` false, deltas are dropped until the next snapshot (as a live
subscriber does). Where the exchange gives no sequence (Kraken, Coinbase) no gap can
be seen. Plain data and pure functions first, then the reads.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from mdclient import timeparse
from mdclient.errors import InvalidRequest, StorageError
from mdclient.timeparse import format_ms
from mdproto import rules
from mdproto.book import OrderBook, levels_message
from mdproto.error_codes import BAD_TIME, BAD_TIME_RANGE, NO_BOOK, RANGE_TOO_LARGE
from mdproto.messages import BookDelta, BookSnapshot
from mdproto.tables import BookDeltas, BookSnapshots

if TYPE_CHECKING:
    from mdclient.config import ClientSettings
    from mdclient.frames import IcebergReader

#: The most samples one `book_samples` call returns (a day at 100 ms is 864,000).
MAX_SAMPLES = 1_000_000
#: The most levels per side a sample holds.
MAX_DEPTH = 1_000

SNAPSHOT_COLUMNS: tuple[str, ...] = (
    BookSnapshots.SNAPSHOT_TIME,
    BookSnapshots.EXCHANGE_SEQUENCE,
    BookSnapshots.DEPTH,
    BookSnapshots.BIDS,
    BookSnapshots.ASKS,
)
DELTA_COLUMNS: tuple[str, ...] = (
    BookDeltas.DELTA_TIME,
    BookDeltas.EXCHANGE_SEQUENCE,
    BookDeltas.EXCHANGE_PREV_SEQUENCE,
    BookDeltas.BIDS,
    BookDeltas.ASKS,
    BookDeltas.KAFKA_OFFSET,
)


class StoredBook(OrderBook):
    """A book rebuilt from storage (an `OrderBook`, equal level by level to a live one),
    and how far it can be trusted.

    exact: no delta was missing between its snapshot and its time (false after a gap
    in the exchange's sequence, until the next snapshot; see `gap`). snapshot_time_ms:
    the stored snapshot it starts from; deltas_applied: the deltas applied since;
    ``exchange_time_ms``: the time of the last change applied.
    """

    __slots__ = ("deltas_applied", "exact", "gap", "snapshot_time_ms")

    def __init__(self, ticker: str, depth: int = 0) -> None:
        super().__init__(ticker, depth)
        self.exact = False
        self.gap = "no book yet"
        self.snapshot_time_ms = 0
        self.deltas_applied = 0


# --- pure: replay -------------------------------------------------------------------------

#: One stored change: (time µs, exchange sequence, 0 delta / 1 snapshot, Kafka offset,
#: message). The sort order: by time; at one time by sequence; at one sequence the delta
#: first (the ingestor writes a periodic snapshot right after the delta of its update).
_Change = tuple[int, int, int, int, BookSnapshot | BookDelta]


def _levels(rows: list[dict[str, float]] | None) -> list[tuple[float, float]]:
    return [(lv["price"], lv["amount"]) for lv in rows or ()]


def _rows(table: pa.Table, time_column: str) -> list[dict[str, Any]]:
    """The rows as dicts, `time_column` as epoch µs (no datetime per row)."""
    at = table.schema.get_field_index(time_column)
    micros = table[time_column].cast(pa.int64())
    rows: list[dict[str, Any]] = table.set_column(at, time_column, micros).to_pylist()
    return rows


def changes(ticker: str, snapshots: pa.Table, deltas: pa.Table) -> list[_Change]:
    """``book_snapshots`` and ``book_deltas`` rows (`SNAPSHOT_COLUMNS`, `DELTA_COLUMNS`) as
    messages, in the order they are applied."""
    out: list[_Change] = []
    for row in _rows(snapshots, BookSnapshots.SNAPSHOT_TIME):
        at_us, seq = row[BookSnapshots.SNAPSHOT_TIME], row[BookSnapshots.EXCHANGE_SEQUENCE]
        message = BookSnapshot(
            ticker=ticker,
            bids=levels_message(_levels(row[BookSnapshots.BIDS])),
            asks=levels_message(_levels(row[BookSnapshots.ASKS])),
            depth=row[BookSnapshots.DEPTH] or 0,
            exchange_sequence=seq,
            exchange_time_ms=at_us // 1000,
        )
        out.append((at_us, seq, 1, 0, message))
    for row in _rows(deltas, BookDeltas.DELTA_TIME):
        at_us, seq = row[BookDeltas.DELTA_TIME], row[BookDeltas.EXCHANGE_SEQUENCE]
        delta = BookDelta(
            ticker=ticker,
            bids=levels_message(_levels(row[BookDeltas.BIDS])),
            asks=levels_message(_levels(row[BookDeltas.ASKS])),
            exchange_sequence=seq,
            exchange_prev_sequence=row[BookDeltas.EXCHANGE_PREV_SEQUENCE],
            exchange_time_ms=at_us // 1000,
        )
        out.append((at_us, seq, 0, row[BookDeltas.KAFKA_OFFSET], delta))
    out.sort(key=lambda c: c[:4])
    return out


class BookReplay:
    """Stored changes applied in order to one `StoredBook` (pure)."""

    def __init__(self, ticker: str) -> None:
        self.book = StoredBook(ticker)
        self._synced = False

    def step(self, change: _Change) -> None:
        message = change[4]
        book = self.book
        if isinstance(message, BookSnapshot):
            book.replace(message)
            book.snapshot_time_ms = message.exchange_time_ms
            book.deltas_applied = 0
            book.exact, book.gap, self._synced = True, "", True
            return
        if not self._synced:
            return  # before the first snapshot, or after a gap: dropped
        seq = message.exchange_sequence
        if seq and book.exchange_sequence and seq <= book.exchange_sequence:
            return  # already in the book
        if not book.follows(message):
            book.exact, self._synced = False, False
            book.gap = (
                f"a delta after exchange sequence {message.exchange_prev_sequence} at "
                f"{format_ms(message.exchange_time_ms)} does not follow the book at "
                f"{book.exchange_sequence}: the book is as of {format_ms(book.exchange_time_ms)} "
                "until the next stored snapshot"
            )
            return
        book.apply(message)
        book.deltas_applied += 1


def replay_at(
    ticker: str, all_changes: Sequence[_Change], times_ms: Sequence[int]
) -> Iterator[tuple[int, StoredBook]]:
    """(t, the book at t) for each of the ascending `times_ms`: every change at or before
    t applied, the changes walked once. The same `StoredBook` is yielded each time: read
    it before the next."""
    replay = BookReplay(ticker)
    i, n = 0, len(all_changes)
    for t in times_ms:
        limit_us = t * 1000
        while i < n and all_changes[i][0] <= limit_us:
            replay.step(all_changes[i])
            i += 1
        yield t, replay.book


def newest_snapshot_us(snapshots: pa.Table, at_ms: int) -> int | None:
    """The time (µs) of the newest snapshot at or before `at_ms`, or None."""
    micros = snapshots[BookSnapshots.SNAPSHOT_TIME].cast(pa.int64())
    before = micros.filter(pc.less_equal(micros, at_ms * 1000))
    if len(before) == 0:
        return None
    newest: int = pc.max(before).as_py()
    return newest


def book_at_from(ticker: str, snapshots: pa.Table, deltas: pa.Table, at_ms: int) -> StoredBook:
    """The book at `at_ms` from the newest snapshot at or before it and the deltas after."""
    (_, book), *_ = replay_at(ticker, changes(ticker, snapshots, deltas), [at_ms])
    return book


def sample_times(start_ms: int, end_ms: int, every_ms: int) -> range:
    """start, start + every, ... before end."""
    return range(start_ms, end_ms, every_ms)


def sample_schema(depth: int) -> pa.Schema:
    """The samples' columns: time, exact, book_time, exchange_sequence, then per side and
    level (0 the best) its price and amount: ``bid_price_0``, ``bid_amount_0``, ...,
    ``ask_price_0``, ``ask_amount_0``, ...; null where the side has fewer levels."""
    utc = pa.timestamp("us", tz="UTC")
    fields = [
        pa.field("time", utc, nullable=False),
        pa.field("exact", pa.bool_(), nullable=False),
        pa.field("book_time", utc),
        pa.field("exchange_sequence", pa.int64()),
    ]
    for side in ("bid", "ask"):
        for i in range(depth):
            fields += [pa.field(f"{side}_price_{i}", pa.float64())]
            fields += [pa.field(f"{side}_amount_{i}", pa.float64())]
    return pa.schema(fields)


def sample(
    ticker: str,
    snapshots: pa.Table,
    deltas: pa.Table,
    times_ms: Sequence[int],
    depth: int,
) -> pa.Table:
    """The book's best `depth` levels per side at each of `times_ms` (`sample_schema`).
    A time before the first snapshot has no book: levels null, ``exact`` false."""
    schema = sample_schema(depth)
    columns: dict[str, list[Any]] = {name: [] for name in schema.names}
    for t, book in replay_at(ticker, changes(ticker, snapshots, deltas), times_ms):
        has_book = book.snapshot_time_ms > 0
        columns["time"].append(t * 1000)
        columns["exact"].append(book.exact)
        columns["book_time"].append(book.exchange_time_ms * 1000 if has_book else None)
        columns["exchange_sequence"].append(book.exchange_sequence if has_book else None)
        for side, levels in (("bid", book.bids.top(depth)), ("ask", book.asks.top(depth))):
            for i in range(depth):
                price, amount = levels[i] if i < len(levels) else (None, None)
                columns[f"{side}_price_{i}"].append(price)
                columns[f"{side}_amount_{i}"].append(amount)
    arrays = [pa.array(columns[f.name], f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


# --- the reads ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SampleQuery:
    """A checked `book_samples` read: `sample_range`'s answer."""

    ticker: str
    start_ms: int
    end_ms: int
    every_ms: int
    depth: int


def ticker_and_times(ticker: str, times: Sequence[int | datetime | str], now_ms: int) -> list[int]:
    """The ticker checked and the times in epoch ms, or InvalidRequest (bad_ticker,
    bad_time): the reads' common first check (book history, replay)."""
    try:
        rules.ticker(ticker)
        return [timeparse.to_ms(t, now_ms=now_ms) for t in times]
    except rules.RuleViolation as bad:
        raise InvalidRequest(bad.reason, error_code=bad.error_code) from None
    except timeparse.TimeFormatError as exc:
        raise InvalidRequest(str(exc), error_code=BAD_TIME) from None


def book_time(ticker: str, at: int | datetime | str, *, now_ms: int) -> int:
    """`book_at`'s ticker and time checked (InvalidRequest): the time in epoch ms."""
    (at_ms,) = ticker_and_times(ticker, [at], now_ms)
    if at_ms <= 0:
        raise InvalidRequest(f"need a time after 1970, got {at_ms} ms", error_code=BAD_TIME)
    return at_ms


def sample_range(
    ticker: str,
    start: int | datetime | str,
    end: int | datetime | str,
    every_ms: int,
    depth: int,
    *,
    now_ms: int,
) -> SampleQuery:
    """A samples read checked, or InvalidRequest (bad_ticker, bad_time, bad_time_range,
    range_too_large, a step or depth out of range): the SDK's, CLI's and gateway's one
    check."""
    start_ms, end_ms = ticker_and_times(ticker, [start, end], now_ms)
    if start_ms <= 0 or end_ms <= start_ms:
        raise InvalidRequest(
            f"need 0 < start < end, got [{start_ms}, {end_ms}) in epoch ms: an empty range "
            "has no samples",
            error_code=BAD_TIME_RANGE,
        )
    if every_ms < 1:
        raise InvalidRequest(f"every_ms must be at least 1, not {every_ms}", error_code=BAD_TIME)
    if not 1 <= depth <= MAX_DEPTH:
        raise InvalidRequest(f"depth must be 1..{MAX_DEPTH} levels per side, not {depth}")
    count = len(sample_times(start_ms, end_ms, every_ms))
    if count > MAX_SAMPLES:
        raise InvalidRequest(
            f"{count} samples asked, at most {MAX_SAMPLES} per call: a shorter range or a "
            "longer step",
            error_code=RANGE_TOO_LARGE,
        )
    return SampleQuery(ticker, start_ms, end_ms, every_ms, depth)


def _no_book(ticker: str, table: str, settings: ClientSettings, at_ms: int) -> StorageError:
    return StorageError(
        f"no {ticker} book stored in {table} within {settings.book_lookback_s:g} s "
        f"before {format_ms(at_ms)}",
        error_code=NO_BOOK,
    )


def _read_deltas(
    reader: IcebergReader, settings: ClientSettings, ticker: str, from_us: int, to_ms: int
) -> pa.Table:
    """The ticker's deltas from the first book (µs, inclusive) to `to_ms` (inclusive)."""
    return reader.read_book_rows(
        settings.book_deltas_table,
        ticker,
        BookDeltas.DELTA_TIME,
        from_us // 1000,
        to_ms,
        DELTA_COLUMNS,
    )


def read_book_at(
    reader: IcebergReader, settings: ClientSettings, ticker: str, at_ms: int
) -> StoredBook:
    """The exact stored book of `ticker` at `at_ms` (`Client.book_at`, the CLI's `book
    --at`, the gateway's GET /book); StorageError `no_book` without a snapshot within
    `book_lookback_s` before it."""
    table = settings.book_snapshots_table
    lookback_ms = int(settings.book_lookback_s * 1000)
    snapshots = reader.read_book_rows(
        table, ticker, BookSnapshots.SNAPSHOT_TIME, at_ms - lookback_ms, at_ms, SNAPSHOT_COLUMNS
    )
    base_us = newest_snapshot_us(snapshots, at_ms)
    if base_us is None:
        raise _no_book(ticker, table, settings, at_ms)
    newest = snapshots.filter(
        pc.equal(snapshots[BookSnapshots.SNAPSHOT_TIME].cast(pa.int64()), base_us)
    )
    deltas = _read_deltas(reader, settings, ticker, base_us, at_ms)
    return book_at_from(ticker, newest, deltas, at_ms)


def read_book_samples(
    reader: IcebergReader, settings: ClientSettings, query: SampleQuery
) -> pa.Table:
    """`sample` over the query's range from one read of its snapshots and one of its
    deltas; StorageError `no_book` when no book is stored at or before any sample time
    (within `book_lookback_s` of the start): never an empty answer."""
    table = settings.book_snapshots_table
    lookback_ms = int(settings.book_lookback_s * 1000)
    last_ms = query.end_ms - 1
    snapshots = reader.read_book_rows(
        table,
        query.ticker,
        BookSnapshots.SNAPSHOT_TIME,
        query.start_ms - lookback_ms,
        last_ms,
        SNAPSHOT_COLUMNS,
    )
    times = sample_times(query.start_ms, query.end_ms, query.every_ms)
    first_us = newest_snapshot_us(snapshots, query.start_ms)
    if first_us is None:  # no book at the start: the first one inside the range, if any
        micros = snapshots[BookSnapshots.SNAPSHOT_TIME].cast(pa.int64())
        first_us = pc.min(micros).as_py() if len(micros) else None
    if first_us is None or first_us > times[-1] * 1000:
        raise StorageError(
            f"no {query.ticker} book stored in {table} from "
            f"{settings.book_lookback_s:g} s before {format_ms(query.start_ms)} "
            f"to {format_ms(times[-1])}",
            error_code=NO_BOOK,
        )
    micros = snapshots[BookSnapshots.SNAPSHOT_TIME].cast(pa.int64())
    used = snapshots.filter(pc.greater_equal(micros, first_us))
    deltas = _read_deltas(reader, settings, query.ticker, first_us, times[-1])
    return sample(query.ticker, used, deltas, times, query.depth)
