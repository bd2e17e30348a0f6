"""Pure parts of the live path: closed candle records -> Iceberg rows; re-delivery filter."""

from __future__ import annotations

from typing import Any

from mdproto import envelope
from mdproto.messages import OHLC
from pipeline import live, live_engine, records


def _closed(
    build: Any, period: int, close: float, *, correction: bool = False, incomplete: bool = False
) -> bytes:
    return envelope.encode_record(
        OHLC(
            ticker=build.TICKER,
            period_seconds=period,
            open_time_ms=build.T0,
            open=1.0,
            high=3.0,
            low=0.5,
            close=close,
            volume=10.0,
            trade_count=4,
            closed=True,
            correction=correction,
            incomplete=incomplete,
        )
    )


def test_closed_candle_records_become_live_ohlc_rows_the_last_copy_winning(build: Any) -> None:
    values = [
        _closed(build, 60, 2.0),
        _closed(build, 300, 2.5, incomplete=True),  # built across a feed gap
        b"junk",
        _closed(build, 60, 2.2, correction=True),  # a late trade amended the 1-minute candle
    ]
    rows, rejects = records.decode_live_candles(build.kafka_table(values))

    assert len(rejects) == 1
    assert rows.num_rows == 2
    by_period = {r["period_seconds"]: r for r in rows.to_pylist()}
    assert by_period[60]["close"] == 2.2 and by_period[60]["correction"]
    assert by_period[300]["close"] == 2.5 and by_period[300]["incomplete"]
    assert by_period[60]["incomplete"] is False
    assert (by_period[60]["exchange"], by_period[60]["symbol"]) == ("BINANCE", "BTC/USDT")

    table = live.live_ohlc_rows(rows)

    assert table.schema == records.OHLC_SCHEMA
    assert table["source"].to_pylist() == ["live", "live"]
    assert table["request_id"].to_pylist() == [None, None]
    flags = table.select(["period_seconds", "incomplete"]).to_pylist()
    stored = {r["period_seconds"]: r["incomplete"] for r in flags}
    assert stored == {60: False, 300: True}  # the note is stored with the candle
    assert table["open_time"].to_pylist()[0].timestamp() * 1000 == build.T0


def test_recent_keys_drop_redeliveries_within_capacity() -> None:
    recent = live_engine.RecentKeys(capacity=2)
    assert recent.first_time(("T", "1"))
    assert not recent.first_time(("T", "1"))
    assert recent.first_time(("T", "2"))
    assert recent.first_time(("U", "1"))  # evicts ("T", "1")
    assert recent.first_time(("T", "1"))
