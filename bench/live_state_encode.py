"""What a save round costs the live engine's loop per partition (ADR 0024).

One ticks partition's state as the engine holds it: ``--tickers`` tickers' open windows
(`LiveCandles` fed ``--trades`` trades of the last two seconds) and the newest 10,000
trade ids of a full `RecentKeys`. Each timed ``--reps`` times, in one process:

- **take**: what the loop does (`TickerCandles.to_dict` of every ticker,
  `RecentKeys.newest`);
- **encode, json**: the standard library's `json.dumps` of the body (before ADR 0024),
  the baseline;
- **encode, orjson**: `PartitionState.encode` as it runs (orjson, header, SHA-256).

Reported: the median milliseconds of each and orjson / json.

    .venv/bin/python bench/live_state_encode.py [--tickers 333] [--trades 20000] [--reps 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from mdproto.messages import Tick
from mdproto.recent import RecentKeys
from pipeline.candle_close import Closing
from pipeline.live_candles import LiveCandles
from pipeline.live_state import RECENT_SAVED, PartitionState


def median_ms(work: Callable[[], Any], reps: int) -> float:
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        work()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tickers", type=int, default=333)
    parser.add_argument("--trades", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()

    candles = LiveCandles(Closing((60, 300, 3600), 2.0, 1.0), preview_every_ms=250)
    recent = RecentKeys[tuple[str, str]](100_000)
    now_ms = int(time.time() * 1000)
    ticks = [
        Tick(
            ticker=f"BINANCE:S{i % args.tickers}/USDT",
            trade_id=str(10**9 + i),
            price=100.0 + (i % 97) / 100,
            amount=1.0,
            timestamp_ms=now_ms - 2000 + i * 2000 // args.trades,
        )
        for i in range(max(args.trades, 100_000))
    ]
    candles.add(ticks[-args.trades :], now_ms)
    for t in ticks:
        recent.first_time((t.ticker, t.trade_id))

    def take() -> PartitionState:
        windows = {t: c.to_dict() for t, c in candles.tickers.items()}
        return PartitionState("market.ticks", 0, 1, windows, recent.newest(RECENT_SAVED))

    state = take()
    body = {"candles": state.candles, "recent": state.recent, "cep": state.cep}
    rows = {"take": 0.0, "encode, json": 0.0, "encode, orjson": 0.0}
    for name, work in [
        ("take", take),
        ("encode, json", lambda: json.dumps(body, separators=(",", ":")).encode()),
        ("encode, orjson", state.encode),
    ]:
        rows[name] = median_ms(work, args.reps)
    print(f"one partition: {args.tickers} tickers, {len(state.encode()):,} bytes")
    print("| step | median ms |\n|---|---:|")
    for name, ms in rows.items():
        print(f"| {name} | {ms:.2f} |")
    print(f"orjson / json: {rows['encode, orjson'] / rows['encode, json']:.3f}")


if __name__ == "__main__":
    main()
