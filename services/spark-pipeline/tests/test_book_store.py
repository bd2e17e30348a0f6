"""book-store without Spark: market.book records -> book_snapshots rows, and the table's SQL."""

from __future__ import annotations

from typing import Any

from mdproto import envelope
from mdproto.book import levels_message
from mdproto.messages import BookDelta, BookReset, BookSnapshot, Tick
from pipeline import lake
from pipeline.lake import TableNames
from pipeline.records import BOOK_SNAPSHOT_SCHEMA, decode_book_snapshots

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


def test_snapshots_become_rows_and_deltas_are_skipped(build: Any) -> None:
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
    rows, rejects = decode_book_snapshots(build.kafka_table(values, timestamp_ms=1_600_000_000_000))
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


def test_the_table_lists_the_row_columns_in_order_and_partitions_by_ticker_and_day() -> None:
    ddl = lake.create_book_snapshots(NAMES)
    body = ddl[ddl.index("(") + 1 : ddl.index(")\nUSING")]
    assert [line.split()[0] for line in body.splitlines() if line.strip()] == (
        BOOK_SNAPSHOT_SCHEMA.names
    )
    assert "PARTITIONED BY (ticker, days(snapshot_time))" in ddl
    assert "bids ARRAY<STRUCT<price: DOUBLE, amount: DOUBLE>>" in ddl
    assert ddl in lake.ddl(NAMES)
    merge = lake.merge_book_snapshots(NAMES.book_snapshots, "src", 1_000, 2_000)
    assert merge.startswith("MERGE INTO lake.market.book_snapshots t")
    assert "t.exchange_sequence = s.exchange_sequence AND t.reset = s.reset" in merge
    assert "t.snapshot_time >= TIMESTAMP '1970-01-01 00:00:01.000000+00:00'" in merge
    assert merge.endswith("WHEN NOT MATCHED THEN INSERT *")
