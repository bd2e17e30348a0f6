"""The gaps table: TradeGap records -> the newest state per gap_id (pure), the table's DDL
and MERGE text. The stack test is test_stack_gaps.py."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from mdproto import envelope
from mdproto.messages import Tick, TradeGap
from mdproto.tables import Gaps
from pipeline import lake
from pipeline.gaps import GAPS_SCHEMA, Gap, decode_gaps
from pipeline.lake import TableNames

TICKER = "BINANCE:BTC/USDT"
GAP_ID = f"{TICKER}|100|110"


def gap(state: int, updated_at_ms: int, *, gap_id: str = GAP_ID, **fields: Any) -> TradeGap:
    values: dict[str, Any] = {
        "gap_id": gap_id,
        "ticker": TICKER,
        "from_trade_id": "100",
        "to_trade_id": "110",
        "from_time_ms": 1_700_000_000_000,
        "to_time_ms": 1_700_000_090_000,
        "detected_at_ms": 1_700_000_091_000,
        "cause": TradeGap.SKIPPED_IDS,
        "missing_ids": 9,
        "ingestor_id": "ingestor-a",
        "state": state,
        "updated_at_ms": updated_at_ms,
    }
    values.update(fields)
    return TradeGap(**values)


def kafka(*values: bytes | None) -> pa.Table:
    """What the gaps query hands the decoder: value, partition, offset (gap keys only)."""
    return pa.table(
        {
            "value": pa.array(values, pa.binary()),
            "partition": pa.array([2] * len(values), pa.int32()),
            "offset": pa.array(range(len(values)), pa.int64()),
        }
    )


def encode(*messages: TradeGap | Tick) -> list[bytes]:
    return [envelope.encode_record(m) for m in messages]


def test_the_newest_record_per_gap_id_is_its_row() -> None:
    other = f"{TICKER}|200|205"
    batch = decode_gaps(
        kafka(
            *encode(
                gap(TradeGap.OPEN, 1_000),
                gap(TradeGap.OPEN, 1_000, gap_id=other, cause=TradeGap.RECONNECT),
                gap(TradeGap.REPAIRING, 2_000, reason="paging BINANCE by id"),
                gap(TradeGap.REPAIRED, 3_000, trades_recovered=9, reason="9 trades recovered"),
                gap(TradeGap.REPAIRING, 2_500),  # older than REPAIRED, later in Kafka: loses
                gap(TradeGap.UNREPAIRABLE, 1_500, gap_id=other, cause=TradeGap.RECONNECT),
            )
        )
    )
    assert batch.rejects == []
    assert batch.rows.schema == GAPS_SCHEMA
    rows = {r["gap_id"]: r for r in batch.rows.to_pylist()}
    assert set(rows) == {GAP_ID, other}
    repaired = rows[GAP_ID]
    assert (repaired["status"], repaired["cause"]) == ("REPAIRED", "SKIPPED_IDS")
    assert (repaired["ticker"], repaired["exchange"]) == (TICKER, "BINANCE")
    assert (repaired["from_trade_id"], repaired["to_trade_id"]) == ("100", "110")
    assert (repaired["trades_recovered"], repaired["missing_ids"]) == (9, 9)
    assert (repaired["reason"], repaired["ingestor_id"]) == ("9 trades recovered", "ingestor-a")
    assert repaired["from_time"].timestamp() == 1_700_000_000
    assert repaired["to_time"].timestamp() == 1_700_000_090
    assert repaired["detected_at"].timestamp() == 1_700_000_091
    assert repaired["updated_at"].timestamp() == 3.0
    assert (rows[other]["status"], rows[other]["cause"]) == ("UNREPAIRABLE", "RECONNECT")
    assert batch.repaired == [
        Gap(GAP_ID, TICKER, "100", "110", 1_700_000_000_000, 1_700_000_090_000, 9, 3_000)
    ]


def test_equal_times_keep_the_later_record_and_unknown_values_read_null() -> None:
    batch = decode_gaps(
        kafka(
            *encode(
                gap(TradeGap.OPEN, 5_000),
                gap(TradeGap.REPAIRING, 5_000, cause=0, from_time_ms=0, detected_at_ms=0),
            )
        )
    )
    [row] = batch.rows.to_pylist()
    assert row["status"] == "REPAIRING"
    assert (row["cause"], row["from_time"], row["detected_at"]) == (None, None, None)
    assert batch.repaired == []


def test_tombstones_are_skipped_and_bad_records_rejected() -> None:
    values = [
        None,  # compaction of a finished gap: the table keeps it
        b"\x01\x7fjunk",
        *encode(
            Tick(ticker=TICKER, trade_id="1"),
            gap(TradeGap.OPEN, 1, gap_id=""),
            gap(TradeGap.OPEN, 1, ticker="btc"),
            gap(TradeGap.STATE_UNSPECIFIED, 1),
        ),
    ]
    batch = decode_gaps(kafka(*values))
    assert batch.rows.num_rows == 0 and batch.rows.schema == GAPS_SCHEMA
    assert [(r.offset, r.code) for r in batch.rejects] == [
        (1, "unknown_type"),
        (2, "unexpected_type"),
        (3, "missing_id"),
        (4, "bad_ticker"),
        (5, "bad_row"),
    ]


def test_a_repaired_gap_without_both_ends_cannot_be_rebuilt() -> None:
    whole = Gap(GAP_ID, TICKER, "100", "110", 1_000, 2_000, 3, 9)
    assert whole.problem() == ""
    assert Gap(GAP_ID, TICKER, "100", "", 1_000, 2_000, 3, 9).problem() == "no to_trade_id"
    assert "not a range" in Gap(GAP_ID, TICKER, "100", "110", 0, 2_000, 3, 9).problem()
    assert "not a range" in Gap(GAP_ID, TICKER, "100", "110", 3_000, 2_000, 3, 9).problem()


def test_table_ddl_and_merge_follow_the_schema() -> None:
    names = TableNames("lake", "market")
    assert names.gaps == "lake.market.gaps"
    assert lake.pipeline_tables(names)[names.gaps] is Gaps.SCHEMA
    ddl = lake.create_gaps(names)
    assert "PARTITIONED BY (ticker)" in ddl and "gap_id STRING NOT NULL" in ddl
    merge = lake.merge_gaps(names.gaps, "src")
    assert "ON t.ticker = s.ticker AND t.gap_id = s.gap_id" in merge
    assert "s.updated_at > t.updated_at" in merge  # a replayed (equal) record changes nothing
    assert "WHEN NOT MATCHED THEN INSERT *" in merge
    assert "DELETE" not in merge
