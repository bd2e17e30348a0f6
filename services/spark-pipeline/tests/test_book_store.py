"""book-store without Spark: market.book records -> book_snapshots and book_deltas rows,
and the tables' SQL."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from mdproto import envelope
from mdproto.book import levels_message
from mdproto.messages import BookDelta, BookReset, BookSnapshot, Tick
from mdproto.tables import arrow_schema
from pipeline import executor_writes, lake, records
from pipeline.lake import TableNames
from pipeline.records import BOOK_DELTA_SCHEMA, BOOK_SNAPSHOT_SCHEMA, decode_book

NAMES = TableNames("lake", "market")
T = "OKX:BTC/USDT"


def book(**kw: Any) -> BookSnapshot:
    values: dict[str, Any] = {
        "ticker": T,
        "bids": levels_message([(100.0, 1.0), (99.0, 2.0)]),
        "asks": levels_message([(101.0, 3.0)]),
        "depth": 400,
        "exchange_sequence": 77,
        "exchange_time_ms": 1_700_000_000_123,
        "ingested_at_ms": 1_700_000_000_200,
    }
    values.update(kw)
    return BookSnapshot(**values)


def test_snapshots_and_deltas_become_rows_of_their_tables(build: Any) -> None:
    values = [
        envelope.encode_record(book(reset=BookReset.BOOK_RESET_START, reason="feed started")),
        envelope.encode_record(BookDelta(ticker=T, bids=levels_message([(100.0, 0.0)]))),
        envelope.encode_record(book(exchange_time_ms=0, exchange_sequence=78)),  # ingestor time
        envelope.encode_record(book(exchange_time_ms=0, ingested_at_ms=0, exchange_sequence=79)),
        envelope.encode_record(book(reset=BookReset.BOOK_RESET_START, reason="feed started")),
        envelope.encode_record(Tick(ticker=T, trade_id="1")),
        envelope.encode_record(book(ticker="not a ticker")),
        b"\x00junk",
    ]
    decoded = decode_book(build.kafka_table(values, timestamp_ms=1_600_000_000_000))
    rows, rejects = decoded.snapshots, decoded.rejects
    assert rows.schema == BOOK_SNAPSHOT_SCHEMA
    got = sorted(rows.to_pylist(), key=lambda r: r["exchange_sequence"])
    # The START snapshot delivered twice is one row.
    assert [(r["reset"], r["exchange_sequence"]) for r in got] == [
        ("START", 77),
        ("NONE", 78),
        ("NONE", 79),
    ]
    first = got[0]
    assert (first["exchange"], first["symbol"], first["depth"]) == ("OKX", "BTC/USDT", 400)
    assert first["snapshot_time"].timestamp() == 1_700_000_000.123
    assert first["bids"] == [{"price": 100.0, "amount": 1.0}, {"price": 99.0, "amount": 2.0}]
    assert first["asks"] == [{"price": 101.0, "amount": 3.0}]
    assert got[1]["snapshot_time"].timestamp() == 1_700_000_000.2  # the ingestor's time
    assert got[2]["snapshot_time"].timestamp() == 1_600_000_000.0  # else Kafka's
    assert sorted(r.code for r in rejects) == ["bad_book", "bad_book", "bad_version"]
    assert decoded.deltas.schema == BOOK_DELTA_SCHEMA
    (delta,) = decoded.deltas.to_pylist()
    assert delta["bids"] == [{"price": 100.0, "amount": 0.0}]  # amount 0: removes the level
    assert delta["delta_time"].timestamp() == 1_600_000_000.0  # no exchange/ingestor time
    assert (delta["kafka_partition"], delta["kafka_offset"]) == (0, 1)


def test_deltas_keep_their_sequences_and_kafka_place_and_a_replay_is_one_row(build: Any) -> None:
    delta = BookDelta(
        ticker=T,
        asks=levels_message([(101.0, 2.5)]),
        exchange_sequence=80,
        exchange_prev_sequence=79,
        exchange_time_ms=1_700_000_000_300,
        ingested_at_ms=1_700_000_000_310,
    )
    table = build.kafka_table([envelope.encode_record(delta)] * 2, timestamp_ms=1)
    twice = pa.concat_tables([table, table])  # the same records read again
    rows = decode_book(twice).deltas.to_pylist()
    assert [
        (r["kafka_offset"], r["exchange_sequence"], r["exchange_prev_sequence"]) for r in rows
    ] == [
        (0, 80, 79),
        (1, 80, 79),  # another record at another offset: its own row
    ]
    assert rows[0]["delta_time"].timestamp() == 1_700_000_000.3
    assert rows[0]["ingested_at"].timestamp() == 1_700_000_000.31
    assert rows[0]["asks"] == [{"price": 101.0, "amount": 2.5}]


@pytest.mark.parametrize(
    ("ddl", "schema", "merge", "time", "key"),
    [
        (
            lake.create_book_snapshots(NAMES),
            BOOK_SNAPSHOT_SCHEMA,
            lake.merge_book_snapshots(NAMES.book_snapshots, "src", 1_000, 2_000),
            "snapshot_time",
            "t.exchange_sequence = s.exchange_sequence AND t.reset = s.reset",
        ),
        (
            lake.create_book_deltas(NAMES),
            BOOK_DELTA_SCHEMA,
            lake.merge_book_deltas(NAMES.book_deltas, "src", 1_000, 2_000),
            "delta_time",
            "t.kafka_partition = s.kafka_partition AND t.kafka_offset = s.kafka_offset",
        ),
    ],
    ids=["book_snapshots", "book_deltas"],
)
def test_each_book_table_lists_its_row_columns_partitions_by_ticker_and_day_and_merges_new_keys(
    ddl: str, schema: pa.Schema, merge: str, time: str, key: str
) -> None:
    body = ddl[ddl.index("(") + 1 : ddl.index(")\nUSING")]
    assert [line.split()[0] for line in body.splitlines() if line.strip()] == schema.names
    assert f"PARTITIONED BY (ticker, days({time}))" in ddl
    assert "bids ARRAY<STRUCT<price: DOUBLE, amount: DOUBLE>>" in ddl
    assert ddl in lake.ddl(NAMES)
    table = ddl.split()[5]  # CREATE TABLE IF NOT EXISTS <name>
    assert merge.startswith(f"MERGE INTO {table} t")
    assert key in merge
    assert f"t.{time} >= TIMESTAMP '1970-01-01 00:00:01.000000+00:00'" in merge
    assert f"t.{time} <= TIMESTAMP '1970-01-01 00:00:02.000000+00:00'" in merge
    assert merge.endswith("WHEN NOT MATCHED THEN INSERT *")


def test_the_executors_decode_both_kinds_in_one_pass_and_split_them_as_the_driver_does(
    build: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """What a task of a large book-store batch runs (`executor_writes.BOOKS`): every copy
    kept with its Kafka place, rejects logged by the worker; the split and the last copy
    per key then give the driver's rows (`decode_book`)."""
    start = envelope.encode_record(book(reset=BookReset.BOOK_RESET_START, ingested_at_ms=1))
    again = envelope.encode_record(book(reset=BookReset.BOOK_RESET_START, ingested_at_ms=2))
    change = BookDelta(ticker=T, bids=levels_message([(100.0, 0.0)]), exchange_prev_sequence=77)
    values = [
        start,
        envelope.encode_record(change),
        b"\x00junk",
        envelope.encode_record(book(exchange_sequence=78)),
        again,  # the same snapshot delivered again: the later copy wins
        envelope.encode_record(change),  # another record: another delta
    ]
    kafka = build.kafka_table(values, partition=2, first_offset=10, timestamp_ms=1_600_000_000_000)
    task = kafka.to_batches(max_chunksize=4)  # a task's input, in record batches

    with caplog.at_level("ERROR"):
        out = executor_writes.decode_partition(
            task, executor_writes.BOOKS.decode, executor_writes.BOOKS.context
        )
        rows = pa.Table.from_batches(list(out), schema=records.BOOK_ROWS_SCHEMA)

    assert "book-store on an executor: dropped partition 2 offset 12" in caplog.text
    assert rows.column(records.KAFKA_OFFSET).to_pylist() == [10, 11, 13, 14, 15]
    assert rows.column(records.BOOK_IS_DELTA).to_pylist() == [False, True, False, False, True]
    driver = decode_book(kafka)
    snapshots = records.book_part(rows, records.BOOK_SNAPSHOTS)
    assert snapshots.num_rows == 3  # copies kept: the shuffle's window picks the last
    assert records.dedupe_last(snapshots, records.BOOK_SNAPSHOT_KEY).equals(driver.snapshots)
    assert records.book_part(rows, records.BOOK_DELTAS).equals(driver.deltas)
    (kept,) = [r for r in driver.snapshots.to_pylist() if r["reset"] == "START"]
    assert int(kept["ingested_at"].timestamp() * 1000) == 2


@pytest.mark.parametrize("part", [records.BOOK_SNAPSHOTS, records.BOOK_DELTAS])
def test_a_book_table_is_its_columns_of_the_decoded_rows_renamed_and_required_stays_non_null(
    part: records.BookPart,
) -> None:
    """On the executors the split is a filter, a rename and a select (no cast): each
    table's fields, nullability included, must be the decoded rows' (Spark's Iceberg
    writer refuses a nullable column for a required one)."""
    fields = [
        records.BOOK_ROWS_SCHEMA.field(records.BOOK_TIME if n == part.time_column else n)
        for n in part.table.names
    ]
    assert pa.schema(f.with_name(n) for f, n in zip(fields, part.table.names, strict=True)) == (
        arrow_schema(part.table)
    )
    assert [f.nullable for f in fields] == [not c.required for c in part.table.columns]


def test_only_a_snapshot_key_can_repeat_within_a_batch() -> None:
    """A delta's key holds its Kafka place (one record, one row): no window for it."""
    assert executor_writes.copies_possible(records.BOOK_SNAPSHOT_KEY)
    assert executor_writes.copies_possible(records.TICK_KEY)
    assert not executor_writes.copies_possible(records.BOOK_DELTA_KEY)


@pytest.mark.parametrize(("shared", "expected"), [(None, 1_000_000), (5_000, 5_000)])
def test_a_book_store_batch_holds_at_most_its_cap(
    monkeypatch: pytest.MonkeyPatch, shared: int | None, expected: int
) -> None:
    """A backlog of books is stored in batches of at most `live.book_store_max_records`
    (a 2,000,000-record batch ran the executors out of heap), or the lower
    `live.max_offsets_per_trigger`; the other queries keep the latter alone."""
    from pipeline import live
    from pipeline.config import Settings

    asked: dict[str, int | None] = {}
    monkeypatch.setattr(
        live, "kafka_source", lambda _spark, _s, topic, most: asked.setdefault(topic, most)
    )
    monkeypatch.setattr(live, "start_query", lambda *_a, **_kw: None)
    settings = Settings.model_validate({"live": {"max_offsets_per_trigger": shared}})
    nothing: Any = None  # Spark and the lake: not reached with start_query replaced
    queries = live.starters(nothing, settings, nothing)
    queries["book-store"]()
    queries["ticks-persist"]()
    assert asked[settings.kafka.topic_book] == expected
    assert asked[settings.kafka.topic_ticks] == shared
