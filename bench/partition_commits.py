"""Files per commit at universe scale: ``ohlc`` by identity(ticker) against bucket[N](ticker)
(issue 44; docs/adr/0023).

Today ``ohlc`` is partitioned by (ticker, period_seconds, month(open_time)), so a
``candles-store`` commit of K tickers' closed candles writes K data files. Here, side by
side in one run on a fresh local lake (SeaweedFS S3 + the Iceberg REST catalog; no
Kafka), one table per layout (`LAYOUTS`), made by the pipeline's Spark session from
`mdproto.tables` (`lake.create_table`), the bucket layouts with the write order
(ticker, open_time) and full ``ticker`` bounds:

1. **fill** (not timed): 30 days of 1m history candles of the tickers that share the
   read ticker's bucket[8] (bucket[16]'s too: 16 is a multiple of 8), sorted by ticker
   then time, one pyiceberg append; the other tickers' history touches no file a
   one-ticker read of any layout opens, so it is left out (the manifests are smaller
   than on a lake with every ticker's history);
2. **commits** (timed): ``--commits`` batches of one closed 1m candle of each of K
   tickers, written the way ``candles-store`` writes them (`CandleStore` ->
   `Lake.write_live`: the driver's probe for stored candles of the batch's series, then
   the pyiceberg append), the layouts' order rotating each batch. Per commit: seconds
   (the probe's apart), data files added (the snapshot summary);
3. **reads** (timed, ``--reads`` rounds, the order reversed every other round): one
   ticker's 30 days (and the committed minutes) as a client reads them
   (`mdclient.frames.IcebergReader.read_ohlc`) and as the pipeline counts a stored
   answer (`Lake.count_request_rows`: `row_counts.count` on the freshly loaded table);
4. with ``--compact``: upkeep's compaction (`upkeep.plan`'s ``rewrite_data_files``, a
   Spark procedure) on every table, then the reads again.

Medians, min-max and each bucket layout's ratio to today's (of medians).

    nice -n 10 .venv/bin/python bench/partition_commits.py [--tickers 200 1000]
        [--commits 20 8] [--layouts current bucket8 bucket16 bucket16-rg32k] [--reads 5]
        [--compact] [--skip-probe] [--json FILE]

``--skip-probe`` times the append alone: at 1,000 tickers the probe raises
RecursionError (docs/pipeline-benchmarks.md (p)).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from pipeline_common import local_session
from pyiceberg.transforms import BucketTransform
from pyiceberg.types import StringType
from trade_history import alternating_rounds, lake

from mdclient.frames import IcebergReader
from mdproto.tables import Ohlc, Partition, Transform
from pipeline import records, row_counts, upkeep
from pipeline.arrow_appends import ArrowAppends
from pipeline.config import UpkeepConfig
from pipeline.lake import Lake, TableNames, create_namespace, create_table
from pipeline.live import live_ohlc_rows

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from pyiceberg.table import Table
    from pyspark.sql import SparkSession

    from infra.localstack import StackEndpoints

MINUTE_MS = 60_000
DAYS = 30
#: 2025-10-16T00:00Z: 30 days span two months, as most 30-day reads do (ADR 0004).
HISTORY_START_MS = 1_760_572_800_000
PERIOD = 60
READ_TICKER_INDEX = 0


@dataclass(frozen=True, slots=True)
class Layout:
    """One ``ohlc`` layout: its partitioning, whether rows are written ordered by
    (ticker, open_time), and table properties besides the pipeline's."""

    partitioning: tuple[Partition, ...]
    ordered: bool = False
    properties: dict[str, str] = field(default_factory=dict)


def _bucketed(n: int, row_group_rows: int | None = None) -> Layout:
    transform: Transform = "bucket[8]" if n == 8 else "bucket[16]"
    groups = (
        {} if row_group_rows is None else {"write.parquet.row-group-limit": str(row_group_rows)}
    )
    return Layout(
        (
            Partition(Ohlc.TICKER, transform),
            Partition(Ohlc.PERIOD_SECONDS),
            Partition(Ohlc.OPEN_TIME, "month"),
        ),
        ordered=True,
        # A ticker longer than 16 characters keeps exact bounds (not a truncated
        # prefix): files of other tickers of the bucket are pruned by them.
        properties={"write.metadata.metrics.column.ticker": "full", **groups},
    )


LAYOUTS = {
    # Before ADR 0023: identity(ticker), no write order.
    "current": Layout(
        (Partition(Ohlc.TICKER), Partition(Ohlc.PERIOD_SECONDS), Partition(Ohlc.OPEN_TIME, "month"))
    ),
    "bucket8": _bucketed(8),
    "bucket16": _bucketed(16),
    # Row groups of 32,768 rows (pyiceberg's writes; Spark's are sized in bytes): a
    # ticker's month of 1m candles (<= 44,640 rows) spans at most 3 of them.
    "bucket16-rg32k": _bucketed(16, 32_768),
}


def ticker_names(k: int) -> list[str]:
    """``k`` tickers, 18 characters each (longer than Iceberg's default 16-character bounds)."""
    return [f"BINANCE:T{i:04d}/USDT" for i in range(k)]


def same_bucket(tickers: Sequence[str], of: str, buckets: int = 8) -> list[str]:
    """The ``tickers`` in ``of``'s bucket (``of`` included), as Iceberg hashes them."""
    bucket = BucketTransform(buckets).transform(StringType())
    return [t for t in tickers if bucket(t) == bucket(of)]


def history(tickers: Sequence[str], start_ms: int, minutes: int) -> pa.Table:
    """``minutes`` 1m history candles of each ticker from ``start_ms``, ticker then time."""
    n = len(tickers) * minutes
    rng = np.random.default_rng(len(tickers))
    names = pa.DictionaryArray.from_arrays(
        pa.array(np.repeat(np.arange(len(tickers), dtype=np.int32), minutes)),
        pa.array(list(tickers)),
    ).cast(pa.string())
    symbols = pa.array([t.partition(":")[2] for t in tickers])
    open_us = np.tile(start_ms * 1000 + np.arange(minutes) * MINUTE_MS * 1000, len(tickers))
    close = 100.0 + rng.random(n)
    return pa.table(
        {
            Ohlc.TICKER: names,
            Ohlc.EXCHANGE: pa.array(np.full(n, "BINANCE", dtype=object), pa.string()),
            Ohlc.SYMBOL: pa.DictionaryArray.from_arrays(
                pa.array(np.repeat(np.arange(len(tickers), dtype=np.int32), minutes)), symbols
            ).cast(pa.string()),
            Ohlc.PERIOD_SECONDS: pa.array(np.full(n, PERIOD, dtype=np.int32)),
            Ohlc.OPEN_TIME: pa.array(open_us).cast(records.UTC_US),
            Ohlc.OPEN: close - 0.1,
            Ohlc.HIGH: close + 0.2,
            Ohlc.LOW: close - 0.3,
            Ohlc.CLOSE: close,
            Ohlc.VOLUME: rng.random(n) * 10,
            Ohlc.TRADE_COUNT: rng.integers(1, 500, n),
            Ohlc.SOURCE: pa.array(np.full(n, records.SOURCE_HISTORY, dtype=object), pa.string()),
            Ohlc.REQUEST_ID: pa.nulls(n, pa.string()),
            Ohlc.INGESTED_AT: pa.array(open_us + 61_000_000).cast(records.UTC_US),
            Ohlc.QUOTE_VOLUME: rng.random(n) * 1000,
            Ohlc.TAKER_BUY_VOLUME: rng.random(n) * 5,
            Ohlc.TAKER_BUY_QUOTE_VOLUME: rng.random(n) * 500,
            Ohlc.INCOMPLETE: pa.nulls(n, pa.bool_()),
        }
    ).cast(records.OHLC_SCHEMA)


def closed(tickers: Sequence[str], open_ms: int) -> pa.Table:
    """One closed live 1m candle per ticker, opening at ``open_ms``, as candles-store
    decodes them (`live_ohlc_rows`), in ticker order."""
    n = len(tickers)
    close = np.linspace(100.0, 101.0, n)
    rows = pa.table(
        {
            Ohlc.TICKER: pa.array(list(tickers)),
            Ohlc.EXCHANGE: pa.array(["BINANCE"] * n),
            Ohlc.SYMBOL: pa.array([t.partition(":")[2] for t in tickers]),
            Ohlc.PERIOD_SECONDS: pa.array([PERIOD] * n, pa.int32()),
            Ohlc.OPEN_TIME: pa.array([open_ms * 1000] * n).cast(records.UTC_US),
            Ohlc.OPEN: close,
            Ohlc.HIGH: close + 0.1,
            Ohlc.LOW: close - 0.1,
            Ohlc.CLOSE: close,
            Ohlc.VOLUME: np.ones(n),
            Ohlc.TRADE_COUNT: pa.array([3] * n, pa.int64()),
            Ohlc.INCOMPLETE: pa.array([False] * n),
        }
    )
    return live_ohlc_rows(rows)


class TimedLake(Lake):
    """The pipeline's `Lake`, its probe for stored candles timed apart (the scan only:
    since 4b052f3 the table's load before it is shared with the append; ``skip_probe``: not
    run, the range taken as empty, as it is here: at 1,000 series the probe's expression
    of one term per series is deeper than Python's recursion limit)."""

    probe_s: float = 0.0
    skip_probe: bool = False

    def _stored_candles(self, table: Table, series: list[tuple[str, int, int, int]]) -> pa.Table:
        started = time.perf_counter()
        try:
            return pa.table({}) if self.skip_probe else super()._stored_candles(table, series)
        finally:
            self.probe_s = time.perf_counter() - started


@dataclass
class Commit:
    tickers: int
    layout: str
    seq: int
    seconds: float
    probe_s: float
    files: int
    how: str
    load1: float


@dataclass
class Bench:
    """The run's tables (one namespace), how they are written and what commits took."""

    namespace: str
    endpoints: StackEndpoints
    spark: SparkSession
    commits: list[Commit] = field(default_factory=list)

    def __post_init__(self) -> None:
        #: The driver's pyiceberg client, as the pipeline's (`Lake`'s appends and probes).
        self.tables = ArrowAppends(
            self.endpoints.catalog_name, self.endpoints.pyiceberg_catalog_properties()
        )

    def names(self, label: str) -> TableNames:
        return TableNames(self.endpoints.catalog_name, self.namespace, ohlc_table=label)

    def create(self, label: str, layout: Layout) -> TimedLake:
        """The table, as the pipeline's Spark session makes it, with the layout's order."""
        names = self.names(label)
        schema = dataclasses.replace(Ohlc.SCHEMA, partitioning=layout.partitioning)
        self.spark.sql(create_table(names.ohlc, schema))
        if layout.ordered:
            self.spark.sql(
                f"ALTER TABLE {names.ohlc} WRITE LOCALLY ORDERED BY {Ohlc.TICKER}, {Ohlc.OPEN_TIME}"
            )
        if layout.properties:
            props = ", ".join(f"'{k}' = '{v}'" for k, v in layout.properties.items())
            self.spark.sql(f"ALTER TABLE {names.ohlc} SET TBLPROPERTIES ({props})")
        return TimedLake(self.spark, names, self.tables)

    def commit(
        self, k: int, name: str, label: str, lake_: TimedLake, seq: int, candles: pa.Table
    ) -> Commit:
        load = os.getloadavg()[0]
        started = time.perf_counter()
        how = lake_.write_live(self.spark, candles)
        took = time.perf_counter() - started
        table = self.tables.load(f"{self.namespace}.{label}")
        snapshot = table.current_snapshot()
        assert snapshot is not None and snapshot.summary is not None
        files = int(snapshot.summary.get("added-data-files", "0"))
        commit = Commit(k, name, seq, took, lake_.probe_s, files, how, load)
        self.commits.append(commit)
        return commit

    def data_files(self, label: str) -> int:
        return len(list(self.tables.load(f"{self.namespace}.{label}").scan().plan_files()))


def med(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def spread(values: Sequence[float]) -> str:
    return f"{med(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def run_tickers(
    bench: Bench,
    k: int,
    commits: int,
    layouts: Sequence[str],
    reads: int,
    compact: bool,
    skip_probe: bool = False,
) -> dict[str, Any]:
    """One K: the tables, the fill, the commits, the reads; what it measured."""
    tickers = ticker_names(k)
    reader = tickers[READ_TICKER_INDEX]
    fill_tickers = same_bucket(tickers, reader)
    minutes = DAYS * 24 * 60
    fill = history(fill_tickers, HISTORY_START_MS, minutes)
    labels = {name: f"ohlc_{name.replace('-', '_')}_{k}" for name in layouts}
    lakes: dict[str, TimedLake] = {}
    for name, label in labels.items():
        lakes[name] = bench.create(label, LAYOUTS[name])
        lakes[name].skip_probe = skip_probe
        started = time.perf_counter()
        bench.tables.append(f"{bench.namespace}.{label}", fill)
        print(
            f"K={k} {name}: filled {fill.num_rows:,} rows of {len(fill_tickers)} tickers "
            f"({bench.data_files(label)} files) in {time.perf_counter() - started:.1f} s",
            flush=True,
        )
    live_start = HISTORY_START_MS + minutes * MINUTE_MS
    for seq in range(commits):
        candles = closed(tickers, live_start + seq * MINUTE_MS)
        shift = seq % len(layouts)
        for name in [*layouts[shift:], *layouts[:shift]]:
            c = bench.commit(k, name, labels[name], lakes[name], seq, candles)
            print(
                f"K={k} commit {seq + 1:>2} {name:<14} {c.seconds:6.2f} s (probe "
                f"{c.probe_s:5.2f} s) {c.files:>5} files, {c.how}, load {c.load1:.1f}",
                flush=True,
            )
    end_ms = live_start + commits * MINUTE_MS
    expected = minutes + commits
    result: dict[str, Any] = {"tickers": k, "commits": commits, "fill_tickers": len(fill_tickers)}

    def measure_reads(stage: str) -> None:
        client = IcebergReader(
            bench.endpoints.pyiceberg_catalog_properties(),
            catalog_name=bench.endpoints.catalog_name,
        )
        paths: dict[str, Callable[[], int]] = {}
        for name, label in labels.items():
            table_name = f"{bench.namespace}.{label}"

            def sdk(table_name: str = table_name) -> int:
                rows = client.read_ohlc(table_name, reader, PERIOD, HISTORY_START_MS, end_ms)
                return int(rows.num_rows)

            def count(table_name: str = table_name) -> int:
                # What `Lake.count_request_rows` runs for a stored answer.
                table = bench.tables.load(table_name)
                snapshot = table.current_snapshot()
                assert snapshot is not None
                return row_counts.count(
                    table, snapshot.snapshot_id, reader, PERIOD, HISTORY_START_MS, end_ms
                )

            paths[f"{name} client read"] = sdk
            paths[f"{name} stored-answer count"] = count
        load: list[float] = [os.getloadavg()[0]]
        times, counts = alternating_rounds(paths, reads, load)
        assert set(counts.values()) == {expected}, counts
        files = {name: bench.data_files(label) for name, label in labels.items()}
        result[f"reads_{stage}"] = times
        result[f"files_{stage}"] = files
        result[f"load_{stage}"] = (min(load), max(load))
        print(f"K={k} reads {stage}: data files {files}, load {min(load):.1f}-{max(load):.1f}")
        for label, ts in times.items():
            print(f"  {label:<32} {spread(ts)} s")

    measure_reads("after_commits")
    if compact:
        cfg = UpkeepConfig()
        for name, label in labels.items():
            steps = [
                s
                for s in upkeep.plan(bench.names(label), cfg, int(time.time() * 1000))
                if s.action == "rewrite_data_files" and s.table.endswith(f".{label}")
            ]
            started = time.perf_counter()
            for step in steps:
                bench.spark.sql(step.sql).collect()
            print(f"K={k} {name}: compacted in {time.perf_counter() - started:.1f} s")
        measure_reads("after_compaction")
    return result


def summary(bench: Bench, results: list[dict[str, Any]], layouts: Sequence[str]) -> str:
    """Markdown: commits per K and layout, reads per stage, ratios to ``current``."""
    lines = [
        "| K | layout | commit s, median (min-max) | probe s | data files per commit "
        "| commit / current |",
        "|---:|---|---|---:|---:|---:|",
    ]
    for result in results:
        k = result["tickers"]
        base = med([c.seconds for c in bench.commits if c.tickers == k and c.layout == "current"])
        for name in layouts:
            cs = [c for c in bench.commits if c.tickers == k and c.layout == name]
            seconds = [c.seconds for c in cs]
            lines.append(
                f"| {k:,} | {name} | {spread(seconds)} | {med([c.probe_s for c in cs]):.3f} "
                f"| {med([c.files for c in cs]):.0f} | {med(seconds) / base:.2f} |"
            )
    lines += [
        "",
        "| K | stage | layout | data files | client read s | read / current "
        "| stored-answer count s | count / current |",
        "|---:|---|---|---:|---|---:|---|---:|",
    ]
    for result in results:
        for stage in ("after_commits", "after_compaction"):
            times = result.get(f"reads_{stage}")
            if times is None:
                continue
            read0 = med(times["current client read"]) if "current" in layouts else float("nan")
            count0 = med(times["current stored-answer count"]) if "current" in layouts else 0
            for name in layouts:
                read, count = times[f"{name} client read"], times[f"{name} stored-answer count"]
                lines.append(
                    f"| {result['tickers']:,} | {stage.replace('_', ' ')} | {name} "
                    f"| {result[f'files_{stage}'][name]:,} | {spread(read)} "
                    f"| {med(read) / read0:.2f} | {spread(count)} | {med(count) / count0:.2f} |"
                )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tickers", type=int, nargs="+", default=[200, 1000])
    parser.add_argument("--commits", type=int, nargs="+", default=[20, 8], help="per --tickers")
    parser.add_argument("--layouts", nargs="+", choices=list(LAYOUTS), default=list(LAYOUTS))
    parser.add_argument("--reads", type=int, default=5)
    parser.add_argument("--compact", action="store_true")
    parser.add_argument("--skip-probe", action="store_true", help="the append alone")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if len(args.commits) != len(args.tickers):
        parser.error("--commits takes one count per --tickers")
    tag = uuid.uuid4().hex[:6]
    with (
        tempfile.TemporaryDirectory(prefix="bench-partitions-") as tmp,
        lake(Path(tmp) / "lake") as endpoints,
    ):
        namespace = f"bench_partitions_{tag}"
        settings, spark = local_session(endpoints, namespace, Path(tmp))
        bench = Bench(namespace, endpoints, spark)
        spark.sql(create_namespace(TableNames(settings.catalog.name, namespace)))
        results = []
        try:
            for k, commits in zip(args.tickers, args.commits, strict=True):
                results.append(
                    run_tickers(
                        bench, k, commits, args.layouts, args.reads, args.compact, args.skip_probe
                    )
                )
        finally:
            print()
            print(f"local[2] on {os.cpu_count()} cores")
            print(summary(bench, results, args.layouts))
            if args.json:
                args.json.write_text(
                    json.dumps(
                        {
                            "results": results,
                            "commits": [dataclasses.asdict(c) for c in bench.commits],
                        },
                        indent=1,
                    )
                )
            spark.stop()


if __name__ == "__main__":
    main()
