"""Trade history read: a day of one busy ticker through the SDK against a bare pyiceberg scan.

On a fresh local lake (SeaweedFS S3 + Iceberg REST catalog; no Kafka: nothing here
uses it), tables ``ticks`` and ``gaps`` are made from `mdproto.tables` (ticks:
identity(ticker), day(trade_time), as the pipeline creates them). One UTC day gets
`--trades` trades of BTC/USDT plus `--others` of ETH/USDT and SOL/USDT (half on that
day, half the day after), in `--appends` time-ordered appends: each writes one file
per (ticker, day), as the pipeline's micro-batches and its compaction leave them.

Then, `--reps` rounds, the order alternating each round, over the same day of BTC:

1. `Client.trades(ticker, start, end)` -> Arrow (report + read + time order);
2. `Client.trade_batches(...)`, every record batch consumed (the iterator);
3. bare pyiceberg: ``load_table(...).scan(row_filter=<the SDK's filter>).to_arrow()``.

Medians, min-max and the SDK/bare ratio (of medians, and the median of each round's
own ratio, steadier on a shared machine). `--profile` writes a cProfile of one more
SDK read. The Client connects to a stand-in relay (a bound XPUB and ROUTER that carry
nothing): its constructor needs one, a trade read never uses it.

    .venv/bin/python bench/trade_history.py [--trades 1000000] [--reps 5] [--profile FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import pstats
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import zmq
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, LessThan
from pyiceberg.transforms import DayTransform, IdentityTransform

from infra.localstack import StackConfig, StackEndpoints, start_on_free_ports
from infra.localstack.components import (
    CatalogDatabase,
    Component,
    IcebergRest,
    SeaweedFS,
)
from mdclient import Client, ClientSettings
from mdproto.tables import Gaps, TableSchema, Ticks, arrow_schema

BUSY = "BINANCE:BTC/USDT"
OTHERS = ("BINANCE:ETH/USDT", "BINANCE:SOL/USDT")
DAY_MS = 86_400_000
#: A fixed past UTC day (2023-11-14): the range is whole and closed.
DAY = 1_700_000_000_000 // DAY_MS * DAY_MS


def lake_only(config: StackConfig, endpoints: StackEndpoints) -> list[Component]:
    """S3 and the catalog (its database first): a trade read needs no Kafka."""
    return [
        SeaweedFS(config, endpoints),
        CatalogDatabase(config, endpoints),
        IcebergRest(config, endpoints),
    ]


def trades(ticker: str, rows: int, start_ms: int, span_ms: int, seed: int) -> pa.Table:
    """`rows` trades of `ticker` in [start_ms, start_ms + span_ms), in time order."""
    rng = np.random.default_rng(seed)
    micros = np.sort(rng.integers(start_ms * 1000, (start_ms + span_ms) * 1000, rows))
    times = pa.array(micros).cast(pa.timestamp("us", tz="UTC"))
    exchange, _, symbol = ticker.partition(":")
    ids = pc.cast(pa.array(np.arange(seed * 10**9, seed * 10**9 + rows)), pa.string())
    return pa.table(
        {
            Ticks.TICKER: pa.array(np.full(rows, ticker, dtype=object), pa.string()),
            Ticks.EXCHANGE: pa.array(np.full(rows, exchange, dtype=object), pa.string()),
            Ticks.SYMBOL: pa.array(np.full(rows, symbol, dtype=object), pa.string()),
            Ticks.TRADE_ID: ids,
            Ticks.PRICE: 30_000 + rng.random(rows) * 100,
            Ticks.AMOUNT: rng.random(rows),
            Ticks.SIDE: pa.array(np.where(rng.random(rows) < 0.5, "BUY", "SELL"), pa.string()),
            Ticks.TRADE_TIME: times,
            Ticks.INGESTED_AT: times,
        },
        schema=arrow_schema(Ticks.SCHEMA),
    )


def new_table(catalog: Catalog, name: str, shape: TableSchema) -> None:
    """`shape` as mdproto.tables has it (the pipeline's tables): columns, partitioning."""
    with catalog.create_table(name, schema=arrow_schema(shape)).update_spec() as spec:
        for p in shape.partitioning:
            day = p.transform == "day"
            spec.add_field(p.column, DayTransform() if day else IdentityTransform())


def fill(catalog: Catalog, name: str, busy: int, others: int, appends: int) -> None:
    """`appends` appends, each a time slice of the day (and of the next, for the others)."""
    table = catalog.load_table(name)
    slice_ms = DAY_MS // appends
    for k in range(appends):
        parts = [trades(BUSY, busy // appends, DAY + k * slice_ms, slice_ms, 1 + k)]
        for n, ticker in enumerate(OTHERS):
            for day in (DAY, DAY + DAY_MS):
                seed = 100 + 10 * k + 2 * n + (day != DAY)
                parts.append(
                    trades(ticker, others // appends // 2, day + k * slice_ms, slice_ms, seed)
                )
        table.append(pa.concat_tables(parts))


@contextlib.contextmanager
def stand_in_relay() -> Iterator[tuple[str, str]]:
    """A bound ROUTER and XPUB on free ports (request, market-data endpoints): enough for
    `Client`'s connect handshake; they carry nothing."""
    context = zmq.Context()
    router, xpub = context.socket(zmq.ROUTER), context.socket(zmq.XPUB)
    try:
        request = router.bind_to_random_port("tcp://127.0.0.1")
        market = xpub.bind_to_random_port("tcp://127.0.0.1")
        yield f"tcp://127.0.0.1:{request}", f"tcp://127.0.0.1:{market}"
    finally:
        router.close(linger=0)
        xpub.close(linger=0)
        context.term()


@contextlib.contextmanager
def bench_client(e: StackEndpoints, namespace: str) -> Iterator[Client]:
    """A `Client` reading `namespace`'s ticks and gaps on the lake `e`, connected to a
    stand-in relay."""
    catalog_fields = {
        {"name": "catalog_name", "uri": "catalog_uri"}.get(key, key): str(value)
        for key, value in e.catalog_settings().model_dump().items()
    }
    with stand_in_relay() as (request, market):
        settings = ClientSettings.model_validate(
            {
                **catalog_fields,
                "ticks_table": f"{namespace}.ticks",
                "gaps_table": f"{namespace}.gaps",
                "request_endpoint": request,
                "market_data_endpoint": market,
            }
        )
        with Client(settings=settings) as client:
            yield client


def alternating_rounds(
    paths: dict[str, Callable[[], int]], reps: int, load: list[float]
) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Each path once to warm up (all must count the same rows), then `reps` rounds, the
    order reversed every other round: the seconds of each, and the rows each counted.
    The 1-minute load average is appended to `load` after each round."""
    times: dict[str, list[float]] = {label: [] for label in paths}
    counts = {label: call() for label, call in paths.items()}
    assert len(set(counts.values())) == 1, counts
    for rep in range(reps):
        order = list(paths) if rep % 2 == 0 else list(reversed(paths))
        for label in order:
            took, rows = seconds(paths[label])
            assert rows == counts[label]
            times[label].append(took)
        load.append(os.getloadavg()[0])
        print(f"round {rep + 1}: " + ", ".join(f"{times[k][-1]:.2f} s" for k in paths))
    return times, counts


def seconds(call: Callable[[], int]) -> tuple[float, int]:
    started = time.perf_counter()
    rows = call()
    return time.perf_counter() - started, rows


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trades", type=int, default=1_000_000, help="of the busy ticker")
    parser.add_argument("--others", type=int, default=400_000, help="of each other ticker")
    parser.add_argument("--appends", type=int, default=4)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--profile", type=Path, default=None, help="cProfile one SDK read")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-trade-history-") as tmp, lake(Path(tmp)) as e:
        run(e, args)


@contextlib.contextmanager
def lake(data_dir: Path) -> Iterator[StackEndpoints]:
    """`lake_only` on free ports in `data_dir`, stopped on the way out."""
    stack = start_on_free_ports(data_dir, components=lake_only)
    try:
        yield stack.endpoints
    finally:
        stack.down()


def day_lake(catalog: Catalog, prefix: str, args: argparse.Namespace) -> tuple[str, int]:
    """A new namespace ``<prefix>_<hex>`` with ``ticks`` filled (`fill`, from `args`) and
    ``gaps`` empty (no gap recorded): the ticks table's name and its file count."""
    namespace = f"{prefix}_{uuid.uuid4().hex[:6]}"
    name = f"{namespace}.ticks"
    catalog.create_namespace(namespace)
    new_table(catalog, name, Ticks.SCHEMA)
    new_table(catalog, f"{namespace}.gaps", Gaps.SCHEMA)
    started = time.perf_counter()
    fill(catalog, name, args.trades, args.others, args.appends)
    written = time.perf_counter() - started
    files = len(list(catalog.load_table(name).scan().plan_files()))
    print(f"{name}: {files} files, written in {written:.0f} s", flush=True)
    return name, files


def run(e: StackEndpoints, args: argparse.Namespace) -> None:
    catalog = load_catalog(e.catalog_name, **e.pyiceberg_catalog_properties())
    name, files = day_lake(catalog, "bench_trades", args)
    namespace = name.partition(".")[0]

    start_ms, end_ms = DAY, DAY + DAY_MS
    # The SDK's filter (IcebergReader._trade_scan), written out: the scan's own API.
    row_filter = And(
        EqualTo(Ticks.TICKER, BUSY),  # type: ignore[call-arg, arg-type]
        GreaterThanOrEqual(Ticks.TRADE_TIME, start_ms * 1000),  # type: ignore[call-arg, arg-type]
        LessThan(Ticks.TRADE_TIME, end_ms * 1000),  # type: ignore[call-arg, arg-type]
    )

    def bare() -> int:
        return int(catalog.load_table(name).scan(row_filter=row_filter).to_arrow().num_rows)

    load = [os.getloadavg()[0]]
    with bench_client(e, namespace) as client:

        def sdk() -> int:
            return len(client.trades(BUSY, start_ms, end_ms))

        def batches() -> int:
            return sum(b.num_rows for b in client.trade_batches(BUSY, start_ms, end_ms))

        paths: dict[str, Callable[[], int]] = {
            "SDK Client.trades -> Arrow": sdk,
            "SDK Client.trade_batches (all batches)": batches,
            "bare pyiceberg scan(row_filter).to_arrow()": bare,
        }
        times, counts = alternating_rounds(paths, args.reps, load)
        if args.profile is not None:
            profiler = cProfile.Profile()
            profiler.runcall(sdk)
            profiler.dump_stats(str(args.profile))
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)

    rows = next(iter(counts.values()))
    base = times["bare pyiceberg scan(row_filter).to_arrow()"]
    print(
        f"\n{rows:,} trades of {BUSY} on one day; {files} files; {args.reps} rounds; "
        f"load average (1 min) {min(load):.1f}-{max(load):.1f} on {os.cpu_count()} cores\n"
    )
    print("| path | median (min-max) | x bare (medians) | x bare (median of rounds) |")
    print("|---|---|---:|---:|")
    for label, values in times.items():
        ratio = statistics.median(values) / statistics.median(base)
        paired = statistics.median(v / b for v, b in zip(values, base, strict=True))
        print(f"| {label} | {spread(values)} | {ratio:.2f} | {paired:.2f} |")


if __name__ == "__main__":
    main()
