"""Candlestick chart with a volume panel, drawn with plain matplotlib (no pyplot state).

matplotlib is the optional extra `mdclient[chart]` (mdclient.extras).

Up candles (close >= open) are green, down candles red; wicks span low-high,
bodies open-close, and a doji still gets a thin visible body.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from mdclient import extras
from mdproto.tables import Ohlc

if TYPE_CHECKING:
    import pyarrow as pa

UP = "#26a69a"
DOWN = "#ef5350"
FEATURE = "drawing a chart (--chart)"


def candlestick_png(
    table: pa.Table, path: Path, *, title: str, period_seconds: int, dpi: int = 110
) -> Path:
    """Write the chart for a candle frame (frames.SCHEMA) to `path` (PNG)."""
    extras.require("chart", FEATURE)
    import matplotlib.dates
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    mdates: Any = matplotlib.dates  # partly untyped: keep mypy strict elsewhere
    if table.num_rows == 0:
        raise ValueError("no candles to draw")
    rows = table.to_pylist()
    x = mdates.date2num([row[Ohlc.OPEN_TIME] for row in rows])
    opens = [row[Ohlc.OPEN] for row in rows]
    closes = [row[Ohlc.CLOSE] for row in rows]
    highs = [row[Ohlc.HIGH] for row in rows]
    lows = [row[Ohlc.LOW] for row in rows]
    volumes = [row[Ohlc.VOLUME] for row in rows]
    colors = [UP if c >= o else DOWN for o, c in zip(opens, closes, strict=True)]
    width = period_seconds / 86_400 * 0.7  # matplotlib dates are days
    span = (max(highs) - min(lows)) or max(abs(highs[0]), 1.0)
    bodies = [max(abs(c - o), span * 0.002) for o, c in zip(opens, closes, strict=True)]
    bottoms = [min(o, c) for o, c in zip(opens, closes, strict=True)]
    half_period = period_seconds / 86_400 / 2
    centre = [x_i + half_period for x_i in x]  # each candle drawn over its own period

    fig = Figure(figsize=(12, 7), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(4, 1)
    price = fig.add_subplot(grid[:3, 0])
    volume = fig.add_subplot(grid[3, 0], sharex=price)
    price.vlines(centre, lows, highs, colors=colors, linewidth=1)
    price.bar(centre, bodies, width=width, bottom=bottoms, color=colors, edgecolor=colors)
    volume.bar(centre, volumes, width=width, color=colors, alpha=0.7)
    price.set_title(title, loc="left")
    price.set_ylabel("price")
    volume.set_ylabel("volume")
    for ax in (price, volume):
        ax.grid(True, alpha=0.25)
    price.tick_params(labelbottom=False)
    locator = mdates.AutoDateLocator()
    volume.xaxis.set_major_locator(locator)
    volume.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    volume.set_xlabel("open time (UTC)")
    pad = width
    price.set_xlim(min(x) - pad, max(x) + period_seconds / 86_400 + pad)
    fig.savefig(path, dpi=dpi, format="png")
    return path
