"""Candlestick chart: a real PNG with up and down candles and a volume panel."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from PIL import Image

from mdclient.chart import DOWN, UP, candlestick_png
from mdclient.frames import candles_from_ohlc, empty_candles
from mdproto.messages import OHLC

T0 = 1_795_132_800_000


def _random_walk(n: int, seed: int = 7) -> list[OHLC]:
    rng = random.Random(seed)
    price, rows = 96_000.0, []
    for i in range(n):
        close = price * (1 + rng.gauss(0, 0.002))
        high = max(price, close) * (1 + abs(rng.gauss(0, 0.001)))
        low = min(price, close) * (1 - abs(rng.gauss(0, 0.001)))
        rows.append(
            OHLC(
                ticker="BINANCE:BTC/USDT", period_seconds=300, open_time_ms=T0 + i * 300_000,
                open=price, high=high, low=low, close=close, volume=rng.uniform(1, 50),
            )
        )  # fmt: skip
        price = close
    return rows


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))  # type: ignore[return-value]


def test_chart_has_up_and_down_candles_and_volume(tmp_path: Path) -> None:
    path = candlestick_png(
        candles_from_ohlc(_random_walk(80)), tmp_path / "c.png", title="t", period_seconds=300
    )
    image = Image.open(path).convert("RGB")
    assert image.size == (1320, 770)
    pixels = list(image.get_flattened_data())
    up, down = _rgb(UP), _rgb(DOWN)
    assert sum(1 for p in pixels if p == up) > 2_000
    assert sum(1 for p in pixels if p == down) > 2_000
    # The volume panel (bottom quarter) holds coloured bars too.
    bottom = image.crop(
        (0, int(image.height * 0.8), image.width, image.height)
    ).get_flattened_data()
    assert sum(1 for p in bottom if p != (255, 255, 255)) > 5_000


def test_chart_of_nothing_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no candles"):
        candlestick_png(empty_candles(), tmp_path / "c.png", title="t", period_seconds=60)
    assert not (tmp_path / "c.png").exists()
