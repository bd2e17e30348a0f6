"""The Iceberg tables the pipeline writes and clients read: columns, keys, partitioning.

One description per table, in Iceberg's own terms and free of any engine, so the
writer and every reader agree by construction: the pipeline derives its Spark
DDL and Arrow row layouts from it, readers their Arrow schemas (`arrow_schema`)
and the column names they filter and read by (`Ohlc.OPEN_TIME`, not
``"open_time"``). Table names are `mdproto.contracts.ICEBERG_*`; what each
column means is docs/protocol.md's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

from mdproto import contracts

if TYPE_CHECKING:
    import pyarrow as pa

#: Iceberg types the tables use; ``timestamptz`` is UTC, in microseconds; ``levels`` is
#: one side of an L2 book, ``list<struct<price: double, amount: double>>``, best first.
ColumnType = Literal["string", "int", "long", "double", "boolean", "timestamptz", "levels"]
#: Iceberg partition transforms the tables use (``bucket[16]``: 16 hash buckets).
Transform = Literal["identity", "day", "month", "bucket[8]", "bucket[16]"]


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: ColumnType
    required: bool = False  # NOT NULL; every other column may be null


@dataclass(frozen=True, slots=True)
class Partition:
    column: str
    transform: Transform = "identity"


@dataclass(frozen=True, slots=True)
class TableSchema:
    """One table: columns in storage order, natural key, partitioning, evolution."""

    name: str  # default ``namespace.table`` (mdproto.contracts)
    columns: tuple[Column, ...]
    key: tuple[str, ...]  # unique per row: what every MERGE matches on
    partitioning: tuple[Partition, ...]
    #: Columns added after the table's first release (nullable, last): a writer adds
    #: them to an older table at start, whose earlier rows then read null.
    added: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"{self.name} has no column {name!r}")


class Ohlc:
    """``market.ohlc``: one candle per (ticker, period_seconds, open_time), from the
    exchange (``source`` "history"), built from trades as they arrive (``source`` "live")
    or by a history request over recorded trades (``source`` "trades")."""

    TICKER: Final = "ticker"
    EXCHANGE: Final = "exchange"
    SYMBOL: Final = "symbol"
    PERIOD_SECONDS: Final = "period_seconds"
    OPEN_TIME: Final = "open_time"
    OPEN: Final = "open"
    HIGH: Final = "high"
    LOW: Final = "low"
    CLOSE: Final = "close"
    VOLUME: Final = "volume"
    TRADE_COUNT: Final = "trade_count"
    SOURCE: Final = "source"
    REQUEST_ID: Final = "request_id"
    INGESTED_AT: Final = "ingested_at"
    # What the exchange reports besides OHLCV; null where it does not.
    QUOTE_VOLUME: Final = "quote_volume"
    TAKER_BUY_VOLUME: Final = "taker_buy_volume"
    TAKER_BUY_QUOTE_VOLUME: Final = "taker_buy_quote_volume"
    # Live candles: true if the feed may have missed trades of the window
    # (OHLC.incomplete); null for exchange candles.
    INCOMPLETE: Final = "incomplete"

    SCHEMA: Final = TableSchema(
        contracts.ICEBERG_OHLC,
        columns=(
            Column(TICKER, "string", required=True),
            Column(EXCHANGE, "string"),
            Column(SYMBOL, "string"),
            Column(PERIOD_SECONDS, "int", required=True),
            Column(OPEN_TIME, "timestamptz", required=True),
            Column(OPEN, "double"),
            Column(HIGH, "double"),
            Column(LOW, "double"),
            Column(CLOSE, "double"),
            Column(VOLUME, "double"),
            Column(TRADE_COUNT, "long"),
            Column(SOURCE, "string"),
            Column(REQUEST_ID, "string"),
            Column(INGESTED_AT, "timestamptz"),
            Column(QUOTE_VOLUME, "double"),
            Column(TAKER_BUY_VOLUME, "double"),
            Column(TAKER_BUY_QUOTE_VOLUME, "double"),
            Column(INCOMPLETE, "boolean"),
        ),
        key=(TICKER, PERIOD_SECONDS, OPEN_TIME),
        partitioning=(Partition(TICKER), Partition(PERIOD_SECONDS), Partition(OPEN_TIME, "month")),
        added=(QUOTE_VOLUME, TAKER_BUY_VOLUME, TAKER_BUY_QUOTE_VOLUME, INCOMPLETE),
    )


class Ticks:
    """``market.ticks``: one trade per (ticker, trade_id)."""

    TICKER: Final = "ticker"
    EXCHANGE: Final = "exchange"
    SYMBOL: Final = "symbol"
    TRADE_ID: Final = "trade_id"
    PRICE: Final = "price"
    AMOUNT: Final = "amount"
    SIDE: Final = "side"  # "BUY", "SELL" or null
    TRADE_TIME: Final = "trade_time"
    INGESTED_AT: Final = "ingested_at"

    SCHEMA: Final = TableSchema(
        contracts.ICEBERG_TICKS,
        columns=(
            Column(TICKER, "string", required=True),
            Column(EXCHANGE, "string"),
            Column(SYMBOL, "string"),
            Column(TRADE_ID, "string", required=True),
            Column(PRICE, "double"),
            Column(AMOUNT, "double"),
            Column(SIDE, "string"),
            Column(TRADE_TIME, "timestamptz", required=True),
            Column(INGESTED_AT, "timestamptz"),
        ),
        key=(TICKER, TRADE_ID),
        partitioning=(Partition(TICKER), Partition(TRADE_TIME, "day")),
    )


class Requests:
    """``market.requests``: one row per notified history request, the notification's
    fields (status and source by their enum names)."""

    REQUEST_ID: Final = "request_id"
    CLIENT_ID: Final = "client_id"
    STATUS: Final = "status"
    REASON: Final = "reason"
    ERROR_CODE: Final = "error_code"
    TICKER: Final = "ticker"
    PERIOD_SECONDS: Final = "period_seconds"
    # Client-supplied range, kept as given (epoch ms): any int64 is storable.
    START_TIME_MS: Final = "start_time_ms"
    END_TIME_MS: Final = "end_time_ms"
    ROW_COUNT: Final = "row_count"
    ICEBERG_TABLE: Final = "iceberg_table"
    SNAPSHOT_ID: Final = "snapshot_id"
    NOTIFICATION_TOPIC: Final = "notification_topic"
    INGESTOR_ID: Final = "ingestor_id"
    COMPLETED_AT: Final = "completed_at"
    QUERY_ID: Final = "query_id"
    BATCH_ID: Final = "batch_id"
    KAFKA_PARTITION: Final = "kafka_partition"
    KAFKA_OFFSET: Final = "kafka_offset"
    # The integrity report.
    EXPECTED_CANDLES: Final = "expected_candles"
    EXCHANGE_GAPS: Final = "exchange_gaps"
    MISSING_CANDLES: Final = "missing_candles"
    SOURCE: Final = "source"
    BARS: Final = "bars"  # tick or volume bars ("100ticks", "2.5vol"); "" or null: candles

    SCHEMA: Final = TableSchema(
        contracts.ICEBERG_REQUESTS,
        columns=(
            Column(REQUEST_ID, "string", required=True),
            Column(CLIENT_ID, "string"),
            Column(STATUS, "string"),
            Column(REASON, "string"),
            Column(ERROR_CODE, "string"),
            Column(TICKER, "string"),
            Column(PERIOD_SECONDS, "int"),
            Column(START_TIME_MS, "long"),
            Column(END_TIME_MS, "long"),
            Column(ROW_COUNT, "long"),
            Column(ICEBERG_TABLE, "string"),
            Column(SNAPSHOT_ID, "long"),
            Column(NOTIFICATION_TOPIC, "string"),
            Column(INGESTOR_ID, "string"),
            Column(COMPLETED_AT, "timestamptz"),
            Column(QUERY_ID, "string"),
            Column(BATCH_ID, "long"),
            Column(KAFKA_PARTITION, "int"),
            Column(KAFKA_OFFSET, "long"),
            Column(EXPECTED_CANDLES, "long"),
            Column(EXCHANGE_GAPS, "long"),
            Column(MISSING_CANDLES, "long"),
            Column(SOURCE, "string"),
            Column(BARS, "string"),
        ),
        key=(REQUEST_ID,),
        partitioning=(Partition(REQUEST_ID, "bucket[16]"),),
        added=(EXPECTED_CANDLES, EXCHANGE_GAPS, MISSING_CANDLES, SOURCE, BARS),
    )


class TradeBars:
    """``market.trade_bars``: tick bars (every N trades) and volume bars (every V of base
    volume) built from ``ticks`` by a history request (docs/adr/0015). Counted from the
    first trade at or after ``anchor_time`` (the request's start), in trade order: bar
    ``seq`` of "Nticks" holds trades N*seq .. N*seq+N-1; of "Vvol", the trades whose
    volume before them (since the anchor) lies in [V*seq, V*(seq+1)). Only full bars."""

    TICKER: Final = "ticker"
    BARS: Final = "bars"  # canonical "100ticks" / "2.5vol" (mdproto.rules.Bars.name)
    ANCHOR_TIME: Final = "anchor_time"
    SEQ: Final = "seq"
    CLOSE_TIME: Final = "close_time"  # the last trade's time (open_time: the first's)
    FIRST_TRADE_ID: Final = "first_trade_id"
    LAST_TRADE_ID: Final = "last_trade_id"
    # A candle's columns, by its names; incomplete: a gap not repaired lies before the
    # bar's end, so its count may be off.
    EXCHANGE, SYMBOL, OPEN_TIME = Ohlc.EXCHANGE, Ohlc.SYMBOL, Ohlc.OPEN_TIME
    OPEN, HIGH, LOW, CLOSE, VOLUME = Ohlc.OPEN, Ohlc.HIGH, Ohlc.LOW, Ohlc.CLOSE, Ohlc.VOLUME
    TRADE_COUNT, QUOTE_VOLUME = Ohlc.TRADE_COUNT, Ohlc.QUOTE_VOLUME
    TAKER_BUY_VOLUME, TAKER_BUY_QUOTE_VOLUME = Ohlc.TAKER_BUY_VOLUME, Ohlc.TAKER_BUY_QUOTE_VOLUME
    INCOMPLETE, REQUEST_ID, INGESTED_AT = Ohlc.INCOMPLETE, Ohlc.REQUEST_ID, Ohlc.INGESTED_AT

    SCHEMA: Final = TableSchema(
        contracts.ICEBERG_TRADE_BARS,
        columns=(
            Column(TICKER, "string", required=True),
            Column(BARS, "string", required=True),
            Column(ANCHOR_TIME, "timestamptz", required=True),
            Column(SEQ, "long", required=True),
            Column(EXCHANGE, "string"),
            Column(SYMBOL, "string"),
            Column(OPEN_TIME, "timestamptz"),
            Column(CLOSE_TIME, "timestamptz"),
            *(Ohlc.SCHEMA.column(name) for name in (OPEN, HIGH, LOW, CLOSE, VOLUME, TRADE_COUNT)),
            *(Ohlc.SCHEMA.column(name) for name in Ohlc.SCHEMA.added[:3]),  # the volumes
            Column(FIRST_TRADE_ID, "string"),
            Column(LAST_TRADE_ID, "string"),
            Column(INCOMPLETE, "boolean"),
            Column(REQUEST_ID, "string"),
            Column(INGESTED_AT, "timestamptz"),
        ),
        key=(TICKER, BARS, ANCHOR_TIME, SEQ),
        partitioning=(Partition(TICKER), Partition(BARS)),
    )


class Markets:
    """``market.markets``: one row per listed ticker, the Market message's fields; 0 in
    a precision or limit means the exchange did not give one."""

    TICKER: Final = "ticker"
    EXCHANGE: Final = "exchange"
    SYMBOL: Final = "symbol"  # exchange-native id, e.g. BTCUSDT
    BASE: Final = "base"
    QUOTE: Final = "quote"
    ACTIVE: Final = "active"
    PRICE_PRECISION: Final = "price_precision"
    AMOUNT_PRECISION: Final = "amount_precision"
    MIN_AMOUNT: Final = "min_amount"
    MAX_AMOUNT: Final = "max_amount"
    MIN_PRICE: Final = "min_price"
    MAX_PRICE: Final = "max_price"
    MIN_COST: Final = "min_cost"
    UPDATED_AT: Final = "updated_at"

    SCHEMA: Final = TableSchema(
        contracts.ICEBERG_MARKETS,
        columns=(
            Column(TICKER, "string", required=True),
            Column(EXCHANGE, "string"),
            Column(SYMBOL, "string"),
            Column(BASE, "string"),
            Column(QUOTE, "string"),
            Column(ACTIVE, "boolean"),
            Column(PRICE_PRECISION, "double"),
            Column(AMOUNT_PRECISION, "double"),
            Column(MIN_AMOUNT, "double"),
            Column(MAX_AMOUNT, "double"),
            Column(MIN_PRICE, "double"),
            Column(MAX_PRICE, "double"),
            Column(MIN_COST, "double"),
            Column(UPDATED_AT, "timestamptz"),
        ),
        key=(TICKER,),
        partitioning=(Partition(EXCHANGE),),  # a few thousand rows per exchange
    )


class BookSnapshots:
    """``market.book_snapshots``: L2 order books, one per row (the ingestors' periodic
    snapshots and resets); a past book is the newest row at or before its time."""

    TICKER: Final = "ticker"
    EXCHANGE: Final = "exchange"
    SYMBOL: Final = "symbol"
    # The exchange's time of the book, else when the ingestor built it.
    SNAPSHOT_TIME: Final = "snapshot_time"
    EXCHANGE_SEQUENCE: Final = "exchange_sequence"  # 0: the exchange has none
    DEPTH: Final = "depth"  # levels per side the feed keeps
    # BookReset without its prefix: NONE (periodic), START, SEQUENCE_GAP, CHECKSUM, ...
    RESET: Final = "reset"
    BIDS: Final = "bids"
    ASKS: Final = "asks"
    INGESTED_AT: Final = "ingested_at"

    SCHEMA: Final = TableSchema(
        contracts.ICEBERG_BOOK_SNAPSHOTS,
        columns=(
            Column(TICKER, "string", required=True),
            Column(EXCHANGE, "string"),
            Column(SYMBOL, "string"),
            Column(SNAPSHOT_TIME, "timestamptz", required=True),
            Column(EXCHANGE_SEQUENCE, "long", required=True),
            Column(DEPTH, "int"),
            Column(RESET, "string", required=True),
            Column(BIDS, "levels"),
            Column(ASKS, "levels"),
            Column(INGESTED_AT, "timestamptz"),
        ),
        key=(TICKER, SNAPSHOT_TIME, EXCHANGE_SEQUENCE, RESET),
        partitioning=(Partition(TICKER), Partition(SNAPSHOT_TIME, "day")),
    )


class BookDeltas:
    """``market.book_deltas``: every BookDelta record of Kafka ``market.book``, one per row:
    with ``book_snapshots``, the book of any stored instant (docs/protocol.md "Book
    history")."""

    TICKER: Final = "ticker"
    EXCHANGE: Final = "exchange"
    SYMBOL: Final = "symbol"
    # The exchange's time of the change, else the ingestor's (as ``snapshot_time``).
    DELTA_TIME: Final = "delta_time"
    EXCHANGE_SEQUENCE: Final = "exchange_sequence"  # 0: the exchange has none
    EXCHANGE_PREV_SEQUENCE: Final = "exchange_prev_sequence"  # the book's before it; 0: none
    BIDS: Final = "bids"  # changed levels, absolute amounts; 0 removes the level
    ASKS: Final = "asks"
    INGESTED_AT: Final = "ingested_at"
    # Where the record is in Kafka: unique per record, and its order where the
    # exchange gives no sequence.
    KAFKA_PARTITION: Final = "kafka_partition"
    KAFKA_OFFSET: Final = "kafka_offset"

    SCHEMA: Final = TableSchema(
        contracts.ICEBERG_BOOK_DELTAS,
        columns=(
            Column(TICKER, "string", required=True),
            Column(EXCHANGE, "string"),
            Column(SYMBOL, "string"),
            Column(DELTA_TIME, "timestamptz", required=True),
            Column(EXCHANGE_SEQUENCE, "long", required=True),
            Column(EXCHANGE_PREV_SEQUENCE, "long", required=True),
            Column(BIDS, "levels"),
            Column(ASKS, "levels"),
            Column(INGESTED_AT, "timestamptz"),
            Column(KAFKA_PARTITION, "int", required=True),
            Column(KAFKA_OFFSET, "long", required=True),
        ),
        key=(TICKER, DELTA_TIME, KAFKA_PARTITION, KAFKA_OFFSET),
        partitioning=(Partition(TICKER), Partition(DELTA_TIME, "day")),
    )


class Gaps:
    """``market.gaps``: one row per gap of a recorded market's trades (TradeGap.gap_id),
    its latest state; cause and state by their enum names (docs/protocol.md "Recording")."""

    GAP_ID: Final = "gap_id"
    TICKER: Final = "ticker"
    EXCHANGE: Final = "exchange"
    FROM_TRADE_ID: Final = "from_trade_id"
    TO_TRADE_ID: Final = "to_trade_id"
    FROM_TIME: Final = "from_time"
    TO_TIME: Final = "to_time"
    DETECTED_AT: Final = "detected_at"
    CAUSE: Final = "cause"  # SKIPPED_IDS, RECONNECT, RESTART
    STATUS: Final = "status"  # OPEN, REPAIRING, REPAIRED, UNREPAIRABLE
    REASON: Final = "reason"
    TRADES_RECOVERED: Final = "trades_recovered"
    MISSING_IDS: Final = "missing_ids"
    INGESTOR_ID: Final = "ingestor_id"
    UPDATED_AT: Final = "updated_at"

    SCHEMA: Final = TableSchema(
        contracts.ICEBERG_GAPS,
        columns=(
            Column(GAP_ID, "string", required=True),
            Column(TICKER, "string", required=True),
            Column(EXCHANGE, "string"),
            Column(FROM_TRADE_ID, "string"),
            Column(TO_TRADE_ID, "string"),
            Column(FROM_TIME, "timestamptz"),
            Column(TO_TIME, "timestamptz"),
            Column(DETECTED_AT, "timestamptz"),
            Column(CAUSE, "string"),
            Column(STATUS, "string"),
            Column(REASON, "string"),
            Column(TRADES_RECOVERED, "long"),
            Column(MISSING_IDS, "long"),
            Column(INGESTOR_ID, "string"),
            Column(UPDATED_AT, "timestamptz"),
        ),
        key=(GAP_ID,),
        partitioning=(Partition(TICKER),),  # a few rows per market and day
    )


TABLES: Final = (
    Ohlc.SCHEMA,
    Ticks.SCHEMA,
    Requests.SCHEMA,
    Markets.SCHEMA,
    BookSnapshots.SCHEMA,
    BookDeltas.SCHEMA,
    Gaps.SCHEMA,
    TradeBars.SCHEMA,
)


def arrow_schema(table: TableSchema, names: Sequence[str] | None = None) -> pa.Schema:
    """The Arrow layout of ``table``'s rows (of ``names`` only, in that order, if given),
    as Iceberg reads them back: pyarrow is imported here only (``mdproto[arrow]``)."""
    import pyarrow as pa

    types = {
        "string": pa.string(),
        "int": pa.int32(),
        "long": pa.int64(),
        "double": pa.float64(),
        "boolean": pa.bool_(),
        "timestamptz": pa.timestamp("us", tz="UTC"),
        "levels": pa.list_(
            pa.struct([pa.field("price", pa.float64()), pa.field("amount", pa.float64())])
        ),
    }
    columns = table.columns if names is None else tuple(table.column(n) for n in names)
    return pa.schema(pa.field(c.name, types[c.type], nullable=not c.required) for c in columns)
