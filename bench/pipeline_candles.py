"""Closed candles: window end -> OHLC(closed=true) on a SUB of the pipeline's PUB.

A producer process writes Tick records at a steady rate over `--tickers` tickers,
trade time = wall clock at produce time. A SUB records every OHLC; latency of a
window = receive time of its first `closed=true` message - window end (wall
clock; trade times are wall clock too). Only windows that lie entirely inside
the produce interval count. After the producer stops, the script waits for the
last windows, then checks the outcome against Iceberg: every window with trades
published closed exactly once (corrections aside), and its final published
values equal to the stored `ohlc` row and to the candle built from the stored
`ticks` (tests/oracles/candle_oracle.py, the tests' definition).

Cases run one after the other on the same stack (same machine, same load
window), each a fresh pipeline on its own topics and namespace:

    .venv/bin/python bench/pipeline_candles.py [--seconds 150] [--tickers 20]
        [--rate 200] [--periods 10 60] [--case NAME=K=V,K=V ...] [--stack-dir .data]

Default case: `engine` (the live engine: closing on event time / idle timeout,
previews per poll); add cases to compare settings, e.g.
`idle05=PIPELINE_LIVE__CLOSE_IDLE_S=0.5`.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import importlib
import multiprocessing as mp
import os
import sys
import time
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any

from pipeline_common import (
    WAIT_S,
    PipelineProcess,
    median,
    percentile,
    produce_ticks,
    stack,
    workdir,
)

from infra.testing import Subscriber
from mdproto.messages import OHLC, Tick

ORACLES = Path(__file__).resolve().parents[1] / "services/spark-pipeline/tests/oracles"
DEFAULT_CASES = ["engine="]


def tickers(n: int) -> list[str]:
    return [f"BENCH:T{i:03d}/USDT" for i in range(n)]


def group_cpu_s(pgid: int) -> float:
    """CPU seconds (user + system) of every live process in a process group."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after "(comm)": state, ppid, pgrp, ...
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def values(c: Any) -> tuple[float, ...]:
    return (c.open, c.high, c.low, c.close, c.volume, float(c.trade_count))


def measure(
    pipeline: PipelineProcess, names: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    prefixes = [f"{t}|ohlc:".encode() for t in names]
    collector = Subscriber(pipeline.pub_endpoint, prefixes, wait_s=WAIT_S)
    time.sleep(1.0)  # the subscription reaches the PUB
    ctx = mp.get_context("spawn")
    done: Queue[int] = ctx.Queue()
    produced: Queue[list[tuple[str, int]]] = ctx.Queue()
    start_ms = time.time_ns() // 1_000_000
    prod = ctx.Process(
        target=produce_ticks,
        args=(
            pipeline.endpoints.kafka_bootstrap,
            pipeline.ticks_topic,
            names,
            args.rate,
            args.seconds,
            done,
            produced,
        ),
    )
    prod.start()
    trade_times = produced.get()  # before join: a child blocks until its queue is drained
    prod.join()
    sent = done.get()
    stop_ms = time.time_ns() // 1_000_000
    # Windows entirely inside the produce interval.
    windows = {
        (t, p, s)
        for p in args.periods
        for s in range(start_ms - start_ms % (p * 1000) + p * 1000, stop_ms, p * 1000)
        if s + p * 1000 <= stop_ms
        for t in names
    }
    last_end = max(s + p * 1000 for _, p, s in windows)

    def closed(t: str, p: int, s: int) -> bool:
        return any(
            isinstance(m, OHLC)
            and m.closed
            and (m.ticker, m.period_seconds, m.open_time_ms) == (t, p, s)
            for m in (r.message for r in collector.received)
        )

    # Every window closed, or give up after the baseline's worst case and a margin.
    deadline = time.monotonic() + args.wait
    while time.monotonic() < deadline:
        if all(closed(t, p, s) for t, p, s in windows if s + p * 1000 == last_end):
            break
        time.sleep(1.0)
    time.sleep(2.0)  # stragglers and corrections
    collector.close()
    first: dict[tuple[str, int, int], float] = {}
    final: dict[tuple[str, int, int], OHLC] = {}
    published: dict[tuple[str, int, int], int] = {}
    corrections = 0
    for received in collector.received:
        at, m = received.at, received.message
        if not isinstance(m, OHLC) or not m.closed:
            continue
        key = (m.ticker, m.period_seconds, m.open_time_ms)
        if getattr(m, "correction", False):
            corrections += 1
        else:
            published[key] = published.get(key, 0) + 1
            first.setdefault(key, at)
        final[key] = m
    result: dict[str, Any] = {
        "sent": sent,
        "windows": len(windows),
        "corrections": corrections,
        "received_ohlc": len(collector.received),
        "received_closed": sum(1 for r in collector.received if getattr(r.message, "closed", 0)),
    }
    for period in args.periods:
        lat = [
            (first[k] * 1000 - (k[2] + period * 1000)) / 1000
            for k in windows
            if k[1] == period and k in first
        ]
        result[f"p50_{period}"] = percentile(lat, 50)
        result[f"p99_{period}"] = percentile(lat, 99)
        result[f"max_{period}"] = max(lat) if lat else float("nan")
        result[f"n_{period}"] = len(lat)
    previews = preview_latencies(collector.received, trade_times)
    result["preview_p50"] = percentile(previews, 50)
    result["preview_p99"] = percentile(previews, 99)
    result["missing"] = sum(1 for k in windows if k not in first)
    result["duplicated"] = sum(1 for k in windows if published.get(k, 0) > 1)
    result.update(check_lake(pipeline, windows, final))
    return result


def preview_latencies(received: list[Any], trade_times: list[tuple[str, int]]) -> list[float]:
    """Seconds from the newest trade a preview holds to the preview's arrival.

    A preview (`closed=false`) with `trade_count` n holds its window's first n
    trades of the ticker (one Kafka key per ticker, so they arrive in order); the
    n-th one's produce time is when the update became possible.
    """
    by_ticker: dict[str, list[int]] = {}
    for ticker, at_ms in trade_times:
        by_ticker.setdefault(ticker, []).append(at_ms)
    latencies = []
    for r in received:
        m = r.message
        if not isinstance(m, OHLC) or m.closed or m.trade_count <= 0:
            continue
        times = by_ticker.get(m.ticker, [])
        first = bisect.bisect_left(times, m.open_time_ms)
        newest = first + m.trade_count - 1
        end = m.open_time_ms + m.period_seconds * 1000
        if newest < len(times) and times[newest] < end:
            latencies.append(r.at - times[newest] / 1000)
    return latencies


def check_lake(
    pipeline: PipelineProcess, windows: set[tuple[str, int, int]], final: dict[Any, OHLC]
) -> dict[str, int]:
    """Published (final) values == stored ohlc row == candle of the stored ticks."""
    from pyiceberg.catalog import load_catalog

    sys.path.insert(0, str(ORACLES))
    aggregate = importlib.import_module("candle_oracle").aggregate

    endpoints = pipeline.endpoints
    catalog = load_catalog(endpoints.catalog_name, **endpoints.pyiceberg_catalog_properties())
    # ticks-persist commits on its own trigger: wait until the stored ticks stop growing.
    ticks_table = f"{pipeline.namespace}.ticks"
    count, stable_since = -1, time.monotonic()
    while time.monotonic() - stable_since < 12:
        n = len(catalog.load_table(ticks_table).scan().to_arrow())
        if n != count:
            count, stable_since = n, time.monotonic()
        time.sleep(2)
    rows = catalog.load_table(ticks_table).scan().to_arrow().to_pylist()
    trades = [
        Tick(
            ticker=r["ticker"],
            trade_id=r["trade_id"],
            price=r["price"],
            amount=r["amount"],
            timestamp_ms=int(r["trade_time"].timestamp() * 1000),
        )
        for r in rows
    ]
    periods = sorted({p for _, p, _ in windows})
    reference = {
        (c.ticker, c.period_seconds, c.open_time_ms): c for c in aggregate(trades, periods)
    }
    stored = {
        (r["ticker"], r["period_seconds"], int(r["open_time"].timestamp() * 1000)): r
        for r in catalog.load_table(f"{pipeline.namespace}.ohlc").scan().to_arrow().to_pylist()
    }
    bad_published = bad_stored = 0
    for key in windows:
        ref = reference.get(key)
        if ref is None:
            continue
        got = final.get(key)
        if got is None or values(got) != values(ref):
            bad_published += 1
        row = stored.get(key)
        if row is None or (
            row["open"],
            row["high"],
            row["low"],
            row["close"],
            row["volume"],
            float(row["trade_count"]),
        ) != values(ref):
            bad_stored += 1
    return {"published_differs": bad_published, "stored_differs": bad_stored}


def run(args: argparse.Namespace) -> None:
    names = tickers(args.tickers)
    with (
        stack(args.stack_dir) as endpoints,
        workdir(args.workdir) as tmp,
        contextlib.ExitStack() as cleanup,
    ):
        results: dict[str, list[dict[str, Any]]] = {}
        for _ in range(args.reps):
            for case in args.case:
                name, _, env = case.partition("=")
                overrides = dict(kv.split("=", 1) for kv in env.split(",") if kv)
                pipeline = PipelineProcess(
                    endpoints,
                    Path(tmp),
                    {
                        "PIPELINE_HISTORY__ENABLED": "false",
                        "PIPELINE_KAFKA__STARTING_OFFSETS": "latest",
                        "PIPELINE_LIVE__PERIODS": str(args.periods),
                        **overrides,
                    },
                )
                cleanup.callback(pipeline.stop)
                started = time.perf_counter()
                pipeline.start()
                print(f"{name}: ready in {time.perf_counter() - started:.1f} s", flush=True)
                assert pipeline.process is not None
                cpu = group_cpu_s(pipeline.process.pid)
                time.sleep(args.warmup)
                idle_cpu = (group_cpu_s(pipeline.process.pid) - cpu) / args.warmup
                load = os.getloadavg()[0]
                r = measure(pipeline, names, args)
                r["idle_cpu"] = idle_cpu
                r["load"] = (load + os.getloadavg()[0]) / 2
                pipeline.stop()
                results.setdefault(name, []).append(r)
                print(f"  {name}: {r}", flush=True)
        print()
        cols = "".join(f" {f'p50/p99/max {p}s (s)':>24}" for p in args.periods)
        print(
            f"{'case':<12}{cols} {'windows':>8} {'missing':>8} {'dup':>4} {'corr':>5} "
            f"{'pub!=ref':>8} {'row!=ref':>8} {'load':>5} {'idle cpu':>8} "
            f"{'preview p50/p99 (s)':>20}"
        )
        for name, rs in results.items():
            cells = "".join(
                f" {median([r[f'p50_{p}'] for r in rs]):7.2f}/"
                f"{median([r[f'p99_{p}'] for r in rs]):6.2f}/"
                f"{median([r[f'max_{p}'] for r in rs]):6.2f}    "
                for p in args.periods
            )
            print(
                f"{name:<12}{cells} {sum(r['windows'] for r in rs):8d} "
                f"{sum(r['missing'] for r in rs):8d} {sum(r['duplicated'] for r in rs):4d} "
                f"{sum(r['corrections'] for r in rs):5d} "
                f"{sum(r['published_differs'] for r in rs):8d} "
                f"{sum(r['stored_differs'] for r in rs):8d} "
                f"{median([r['load'] for r in rs]):5.1f} "
                f"{median([r['idle_cpu'] for r in rs]):8.2f} "
                f"{median([r['preview_p50'] for r in rs]):9.2f}/"
                f"{median([r['preview_p99'] for r in rs]):.2f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=150.0)
    parser.add_argument("--tickers", type=int, default=20)
    parser.add_argument("--rate", type=int, default=200, help="ticks/s over all tickers")
    parser.add_argument("--periods", type=int, nargs="+", default=[10, 60])
    parser.add_argument(
        "--warmup", type=float, default=20.0, help="idle, after the pipeline is ready (CPU)"
    )
    parser.add_argument("--wait", type=float, default=90.0, help="for the last windows")
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--case", nargs="+", default=DEFAULT_CASES, help="NAME=K=V,K=V")
    parser.add_argument("--stack-dir", type=Path, help="use the stack started with this dir")
    parser.add_argument("--workdir", type=Path, help="keep the pipeline's logs here")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
