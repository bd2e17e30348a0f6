"""OHLCBatch record layout of one request (docs/protocol.md)."""

from __future__ import annotations

import pytest

from ingestor.candles import BatchBuilder, metadata_for
from ingestor.model import Candle
from mdproto.messages import DataRequest, OHLCBatch, Status

REQUEST = DataRequest(
    request_id="req-1",
    client_id="cli",
    kind=DataRequest.HISTORICAL,
    ticker="BINANCE:BTC/USDT",
    period_seconds=60,
    start_time_ms=0,
    end_time_ms=600_000,
    notification_topic="RESPONSE:cli",
    submitted_at_ms=123,
)


def candles(n: int) -> list[Candle]:
    return [Candle(i * 60_000, 1.0 + i, 2.0 + i, 0.5, 1.5, 10.0 * i, i) for i in range(n)]


def build(n: int, batch_size: int, chunk: int = 3) -> tuple[list[OHLCBatch], OHLCBatch]:
    builder = BatchBuilder(metadata_for(REQUEST, "ing-1"), batch_size)
    records: list[OHLCBatch] = []
    rows = candles(n)
    for i in range(0, n, chunk):
        records += builder.add(rows[i : i + chunk])
    records += builder.flush()
    return records, builder.final(expected_gaps=2)


def test_sequence_zero_carries_metadata_and_first_rows() -> None:
    records, _final = build(10, 4)
    assert [r.sequence for r in records] == [0, 1, 2]
    assert [len(r.rows) for r in records] == [4, 4, 2]
    assert records[0].HasField("metadata")
    meta = records[0].metadata
    assert (meta.request_id, meta.client_id, meta.ticker, meta.ingestor_id) == (
        "req-1",
        "cli",
        "BINANCE:BTC/USDT",
        "ing-1",
    )
    assert meta.notification_topic == "RESPONSE:cli"
    assert meta.submitted_at_ms == 123
    assert not records[1].HasField("metadata")
    assert all(r.request_id == "req-1" and not r.is_final for r in records)


def test_rows_keep_every_value_in_order() -> None:
    records, _ = build(10, 4)
    rows = [row for r in records for row in r.rows]
    assert [r.open_time_ms for r in rows] == [i * 60_000 for i in range(10)]
    row = rows[3]
    assert (row.ticker, row.period_seconds, row.open, row.high, row.low, row.close) == (
        "BINANCE:BTC/USDT",
        60,
        4.0,
        5.0,
        0.5,
        1.5,
    )
    assert (row.volume, row.trade_count, row.closed) == (30.0, 3, True)


def test_final_marker_totals() -> None:
    _records, final = build(10, 4)
    assert final.is_final and len(final.rows) == 0
    assert final.sequence == 3 == final.metadata.total_batches
    meta = final.metadata
    assert (meta.status, meta.total_rows, meta.expected_gaps) == (Status.OK, 10, 2)
    assert meta.request_id == "req-1" and meta.ticker == "BINANCE:BTC/USDT"


def test_exact_multiple_of_batch_size_has_no_empty_record() -> None:
    records, final = build(8, 4, chunk=8)
    assert [len(r.rows) for r in records] == [4, 4]
    assert final.sequence == 2


def test_no_candles_is_a_lone_not_found_marker() -> None:
    records, final = build(0, 4)
    assert records == []
    assert final.sequence == 0 and final.is_final
    assert final.metadata.status == Status.NOT_FOUND
    assert final.metadata.total_rows == 0 and final.metadata.total_batches == 0


def test_failure_marker_follows_written_records_and_drops_queued_rows() -> None:
    builder = BatchBuilder(metadata_for(REQUEST, "ing-1"), 4)
    written = builder.add(candles(6))  # one full record, two rows queued
    marker = builder.fail("exchange said no", "bad_symbol")
    assert len(written) == 1
    assert marker.sequence == 1 and marker.is_final
    meta = marker.metadata
    assert (meta.status, meta.reason, meta.error_code) == (
        Status.ERROR,
        "exchange said no",
        "bad_symbol",
    )
    assert (meta.total_rows, meta.total_batches) == (4, 1)


def test_final_requires_flush_and_nothing_after_final() -> None:
    builder = BatchBuilder(metadata_for(REQUEST, "ing-1"), 4)
    builder.add(candles(2))
    with pytest.raises(RuntimeError, match="flush"):
        builder.final(0)
    builder.flush()
    builder.final(0)
    with pytest.raises(RuntimeError, match="final marker"):
        builder.add(candles(1))


def test_batch_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        BatchBuilder(metadata_for(REQUEST, "x"), 0)


def test_reported_extras_are_set_and_unreported_ones_stay_unset() -> None:
    from ingestor.candles import ohlc_row

    reported = Candle(0, 1.0, 2.0, 0.5, 1.5, 3.0, 0, 4.5, 1.0, 1.5)
    unknown = Candle(60_000, 1.0, 2.0, 0.5, 1.5, 3.0)
    builder = BatchBuilder(metadata_for(REQUEST, "ing"), 10)
    [record] = builder.add([reported, unknown]) + builder.flush()
    legacy = [ohlc_row("T", 60, reported), ohlc_row("T", 60, unknown)]
    for first, second in (record.rows, legacy):
        assert first.HasField("trade_count") and first.trade_count == 0  # a real zero
        assert (first.quote_volume, first.taker_buy_volume, first.taker_buy_quote_volume) == (
            4.5,
            1.0,
            1.5,
        )
        assert not any(
            second.HasField(f)
            for f in ("trade_count", "quote_volume", "taker_buy_volume", "taker_buy_quote_volume")
        )
