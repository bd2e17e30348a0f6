"""Market metadata rows: decoding (pure) and the MERGE text; the stack test is in
test_stack_pipeline.py."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from mdproto import envelope
from mdproto.messages import Market
from pipeline import lake
from pipeline.lake import TableNames
from pipeline.markets import MARKETS_SCHEMA, decode_markets


def market(ticker: str, updated_at_ms: int, **fields: Any) -> bytes:
    exchange, _, symbol = ticker.partition(":")
    return envelope.encode_record(
        Market(
            ticker=ticker,
            exchange=exchange,
            symbol=symbol.replace("/", ""),
            active=True,
            updated_at_ms=updated_at_ms,
            **fields,
        )
    )


def kafka(build: Any, *records: tuple[str, bytes | None]) -> pa.Table:
    return pa.concat_tables(
        build.kafka_table([value], key=key.encode(), first_offset=i)
        for i, (key, value) in enumerate(records)
    )


def test_the_last_record_per_ticker_wins_and_tombstones_delete(build: Any) -> None:
    batch = decode_markets(
        kafka(
            build,
            ("BINANCE:BTC/USDT", market("BINANCE:BTC/USDT", 1_000, min_amount=0.1)),
            ("BINANCE:ETH/USDT", market("BINANCE:ETH/USDT", 1_000)),
            ("BINANCE:BTC/USDT", market("BINANCE:BTC/USDT", 2_000, min_amount=0.2)),
            ("BINANCE:ETH/USDT", None),
            ("BINANCE:X/Y", b"\x01\x7fjunk"),
            ("lower:case", market("lower:case", 1)),
        )
    )
    assert batch.rows.schema == MARKETS_SCHEMA
    rows = batch.rows.to_pylist()
    assert [(r["ticker"], r["min_amount"], r["symbol"]) for r in rows] == [
        ("BINANCE:BTC/USDT", 0.2, "BTCUSDT")
    ]
    assert rows[0]["updated_at"].timestamp() == 2.0
    assert batch.deleted == ["BINANCE:ETH/USDT"]
    assert [(r.offset, r.code) for r in batch.rejects] == [(4, "unknown_type"), (5, "bad_ticker")]


def test_an_empty_batch_has_the_table_schema(build: Any) -> None:
    batch = decode_markets(kafka(build, ("BINANCE:A/B", None)))
    assert batch.rows.num_rows == 0 and batch.rows.schema == MARKETS_SCHEMA
    assert batch.deleted == ["BINANCE:A/B"]


def test_table_columns_and_merge_follow_the_schema() -> None:
    names = TableNames("lake", "market")
    assert names.markets == "lake.market.markets"
    assert tuple(MARKETS_SCHEMA.names) == lake.MARKET_COLUMNS
    ddl = lake.create_markets(names)
    assert "PARTITIONED BY (exchange)" in ddl and "ticker STRING NOT NULL" in ddl
    merge = lake.merge_markets(names.markets, "src")
    assert "ON t.ticker = s.ticker" in merge
    assert "WHEN MATCHED AND s.deleted THEN DELETE" in merge
    assert "s.updated_at > t.updated_at" in merge  # a replayed (equal) record changes nothing
    assert "WHEN NOT MATCHED AND NOT s.deleted THEN INSERT" in merge
