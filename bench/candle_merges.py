"""A history answer over a recorded market's recent hours: the exchange's candles merged
into ``ohlc`` over the live candles stored there, on the driver (`candle_merges`,
"driver-merge") vs by Spark's MERGE ("spark-merge", the baseline), side by side.

For each size (``--minutes``: the hours a client asks, in 1-minute candles) and rep, a
fresh ``ohlc`` per way is filled as the live engine fills it, one commit per closed minute
(``--live-per-commit`` candles each), then `Lake.write_history` writes the exchange's
candles of the same minutes, every tenth with a different close and every twentieth
stored ``incomplete`` (replaced), the rest equal (left alone). Timed: the write alone,
as the history query's "merge" lap. Both ways must leave the same rows (checked).

    .venv/bin/python bench/candle_merges.py [--minutes 180 1440] [--reps 3]
        [--stack-dir DIR]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
from pipeline_common import local_session, stack

from mdproto.tables import Ohlc, arrow_schema
from pipeline.arrow_appends import ArrowAppends
from pipeline.candle_merges import OHLC_VALUE_COLUMNS
from pipeline.lake import Lake, TableNames, create_namespace
from pipeline.write_paths import WriteRule

T0_MS = 1_764_547_200_000  # 2025-12-01T00:00:00Z
MINUTE_MS = 60_000
TICKER = "BINANCE:ETH/USDT"
WAYS = {"driver-merge": WriteRule(), "spark-merge": WriteRule(driver_append_max_rows=0)}


def candles(minutes: int, *, live: bool) -> pa.Table:
    """``minutes`` 1-minute candles; live ones differ from the exchange's as described."""
    n = range(minutes)
    close = [100.0 + i + (0.5 if live and i % 10 == 0 else 0.0) for i in n]
    columns: dict[str, Any] = {c: pa.array([1.0 + i for i in n]) for c in OHLC_VALUE_COLUMNS}
    columns[Ohlc.CLOSE] = pa.array(close)
    columns[Ohlc.TRADE_COUNT] = pa.array([7] * minutes, pa.int64())
    return (
        pa.table(
            {
                Ohlc.TICKER: [TICKER] * minutes,
                Ohlc.EXCHANGE: ["BINANCE"] * minutes,
                Ohlc.SYMBOL: ["ETH/USDT"] * minutes,
                Ohlc.PERIOD_SECONDS: pa.array([60] * minutes, pa.int32()),
                Ohlc.OPEN_TIME: pa.array([T0_MS + i * MINUTE_MS for i in n], pa.int64()).cast(
                    pa.timestamp("ms", tz="UTC")
                ),
                **columns,
                Ohlc.SOURCE: ["live" if live else "history"] * minutes,
                Ohlc.REQUEST_ID: pa.nulls(minutes, pa.string()),
                Ohlc.INGESTED_AT: pa.nulls(minutes, pa.timestamp("us", tz="UTC")),
                Ohlc.INCOMPLETE: pa.array([live and i % 20 == 5 for i in n]),
            }
        )
        .select(SCHEMA.names)
        .cast(SCHEMA)
    )


SCHEMA = arrow_schema(Ohlc.SCHEMA)


def run(spark: Any, appends: ArrowAppends, catalog: str, way: str, minutes: int, per: int) -> Any:
    namespace = f"bench_merges_{uuid.uuid4().hex[:8]}"
    lake = Lake(spark, TableNames(catalog, namespace), appends, rule=WAYS[way])
    spark.sql(create_namespace(lake.names))
    lake.ensure_tables()
    live = candles(minutes, live=True)
    for start in range(0, minutes, per):
        appends.append(f"{namespace}.ohlc", live.slice(start, per))
    started = time.perf_counter()
    how = lake.write_history(spark, candles(minutes, live=False)).how
    seconds = time.perf_counter() - started
    assert how == "merge", how
    rows = appends.load(f"{namespace}.ohlc").scan().to_arrow()
    kept = sorted(
        (r[Ohlc.OPEN_TIME], r[Ohlc.CLOSE], r[Ohlc.SOURCE])
        for r in rows.select([Ohlc.OPEN_TIME, Ohlc.CLOSE, Ohlc.SOURCE]).to_pylist()
    )
    return seconds, kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=int, nargs="+", default=[180, 1440])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--live-per-commit", type=int, default=10)
    parser.add_argument("--stack-dir", type=Path)
    args = parser.parse_args()
    with stack(args.stack_dir) as endpoints, tempfile.TemporaryDirectory(prefix="bench-m-") as tmp:
        settings, spark = local_session(endpoints, "bench_merges", Path(tmp))
        c = settings.catalog
        appends = ArrowAppends(c.name, c.pyiceberg_properties())
        run(spark, appends, c.name, "spark-merge", 20, args.live_per_commit)  # warm up
        run(spark, appends, c.name, "driver-merge", 20, args.live_per_commit)
        times: dict[tuple[int, str], list[float]] = {}
        for rep in range(args.reps):
            for minutes in args.minutes:
                order = list(WAYS) if rep % 2 == 0 else list(reversed(WAYS))
                results = {}
                for way in order:
                    seconds, rows = run(spark, appends, c.name, way, minutes, args.live_per_commit)
                    results[way] = rows
                    times.setdefault((minutes, way), []).append(seconds)
                    print(f"rep {rep} {minutes} min {way}: {seconds:.3f} s", flush=True)
                assert results["driver-merge"] == results["spark-merge"], "the ways disagree"
        print()
        print(
            "| candles | live commits | spark-merge s (median, min-max) | driver-merge s | ratio |"
        )
        print("|---:|---:|---|---|---:|")
        for minutes in args.minutes:
            spark_s, driver_s = times[(minutes, "spark-merge")], times[(minutes, "driver-merge")]
            print(
                f"| {minutes:,} | {-(-minutes // args.live_per_commit)} "
                f"| {_spread(spark_s)} | {_spread(driver_s)} "
                f"| {statistics.median(driver_s) / statistics.median(spark_s):.2f}x |"
            )


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


if __name__ == "__main__":
    main()
