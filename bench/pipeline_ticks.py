"""Live path: tick produced to Kafka -> Tick received on a SUB of the pipeline's PUB.

A producer process writes Tick records at a fixed rate (100 and 10,000 ticks/s
by default) over four tickers, stamping `ingested_at_ms` with the wall clock at
produce time; a subscriber process takes `receive time - ingested_at_ms` for
every tick after a warm-up. The pipeline runs with its whole live path (the
live engine: ticks, candles, CEP; the ticks-persist and candles-store queries)
and the history query off.

Baseline, side by side: a bare Python bridge (confluent-kafka consumer ->
mdproto decode -> PUB), the same hops without Spark. Rates alternate between
pipeline and baseline `--reps` times; p50/p99 are medians over reps.

    .venv/bin/python bench/pipeline_ticks.py [--rates 100 10000] [--seconds 20]
        [--reps 2] [--stack-dir .data]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import time
import uuid
from collections.abc import Iterator
from math import nan
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import zmq
from pipeline_common import (
    PipelineProcess,
    cpu_seconds,
    median,
    percentile,
    produce_ticks,
    stack,
    workdir,
)
from pipeline_cost import pipeline_part, scan

from infra.testing import free_port
from mdproto import envelope, topics
from mdproto.messages import Tick
from mdproto.runtime.kafka import consume_ready

TICKERS = ["BINANCE:BTC/USDT", "BINANCE:ETH/USDT", "BINANCE:SOL/USDT", "BINANCE:XRP/USDT"]


def subscriber(endpoint: str, ready: Event, stop: Event, out: Queue[list[float]]) -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 0)
    for ticker in TICKERS:
        sub.setsockopt(zmq.SUBSCRIBE, topics.tick_topic(ticker).encode())
    sub.connect(endpoint)
    # The pipeline answers a subscription with each topic's last value (docs/protocol.md
    # "Sequence numbers and recovery"): a tick from before this subscriber is not a sample.
    since_ms = time.time_ns() // 1_000_000
    ready.set()
    latencies: list[float] = []
    # After `stop`, keep reading until the stream has been quiet for 3 s (the tail).
    while not stop.is_set() or sub.poll(3000):
        if not sub.poll(100):
            continue
        frames = sub.recv_multipart()
        now = time.time_ns() / 1e6
        _, tick = envelope.decode_sub(frames)
        assert isinstance(tick, Tick)
        if tick.ingested_at_ms >= since_ms:
            latencies.append(now - tick.ingested_at_ms)
    out.put(latencies)
    ctx.destroy(linger=0)


def bridge(bootstrap: str, topic: str, endpoint: str, stop: Event) -> None:
    """Baseline: Kafka consumer -> decode -> PUB, nothing else."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "latest",
            "fetch.wait.max.ms": 10,
        }
    )
    consumer.subscribe([topic])
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 100_000)
    pub.bind(endpoint)
    while not stop.is_set():
        for message in consume_ready(consumer, 1000, 0.05):  # no wait once a record is there
            value = message.value()
            if message.error() or value is None:
                continue
            tick = envelope.decode_record(value, Tick)
            pub.send_multipart(envelope.encode_pub(topics.tick_topic(tick.ticker), tick))
    consumer.close()
    ctx.destroy(linger=0)


def measure(
    bootstrap: str,
    topic: str,
    endpoint: str,
    rate: int,
    seconds: float,
    warmup: float,
    *,
    cpu_of: int | None = None,
) -> dict[str, float]:
    """Latencies of the ticks produced after a warm-up; with `cpu_of` (a pid), also that
    process's CPU ms per 1,000 ticks while they were produced (``cpu_ms_per_k``)."""
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    out: Queue[list[float]] = ctx.Queue()
    done: Queue[int] = ctx.Queue()
    sub = ctx.Process(target=subscriber, args=(endpoint, ready, stop, out))
    sub.start()
    ready.wait(30)
    # Warm-up traffic (not measured) so the first batches of a cold query do not count.
    warm = ctx.Process(target=produce_ticks, args=(bootstrap, topic, TICKERS, rate, warmup, done))
    warm.start()
    warm.join()
    done.get()
    stop.set()  # the subscriber drains the warm-up before it returns
    out.get(timeout=60)
    sub.join()
    ready, stop = ctx.Event(), ctx.Event()
    sub = ctx.Process(target=subscriber, args=(endpoint, ready, stop, out))
    sub.start()
    ready.wait(30)
    time.sleep(0.5)  # the SUB's subscription must reach the PUB before ticks flow
    prod = ctx.Process(target=produce_ticks, args=(bootstrap, topic, TICKERS, rate, seconds, done))
    cpu_before = cpu_seconds(cpu_of) if cpu_of is not None else 0.0
    prod.start()
    prod.join()
    cpu_used = cpu_seconds(cpu_of) - cpu_before if cpu_of is not None else nan
    sent = done.get()
    stop.set()
    latencies = out.get(timeout=120)
    sub.join()
    return {
        "sent": float(sent),
        "received": float(len(latencies)),
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "max": max(latencies) if latencies else nan,
        "cpu_ms_per_k": cpu_used * 1e6 / sent if sent else nan,
    }


def pub_server_pid(driver: int) -> int:
    """The pipeline's PUB server process (its live engine), as `pipeline_cost` tells it."""
    found = [
        pid
        for (pid, _), stat in scan().items()
        if stat.ppid == driver and pipeline_part(pid, driver) == "pipeline: PUB server"
    ]
    if len(found) != 1:
        raise RuntimeError(f"expected one PUB server process under {driver}: {found}")
    return found[0]


def run(args: argparse.Namespace) -> None:
    with (
        stack(args.stack_dir) as endpoints,
        workdir(args.workdir) as tmp,
        contextlib.ExitStack() as cleanup,
    ):
        pipeline = PipelineProcess(
            endpoints,
            Path(tmp),
            {
                "PIPELINE_HISTORY__ENABLED": "false",
                "PIPELINE_KAFKA__STARTING_OFFSETS": "latest",
                **dict(kv.split("=", 1) for kv in args.env),
            },
        )
        cleanup.callback(pipeline.stop)  # also when a measurement fails
        started = time.perf_counter()
        pipeline.start()
        print(f"pipeline ready in {time.perf_counter() - started:.1f} s", flush=True)
        bridge_endpoint = f"tcp://127.0.0.1:{free_port()}"
        bridge_topic = f"{pipeline.ticks_topic}.baseline"
        assert pipeline.process is not None
        engine = pub_server_pid(pipeline.process.pid)
        results: dict[str, list[dict[str, float]]] = {}
        for _ in range(args.reps):
            for rate in args.rates:
                r = measure(
                    endpoints.kafka_bootstrap,
                    pipeline.ticks_topic,
                    pipeline.pub_endpoint,
                    rate,
                    args.seconds,
                    args.warmup,
                    cpu_of=engine,
                )
                results.setdefault(f"pipeline {rate}/s", []).append(r)
                print(f"  pipeline {rate}/s: {fmt(r)}", flush=True)
                with bridge_running(
                    endpoints.kafka_bootstrap, bridge_topic, bridge_endpoint
                ) as bridge_pid:
                    r = measure(
                        endpoints.kafka_bootstrap,
                        bridge_topic,
                        bridge_endpoint,
                        rate,
                        args.seconds,
                        args.warmup,
                        cpu_of=bridge_pid,
                    )
                results.setdefault(f"baseline {rate}/s", []).append(r)
                print(f"  baseline {rate}/s: {fmt(r)}", flush=True)
        summary(results, args.rates, ["pipeline"], "baseline")
        print()
        for line in pipeline.log_lines("ticks-publish:")[-5:]:
            print("  " + line.split("pipeline.progress: ", 1)[-1])
        pipeline.stop()


@contextlib.contextmanager
def bridge_running(bootstrap: str, topic: str, endpoint: str) -> Iterator[int]:
    """The baseline bridge in a process of its own, its consumer group joined: its pid."""
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    process = ctx.Process(target=bridge, args=(bootstrap, topic, endpoint, stop))
    process.start()
    try:
        time.sleep(2.0)  # consumer group join
        assert process.pid is not None
        yield process.pid
    finally:
        stop.set()
        process.join(30)


def summary(
    results: dict[str, list[dict[str, float]]], rates: list[int], cases: list[str], baseline: str
) -> None:
    """Medians over reps per case and rate, p99 as a multiple of the baseline's."""
    print()
    print(
        f"{'case':<26} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'recv/sent':>10} {'p99 x':>6}"
        f" {'CPU ms/1k':>10}"
    )
    for rate in rates:
        base = median([r["p99"] for r in results.get(f"{baseline} {rate}/s", [])])
        for case in [f"{c} {rate}/s" for c in [*cases, baseline]]:
            rs = results.get(case, [])
            if not rs:
                continue
            p99 = median([r["p99"] for r in rs])
            print(
                f"{case:<26} {median([r['p50'] for r in rs]):8.1f} {p99:8.1f} "
                f"{median([r['max'] for r in rs]):8.1f} "
                f"{sum(r['received'] for r in rs) / max(1.0, sum(r['sent'] for r in rs)):10.4f} "
                f"{p99 / base:6.1f} {median([r['cpu_ms_per_k'] for r in rs]):10.1f}"
            )


def fmt(r: dict[str, Any]) -> str:
    return (
        f"p50 {r['p50']:.1f} ms, p99 {r['p99']:.1f} ms, max {r['max']:.1f} ms, "
        f"{int(r['received'])}/{int(r['sent'])} received, "
        f"CPU {r['cpu_ms_per_k']:.1f} ms per 1,000 ticks"
    )


def measurement_arguments(parser: argparse.ArgumentParser, seconds: float) -> None:
    """Options every tick-latency benchmark takes (rates, durations, reps, where to run)."""
    parser.add_argument("--rates", type=int, nargs="+", default=[100, 10_000])
    parser.add_argument("--seconds", type=float, default=seconds, help="per measurement")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--stack-dir", type=Path, help="use the stack started with this dir")
    parser.add_argument("--workdir", type=Path, help="keep the logs here")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    measurement_arguments(parser, seconds=20.0)
    parser.add_argument("--env", nargs="*", default=[], help="extra PIPELINE_X=Y settings")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
