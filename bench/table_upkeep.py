"""Table upkeep: read time of a 30-day range after N history requests, before and after.

Issue #15, deliverable 5. On a fresh local stack (Iceberg REST catalog + SeaweedFS
S3; `start_on_free_ports` brings Kafka up too, unused here), in one process:

1. a Spark session built by the pipeline's own `session.build_session` and its
   `Lake.ensure_tables` (the pipeline's DDL: schema, partitioning, properties);
2. N requests, each 2-6 h of 1-minute candles of one ticker at a random place in
   one 30-day range (September 2026: one month partition), written one at a time
   through `Lake.write_history`, the pipeline's history write path (append if the
   range is empty, else MERGE): one Iceberg commit per request, as when each
   request reaches the pipeline in its own micro-batch. Requests overlap. A
   request's last candle is still forming when fetched (half its volume); a later
   request that covers that minute brings the closed candle, so the MERGE updates
   it (position-delete file + new data file), as it does for real;
3. measure: the client read of the whole range (mdclient's `IcebergReader.read_ohlc`,
   the SDK's reader, row filter on ticker/period/open_time; one warm-up, then the
   median of `--reads` runs, time until the Arrow table is in hand), the scan
   planning alone (pyiceberg `plan_files` with the same filter), data files,
   delete files, snapshots, metadata.json, the current snapshot's manifest list
   and manifests, and every object under the table's location;
4. one upkeep round: `pipeline.upkeep.Upkeep.run_once` with the pipeline's default
   `UpkeepConfig` except `snapshot_retain_s` (`--retain-s`, default 0: the state
   once the default hour has passed; with 3600 a fresh table expires nothing);
5. measure again, check the rows read are identical, print a markdown table.

    .venv/bin/python bench/table_upkeep.py [--requests 1000] [--reads 7] [--seed 15]
        [--retain-s 0] [--stack-dir .data]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
from pipeline_common import stack

from infra.artifacts import spark_jars
from infra.localstack import StackEndpoints

TICKER = "BINANCE:BTC/USDT"
PERIOD = 60
MINUTE = 60_000
RANGE_START = int(datetime(2026, 9, 1, tzinfo=UTC).timestamp() * 1000)
RANGE_MINUTES = 30 * 24 * 60  # the 30-day range clients read
RANGE_END = RANGE_START + RANGE_MINUTES * MINUTE


@dataclass(frozen=True, slots=True)
class Request:
    request_id: str
    first: int  # minute index inside the range
    count: int  # candles


def plan_requests(n: int, seed: int) -> list[Request]:
    """`n` requests of 2-6 h at random (reproducible) places inside the range."""
    rng = random.Random(seed)
    requests = []
    for k in range(n):
        count = rng.randint(2 * 60, 6 * 60)
        requests.append(Request(f"upkeep-{k}", rng.randrange(RANGE_MINUTES - count), count))
    return requests


def candle_rows(request: Request, closed: bytearray) -> pa.Table:
    """The request's candles as the pipeline decodes them (records.OHLC_SCHEMA).

    Values depend on the minute only, except a last candle not yet `closed`
    (still forming at fetch time: half the volume); the minutes a request
    brings closed are marked in `closed`.
    """
    from pipeline.records import OHLC_SCHEMA, UTC_US

    minutes = range(request.first, request.first + request.count)
    last = request.first + request.count - 1
    forming = not closed[last]
    for m in minutes[:-1]:
        closed[m] = 1
    opens = [(RANGE_START + m * MINUTE) * 1000 for m in minutes]
    base = [100.0 + (m % 997) / 10 for m in minutes]
    volume = [1.0 + m % 13 for m in minutes]
    if forming:
        volume[-1] /= 2
    else:
        closed[last] = 1
    now = time.time_ns() // 1000
    n = request.count
    return pa.table(
        {
            "ticker": [TICKER] * n,
            "exchange": ["BINANCE"] * n,
            "symbol": ["BTC/USDT"] * n,
            "period_seconds": pa.array([PERIOD] * n, pa.int32()),
            "open_time": pa.array(opens, pa.int64()).cast(UTC_US),
            "open": base,
            "high": [b + 1 for b in base],
            "low": [b - 1 for b in base],
            "close": [b + 0.5 for b in base],
            "volume": volume,
            "trade_count": pa.array([10 + m % 7 for m in minutes], pa.int64()),
            "source": ["history"] * n,
            "request_id": [request.request_id] * n,
            "ingested_at": pa.array([now] * n, pa.int64()).cast(UTC_US),
            "quote_volume": pa.array([None] * n, pa.float64()),
            "taker_buy_volume": pa.array([None] * n, pa.float64()),
            "taker_buy_quote_volume": pa.array([None] * n, pa.float64()),
            "incomplete": pa.array([None] * n, pa.bool_()),
        }
    ).cast(OHLC_SCHEMA)


@dataclass(frozen=True, slots=True)
class Measure:
    read_s: float
    plan_s: float
    rows: int
    scan_tasks: int
    data_files: int
    delete_files: int
    snapshots: int
    metadata_json_bytes: int
    manifests: int  # of the current snapshot: what scan planning reads
    manifest_bytes: int  # manifest list + manifests of the current snapshot
    deleted_entries: int  # manifest entries with status DELETED (2): read, then skipped
    objects: int
    object_bytes: int


def measure(endpoints: StackEndpoints, table_name: str, reads: int) -> tuple[Measure, pa.Table]:
    """Client read time (median of `reads` after one warm-up) and the table's shape."""
    from pyarrow import fs

    from mdclient.frames import IcebergReader, ohlc_filter

    reader = IcebergReader(
        endpoints.pyiceberg_catalog_properties(), catalog_name=endpoints.catalog_name
    )

    def read() -> pa.Table:
        return reader.read_ohlc(table_name, TICKER, PERIOD, RANGE_START, RANGE_END)

    first = read()
    times = []
    for _ in range(reads):
        started = time.perf_counter()
        rows = read()
        times.append(time.perf_counter() - started)
        assert rows.num_rows == first.num_rows
    table = reader.catalog().load_table(table_name)
    plans = []
    for _ in range(reads):
        started = time.perf_counter()
        tasks = list(
            table.scan(row_filter=ohlc_filter(TICKER, PERIOD, RANGE_START, RANGE_END)).plan_files()
        )
        plans.append(time.perf_counter() - started)
    snapshot = table.current_snapshot()
    assert snapshot is not None
    s3 = fs.S3FileSystem(**endpoints.s3_filesystem_options())
    manifest_files = snapshot.manifests(table.io)
    manifests = [snapshot.manifest_list, *(m.manifest_path for m in manifest_files)]
    manifest_bytes = sum(s3.get_file_info(_bucket_path(p)).size or 0 for p in manifests)
    under = fs.FileSelector(_bucket_path(table.location()), recursive=True)
    objects = [info for info in s3.get_file_info(under) if info.type == fs.FileType.File]
    return Measure(
        read_s=statistics.median(times),
        plan_s=statistics.median(plans),
        rows=first.num_rows,
        scan_tasks=len(tasks),
        data_files=len(table.inspect.data_files()),
        delete_files=len(table.inspect.delete_files()),
        snapshots=len(table.inspect.snapshots()),
        metadata_json_bytes=s3.get_file_info(_bucket_path(table.metadata_location)).size or 0,
        manifests=len(manifest_files),
        manifest_bytes=manifest_bytes,
        deleted_entries=table.inspect.entries()["status"].to_pylist().count(2),
        objects=len(objects),
        object_bytes=sum(o.size or 0 for o in objects),
    ), first


def _bucket_path(uri: str) -> str:
    return uri.removeprefix("s3://").removeprefix("s3a://")


def report(before: Measure, after: Measure) -> str:
    """The markdown table: before / after / after-to-before ratio."""
    lines = ["| measure | before upkeep | after upkeep | after / before |", "|---|---:|---:|---:|"]
    rows: list[tuple[str, float, float, str]] = [
        ("client read of 30 days (median, ms)", before.read_s * 1e3, after.read_s * 1e3, ".0f"),
        ("scan planning (median, ms)", before.plan_s * 1e3, after.plan_s * 1e3, ".0f"),
        ("rows read", before.rows, after.rows, "d"),
        ("scan tasks", before.scan_tasks, after.scan_tasks, "d"),
        ("data files", before.data_files, after.data_files, "d"),
        ("delete files", before.delete_files, after.delete_files, "d"),
        ("snapshots", before.snapshots, after.snapshots, "d"),
        ("metadata.json (KiB)", before.metadata_json_bytes / 1024,
         after.metadata_json_bytes / 1024, ".0f"),
        ("manifests of the current snapshot", before.manifests, after.manifests, "d"),
        ("manifest entries of replaced files", before.deleted_entries, after.deleted_entries,
         "d"),
        ("manifest list + manifests (KiB)", before.manifest_bytes / 1024,
         after.manifest_bytes / 1024, ".0f"),
        ("objects under the table", before.objects, after.objects, "d"),
        ("bytes under the table (KiB)", before.object_bytes / 1024, after.object_bytes / 1024,
         ".0f"),
    ]  # fmt: skip
    for label, b, a, fmt in rows:
        ratio = f"{a / b:.2f}" if b else "-"
        lines.append(f"| {label} | {b:{fmt}} | {a:{fmt}} | {ratio} |")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> None:
    from pipeline.arrow_appends import ArrowAppends
    from pipeline.config import UpkeepConfig, load_settings
    from pipeline.lake import Lake, TableNames
    from pipeline.session import build_session
    from pipeline.upkeep import Upkeep

    namespace = f"upkeep_{uuid.uuid4().hex[:8]}"
    with stack(args.stack_dir) as endpoints:
        settings = load_settings(
            catalog={**endpoints.catalog_settings().model_dump(), "namespace": namespace},
            spark={
                "master": "local[2]",
                "jars": [str(j) for j in spark_jars()],
                "driver_memory": "1g",
            },
        )
        c = settings.catalog
        names = TableNames(
            c.name, c.namespace, c.ohlc_table, c.ticks_table, c.requests_table, c.markets_table
        )
        started = time.perf_counter()
        spark = build_session(settings)
        lake = Lake(spark, names, ArrowAppends(c.name, c.pyiceberg_properties()))
        lake.ensure_tables()
        print(f"Spark + tables ready in {time.perf_counter() - started:.1f} s", flush=True)
        try:
            closed = bytearray(RANGE_MINUTES)
            ways: dict[str, int] = {}
            started = time.perf_counter()
            for k, request in enumerate(plan_requests(args.requests, args.seed), 1):
                how = lake.write_history(spark, candle_rows(request, closed)).how
                ways[how] = ways.get(how, 0) + 1
                if k % 50 == 0 or k == args.requests:
                    elapsed = time.perf_counter() - started
                    print(f"  {k} requests written in {elapsed:.0f} s ({ways})", flush=True)
            write_s = time.perf_counter() - started
            covered = sum(closed)
            table_name = names.ohlc_for_clients
            before, rows_before = measure(endpoints, table_name, args.reads)
            print(f"before: {before}", flush=True)
            cfg = UpkeepConfig(snapshot_retain_s=args.retain_s)
            started = time.perf_counter()
            steps = Upkeep(spark, names, cfg).run_once()
            upkeep_s = time.perf_counter() - started
            failed = [s for s in steps if not s.ok]
            for s in steps:
                if s.step.table.endswith(".ohlc"):
                    print(f"  {s.step.action}: {s.seconds:.1f} s, {s.detail}", flush=True)
            after, rows_after = measure(endpoints, table_name, args.reads)
            print(f"after: {after}", flush=True)
        finally:
            spark.stop()
    same = rows_before.sort_by("open_time").equals(rows_after.sort_by("open_time"))
    print()
    print(
        f"{args.requests} requests ({ways}) written in {write_s:.0f} s "
        f"({write_s / args.requests:.2f} s each); {before.rows} distinct minutes stored "
        f"({covered} of them closed); upkeep round {upkeep_s:.0f} s (all four tables)"
        + (
            f", FAILED steps: {[(s.step.table, s.step.action, s.detail) for s in failed]}"
            if failed
            else ""
        )
    )
    print(f"rows read after upkeep identical to before: {same}")
    print(f"load: {os.getloadavg()[0]:.2f} (1 min)")
    print()
    print(report(before, after))
    if not same or failed:
        raise SystemExit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--reads", type=int, default=7, help="timed reads per measurement")
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--retain-s", type=float, default=0.0, help="upkeep snapshot_retain_s")
    parser.add_argument("--stack-dir", type=Path, help="use the stack started with this dir")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
