"""Kafka records -> rows: pure decoding of mdproto records into Arrow tables.

Input is what Spark's Kafka source yields (``key``, ``value``, ``partition``,
``offset``, ``timestamp`` columns) as an Arrow table or record batch, so these
functions run unchanged on the driver (``DataFrame.toArrow()``) and on executors
(``mapInArrow``), and in unit tests without Spark.

Bad input never raises: an undecodable record or an invalid row is dropped and
reported as a `Reject` with its Kafka coordinates, so the caller can log it (the
record itself stays in Kafka).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mdproto import ProtocolError, envelope, topics
from mdproto.book import reset_name
from mdproto.error_codes import BAD_BOOK, BAD_CANDLE, BAD_REQUEST_ID, BAD_ROW, BAD_TICK
from mdproto.messages import (
    OHLC,
    BatchMetadata,
    BookDelta,
    BookSnapshot,
    OHLCBatch,
    TakerSide,
    Tick,
)
from mdproto.tables import BookDeltas, BookSnapshots, Ohlc, TableSchema, Ticks, arrow_schema

log = logging.getLogger(__name__)
UTC_US = pa.timestamp("us", tz="UTC")

#: Row layout of Iceberg ``market.ohlc`` (mdproto.tables.Ohlc).
OHLC_SCHEMA = arrow_schema(Ohlc.SCHEMA)

#: OHLC fields that are optional in the message and nullable in ``ohlc``, trade_count aside.
OptionalVolume = Literal["quote_volume", "taker_buy_volume", "taker_buy_quote_volume"]
OPTIONAL_VOLUMES: tuple[OptionalVolume, ...] = (
    Ohlc.QUOTE_VOLUME,
    Ohlc.TAKER_BUY_VOLUME,
    Ohlc.TAKER_BUY_QUOTE_VOLUME,
)

#: Row layout of Iceberg ``market.ticks`` and of the candle aggregation's input.
TICK_SCHEMA = arrow_schema(Ticks.SCHEMA)

#: Row layout of Iceberg ``market.book_snapshots`` (docs/protocol.md "Order books").
BOOK_SNAPSHOT_SCHEMA = arrow_schema(BookSnapshots.SCHEMA)
BOOK_SNAPSHOT_KEY = BookSnapshots.SCHEMA.key
#: Row layout of Iceberg ``market.book_deltas`` (docs/protocol.md "Book history").
BOOK_DELTA_SCHEMA = arrow_schema(BookDeltas.SCHEMA)
BOOK_DELTA_KEY = BookDeltas.SCHEMA.key

OHLC_KEY = Ohlc.SCHEMA.key
#: Times Spark and Iceberg can hold: [1970-01-01, 9999-12-31]; anything else is bad input.
MAX_TIME_MS = 253_402_300_799_999
MAX_PERIOD_SECONDS = 2**31 - 1  # period_seconds is an Iceberg int
TICK_KEY = Ticks.SCHEMA.key
SOURCE_HISTORY = "history"
SOURCE_LIVE = "live"
SOURCE_TRADES = "trades"  # bars a history request built from ``ticks`` (trade_bars)
_SIDES = {TakerSide.BUY: "BUY", TakerSide.SELL: "SELL"}


@dataclass(frozen=True, slots=True)
class Reject:
    """A record (or some of its rows) that was dropped, and why."""

    partition: int
    offset: int
    code: str
    reason: str

    def __str__(self) -> str:
        return f"partition {self.partition} offset {self.offset}: {self.code}: {self.reason}"


@dataclass(frozen=True, slots=True)
class FinalMarker:
    """The end-of-request record of one request (``OHLCBatch.is_final``)."""

    request_id: str
    metadata: BatchMetadata | None
    partition: int
    offset: int


@dataclass(slots=True)
class HistoryBatch:
    """What one micro-batch of ``market.ohlc.batches`` holds."""

    candles: pa.Table
    finals: list[FinalMarker] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)
    records: int = 0
    duplicate_rows: int = 0
    #: (request_id, sequence, valid rows) of every decoded record: what each request's
    #: records brought, before rows shared with other requests are deduplicated.
    accepted: list[tuple[str, int, int]] = field(default_factory=list)


@dataclass(slots=True)
class TickBatch:
    ticks: list[Tick] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)
    #: (partition, offset) of each of ``ticks``
    coordinates: list[tuple[int, int]] = field(default_factory=list)


def log_rejects(context: str, rejects: Sequence[Reject], *, first: int = 5) -> None:
    """One ERROR line per reject for the first few, then a count (a poison topic must
    not flood the log)."""
    for reject in rejects[:first]:
        log.error("%s: dropped %s", context, reject)
    if len(rejects) > first:
        log.error("%s: dropped %d more records/rows like these", context, len(rejects) - first)


@functools.lru_cache(maxsize=4096)
def split_ticker(ticker: str) -> tuple[str, str] | None:
    """(exchange, symbol) of a valid ticker, None otherwise (cached: few distinct tickers)."""
    try:
        parsed = topics.parse_ticker(ticker)
    except ProtocolError:
        return None
    return parsed.exchange, parsed.symbol


def _column(table: pa.Table | pa.RecordBatch, name: str) -> list[Any]:
    values: list[Any] = table.column(name).to_pylist()
    return values


def kafka_coordinates(table: pa.Table | pa.RecordBatch) -> tuple[list[int], list[int]]:
    n = table.num_rows
    names = table.schema.names
    partitions = _column(table, "partition") if "partition" in names else [0] * n
    offsets = _column(table, "offset") if "offset" in names else list(range(n))
    return partitions, offsets


def kafka_timestamps_ms(table: pa.Table | pa.RecordBatch, n: int, default_ms: int) -> list[int]:
    """Kafka record timestamps in ms (a deterministic ``ingested_at`` on replays)."""
    if "timestamp" not in table.schema.names:
        return [default_ms] * n
    col = table.column("timestamp")
    if pa.types.is_timestamp(col.type):
        col = pc.cast(col, pa.timestamp("ms", tz=col.type.tz)).cast(pa.int64())
    return [default_ms if v is None else int(v) for v in col.to_pylist()]


def _present(
    rows: Sequence[OHLC], values: Sequence[float], name: OptionalVolume | Literal["trade_count"]
) -> list[bool]:
    """Whether each row sets the optional field `name`, whose `values` were read: a value
    other than 0 is set, so only the zeros ask protobuf, whose HasField is the dearest
    call per row."""
    return [v != 0 or r.HasField(name) for r, v in zip(rows, values, strict=True)]


class _CandleColumns:
    """OHLC rows gathered column by column.

    One list comprehension per column and record, numpy for the numbers and
    per-record values repeated with numpy, not appended row by row (figures:
    docs/pipeline-benchmarks.md "Headline figures").
    """

    NUMERIC = ("open", "high", "low", "close", "volume")

    def __init__(self) -> None:
        self.ticker: list[str] = []
        self.period: list[int] = []
        self.open_time: list[int] = []
        self.numbers: dict[str, list[float]] = {c: [] for c in self.NUMERIC}
        self.trade_count: list[int] = []
        self.trade_count_known: list[bool] = []  # unset in the OHLC: not reported -> null
        self.optional: dict[str, list[float]] = {c: [] for c in OPTIONAL_VOLUMES}
        self.optional_known: dict[str, list[bool]] = {c: [] for c in OPTIONAL_VOLUMES}
        # One entry per record with rows:
        self.counts: list[int] = []
        self.default_ticker: list[str] = []
        self.default_period: list[int] = []
        self.request_id: list[str] = []
        self.ingested_at: list[int] = []
        self.order: list[int] = []

    def add_record(
        self,
        rows: Sequence[OHLC],
        *,
        default_ticker: str,
        default_period: int,
        request_id: str,
        ingested_at_ms: int,
        order: int,
    ) -> None:
        if not rows:
            return
        self.ticker.extend([r.ticker for r in rows])
        self.period.extend([r.period_seconds for r in rows])
        self.open_time.extend([r.open_time_ms for r in rows])
        self.numbers["open"].extend([r.open for r in rows])
        self.numbers["high"].extend([r.high for r in rows])
        self.numbers["low"].extend([r.low for r in rows])
        self.numbers["close"].extend([r.close for r in rows])
        self.numbers["volume"].extend([r.volume for r in rows])
        counts = [r.trade_count for r in rows]
        self.trade_count.extend(counts)
        self.trade_count_known.extend(_present(rows, counts, "trade_count"))
        for name in OPTIONAL_VOLUMES:
            values = [getattr(r, name) for r in rows]
            self.optional[name].extend(values)
            self.optional_known[name].extend(_present(rows, values, name))
        self.counts.append(len(rows))
        self.default_ticker.append(default_ticker)
        self.default_period.append(default_period)
        self.request_id.append(request_id)
        self.ingested_at.append(ingested_at_ms)
        self.order.append(order)

    def to_table(self, source: str) -> tuple[pa.Table, dict[int, int]]:
        """Valid rows as ``OHLC_SCHEMA``, and {record order: rows dropped}."""
        record_of_row = np.repeat(np.arange(len(self.counts)), self.counts)
        take = pa.array(record_of_row)
        ticker = pa.array(self.ticker, pa.string())
        ticker = pc.if_else(
            pc.equal(ticker, ""), pa.array(self.default_ticker, pa.string()).take(take), ticker
        )
        period = np.array(self.period, dtype=np.int64)
        period = np.where(period == 0, np.array(self.default_period)[record_of_row], period)
        open_time = np.array(self.open_time, dtype=np.int64)
        trade_count = np.array(self.trade_count, dtype=np.uint64)
        numbers = {c: np.array(v, dtype=np.float64) for c, v in self.numbers.items()}

        encoded = _flat(pc.dictionary_encode(ticker))
        splits = [split_ticker(t) for t in encoded.dictionary.to_pylist()]
        ticker_ok = np.array([x is not None for x in splits], dtype=bool)
        index = encoded.indices.to_numpy(zero_copy_only=False)
        ok = ticker_ok[index] if len(index) else np.zeros(0, dtype=bool)
        ok &= (period > 0) & (period <= MAX_PERIOD_SECONDS)
        ok &= (open_time >= 0) & (open_time <= MAX_TIME_MS)
        ok &= trade_count <= np.uint64(2**63 - 1)
        for values in numbers.values():
            ok &= np.isfinite(values)
        optional = {c: np.array(v, dtype=np.float64) for c, v in self.optional.items()}
        known = {c: np.array(v, dtype=bool) for c, v in self.optional_known.items()}
        for name, values in optional.items():
            ok &= np.isfinite(values) | ~known[name]
        dropped = np.bincount(record_of_row[~ok], minlength=len(self.counts))
        bad = {self.order[i]: int(n) for i, n in enumerate(dropped) if n}

        exchange = pa.array([x[0] if x else "" for x in splits], pa.string())
        symbol = pa.array([x[1] if x else "" for x in splits], pa.string())
        keep = pa.array(np.flatnonzero(ok))
        rec = pa.array(record_of_row).take(keep)
        table = pa.table(
            {
                "ticker": ticker.take(keep),
                "exchange": exchange.take(encoded.indices.take(keep)),
                "symbol": symbol.take(encoded.indices.take(keep)),
                "period_seconds": pa.array(period[ok].astype(np.int32)),
                "open_time": pa.array(open_time[ok] * 1000).cast(UTC_US),
                **{c: pa.array(v[ok]) for c, v in numbers.items()},
                "trade_count": pa.array(
                    trade_count[ok].astype(np.int64),
                    mask=~np.array(self.trade_count_known, dtype=bool)[ok],
                ),
                "source": pa.array([source] * len(rec), pa.string()),
                "request_id": pa.array(self.request_id, pa.string()).take(rec),
                "ingested_at": pa.array(np.array(self.ingested_at, dtype=np.int64) * 1000)
                .take(rec)
                .cast(UTC_US),
                **{c: pa.array(v[ok], mask=~known[c][ok]) for c, v in optional.items()},
                "incomplete": pa.nulls(len(rec), pa.bool_()),  # a live candle's note only
            }
        )
        return table, bad


def _flat(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def _ms_to_timestamp(values: Sequence[int]) -> pa.Array:
    return pc.multiply(pa.array(values, pa.int64()), 1000).cast(UTC_US)


def _request_of(record: OHLCBatch) -> tuple[BatchMetadata | None, str]:
    """A record's metadata (None if absent) and request id (the record's, else its
    metadata's)."""
    meta = record.metadata if record.HasField("metadata") else None
    return meta, record.request_id or (meta.request_id if meta else "")


def final_markers(records: Iterable[tuple[bytes | None, int, int]]) -> list[FinalMarker]:
    """The final markers among ``OHLCBatch`` records (value, partition, offset), in order:
    the `HistoryBatch.finals` `decode_history` would list, without decoding any row (a
    reader that acts on markers alone skips a request's candles). Records it would reject
    are skipped; the history query reports them."""
    finals = []
    for value, partition, offset in records:
        try:
            record = envelope.decode_record(value or b"", OHLCBatch)
        except ProtocolError:
            continue
        if record.is_final:
            meta, request_id = _request_of(record)
            if topics.is_valid_id(request_id):
                finals.append(FinalMarker(request_id, meta, partition, offset))
    return finals


def decode_history(kafka: pa.Table | pa.RecordBatch, *, now_ms: int = 0) -> HistoryBatch:
    """Decode ``OHLCBatch`` records into candle rows, final markers and rejects.

    Rows are deduplicated on the natural key (ticker, period, open_time), the
    last occurrence in Kafka order winning: a MERGE source must not hold a key
    twice, and two ingestors may deliver the same request in one micro-batch.
    """
    values = _column(kafka, "value")
    keys: list[bytes | None] = (
        _column(kafka, "key") if "key" in kafka.schema.names else [None] * len(values)
    )
    partitions, offsets = kafka_coordinates(kafka)
    stamps = kafka_timestamps_ms(kafka, len(values), now_ms)
    cols = _CandleColumns()
    batch = HistoryBatch(candles=OHLC_SCHEMA.empty_table(), records=len(values))
    sizes: list[tuple[str, int, int, int]] = []
    for i, value in enumerate(values):
        partition, offset = partitions[i], offsets[i]
        try:
            record = envelope.decode_record(value or b"", OHLCBatch)
        except ProtocolError as exc:
            batch.rejects.append(Reject(partition, offset, exc.code, exc.reason))
            continue
        meta, request_id = _request_of(record)
        if not topics.is_valid_id(request_id):
            batch.rejects.append(
                Reject(partition, offset, BAD_REQUEST_ID, f"request_id {request_id!r} is invalid")
            )
            continue
        key = keys[i]
        key_ticker = key.decode("utf-8", "replace") if key else ""
        # A list: each pass over the protobuf container wraps every row anew, and
        # add_record makes a dozen passes.
        rows = list(record.rows)
        cols.add_record(
            rows,
            default_ticker=(meta.ticker if meta and meta.ticker else key_ticker),
            default_period=meta.period_seconds if meta else 0,
            request_id=request_id,
            ingested_at_ms=stamps[i],
            order=i,
        )
        if record.is_final:
            batch.finals.append(FinalMarker(request_id, meta, partition, offset))
        if rows or not record.is_final:  # a bare marker's sequence holds no rows
            sizes.append((request_id, record.sequence, i, len(rows)))
    table, bad = cols.to_table(SOURCE_HISTORY)
    batch.accepted = [(rid, seq, n - bad.get(i, 0)) for rid, seq, i, n in sizes]
    for order, count in bad.items():
        batch.rejects.append(
            Reject(
                partitions[order],
                offsets[order],
                BAD_ROW,
                f"{count} row(s) without a valid ticker or period, with an open_time outside "
                "1970..9999, a non-finite price or volume, or a trade_count beyond int64",
            )
        )
    deduped = dedupe_last(table, OHLC_KEY)
    batch.duplicate_rows = table.num_rows - deduped.num_rows
    batch.candles = deduped.cast(OHLC_SCHEMA)
    return batch


def dedupe_last(table: pa.Table, key: Sequence[str]) -> pa.Table:
    """Keep one row per key, the last one (rows are in Kafka order); keeps row order."""
    n = table.num_rows
    if n < 2:
        return table
    columns = []
    for name in key:
        col = table[name]
        if pa.types.is_string(col.type):
            col = _flat(pc.dictionary_encode(col)).indices
        elif pa.types.is_timestamp(col.type):
            col = col.cast(pa.int64())
        columns.append(np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.int64))
    rows = np.arange(n)
    order = np.lexsort((rows, *reversed(columns)))
    sorted_keys = [c[order] for c in columns]
    same_as_next = np.ones(n - 1, dtype=bool)
    for c in sorted_keys:
        same_as_next &= c[1:] == c[:-1]
    if not same_as_next.any():
        return table
    last_of_run = np.append(~same_as_next, True)
    return table.take(pa.array(np.sort(order[last_of_run])))


def decode_ticks(kafka: pa.Table | pa.RecordBatch) -> TickBatch:
    """Decode and validate ``Tick`` records (the publisher re-publishes these messages)."""
    partitions, offsets = kafka_coordinates(kafka)
    return decode_tick_values(_column(kafka, "value"), partitions, offsets)


def decode_tick_values(
    values: Sequence[bytes | None], partitions: Sequence[int], offsets: Sequence[int]
) -> TickBatch:
    """`decode_ticks` over plain lists (what a Kafka consumer hands over)."""
    out = TickBatch()
    for i, tick in enumerate(envelope.decode_records(values, Tick)):
        if isinstance(tick, ProtocolError):
            out.rejects.append(Reject(partitions[i], offsets[i], tick.code, tick.reason))
            continue
        problem = tick_problem(tick)
        if problem:
            out.rejects.append(Reject(partitions[i], offsets[i], BAD_TICK, problem))
            continue
        out.ticks.append(tick)
        out.coordinates.append((partitions[i], offsets[i]))
    return out


def tick_problem(tick: Tick) -> str:
    """Why a decoded tick cannot be used, or '' if it can."""
    if split_ticker(tick.ticker) is None:
        return f"ticker {tick.ticker!r} is not EXCHANGE:BASE/QUOTE"
    if not tick.trade_id:
        return "tick has no trade_id"
    if not 0 < tick.timestamp_ms <= MAX_TIME_MS:
        return f"tick timestamp_ms {tick.timestamp_ms} is not in 1970..9999"
    if not 0 < tick.price < math.inf:  # NaN fails it too
        return f"tick price {tick.price} is not a positive number"
    if not 0 <= tick.amount < math.inf:
        return f"tick amount {tick.amount} is not a non-negative number"
    return ""


def ticks_to_table(ticks: Sequence[Tick], ingested_fallback_ms: Sequence[int]) -> pa.Table:
    """Tick messages -> ``TICK_SCHEMA`` rows; ``ingested_at`` falls back to the Kafka time."""
    exchange: list[str] = []
    symbol: list[str] = []
    for t in ticks:
        split = split_ticker(t.ticker)
        assert split is not None, "ticks_to_table takes validated ticks"
        exchange.append(split[0])
        symbol.append(split[1])
    return pa.table(
        {
            "ticker": pa.array([t.ticker for t in ticks], pa.string()),
            "exchange": pa.array(exchange, pa.string()),
            "symbol": pa.array(symbol, pa.string()),
            "trade_id": pa.array([t.trade_id for t in ticks], pa.string()),
            "price": pa.array([t.price for t in ticks], pa.float64()),
            "amount": pa.array([t.amount for t in ticks], pa.float64()),
            "side": pa.array([_SIDES.get(t.side) for t in ticks], pa.string()),
            "trade_time": _ms_to_timestamp([t.timestamp_ms for t in ticks]),
            "ingested_at": _ms_to_timestamp(
                [
                    t.ingested_at_ms if 0 < t.ingested_at_ms <= MAX_TIME_MS else f
                    for t, f in zip(ticks, ingested_fallback_ms, strict=True)
                ]
            ),
        },
        schema=TICK_SCHEMA,
    )


#: The Kafka coordinates `kafka_ticks_rows` adds to each tick row: its order in Kafka.
KAFKA_PARTITION = "kafka_partition"
KAFKA_OFFSET = "kafka_offset"
#: `kafka_ticks_rows`' layout: ``TICK_SCHEMA`` and where each row came from.
TICK_ROWS_SCHEMA = pa.schema(
    [
        *TICK_SCHEMA,
        pa.field(KAFKA_PARTITION, pa.int32(), nullable=False),
        pa.field(KAFKA_OFFSET, pa.int64(), nullable=False),
    ]
)


def kafka_ticks_rows(kafka: pa.Table | pa.RecordBatch) -> tuple[pa.Table, list[Reject]]:
    """Kafka rows -> valid ticks as ``TICK_ROWS_SCHEMA`` rows in Kafka order, duplicates
    kept, and the rejects. ``ingested_at`` falls back to the Kafka time.

    Why the coordinates: on Spark's executors each task decodes its own share, so the
    copies of a trade meet (and the last one wins) only after a shuffle."""
    decoded = decode_ticks(kafka)
    stamps = kafka_timestamps_ms(kafka, kafka.num_rows, 0)
    partitions, offsets = kafka_coordinates(kafka)
    row_of = {(p, o): i for i, (p, o) in enumerate(zip(partitions, offsets, strict=True))}
    fallback = [stamps[row_of[c]] for c in decoded.coordinates]
    ticks = ticks_to_table(decoded.ticks, fallback)
    where = [
        pa.array([p for p, _ in decoded.coordinates], pa.int32()),
        pa.array([o for _, o in decoded.coordinates], pa.int64()),
    ]
    return pa.Table.from_arrays([*ticks.columns, *where], schema=TICK_ROWS_SCHEMA), decoded.rejects


def kafka_ticks_table(kafka: pa.Table | pa.RecordBatch) -> tuple[pa.Table, list[Reject]]:
    """Kafka rows -> valid ticks as ``TICK_SCHEMA`` rows, unique on ``TICK_KEY`` (the
    last copy wins), and the rejects. ``ingested_at`` falls back to the Kafka time."""
    rows, rejects = kafka_ticks_rows(kafka)
    return dedupe_last(rows.select(TICK_SCHEMA.names), TICK_KEY), rejects


#: Columns of closed live candles as the ``ohlc`` MERGE and the PUB take them.
LIVE_CANDLE_SCHEMA = pa.schema(
    [
        *(OHLC_SCHEMA.field(name) for name in OHLC_SCHEMA.names[:11]),  # ticker ... trade_count
        pa.field("open_time_ms", pa.int64()),
        pa.field("correction", pa.bool_()),
        OHLC_SCHEMA.field("incomplete"),
    ]
)


def decode_live_candles(kafka: pa.Table | pa.RecordBatch) -> tuple[pa.Table, list[Reject]]:
    """``market.ohlc.live`` rows (OHLC records) -> ``LIVE_CANDLE_SCHEMA``, one row per key
    (the last in Kafka order: a correction after its candle), and the rejects."""
    partitions, offsets = kafka_coordinates(kafka)
    rows: dict[str, list[Any]] = {name: [] for name in LIVE_CANDLE_SCHEMA.names}
    rejects: list[Reject] = []
    for i, value in enumerate(_column(kafka, "value")):
        try:
            c = envelope.decode_record(value or b"", OHLC)
        except ProtocolError as exc:
            rejects.append(Reject(partitions[i], offsets[i], exc.code, exc.reason))
            continue
        split = split_ticker(c.ticker)
        if split is None or not 0 <= c.open_time_ms <= MAX_TIME_MS or not c.period_seconds:
            rejects.append(Reject(partitions[i], offsets[i], BAD_CANDLE, f"{c.ticker!r}"))
            continue
        for name, v in (
            ("ticker", c.ticker),
            ("exchange", split[0]),
            ("symbol", split[1]),
            ("period_seconds", c.period_seconds),
            ("open_time", c.open_time_ms * 1000),
            ("open", c.open),
            ("high", c.high),
            ("low", c.low),
            ("close", c.close),
            ("volume", c.volume),
            ("trade_count", c.trade_count),
            ("open_time_ms", c.open_time_ms),
            ("correction", c.correction),
            ("incomplete", c.incomplete),
        ):
            rows[name].append(v)
    table = pa.table(
        {n: pa.array(v, LIVE_CANDLE_SCHEMA.field(n).type) for n, v in rows.items()},
        schema=LIVE_CANDLE_SCHEMA,
    )
    return dedupe_last(table, OHLC_KEY), rejects


@dataclass(slots=True)
class BookRows:
    """What one micro-batch of ``market.book`` holds: ``BOOK_SNAPSHOT_SCHEMA`` and
    ``BOOK_DELTA_SCHEMA`` rows, each unique on its table's key, and the rejects."""

    snapshots: pa.Table
    deltas: pa.Table
    rejects: list[Reject] = field(default_factory=list)


#: `kafka_book_rows`' columns besides a table's: the record's time (a snapshot's
#: ``snapshot_time``, a delta's ``delta_time``) and whether it is a delta.
BOOK_TIME = "book_time"
BOOK_IS_DELTA = "is_delta"


@dataclass(frozen=True, slots=True)
class BookPart:
    """One book table's share of `kafka_book_rows`: the rows whose ``is_delta`` is
    ``deltas``, ``book_time`` renamed ``time_column``, the table's columns."""

    table: TableSchema
    time_column: str
    deltas: bool


BOOK_SNAPSHOTS = BookPart(BookSnapshots.SCHEMA, BookSnapshots.SNAPSHOT_TIME, deltas=False)
BOOK_DELTAS = BookPart(BookDeltas.SCHEMA, BookDeltas.DELTA_TIME, deltas=True)

#: `kafka_book_rows`' layout: a snapshot's and a delta's columns side by side, in one
#: table so that one pass (on the driver, or in each executor task) decodes both. A
#: column only one kind has is 0 (``exchange_prev_sequence``), "" (``reset``) or null
#: (``depth``) for the other: the tables' required columns stay non-null.
BOOK_ROWS_SCHEMA = pa.schema(
    [
        *(BOOK_DELTA_SCHEMA.field(n) for n in ("ticker", "exchange", "symbol")),
        pa.field(BOOK_TIME, UTC_US, nullable=False),
        *(BOOK_DELTA_SCHEMA.field(n) for n in ("exchange_sequence", "exchange_prev_sequence")),
        *(BOOK_SNAPSHOT_SCHEMA.field(n) for n in ("depth", "reset")),
        *(BOOK_DELTA_SCHEMA.field(n) for n in ("bids", "asks", "ingested_at")),
        *(BOOK_DELTA_SCHEMA.field(n) for n in (KAFKA_PARTITION, KAFKA_OFFSET)),
        pa.field(BOOK_IS_DELTA, pa.bool_(), nullable=False),
    ]
)


def _levels(levels: Sequence[Any]) -> list[dict[str, float]]:
    return [{"price": x.price, "amount": x.amount} for x in levels]


def kafka_book_rows(kafka: pa.Table | pa.RecordBatch) -> tuple[pa.Table, list[Reject]]:
    """``market.book`` rows -> its BookSnapshot and BookDelta records as
    ``BOOK_ROWS_SCHEMA`` rows in Kafka order, copies kept, and the rejects.

    A record's time is the exchange's, else the ingestor's, else the Kafka time;
    ``ingested_at`` the ingestor's time, else the Kafka time (replays write the same).
    Every row keeps its Kafka partition and offset: a delta's key, and the order in
    which the last copy of a snapshot wins (on the executors, after a shuffle).
    """
    partitions, offsets = kafka_coordinates(kafka)
    stamps = kafka_timestamps_ms(kafka, kafka.num_rows, 0)
    rows: dict[str, list[Any]] = {name: [] for name in BOOK_ROWS_SCHEMA.names}
    rejects: list[Reject] = []
    for i, value in enumerate(_column(kafka, "value")):
        try:
            record = envelope.decode_record(value or b"")
        except ProtocolError as exc:
            rejects.append(Reject(partitions[i], offsets[i], exc.code, exc.reason))
            continue
        split = split_ticker(getattr(record, "ticker", ""))
        if not isinstance(record, BookSnapshot | BookDelta) or split is None:
            what = f"{record.DESCRIPTOR.name} {getattr(record, 'ticker', '')!r}"
            rejects.append(Reject(partitions[i], offsets[i], BAD_BOOK, what))
            continue
        ingested_ms = record.ingested_at_ms or stamps[i]
        at_ms = record.exchange_time_ms or ingested_ms
        if not 0 < at_ms <= MAX_TIME_MS:
            rejects.append(Reject(partitions[i], offsets[i], BAD_BOOK, f"time {at_ms}"))
            continue
        if isinstance(record, BookDelta):
            delta, prev, depth, reset = True, record.exchange_prev_sequence, None, ""
        else:
            delta, prev, depth, reset = False, 0, record.depth, reset_name(record.reset)
        for name, v in (
            ("ticker", record.ticker),
            ("exchange", split[0]),
            ("symbol", split[1]),
            (BOOK_TIME, at_ms * 1000),
            ("exchange_sequence", record.exchange_sequence),
            ("exchange_prev_sequence", prev),
            ("depth", depth),
            ("reset", reset),
            ("bids", _levels(record.bids)),
            ("asks", _levels(record.asks)),
            ("ingested_at", ingested_ms * 1000),
            (KAFKA_PARTITION, partitions[i]),
            (KAFKA_OFFSET, offsets[i]),
            (BOOK_IS_DELTA, delta),
        ):
            rows[name].append(v)
    return _rows_table(rows, BOOK_ROWS_SCHEMA), rejects


def book_part(rows: pa.Table, part: BookPart) -> pa.Table:
    """``part``'s rows of `kafka_book_rows`' ``rows`` in its table's layout, in their
    order, copies kept (what `Lake` and `executor_writes` do in Spark, in Arrow)."""
    mine = rows.filter(pc.equal(rows[BOOK_IS_DELTA], part.deltas))
    renamed = mine.rename_columns(
        [part.time_column if n == BOOK_TIME else n for n in mine.column_names]
    )
    return renamed.select(part.table.names).cast(arrow_schema(part.table))


def decode_book(kafka: pa.Table | pa.RecordBatch) -> BookRows:
    """``market.book`` rows -> its BookSnapshot and BookDelta records as table rows, each
    unique on its table's key (the last copy in Kafka order wins; `kafka_book_rows`)."""
    rows, rejects = kafka_book_rows(kafka)
    return BookRows(
        dedupe_last(book_part(rows, BOOK_SNAPSHOTS), BOOK_SNAPSHOT_KEY),
        dedupe_last(book_part(rows, BOOK_DELTAS), BOOK_DELTA_KEY),
        rejects,
    )


def _rows_table(rows: dict[str, list[Any]], schema: pa.Schema) -> pa.Table:
    return pa.table({n: pa.array(v, schema.field(n).type) for n, v in rows.items()}, schema=schema)
