"""One pyiceberg append as a table's history grows: pyiceberg's own transaction beside the
pipeline's `MetadataOnce` (ADR 0029).

On a fresh local stack (Iceberg REST catalog + SeaweedFS S3), two new tables of the
same schema take ``--commits`` appends of the same ``--rows`` rows each, one after the
other in alternating order: one through ``Table.append`` (pyiceberg's `Transaction`,
which rebuilds and deep-copies the table metadata, every snapshot it keeps, at each
read), the other through the pipeline's `ArrowAppends.append`. Nothing expires the
snapshots, as within the hour the pipeline keeps them (``upkeep.snapshot_retain_s``).

Per window of ``--window`` commits: the median wall time of an append and this
process's CPU time per append (the catalog and S3 store run in their own processes),
and the ratio pyiceberg / pipeline.

    .venv/bin/python bench/append_commits.py [--commits 300] [--window 50] [--rows 1]
        [--stack-dir .data]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from pipeline_common import stack
from pyiceberg.catalog import load_catalog

from pipeline.arrow_appends import ArrowAppends


@dataclass
class Laps:
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    def timed(self, append: Callable[[], object]) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        append()
        self.cpu.append(time.process_time() - cpu)
        self.wall.append(time.perf_counter() - wall)

    def window(self, start: int, end: int) -> tuple[float, float]:
        """Median wall ms and mean CPU ms of the appends in [start, end)."""
        return (
            statistics.median(self.wall[start:end]) * 1000,
            statistics.fmean(self.cpu[start:end]) * 1000,
        )


def rows(count: int) -> pa.Table:
    """``count`` rows shaped like the pipeline's ``requests`` row (ids, times, a count)."""
    return pa.table(
        {
            "request_id": [uuid.uuid4().hex for _ in range(count)],
            "ticker": ["BINANCE:BTC/USDT"] * count,
            "snapshot_id": pa.array(range(count), pa.int64()),
            "completed_at_ms": pa.array([1_764_000_000_000] * count, pa.int64()),
            "row_count": pa.array([1440] * count, pa.int64()),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--commits", type=int, default=300, help="appends to each table")
    parser.add_argument("--window", type=int, default=50, help="appends per row of the table")
    parser.add_argument("--rows", type=int, default=1, help="rows per append")
    parser.add_argument("--stack-dir", type=Path, help="use the stack started with this dir")
    args = parser.parse_args()
    batch = rows(args.rows)
    with stack(args.stack_dir) as endpoints:
        properties = endpoints.pyiceberg_catalog_properties()
        appends = ArrowAppends(endpoints.catalog_name, properties)
        catalog = load_catalog(endpoints.catalog_name, **properties)
        namespace = f"bench_appends_{uuid.uuid4().hex[:8]}"
        catalog.create_namespace(namespace)
        plain = catalog.create_table(f"{namespace}.pyiceberg", batch.schema)
        catalog.create_table(f"{namespace}.pipeline", batch.schema)
        pipeline_table = appends.load(f"{namespace}.pipeline")
        laps = {"pyiceberg": Laps(), "pipeline": Laps()}
        ways: dict[str, Callable[[], object]] = {
            "pyiceberg": lambda: plain.append(batch),
            "pipeline": lambda: appends.append(f"{namespace}.pipeline", batch, pipeline_table),
        }
        print("| snapshots | pyiceberg ms (CPU ms) | pipeline ms (CPU ms) | pyiceberg / pipeline |")
        print("|---|---:|---:|---:|")
        for i in range(args.commits):
            order = ("pyiceberg", "pipeline") if i % 2 else ("pipeline", "pyiceberg")
            for name in order:
                laps[name].timed(ways[name])
            if (i + 1) % args.window == 0:
                start = i + 1 - args.window
                ours = laps["pipeline"].window(start, i + 1)
                theirs = laps["pyiceberg"].window(start, i + 1)
                print(
                    f"| {start + 1}-{i + 1} | {theirs[0]:.1f} ({theirs[1]:.1f}) "
                    f"| {ours[0]:.1f} ({ours[1]:.1f}) | {theirs[0] / ours[0]:.2f}x |",
                    flush=True,
                )
        catalog.purge_table(f"{namespace}.pyiceberg")
        catalog.purge_table(f"{namespace}.pipeline")


if __name__ == "__main__":
    main()
