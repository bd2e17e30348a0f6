"""Closing candles on event time, one ticker at a time: the state of ``candles-close``.

Pure (no Spark): ``live.py`` runs ``close_candles`` under Spark's
``applyInPandasWithState`` (grouped by ticker, processing-time timeouts), the
unit tests run it directly.

Rules (``live.close_mode: event``, docs/protocol.md "What the pipeline announces"):

- The **frontier** is the latest trade time seen for the ticker. A window
  ``[start, end)`` closes as soon as the frontier reaches ``end`` (a trade of a
  later window arrived) or, when the ticker goes quiet, once the frontier plus
  the quiet time beyond ``idle_s`` reaches ``end``: event time is assumed to
  run on with the wall clock. No watermark wait.
- Trades are deduplicated by trade id among the trades not older than
  ``lateness_s`` behind the frontier; an older trade is **too late**: it misses
  its candles (it is still stored in ``ticks``).
- A trade within the lateness for a window that already closed amends it;
  the amended candle is emitted again with ``correction = True``.
- Open/close by (trade time, length of id, id): trade-time order whatever the
  arrival order (tests/oracles/candle_oracle.py).

A window is emitted closed once, then once per batch that amended it. On a
replay Spark restores the state of the previous batch and the batch's
processing time, so the output is the same.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from pipeline.lake import LIVE_VALUE_COLUMNS

TradeKey = tuple[int, int, str]  # (trade time us, len(trade_id), trade_id)

#: Columns of the rows ``close_candles`` emits (Spark DDL of ``OUTPUT_SCHEMA``).
OUTPUT_COLUMNS = (
    *("ticker", "exchange", "symbol", "period_seconds", "open_time_ms"),
    *LIVE_VALUE_COLUMNS,
    "correction",
)
OUTPUT_SCHEMA = (
    "ticker string, exchange string, symbol string, period_seconds int, open_time_ms long, "
    "open double, high double, low double, close double, volume double, trade_count long, "
    "correction boolean"
)
STATE_SCHEMA = "state string"
#: Columns ``close_candles`` reads (trade_us = trade time in microseconds).
INPUT_COLUMNS = ("ticker", "exchange", "symbol", "trade_id", "price", "amount", "trade_us")
US = 1_000_000
_ARROW_OUTPUT = pa.schema(
    [
        *((c, pa.string()) for c in ("ticker", "exchange", "symbol")),
        ("period_seconds", pa.int32()),
        ("open_time_ms", pa.int64()),
        *((c, pa.float64()) for c in ("open", "high", "low", "close", "volume")),
        ("trade_count", pa.int64()),
        ("correction", pa.bool_()),
    ]
)


@dataclass(slots=True)
class Window:
    """One candle being built; ``emitted`` once published closed, ``dirty`` if amended since."""

    open: float
    open_key: TradeKey
    high: float
    low: float
    close: float
    close_key: TradeKey
    volume: float
    count: int
    emitted: bool = False
    dirty: bool = False

    def add(self, price: float, amount: float, key: TradeKey) -> None:
        if key < self.open_key:
            self.open, self.open_key = price, key
        if key > self.close_key:
            self.close, self.close_key = price, key
        self.high = max(self.high, price)
        self.low = min(self.low, price)
        self.volume += amount
        self.count += 1
        if self.emitted:
            self.dirty = True


@dataclass(frozen=True, slots=True)
class Closing:
    """The knobs: candle periods (s), accepted lateness (s), quiet time before idle close (s)."""

    periods: tuple[int, ...]
    lateness_s: float
    idle_s: float

    @property
    def base_us(self) -> int:
        return min(self.periods) * US


@dataclass
class TickerCandles:
    """Everything kept for one ticker between micro-batches."""

    exchange: str = ""
    symbol: str = ""
    frontier_us: int | None = None
    closed_until_us: int = 0
    last_arrival_ms: int = 0
    windows: dict[tuple[int, int], Window] = field(default_factory=dict)
    #: trade ids by the start of their shortest-period window, for deduplication
    ids: dict[int, set[str]] = field(default_factory=dict)
    too_late: int = 0

    def add(self, cfg: Closing, trade_id: str, price: float, amount: float, t_us: int) -> None:
        lateness_us = round(cfg.lateness_s * US)
        if self.frontier_us is not None and t_us < self.frontier_us - lateness_us:
            self.too_late += 1
            return
        base = t_us - t_us % cfg.base_us
        seen = self.ids.setdefault(base, set())
        if trade_id in seen:
            return
        seen.add(trade_id)
        key = (t_us, len(trade_id), trade_id)
        for period in cfg.periods:
            width = period * US
            start = t_us - t_us % width
            window = self.windows.get((period, start))
            if window is None:
                self.windows[(period, start)] = Window(
                    price, key, price, price, price, key, amount, 1
                )
            else:
                window.add(price, amount, key)
        if self.frontier_us is None or t_us > self.frontier_us:
            self.frontier_us = t_us

    def advance(self, cfg: Closing, now_ms: int) -> list[tuple[int, int, Window, bool]]:
        """Close what is due at ``now_ms``: (period, start us, window, is_correction)."""
        if self.frontier_us is None:
            return []
        quiet_ms = max(0, now_ms - self.last_arrival_ms - round(cfg.idle_s * 1000))
        self.closed_until_us = max(self.closed_until_us, self.frontier_us + quiet_ms * 1000)
        lateness_us = round(cfg.lateness_s * US)
        out: list[tuple[int, int, Window, bool]] = []
        for (period, start), window in sorted(self.windows.items()):
            end = start + period * US
            if end > self.closed_until_us:
                continue
            if not window.emitted:
                window.emitted = True
                out.append((period, start, window, False))
            elif window.dirty:
                out.append((period, start, window, True))
            window.dirty = False
        horizon = self.frontier_us - lateness_us
        self.windows = {
            k: w for k, w in self.windows.items() if k[1] + k[0] * US > horizon or not w.emitted
        }
        self.ids = {b: ids for b, ids in self.ids.items() if b + cfg.base_us > horizon}
        return out

    def timeout_ms(self, cfg: Closing, now_ms: int) -> int | None:
        """Processing time until the next idle close is due (None: nothing open)."""
        ends = [s + p * US for (p, s), w in self.windows.items() if not w.emitted]
        if not ends or self.frontier_us is None:
            return None
        due_ms = self.last_arrival_ms + round(cfg.idle_s * 1000)
        due_ms += max(0, -(-(min(ends) - self.frontier_us) // 1000))
        return max(1, due_ms - now_ms)

    def to_json(self) -> str:
        return json.dumps(
            {
                "x": self.exchange,
                "s": self.symbol,
                "f": self.frontier_us,
                "c": self.closed_until_us,
                "a": self.last_arrival_ms,
                "w": [
                    [
                        *(p, s, w.open, list(w.open_key), w.high, w.low, w.close),
                        *(list(w.close_key), w.volume, w.count, w.emitted, w.dirty),
                    ]
                    for (p, s), w in self.windows.items()
                ],
                "i": {str(b): sorted(ids) for b, ids in self.ids.items()},
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> TickerCandles:
        d = json.loads(text)
        windows = {
            (w[0], w[1]): Window(
                w[2], _key(w[3]), w[4], w[5], w[6], _key(w[7]), w[8], w[9], w[10], w[11]
            )
            for w in d["w"]
        }
        ids = {int(b): set(v) for b, v in d["i"].items()}
        return cls(d["x"], d["s"], d["f"], d["c"], d["a"], windows, ids)


def _key(raw: list[Any]) -> TradeKey:
    return (int(raw[0]), int(raw[1]), str(raw[2]))


def output_rows(
    ticker: str, candles: TickerCandles, closed: Iterable[tuple[int, int, Window, bool]]
) -> dict[str, list[Any]]:
    """Columns of ``OUTPUT_COLUMNS`` for the closed and corrected windows."""
    cols: dict[str, list[Any]] = {c: [] for c in OUTPUT_COLUMNS}
    for period, start, w, correction in closed:
        row = (
            ticker,
            candles.exchange,
            candles.symbol,
            period,
            start // 1000,
            w.open,
            w.high,
            w.low,
            w.close,
            w.volume,
            w.count,
            correction,
        )
        for name, value in zip(OUTPUT_COLUMNS, row, strict=True):
            cols[name].append(value)
    return cols


def step(
    cfg: Closing,
    ticker: str,
    state: str | None,
    trades: Iterable[dict[str, list[Any]]],
    now_ms: int,
) -> tuple[dict[str, list[Any]], TickerCandles]:
    """One call for one ticker: add the batch's trades (column dicts), close what is due."""
    candles = TickerCandles.from_json(state) if state else TickerCandles()
    arrived = False
    for chunk in trades:
        ids, prices, amounts, times = (
            chunk["trade_id"],
            chunk["price"],
            chunk["amount"],
            chunk["trade_us"],
        )
        for i in range(len(ids)):
            candles.add(cfg, str(ids[i]), float(prices[i]), float(amounts[i]), int(times[i]))
        if len(ids):
            arrived = True
            candles.exchange = str(chunk["exchange"][-1] or "")
            candles.symbol = str(chunk["symbol"][-1] or "")
    if arrived:
        candles.last_arrival_ms = now_ms
    return output_rows(ticker, candles, candles.advance(cfg, now_ms)), candles


def close_candles(cfg: Closing) -> Any:
    """The ``applyInPandasWithState`` function (key, pandas frames, GroupState)."""

    def run(key: tuple[Any, ...], frames: Iterator[Any], state: Any) -> Iterator[Any]:
        now_ms = int(state.getCurrentProcessingTimeMs())
        previous = state.get[0] if state.exists else None
        chunks = ({c: frame[c].to_numpy() for c in INPUT_COLUMNS} for frame in frames if len(frame))
        cols, candles = step(cfg, str(key[0]), previous, chunks, now_ms)
        if candles.frontier_us is None and not candles.windows:
            state.remove()
        else:
            state.update((candles.to_json(),))
            timeout = candles.timeout_ms(cfg, now_ms)
            if timeout is not None:
                state.setTimeoutDuration(timeout)
        yield pa.table(cols, schema=_ARROW_OUTPUT).to_pandas()

    return run


def keep_state_offsets_integral() -> None:
    """Work around pyspark 4.0.4 with pyarrow 26 in ``applyInPandasWithState``.

    The serializer turns each row's state-info struct into a dict through pandas;
    with pyarrow 26 a padding row (every field null) makes the int fields float,
    and ``RecordBatch.slice(startOffset, numRows)`` fails ("'float' object cannot be
    interpreted as an integer"). Arrow's own ``to_pylist`` keeps them ints. Applied
    on import, so also in every Python worker that unpickles ``close_candles``.
    """
    try:
        from pyspark.sql.pandas.serializers import ApplyInPandasWithStateSerializer as S
    except ImportError:  # pragma: no cover - pyspark is a dependency
        return
    original: Any = S.arrow_to_pandas
    if getattr(original, "_integral_state_info", False):
        return

    def arrow_to_pandas(self: Any, arrow_column: Any, *args: Any, **kwargs: Any) -> Any:
        kind = arrow_column.type
        if pa.types.is_struct(kind) and kind.get_field_index("startOffset") >= 0:
            return _object_series(arrow_column.to_pylist())
        return original(self, arrow_column, *args, **kwargs)

    arrow_to_pandas._integral_state_info = True  # type: ignore[attr-defined]
    S.arrow_to_pandas = arrow_to_pandas  # type: ignore[method-assign]


def _object_series(values: list[Any]) -> Any:
    from pandas import Series  # type: ignore[import-untyped]

    return Series(values, dtype=object)


keep_state_offsets_integral()
