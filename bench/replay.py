"""Replay at `max` speed: trades/s to an SDK consumer, against a bare read of the same rows.

The lake and its rows are `bench/trade_history.py`'s (SeaweedFS S3 + Iceberg REST
catalog; one UTC day of `--trades` trades of BTC/USDT plus ETH/USDT and SOL/USDT, in
`--appends` time-ordered appends). Then, `--reps` rounds, the order alternating each
round, over the same `--hours` of that day:

1. `Client.replay(BTC, start, end, speed="max")`: every `Tick` (the live topic's
   message, sequenced) pulled by the loop, as a strategy would;
2. `Client.replay_batches(BTC, start, end)`: Arrow record batches in event-time order
   (the batch mode for backtests that read columns), every batch consumed;
3. bare: pyiceberg ``scan(row_filter).to_arrow()`` of the same rows, sorted by time
   (what any replay has to read), and the same rows built into `Tick` messages one by
   one with no replay machinery (what any replay in live messages has to build).

Rates are trades/s (medians and min-max); ratios are replay / bare per round, median.

    .venv/bin/python bench/replay.py [--trades 1000000] [--hours 24] [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import load_catalog
from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, LessThan
from trade_history import BUSY, DAY, alternating_rounds, bench_client, day_lake, lake

from infra.localstack import StackEndpoints
from mdproto.messages import TakerSide, Tick
from mdproto.tables import Ticks

HOUR_MS = 3_600_000


def run(e: StackEndpoints, args: argparse.Namespace) -> None:
    catalog = load_catalog(e.catalog_name, **e.pyiceberg_catalog_properties())
    name, _ = day_lake(catalog, "bench_replay", args)
    namespace = name.rsplit(".", 1)[0]
    start_ms, end_ms = DAY, DAY + args.hours * HOUR_MS
    row_filter = And(
        EqualTo(Ticks.TICKER, BUSY),  # type: ignore[call-arg, arg-type]
        GreaterThanOrEqual(Ticks.TRADE_TIME, start_ms * 1000),  # type: ignore[call-arg, arg-type]
        LessThan(Ticks.TRADE_TIME, end_ms * 1000),  # type: ignore[call-arg, arg-type]
    )

    def bare_rows() -> pa.Table:
        rows = catalog.load_table(name).scan(row_filter=row_filter).to_arrow()
        return rows.take(pc.sort_indices(rows, [(Ticks.TRADE_TIME, "ascending")]))

    def bare_read() -> int:
        return int(bare_rows().num_rows)

    def bare_messages() -> int:
        rows = bare_rows()
        micros = rows[Ticks.TRADE_TIME].cast(pa.int64()).to_pylist()
        built = 0
        for trade_id, price, amount, side, us in zip(
            rows[Ticks.TRADE_ID].to_pylist(),
            rows[Ticks.PRICE].to_pylist(),
            rows[Ticks.AMOUNT].to_pylist(),
            rows[Ticks.SIDE].to_pylist(),
            micros,
            strict=True,
        ):
            Tick(
                ticker=BUSY,
                trade_id=trade_id,
                price=price,
                amount=amount,
                side=TakerSide.BUY if side == "BUY" else TakerSide.SELL,
                timestamp_ms=us // 1000,
            )
            built += 1
        return built

    load = [os.getloadavg()[0]]
    with bench_client(e, namespace) as client:

        def replay() -> int:
            stream = client.replay(BUSY, start_ms, end_ms, speed="max", marker=False)
            return sum(1 for _ in stream)

        def batches() -> int:
            return sum(b.num_rows for b in client.replay_batches(BUSY, start_ms, end_ms))

        paths: dict[str, Callable[[], int]] = {
            "Client.replay, max (Tick messages)": replay,
            "bare: scan + sort + Tick per row": bare_messages,
            "Client.replay_batches (Arrow)": batches,
            "bare: scan + sort (Arrow)": bare_read,
        }
        baseline = {
            "Client.replay, max (Tick messages)": "bare: scan + sort + Tick per row",
            "Client.replay_batches (Arrow)": "bare: scan + sort (Arrow)",
        }
        times, counts = alternating_rounds(paths, args.reps, load)

    rows = next(iter(counts.values()))
    print(
        f"\n{rows:,} trades of {BUSY} over {args.hours} h; {args.reps} rounds; load average "
        f"(1 min) {min(load):.1f}-{max(load):.1f} on {os.cpu_count()} cores\n"
    )
    print("| path | trades/s, median (min-max) | x bare (median of rounds) |")
    print("|---|---|---:|")
    for label, values in times.items():
        rates = [rows / v for v in values]
        rate = f"{statistics.median(rates):,.0f} ({min(rates):,.0f}-{max(rates):,.0f})"
        base = baseline.get(label)
        paired = (
            f"{statistics.median(t / v for v, t in zip(values, times[base], strict=True)):.2f}"
            if base
            else ""
        )
        print(f"| {label} | {rate} | {paired} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trades", type=int, default=1_000_000, help="of the busy ticker")
    parser.add_argument("--others", type=int, default=400_000, help="of each other ticker")
    parser.add_argument("--appends", type=int, default=4)
    parser.add_argument("--hours", type=int, default=24, help="replayed, from the day's start")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp, lake(Path(tmp)) as e:
        run(e, args)


if __name__ == "__main__":
    main()
