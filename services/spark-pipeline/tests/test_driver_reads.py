"""The driver reads' pure parts: the timestamp values their Iceberg expressions carry, and
the rows of a batch whose key is not stored yet."""

from __future__ import annotations

import pyarrow as pa

from mdproto.tables import BookDeltas
from pipeline.driver_reads import timestamp_value, unstored
from pipeline.records import BOOK_DELTA_SCHEMA


def test_timestamps_are_iso_strings_exact_to_the_microsecond_at_any_time() -> None:
    # An int below 2**31 would reach Java as an Integer, which Iceberg will not bind.
    assert timestamp_value(60_000_000) == "1970-01-01T00:01:00.000000+00:00"
    assert timestamp_value(0) == "1970-01-01T00:00:00.000000+00:00"
    assert timestamp_value(1_795_132_800_000_001) == "2026-11-20T00:00:00.000001+00:00"
    assert timestamp_value(-1) == "1969-12-31T23:59:59.999999+00:00"


def test_unstored_keeps_the_rows_whose_key_is_new_in_their_order() -> None:
    """Book deltas: a list-of-struct payload (Arrow's join carries none), a timestamp in
    the key, and stored keys as pyiceberg returns them (large strings, nullable)."""
    rows = pa.Table.from_pylist(
        [
            {BookDeltas.TICKER: t, BookDeltas.DELTA_TIME: us, BookDeltas.KAFKA_PARTITION: 0,
             BookDeltas.KAFKA_OFFSET: offset, BookDeltas.EXCHANGE_SEQUENCE: offset,
             BookDeltas.EXCHANGE_PREV_SEQUENCE: offset - 1,
             BookDeltas.BIDS: [{"price": 1.0, "amount": float(offset)}]}
            for t, us, offset in [("B", 3, 12), ("A", 1, 10), ("A", 2, 11), ("B", 4, 13)]
        ],
        schema=BOOK_DELTA_SCHEMA,
    )  # fmt: skip
    key = BookDeltas.SCHEMA.key
    stored = pa.table(
        {
            BookDeltas.TICKER: pa.array(["A", "B"], pa.large_string()),
            BookDeltas.DELTA_TIME: pa.array([1, 4], pa.timestamp("us", "UTC")),
            BookDeltas.KAFKA_PARTITION: pa.array([0, 0], pa.int32()),
            BookDeltas.KAFKA_OFFSET: pa.array([10, 13], pa.int64()),
        }
    )
    new = unstored(rows, key, stored)
    assert new.schema == rows.schema
    assert new[BookDeltas.KAFKA_OFFSET].to_pylist() == [12, 11]  # the rows' own order
    amounts = [[level["amount"] for level in bids] for bids in new[BookDeltas.BIDS].to_pylist()]
    assert amounts == [[12.0], [11.0]]  # the payload came along
    assert unstored(rows, key, stored.slice(0, 0)).equals(rows)  # nothing stored


def test_a_probe_of_thousands_of_tickers_and_windows_builds_and_finds_exactly_its_rows() -> None:
    """A live batch closing 5,000 tickers' candles, and as many distinct windows: a term
    per ticker chained by pyiceberg's Or raised RecursionError from ~500."""
    from pyiceberg.expressions.visitors import expression_evaluator
    from pyiceberg.schema import Schema
    from pyiceberg.typedef import Record
    from pyiceberg.types import IntegerType, NestedField, StringType, TimestamptzType

    from mdproto.tables import Ohlc
    from pipeline.driver_reads import candle_filter

    minute = 60_000
    shared = [(f"X:T{i}/USD", 60, 10 * minute, 10 * minute) for i in range(5_000)]
    distinct = [(f"Y:T{i}/USD", 60, i * minute, i * minute) for i in range(2_000)]
    schema = Schema(  # the columns the probe reads, typed as in `ohlc`
        NestedField(1, Ohlc.TICKER, StringType(), required=True),
        NestedField(2, Ohlc.PERIOD_SECONDS, IntegerType(), required=True),
        NestedField(3, Ohlc.OPEN_TIME, TimestamptzType(), required=True),
    )
    matches = expression_evaluator(schema, candle_filter(shared + distinct), case_sensitive=True)

    def row(ticker: str, period: int, open_ms: int) -> Record:
        return Record(ticker, period, open_ms * 1000)

    assert matches(row("X:T4999/USD", 60, 10 * minute))
    assert matches(row("Y:T1999/USD", 60, 1999 * minute))
    assert not matches(row("X:T4999/USD", 60, 11 * minute))  # outside its window
    assert not matches(row("Y:T5/USD", 60, 6 * minute))  # another ticker's window
    assert not matches(row("X:T1/USD", 300, 10 * minute))  # another period
