"""Pure parts of the live path: candle rows -> OHLC messages and Iceberg rows."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from mdproto.messages import OHLC
from pipeline import live, records, tick_publisher


def _candle_rows(build: Any) -> pa.Table:
    t = datetime.fromtimestamp(build.T0 / 1000, tz=UTC)
    rows = pa.table(
        {
            "ticker": [build.TICKER, build.TICKER],
            "exchange": ["BINANCE", "BINANCE"],
            "symbol": ["BTC/USDT", "BTC/USDT"],
            "period_seconds": pa.array([60, 300], pa.int32()),
            "open_time": pa.array([t, t], records.UTC_US),
            "open": [1.0, 1.0],
            "high": [3.0, 4.0],
            "low": [0.5, 0.5],
            "close": [2.0, 3.0],
            "volume": [10.0, 12.0],
            "trade_count": pa.array([4, 5], pa.int64()),
        }
    )
    return live._with_open_time_ms(rows)


def test_candle_rows_become_ohlc_messages_on_period_topics(build: Any) -> None:
    out = live.ohlc_messages(_candle_rows(build), closed=True)

    assert [topic for topic, _ in out] == [
        "BINANCE:BTC/USDT|ohlc:60",
        "BINANCE:BTC/USDT|ohlc:300",
    ]
    assert out[0][1] == OHLC(
        ticker=build.TICKER,
        period_seconds=60,
        open_time_ms=build.T0,
        open=1.0,
        high=3.0,
        low=0.5,
        close=2.0,
        volume=10.0,
        trade_count=4,
        closed=True,
    )
    assert not live.ohlc_messages(_candle_rows(build), closed=False)[1][1].closed
    assert not out[0][1].correction


def test_a_correction_column_marks_amended_candles(build: Any) -> None:
    rows = _candle_rows(build).append_column("correction", pa.array([False, True]))

    out = live.ohlc_messages(rows, closed=True)

    assert [(m.closed, m.correction) for _, m in out] == [(True, False), (True, True)]


def test_closed_candles_become_live_ohlc_rows(build: Any) -> None:
    table = live._live_ohlc_rows(_candle_rows(build))

    assert table.schema == records.OHLC_SCHEMA
    assert table["source"].to_pylist() == ["live", "live"]
    assert table["request_id"].to_pylist() == [None, None]
    assert table["open_time"].to_pylist()[0].timestamp() * 1000 == build.T0


def test_recent_keys_drop_redeliveries_within_capacity() -> None:
    recent = tick_publisher.RecentKeys(capacity=2)
    assert recent.first_time(("T", "1"))
    assert not recent.first_time(("T", "1"))
    assert recent.first_time(("T", "2"))
    assert recent.first_time(("U", "1"))  # evicts ("T", "1")
    assert recent.first_time(("T", "1"))
