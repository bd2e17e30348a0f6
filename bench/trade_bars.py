"""Bars from trades: a day of 1-second bars by the pipeline's Spark job against pandas.

The lake and its rows are `bench/trade_history.py`'s (SeaweedFS S3 + Iceberg REST
catalog, ``ticks``/``gaps`` from `mdproto.tables`; one UTC day of `--trades` trades of
BTC/USDT plus `--others` of ETH/USDT and SOL/USDT, in `--appends` time-ordered appends).
The day's bar plan (`pipeline.trade_bars.plan`, period 1 s) takes the recording as
covering the whole day, settled, with no gap: every slot is known, so the job
aggregates exactly the day's trades. Then, `--reps` rounds, the order alternating:

1. Spark: ``spark.sql(bars_sql(ticks, plan, id)).toArrow()``, the job's one
   aggregation over ``ticks`` (Iceberg scan on S3, group by slot, open/close by trade
   order) collected to the driver as Arrow; a session built by the pipeline's own
   `session.build_session` (``local[2]``), its start not timed;
2. pandas with the scan: pyiceberg ``scan(row_filter).to_pandas()`` of the same rows,
   sorted in trade order (time, id length, id), ``resample("1s")``: open, high, low,
   close, volume, trade count, empty seconds dropped;
3. pandas without the scan: the same resample of a frame scanned once beforehand.

Every path must give the same bars (slots, OHLC and counts exactly, volume within
1e-9 relative): the run fails otherwise. Medians, min-max, Spark / pandas ratios (of
medians, and the median of each round's own ratio); `--json FILE` writes them.

    .venv/bin/python bench/trade_bars.py [--trades 1000000] [--reps 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd  # type: ignore[import-untyped]  # no stubs installed
import pyarrow as pa
from pyiceberg.catalog import load_catalog
from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, LessThan
from trade_history import BUSY, DAY, DAY_MS, alternating_rounds, day_lake, lake, spread

from infra.artifacts import spark_jars
from infra.localstack import StackEndpoints
from mdproto.tables import Ohlc, Ticks
from pipeline.config import load_settings
from pipeline.session import build_session
from pipeline.trade_bars import Recording, bars_sql, plan

PERIOD_S = 1
SPARK = "Spark bars_sql -> toArrow()"
PANDAS_SCAN = "pandas: pyiceberg scan + resample"
PANDAS = "pandas: resample only"
BAR_COLUMNS = [Ohlc.OPEN, Ohlc.HIGH, Ohlc.LOW, Ohlc.CLOSE, Ohlc.VOLUME, Ohlc.TRADE_COUNT]


class BarsDifferError(AssertionError):
    """The Spark job's bars and pandas' are not the same bars."""


def resample(frame: pd.DataFrame) -> pd.DataFrame:
    """Bars of ``frame``'s trades, indexed by open time (epoch µs), in trade order (time,
    id length, id: `trade_bars.TRADE_ORDER`); seconds without a trade dropped, as the
    aggregation has none."""
    ordered = frame.assign(id_len=frame[Ticks.TRADE_ID].str.len()).sort_values(
        [Ticks.TRADE_TIME, "id_len", Ticks.TRADE_ID]
    )
    bars = (
        ordered.set_index(Ticks.TRADE_TIME)
        .resample(f"{PERIOD_S}s", origin="epoch")
        .agg(
            **{
                Ohlc.OPEN: (Ticks.PRICE, "first"),
                Ohlc.HIGH: (Ticks.PRICE, "max"),
                Ohlc.LOW: (Ticks.PRICE, "min"),
                Ohlc.CLOSE: (Ticks.PRICE, "last"),
                Ohlc.VOLUME: (Ticks.AMOUNT, "sum"),
                Ohlc.TRADE_COUNT: (Ticks.PRICE, "count"),
            }
        )
    )
    bars = bars[bars[Ohlc.TRADE_COUNT] > 0]
    bars.index = bars.index.as_unit("us").asi8
    return bars


def spark_frame(bars: pa.Table) -> pd.DataFrame:
    """The job's rows as `resample` has them: bar columns by open time (epoch µs)."""
    frame = bars.select(BAR_COLUMNS).to_pandas()
    frame.index = bars.column(Ohlc.OPEN_TIME).cast(pa.int64()).to_numpy()
    return frame.sort_index()


def same_bars(spark: pd.DataFrame, pandas: pd.DataFrame) -> None:
    """Raise `BarsDifferError` unless both hold the same slots, OHLC, counts and volumes."""
    if not np.array_equal(spark.index, pandas.index):
        raise BarsDifferError(f"slots differ: {len(spark)} Spark bars, {len(pandas)} pandas bars")
    for column in BAR_COLUMNS:
        a, b = spark[column].to_numpy(), pandas[column].to_numpy()
        close = np.isclose(a, b, rtol=1e-9, atol=0) if column == Ohlc.VOLUME else a == b
        bad = np.flatnonzero(~close)
        if len(bad):
            k = bad[0]
            raise BarsDifferError(
                f"{column} differs in {len(bad)} bars, first at {spark.index[k]} µs: "
                f"Spark {a[k]!r}, pandas {b[k]!r}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trades", type=int, default=1_000_000, help="of the busy ticker")
    parser.add_argument("--others", type=int, default=400_000, help="of each other ticker")
    parser.add_argument("--appends", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-trade-bars-") as tmp, lake(Path(tmp)) as e:
        run(e, Path(tmp), args)


def run(e: StackEndpoints, tmp: Path, args: argparse.Namespace) -> None:
    catalog = load_catalog(e.catalog_name, **e.pyiceberg_catalog_properties())
    name, files = day_lake(catalog, "bench_bars", args)
    namespace = name.partition(".")[0]

    # The whole day known: the recording reaches past its end, no gap (the job's input).
    bar_plan = plan(BUSY, PERIOD_S, DAY, DAY + DAY_MS, Recording(DAY, DAY + DAY_MS), [])
    window = bar_plan.trades_ms
    assert window == (DAY, DAY + DAY_MS), window
    row_filter = And(
        EqualTo(Ticks.TICKER, BUSY),  # type: ignore[call-arg, arg-type]
        GreaterThanOrEqual(Ticks.TRADE_TIME, window[0] * 1000),  # type: ignore[call-arg, arg-type]
        LessThan(Ticks.TRADE_TIME, window[1] * 1000),  # type: ignore[call-arg, arg-type]
    )
    columns = (Ticks.TRADE_TIME, Ticks.TRADE_ID, Ticks.PRICE, Ticks.AMOUNT)

    def scanned() -> pd.DataFrame:
        scan = catalog.load_table(name).scan(row_filter=row_filter, selected_fields=columns)
        return scan.to_pandas()

    settings = load_settings(
        catalog={**e.catalog_settings().model_dump(), "namespace": namespace},
        spark={
            "master": "local[2]",
            "jars": [str(j) for j in spark_jars()],
            "driver_memory": "1g",
            "scratch_dir": str(tmp / "spark-scratch"),
        },
    )
    started = time.perf_counter()
    spark = build_session(settings)
    print(f"Spark session up in {time.perf_counter() - started:.0f} s (not timed)", flush=True)
    sql = bars_sql(f"{settings.catalog.name}.{name}", bar_plan, "bench-trade-bars")
    results: dict[str, pd.DataFrame] = {}
    arrow: list[pa.Table] = []

    def by_spark() -> int:  # timed to the Arrow table on the driver, compared untimed
        arrow[:] = [spark.sql(sql).toArrow()]
        return int(arrow[0].num_rows)

    def with_scan() -> int:
        results[PANDAS_SCAN] = resample(scanned())
        return len(results[PANDAS_SCAN])

    frame = scanned()

    def resample_only() -> int:
        results[PANDAS] = resample(frame)
        return len(results[PANDAS])

    paths: dict[str, Callable[[], int]] = {
        SPARK: by_spark,
        PANDAS_SCAN: with_scan,
        PANDAS: resample_only,
    }
    load = [os.getloadavg()[0]]
    try:
        times, counts = alternating_rounds(paths, args.reps, load)
    finally:
        spark.stop()
    results[SPARK] = spark_frame(arrow[0])
    same_bars(results[SPARK], results[PANDAS_SCAN])
    same_bars(results[SPARK], results[PANDAS])

    bars = next(iter(counts.values()))
    print(
        f"\n{len(frame):,} trades of {BUSY} on one day -> {bars:,} 1-second bars "
        f"(identical on every path); {files} files; {args.reps} rounds; load average "
        f"(1 min) {min(load):.1f}-{max(load):.1f} on {os.cpu_count()} cores\n"
    )
    print("| path | median (min-max) | Spark / this (medians) | Spark / this (median of rounds) |")
    print("|---|---|---:|---:|")
    spark_s = times[SPARK]
    out: dict[str, Any] = {
        "trades": len(frame),
        "bars": bars,
        "files": files,
        "reps": args.reps,
        "cores": os.cpu_count(),
        "load_1min": load,
        "paths": {},
    }
    for label, values in times.items():
        ratio = statistics.median(spark_s) / statistics.median(values)
        paired = statistics.median(s / v for s, v in zip(spark_s, values, strict=True))
        print(f"| {label} | {spread(values)} | {ratio:.2f} | {paired:.2f} |")
        out["paths"][label] = {
            "seconds": values,
            "median_s": statistics.median(values),
            "spark_over_this_medians": ratio,
            "spark_over_this_rounds": paired,
        }
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
