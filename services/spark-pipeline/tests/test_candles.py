"""Reference candle math, checked against hand-computed candles."""

from __future__ import annotations

import random
from typing import Any

from candle_oracle import Candle, aggregate, trade_order, window_start_ms
from hypothesis import given, settings
from hypothesis import strategies as st


def test_window_start_is_epoch_aligned() -> None:
    assert window_start_ms(1_700_000_059_999, 60) == 1_700_000_040_000
    assert window_start_ms(1_700_000_040_000, 60) == 1_700_000_040_000
    assert window_start_ms(1_700_003_599_000, 3600) == 1_700_002_800_000


def test_trade_order_compares_numeric_ids_numerically() -> None:
    assert trade_order(5, "9") < trade_order(5, "10")
    assert trade_order(4, "10") < trade_order(5, "9")


def test_out_of_order_ticks_give_open_and_close_by_trade_time(build: Any) -> None:
    m = 1_699_999_800_000  # 2023-11-14T22:10:00Z, a 5-minute boundary
    # Arrival order differs from trade time order: the earliest trade arrives last.
    ticks = [
        build.tick(11, 102.0, m + 20_000, amount=2.0),
        build.tick(12, 99.0, m + 59_999, amount=1.0),
        build.tick(10, 101.0, m + 1_000, amount=0.5),
        build.tick(13, 105.0, m + 60_000, amount=3.0),  # next minute
        build.tick(11, 102.0, m + 20_000, amount=2.0),  # duplicate delivery
    ]

    candles = aggregate(ticks, [60, 300])

    t = build.TICKER
    five = m
    assert candles == [
        Candle(t, 60, m, open=101.0, high=102.0, low=99.0, close=99.0, volume=3.5, trade_count=3),
        Candle(t, 60, m + 60_000, 105.0, 105.0, 105.0, 105.0, volume=3.0, trade_count=1),
        Candle(t, 300, five, 101.0, 105.0, 99.0, 105.0, volume=6.5, trade_count=4),
    ]


def test_same_millisecond_trades_are_ordered_by_id(build: Any) -> None:
    m = build.T0
    ticks = [build.tick(10, 2.0, m), build.tick(9, 1.0, m), build.tick(11, 3.0, m)]

    [c] = aggregate(ticks, [60])

    assert (c.open, c.close) == (1.0, 3.0)


@settings(max_examples=50, deadline=None)
@given(
    prices=st.lists(st.floats(1, 1000, allow_nan=False), min_size=1, max_size=40),
    seed=st.integers(0, 2**32),
)
def test_arrival_order_never_changes_candles(prices: list[float], seed: int) -> None:
    from mdproto.messages import Tick

    ticks = [
        Tick(ticker="X:A/B", trade_id=str(i), price=p, amount=1.0, timestamp_ms=1_000 + i * 7_919)
        for i, p in enumerate(prices)
    ]
    shuffled = ticks[:]
    random.Random(seed).shuffle(shuffled)

    assert aggregate(shuffled, [60, 300]) == aggregate(ticks, [60, 300])
