"""`Client.recording` on ~1M trades: the manifest path against a projected full scan.

On a fresh local stack (Iceberg REST catalog + SeaweedFS S3), a `market.ticks` table
made from `mdproto.tables.Ticks` (identity(ticker), days(trade_time)) gets `--trades`
trades of 3 BINANCE tickers spread over the last 7 UTC days (today up to now), in
`--appends` pyiceberg appends (time-ordered slices, as micro-batches); `--merge`
sets `commit.manifest-merge.enabled`, so appends merge manifests as the pipeline's
Spark appends do. Then, median of `--reads` runs each:

1. `mdclient.recording.read_recording` for BINANCE (the SDK's path: manifests, rows
   only of files their statistics do not tell; no gaps table: a note);
2. the same summary from a projected scan of `ticker` and `trade_time` of every row;
3. today's rows alone (a `trade_time` filter), what a "today" filter costs by itself.

The two answers must agree.

    .venv/bin/python bench/recording_status.py [--trades 1000000] [--appends 1] [--merge]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
from pyiceberg.catalog import load_catalog
from pyiceberg.expressions import GreaterThanOrEqual
from pyiceberg.transforms import DayTransform, IdentityTransform

from infra.localstack import start_on_free_ports
from mdclient.config import ClientSettings
from mdclient.frames import IcebergReader
from mdclient.recording import RecordingStatus, pieces_from_trades, read_recording, summarise
from mdproto.tables import Ticks, arrow_schema

TICKERS = ("BINANCE:BTC/USDT", "BINANCE:ETH/USDT", "BINANCE:SOL/USDT")
DAYS = 7
DAY_MS = 86_400_000
R = TypeVar("R")


def batch(rows: int, start_ms: int, span_ms: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    micros = pa.array(np.sort(rng.integers(start_ms, start_ms + span_ms, rows)) * 1000)
    times = micros.cast(pa.timestamp("us", tz="UTC"))
    tickers = [TICKERS[i % len(TICKERS)] for i in range(rows)]
    return pa.table(
        {
            Ticks.TICKER: tickers,
            Ticks.EXCHANGE: ["BINANCE"] * rows,
            Ticks.SYMBOL: [t.split(":")[1] for t in tickers],
            Ticks.TRADE_ID: [f"{seed}-{i}" for i in range(rows)],
            Ticks.PRICE: rng.random(rows) * 100,
            Ticks.AMOUNT: rng.random(rows),
            Ticks.SIDE: ["BUY"] * rows,
            Ticks.TRADE_TIME: times,
            Ticks.INGESTED_AT: times,
        },
        schema=arrow_schema(Ticks.SCHEMA),
    )


def timed(call: Callable[[], R], runs: int) -> tuple[str, R]:
    seconds = []
    result = call()  # warm-up
    for _ in range(runs):
        started = time.perf_counter()
        result = call()
        seconds.append(time.perf_counter() - started)
    ms = [s * 1000 for s in seconds]
    return f"{statistics.median(ms):,.0f} ms ({min(ms):,.0f}-{max(ms):,.0f})", result


def rows_of(status: RecordingStatus) -> list[tuple[Any, ...]]:
    return [(m.ticker, m.since_ms, m.last_trade_ms, m.trades_today) for m in status.markets]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trades", type=int, default=1_000_000)
    parser.add_argument("--appends", type=int, default=1)
    parser.add_argument("--merge", action="store_true", help="appends merge manifests")
    parser.add_argument("--reads", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stack = start_on_free_ports(Path(tmp))
        try:
            run(stack.endpoints, args)
        finally:
            stack.down()


def run(e: Any, args: argparse.Namespace) -> None:
    catalog = load_catalog(e.catalog_name, **e.pyiceberg_catalog_properties())
    namespace = f"bench_{uuid.uuid4().hex[:6]}"
    catalog.create_namespace(namespace)
    name = f"{namespace}.ticks"
    props = {"commit.manifest-merge.enabled": "true"} if args.merge else {}
    table = catalog.create_table(name, schema=arrow_schema(Ticks.SCHEMA), properties=props)
    with table.update_spec() as spec:
        spec.add_field(Ticks.TICKER, IdentityTransform())
        spec.add_field(Ticks.TRADE_TIME, DayTransform())
    table = catalog.load_table(name)
    now_ms = int(time.time() * 1000)
    start_ms = now_ms // DAY_MS * DAY_MS - (DAYS - 1) * DAY_MS
    slice_ms = (now_ms - start_ms) // args.appends
    per = args.trades // args.appends
    started = time.perf_counter()
    for k in range(args.appends):
        table.append(batch(per, start_ms + k * slice_ms, slice_ms, k))
    written = time.perf_counter() - started
    table = catalog.load_table(name)
    snapshot = table.current_snapshot()
    assert snapshot is not None
    files = len(list(table.scan().plan_files()))
    manifests = len(snapshot.manifests(table.io))
    print(
        f"{per * args.appends:,} trades, {args.appends} appends: {files} files, "
        f"{manifests} manifests (written in {written:.0f} s)"
    )

    settings = ClientSettings(
        catalog_name=e.catalog_name,
        catalog_uri=e.catalog_uri,
        warehouse=e.warehouse,
        s3_endpoint=e.s3_endpoint,
        s3_access_key=e.s3_access_key,
        s3_secret_key=e.s3_secret_key,
        s3_region=e.s3_region,
        ticks_table=name,
        gaps_table=f"{namespace}.gaps",
    )
    reader = IcebergReader(settings.catalog_properties(), catalog_name=e.catalog_name)

    def sdk() -> RecordingStatus:
        return read_recording(reader, settings, "BINANCE", int(time.time() * 1000))

    def full_scan() -> RecordingStatus:
        scan = catalog.load_table(name).scan(selected_fields=(Ticks.TICKER, Ticks.TRADE_TIME))
        pieces = pieces_from_trades(scan.to_arrow())
        return summarise(pieces, None, exchange="BINANCE", now_ms=int(time.time() * 1000))

    def today_rows() -> int:
        today_us = int(time.time() * 1000) // DAY_MS * DAY_MS * 1000
        scan = catalog.load_table(name).scan(
            row_filter=GreaterThanOrEqual(Ticks.TRADE_TIME, today_us),  # type: ignore[call-arg, arg-type]
            selected_fields=(Ticks.TICKER, Ticks.TRADE_TIME),
        )
        return int(scan.to_arrow().num_rows)

    sdk_time, status = timed(sdk, args.reads)
    scan_time, scanned = timed(full_scan, args.reads)
    today_time, today = timed(today_rows, args.reads)
    assert rows_of(status) == rows_of(scanned), (rows_of(status), rows_of(scanned))
    print("| path | median (min-max) |\n|---|---|")
    print(f'| `recording("BINANCE")` (manifests) | {sdk_time} |')
    print(f"| projected full scan | {scan_time} |")
    print(f"| today's {today:,} rows alone (trade_time filter) | {today_time} |")
    for row in rows_of(status):
        print("  ", *row)


if __name__ == "__main__":
    main()
