"""Record decoding: Kafka rows -> candle/tick rows, markers and rejects (no Spark)."""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa

from mdproto import envelope
from mdproto.messages import OHLC, HistorySource, OHLCBatch, Status, Tick
from pipeline import records


def test_request_becomes_candle_rows_and_one_final_marker(build: Any) -> None:
    rows = [build.candle(i) for i in range(2500)]
    values = build.request_records("req-1", rows, per_record=1000)

    batch = records.decode_history(build.kafka_table(values, first_offset=40))

    assert batch.records == 4  # 3 data records + marker
    assert batch.candles.num_rows == 2500
    assert batch.candles.schema == records.OHLC_SCHEMA
    assert batch.candles["incomplete"].null_count == 2500  # a live candle's note only
    assert batch.rejects == []
    first = batch.candles.slice(0, 1).to_pylist()[0]
    assert first["ticker"] == build.TICKER
    assert (first["exchange"], first["symbol"]) == ("BINANCE", "BTC/USDT")
    assert first["period_seconds"] == 60
    assert int(first["open_time"].timestamp() * 1000) == build.T0
    assert (first["open"], first["high"], first["low"], first["close"]) == (100, 110, 90, 105)
    assert (first["volume"], first["trade_count"]) == (1.5, 7)
    assert (first["source"], first["request_id"]) == ("history", "req-1")
    [marker] = batch.finals
    assert (marker.request_id, marker.partition, marker.offset) == ("req-1", 0, 43)
    assert marker.metadata is not None and marker.metadata.total_rows == 2500


def test_an_unreported_trade_count_is_null_and_a_reported_zero_stays_zero(build: Any) -> None:
    unknown = build.candle(0)
    unknown.ClearField("trade_count")  # the exchange did not say
    zero = build.candle(1)
    zero.trade_count = 0  # it said: no trades
    values = build.request_records("req-1", [unknown, zero, build.candle(2)])

    batch = records.decode_history(build.kafka_table(values))

    assert batch.candles.column("trade_count").to_pylist() == [None, 0, 7]


def test_reported_volumes_are_kept_and_unreported_ones_are_null(build: Any) -> None:
    binance = build.candle(0)
    binance.quote_volume, binance.taker_buy_volume, binance.taker_buy_quote_volume = 9.5, 1.0, 6.5
    bybit = build.candle(1)
    bybit.quote_volume = 0.0  # reported, and zero
    coinbase = build.candle(2)
    broken = build.candle(3)
    broken.quote_volume = math.inf
    values = build.request_records("req-1", [binance, bybit, coinbase, broken])

    batch = records.decode_history(build.kafka_table(values))

    rows = batch.candles.select(list(records.OPTIONAL_VOLUMES)).to_pylist()
    assert [tuple(r.values()) for r in rows] == [(9.5, 1.0, 6.5), (0.0, None, None), (None,) * 3]
    assert batch.candles.schema == records.OHLC_SCHEMA
    assert [r.code for r in batch.rejects] == ["bad_row"]  # the non-finite volume


def test_duplicate_delivery_in_one_batch_keeps_one_row_per_key_the_last(build: Any) -> None:
    first = build.request_records("req-1", [build.candle(i) for i in range(3)])
    second = build.request_records("req-1", [build.candle(i, close=1.0) for i in range(3)])

    batch = records.decode_history(build.kafka_table(first + second))

    assert batch.candles.num_rows == 3
    assert batch.duplicate_rows == 3
    assert batch.candles["close"].to_pylist() == [1.0, 1.0, 1.0]  # the later copy wins
    assert [m.request_id for m in batch.finals] == ["req-1", "req-1"]


def test_rows_inherit_ticker_and_period_from_metadata_or_key(build: Any) -> None:
    bare = OHLC(open_time_ms=build.T0, open=1, high=1, low=1, close=1)
    with_meta = OHLCBatch(request_id="r", sequence=0, metadata=build.metadata("r"), rows=[bare])
    key_only = OHLCBatch(request_id="r", sequence=1, rows=[bare])

    batch = records.decode_history(
        build.kafka_table([envelope.encode_record(with_meta), envelope.encode_record(key_only)])
    )

    # The first row gets ticker and period from metadata; the second has a ticker
    # (the Kafka key) but no period anywhere, so it is dropped and reported.
    assert batch.candles["ticker"].to_pylist() == [build.TICKER]
    assert batch.candles["period_seconds"].to_pylist() == [60]
    [reject] = batch.rejects
    assert (reject.offset, reject.code) == (1, "bad_row")


def test_undecodable_records_are_rejected_with_their_coordinates(build: Any) -> None:
    good = build.request_records("ok-1", [build.candle(0)])
    tick_record = envelope.encode_record(Tick(ticker=build.TICKER, trade_id="1"))
    values = [b"\x02garbage", tick_record, None, *good]

    batch = records.decode_history(build.kafka_table(values, partition=2, first_offset=10))

    assert [(r.partition, r.offset, r.code) for r in batch.rejects] == [
        (2, 10, "bad_version"),
        (2, 11, "unexpected_type"),
        (2, 12, "empty_frame"),
    ]
    assert batch.candles.num_rows == 1
    assert [m.request_id for m in batch.finals] == ["ok-1"]


def test_final_markers_alone_are_those_decode_history_finds(build: Any) -> None:
    meta = build.metadata("stored")
    meta.source = HistorySource.SOURCE_STORAGE
    values = [
        *build.request_records("fetched", [build.candle(i) for i in range(3)], per_record=2),
        b"\x02garbage",
        envelope.encode_record(Tick(ticker=build.TICKER, trade_id="1")),
        None,
        *build.request_records("bad id!", [build.candle(0)]),
        envelope.encode_record(OHLCBatch(request_id="stored", is_final=True, metadata=meta)),
        *build.request_records("errored", [], status=Status.ERROR, reason="exchange said 503"),
    ]
    kafka = build.kafka_table(values, partition=3, first_offset=100)

    markers = records.final_markers(
        zip(values, [3] * len(values), range(100, 100 + len(values)), strict=True)
    )

    assert markers == records.decode_history(kafka).finals
    assert [m.request_id for m in markers] == ["fetched", "stored", "errored"]


def test_invalid_request_id_is_rejected(build: Any) -> None:
    values = build.request_records("bad id!", [build.candle(0)])

    batch = records.decode_history(build.kafka_table(values))

    assert batch.candles.num_rows == 0
    assert batch.finals == []
    assert {r.code for r in batch.rejects} == {"bad_request_id"}


def test_rows_iceberg_cannot_hold_are_dropped_not_fatal(build: Any) -> None:
    rows = [
        build.candle(0),
        build.candle(1, open=math.nan),
        build.candle(2, high=math.inf),
        OHLC(ticker=build.TICKER, period_seconds=60, open_time_ms=10**17, open=1),  # year > 9999
        OHLC(ticker=build.TICKER, period_seconds=60, open_time_ms=-60_000, open=1),
        OHLC(ticker="btcusdt", period_seconds=60, open_time_ms=build.T0, open=1),
        OHLC(ticker=build.TICKER, period_seconds=2**31, open_time_ms=build.T0, open=1),
        OHLC(ticker=build.TICKER, period_seconds=60, open_time_ms=build.T0, trade_count=2**63),
        build.candle(3),
    ]
    values = build.request_records("req-1", rows)

    batch = records.decode_history(build.kafka_table(values))

    assert batch.candles.num_rows == 2
    assert batch.candles["open"].to_pylist() == [100.0, 103.0]
    [reject] = batch.rejects
    assert reject.code == "bad_row" and reject.reason.startswith("7 row(s)")
    assert [m.request_id for m in batch.finals] == ["req-1"]


def test_empty_batch_gives_an_empty_typed_table(build: Any) -> None:
    batch = records.decode_history(build.kafka_table([]))

    assert batch.candles.num_rows == 0
    assert batch.candles.schema == records.OHLC_SCHEMA


def test_error_marker_alone_is_a_final_marker_without_rows(build: Any) -> None:
    values = build.request_records("req-e", [], status=3, reason="boom", error_code="exchange_down")

    batch = records.decode_history(build.kafka_table(values))

    assert batch.candles.num_rows == 0
    [marker] = batch.finals
    assert marker.metadata is not None
    assert (marker.metadata.reason, marker.metadata.error_code) == ("boom", "exchange_down")


def test_dedupe_last_keeps_order_and_last_copy() -> None:
    table = pa.table({"k": ["a", "b", "a", "c", "b"], "n": [1, 2, 3, 4, 5], "v": [0, 1, 2, 3, 4]})

    out = records.dedupe_last(table, ["k", "n"])
    assert out.equals(table)  # no duplicate keys: untouched

    out = records.dedupe_last(table, ["k"])
    assert out["v"].to_pylist() == [2, 3, 4]


def test_ticks_decode_validate_and_reject(build: Any) -> None:
    good = build.tick(1, 100.0, build.T0, ingested_at_ms=build.T0 + 5)
    values = [
        envelope.encode_record(good),
        envelope.encode_record(build.tick("", 100.0, build.T0)),
        envelope.encode_record(build.tick(2, -1.0, build.T0)),
        envelope.encode_record(build.tick(3, 100.0, 0)),
        envelope.encode_record(build.tick(4, 100.0, build.T0, ticker="nope")),
        b"\x01\x7f",
    ]

    decoded = records.decode_ticks(build.kafka_table(values))

    assert decoded.ticks == [good]
    assert [r.code for r in decoded.rejects] == ["bad_tick"] * 4 + ["unknown_type"]


def test_kafka_ticks_become_unique_tick_rows(build: Any) -> None:
    first = envelope.encode_record(build.tick(1, 100.0, build.T0, ingested_at_ms=build.T0 + 7))
    values = [
        first,
        envelope.encode_record(build.tick(2, 101.0, build.T0 + 1)),  # no ingested_at: Kafka time
        b"junk",
        first,  # re-delivered
    ]
    kafka = build.kafka_table(values, timestamp_ms=build.T0 + 9)

    out, rejects = records.kafka_ticks_table(kafka)

    assert len(rejects) == 1
    assert out.schema == records.TICK_SCHEMA
    rows = sorted(out.to_pylist(), key=lambda r: r["trade_id"])
    assert [r["trade_id"] for r in rows] == ["1", "2"]
    assert [int(r["ingested_at"].timestamp() * 1000) for r in rows] == [
        build.T0 + 7,
        build.T0 + 9,
    ]
    assert rows[0]["side"] == "BUY" and rows[0]["symbol"] == "BTC/USDT"


def test_kafka_tick_rows_keep_every_copy_and_where_it_came_from(build: Any) -> None:
    """What an executor's task decodes: the copies of a trade meet only after a shuffle,
    where the last in Kafka order wins, so each row keeps its partition and offset."""
    first = envelope.encode_record(build.tick(1, 100.0, build.T0))
    again = envelope.encode_record(build.tick(1, 100.0, build.T0, ingested_at_ms=build.T0 + 5))
    values = [first, b"junk", envelope.encode_record(build.tick(2, 101.0, build.T0)), again]
    kafka = build.kafka_table(values, partition=3, first_offset=40)

    rows, rejects = records.kafka_ticks_rows(kafka)

    assert [(r.partition, r.offset) for r in rejects] == [(3, 41)]
    assert rows.schema == records.TICK_ROWS_SCHEMA
    assert rows.column(records.KAFKA_OFFSET).to_pylist() == [40, 42, 43]
    assert set(rows.column(records.KAFKA_PARTITION).to_pylist()) == {3}
    assert rows.column("trade_id").to_pylist() == ["1", "2", "1"]
    unique, _ = records.kafka_ticks_table(kafka)  # the driver's: the last copy
    last = [r for r in unique.to_pylist() if r["trade_id"] == "1"]
    assert [int(r["ingested_at"].timestamp() * 1000) for r in last] == [build.T0 + 5]


def test_each_record_reports_the_valid_rows_it_brought(build: Any) -> None:
    rows = [build.candle(i) for i in range(5)]
    rows[3] = build.candle(3, open=math.nan)
    values = build.request_records("req-1", rows, per_record=2)

    batch = records.decode_history(build.kafka_table(values))

    # sequence 1 lost its NaN row; the bare final marker (sequence 3) is not a data record
    assert batch.accepted == [("req-1", 0, 2), ("req-1", 1, 1), ("req-1", 2, 1)]
