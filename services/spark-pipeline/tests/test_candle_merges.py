"""The driver's merge of exchange candles (`candle_merges`): what a range holds after it,
by `lake.merge_history_candles`'s rule; the stack test runs both against real tables."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa

from mdproto.tables import Ohlc
from pipeline import candle_merges
from pipeline.candle_merges import Merged, history_merge, live_merge

MINUTE_US = 60_000_000
T0_US = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1_000_000)
TICKER = "BINANCE:BTC/USDT"


def candles(minutes: list[int], **columns: list[object]) -> pa.Table:
    n = len(minutes)
    values: dict[str, list[object]] = {c: [1.0] * n for c in candle_merges.OHLC_VALUE_COLUMNS}
    values[Ohlc.TRADE_COUNT] = [7] * n
    values.update(columns)
    return pa.table(
        {
            Ohlc.TICKER: [TICKER] * n,
            Ohlc.PERIOD_SECONDS: pa.array([60] * n, pa.int32()),
            Ohlc.OPEN_TIME: pa.array([T0_US + m * MINUTE_US for m in minutes], pa.int64()).cast(
                pa.timestamp("us", tz="UTC")
            ),
            **{
                c: pa.array(v, pa.int64() if c == Ohlc.TRADE_COUNT else pa.float64())
                for c, v in values.items()
                if c in candle_merges.OHLC_VALUE_COLUMNS
            },
            Ohlc.SOURCE: pa.array(columns.get(Ohlc.SOURCE, ["history"] * n), pa.string()),
            Ohlc.INCOMPLETE: pa.array(columns.get(Ohlc.INCOMPLETE, [None] * n), pa.bool_()),
        }
    )


def minutes(table: pa.Table) -> list[int]:
    us = table[Ohlc.OPEN_TIME].cast(pa.int64()).to_pylist()
    return [(t - T0_US) // MINUTE_US for t in us]


def minutes_and_sources(merged: Merged) -> list[tuple[int, str]]:
    return list(zip(minutes(merged.rows), merged.rows[Ohlc.SOURCE].to_pylist(), strict=True))


def test_new_keys_are_added_and_equal_stored_candles_kept_as_stored() -> None:
    merged = history_merge(candles([0, 1, 2, 3]), candles([1, 2, 7], source=["live"] * 3))
    # The batch's new candles first, in its order; then every stored one kept (7 too:
    # a stored candle the batch does not have stays).
    assert sorted(minutes_and_sources(merged)[:2]) == [(0, "history"), (3, "history")]
    assert sorted(minutes_and_sources(merged)[2:]) == [(1, "live"), (2, "live"), (7, "live")]
    assert merged.written == 2


def test_a_changed_value_or_an_incomplete_stored_candle_is_replaced() -> None:
    stored = candles(
        [0, 1, 2, 3],
        close=[1.0, 2.0, 1.0, 1.0],  # minute 1 differs
        incomplete=[False, False, True, None],  # minute 2 was built across a feed gap
        source=["live"] * 4,
    )
    merged = history_merge(candles([3, 2, 1, 0, 4]), stored)
    assert minutes_and_sources(merged)[:3] == [(2, "history"), (1, "history"), (4, "history")]
    assert sorted(minutes_and_sources(merged)[3:]) == [(0, "live"), (3, "live")]
    assert merged.written == 3


def test_a_replay_writes_nothing() -> None:
    batch = candles([0, 1, 2])
    merged = history_merge(batch, batch)
    assert merged.written == 0
    assert sorted(minutes(merged.rows)) == [0, 1, 2]


def test_nulls_compare_equal_and_a_null_against_a_value_differs() -> None:
    stored = candles([0, 1], quote_volume=[None, None], source=["live"] * 2)
    merged = history_merge(candles([0, 1], quote_volume=[None, 5.0]), stored)
    assert sorted(minutes_and_sources(merged)) == [(0, "live"), (1, "history")]


def test_a_live_candle_never_replaces_an_exchange_one() -> None:
    stored = candles([0, 1], close=[1.0, 1.0])
    merged = live_merge(candles([0, 1, 2], close=[5.0, 1.0, 1.0], source=["live"] * 3), stored)
    assert sorted(minutes_and_sources(merged)) == [(0, "history"), (1, "history"), (2, "live")]
    assert merged.written == 1


def test_a_live_candle_amends_a_stored_live_one_unless_that_counts_more_trades() -> None:
    stored = candles(
        [0, 1, 2, 3],
        close=[1.0, 2.0, 2.0, 1.0],  # 1 and 2 differ from the batch's
        trade_count=[7, 7, 9, 7],  # 2 counts more trades: an older view stored late
        incomplete=[False, False, False, True],  # 3: the note differs
        source=["live"] * 4,
    )
    batch = candles([0, 1, 2, 3], incomplete=[False] * 4, source=["live"] * 4)
    merged = live_merge(batch, stored)
    assert merged.written == 2
    rows = merged.rows.to_pylist()
    assert sorted(minutes(merged.rows)) == [0, 1, 2, 3]
    kept_close = {m: r[Ohlc.CLOSE] for m, r in zip(minutes(merged.rows), rows, strict=True)}
    assert kept_close == {0: 1.0, 1: 1.0, 2: 2.0, 3: 1.0}
    assert minutes(merged.rows)[:2] == [1, 3]  # the batch's, in its order, first


def test_a_null_trade_count_does_not_stop_an_amend() -> None:
    stored = candles([0], close=[2.0], trade_count=[None], source=["live"])
    merged = live_merge(candles([0], source=["live"]), stored)
    assert merged.written == 1
