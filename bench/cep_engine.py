"""CEP evaluation cost without Spark: ticks/s with 0 vs N triggers on one ticker.

Two layers, each run with 0 triggers (baseline) and with N (default 10,000)
triggers on the same ticker, side by side on the same tick sequence:

    engine   Engine.on_tick only (condition edges, windows, sequences)
    runner   CepRunner per micro-batch: decode the Kafka rows (protobuf), order
             them, evaluate, publish (no-op), snapshot the engine to disk

The trigger mix, meant to look like alerts (most are far from firing): 40 %
price crossings 1-10 % away from the start price, 20 % PCT_MOVE (1-5 %) and
20 % VOLUME_OVER (1.1-3x the typical window volume), windows 60 s and 300 s,
20 % sequences (below then above, 1-5 % away, within 60 s); half repeating.
Fired one-shot triggers are replaced so N stay registered. The price is a
random walk at 20 trades/s with 0.01 % steps.

    .venv/bin/python bench/cep_engine.py [--ticks 200000] [--triggers 10000] [--batch 1000]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import pyarrow as pa
from google.protobuf.message import Message

from mdproto import envelope
from mdproto.messages import CEPCondition, CEPTriggerRequest, NotifyPattern, Tick
from pipeline.cep.engine import Engine
from pipeline.cep.model import TriggerSpec, spec_from_request
from pipeline.cep.runner import CepRunner
from pipeline.cep.state import SnapshotStore

TICKER = "BINANCE:BTC/USDT"
T0 = 1_700_000_000_000
TOPIC = "cep.triggers"


def make_ticks(n: int, seed: int = 7) -> list[tuple[str, int, float, float]]:
    """A random walk at 20 trades/s: (trade_id, time_ms, price, amount)."""
    rng = random.Random(seed)
    price = 100.0
    out = []
    for i in range(n):
        price *= 1 + rng.gauss(0, 0.0001)
        out.append((str(i), T0 + i * 50, round(price, 4), round(rng.expovariate(1.0), 4)))
    return out


def make_request(i: int, rng: random.Random) -> CEPTriggerRequest:
    def cond(kind: int, threshold: float, window: int = 0) -> CEPCondition:
        return CEPCondition(kind=kind, threshold=threshold, window_seconds=window)  # type: ignore[arg-type]

    roll = rng.random()
    within = 0
    if roll < 0.2:
        conditions = [cond(CEPCondition.PRICE_ABOVE, 100 * (1 + rng.uniform(0.01, 0.1)))]
    elif roll < 0.4:
        conditions = [cond(CEPCondition.PRICE_BELOW, 100 * (1 - rng.uniform(0.01, 0.1)))]
    elif roll < 0.6:
        conditions = [cond(CEPCondition.PCT_MOVE, rng.uniform(1, 5), rng.choice([60, 300]))]
    elif roll < 0.8:
        window = rng.choice([60, 300])
        typical = window * 20  # 20 trades/s of 1.0 on average
        conditions = [cond(CEPCondition.VOLUME_OVER, typical * rng.uniform(1.1, 3), window)]
    else:
        conditions = [
            cond(CEPCondition.PRICE_BELOW, 100 * (1 - rng.uniform(0.01, 0.05))),
            cond(CEPCondition.PRICE_ABOVE, 100 * (1 + rng.uniform(0.01, 0.05))),
        ]
        within = 60
    return CEPTriggerRequest(
        trigger_id=f"t{i}",
        client_id="bench",
        action=CEPTriggerRequest.REGISTER,
        ticker=TICKER,
        conditions=conditions,
        within_seconds=within,
        repeating=rng.random() < 0.5,
        notify=NotifyPattern.NOTIFY_PER_REQUEST,
    )


def specs(n: int) -> list[TriggerSpec]:
    rng = random.Random(11)
    return [spec_from_request(make_request(i, rng)) for i in range(n)]


def bench_engine(
    ticks: list[tuple[str, int, float, float]], triggers: list[TriggerSpec]
) -> dict[str, float]:
    engine = Engine()
    for spec in triggers:
        engine.register(spec, T0)
    spare = iter(specs(len(triggers) * 20)[len(triggers) :])
    fired = 0
    started = time.perf_counter()
    for trade_id, t, price, amount in ticks:
        notices = engine.on_tick(TICKER, trade_id, t, price, amount, T0)
        fired += len(notices)
        for _ in engine.drain_retired():  # keep N registered
            engine.register(next(spare), T0)
    elapsed = time.perf_counter() - started
    return {"ticks_per_s": len(ticks) / elapsed, "events": fired, "active": len(engine)}


def kafka_rows(records: Sequence[tuple[str, bytes, bytes | None, int]]) -> pa.Table:
    return pa.table(
        {
            "topic": pa.array([r[0] for r in records], pa.string()),
            "key": pa.array([r[1] for r in records], pa.binary()),
            "value": pa.array([r[2] for r in records], pa.binary()),
            "timestamp": pa.array([r[3] * 1000 for r in records], pa.timestamp("us", tz="UTC")),
            "partition": pa.array([0] * len(records), pa.int32()),
            "offset": pa.array(range(len(records)), pa.int64()),
        }
    )


def bench_runner(
    ticks: list[tuple[str, int, float, float]], n_triggers: int, batch: int
) -> dict[str, float]:
    rng = random.Random(11)
    registrations = [
        (TOPIC, f"t{i}".encode(), envelope.encode_record(make_request(i, rng)), T0)
        for i in range(n_triggers)
    ]
    tick_rows = [
        (
            "market.ticks",
            TICKER.encode(),
            envelope.encode_record(
                Tick(ticker=TICKER, trade_id=tid, price=p, amount=a, timestamp_ms=t)
            ),
            t,
        )
        for tid, t, p, a in ticks
    ]
    published = 0

    def publish(items: Iterable[tuple[str, Message]]) -> int:
        nonlocal published
        count = sum(1 for _ in items)
        published += count
        return count

    with tempfile.TemporaryDirectory() as tmp:
        runner = CepRunner(
            store=SnapshotStore(Path(tmp)),
            trigger_topic=TOPIC,
            publish=publish,
            retire=lambda ids: None,
            clock=lambda: T0,
        )
        setup = time.perf_counter()
        runner(kafka_rows(registrations), 0)
        setup_s = time.perf_counter() - setup
        batches = [tick_rows[i : i + batch] for i in range(0, len(tick_rows), batch)]
        tables = [kafka_rows(b) for b in batches]
        started = time.perf_counter()
        snapshot = 0
        for batch_id, table in enumerate(tables, start=1):
            report = runner(table, batch_id)
            snapshot = max(snapshot, report.snapshot_bytes)
        elapsed = time.perf_counter() - started
    return {
        "ticks_per_s": len(ticks) / elapsed,
        "ms_per_batch": elapsed / len(tables) * 1000,
        "register_s": setup_s,
        "snapshot_kb": snapshot / 1024,
        "events": published,
    }


def bench_snapshot(ticks: list[tuple[str, int, float, float]], n: int) -> dict[str, float]:
    """Save cost with N triggers: first save (specs too), then an unchanged set (state only)."""
    engine = Engine()
    for spec in specs(n):
        engine.register(spec, T0)
    for trade_id, t, price, amount in ticks[:20_000]:  # fill the 60 s / 300 s windows
        engine.on_tick(TICKER, trade_id, t, price, amount, T0)
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = SnapshotStore(Path(tmp))
        for label, batch_id in (("first", 0), ("unchanged", 1)):
            started = time.perf_counter()
            size = store.save(batch_id, engine)
            out[f"{label}_ms"] = (time.perf_counter() - started) * 1000
            out[f"{label}_kb"] = size / 1024
        started = time.perf_counter()
        loaded = store.load_before(2)
        out["load_ms"] = (time.perf_counter() - started) * 1000
        assert loaded is not None and len(loaded[1]) == len(engine)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ticks", type=int, default=200_000)
    parser.add_argument("--triggers", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=1_000, help="ticks per micro-batch (runner)")
    args = parser.parse_args()
    ticks = make_ticks(args.ticks)
    many = specs(args.triggers)
    print(f"{args.ticks:,} ticks, one ticker, {args.batch:,} ticks per micro-batch\n")
    print("| layer | triggers | ticks/s | ratio | ms/batch | snapshot KB | events |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    base = bench_engine(ticks, [])
    loaded = bench_engine(ticks, many)
    for label, result in (("0", base), (f"{args.triggers:,}", loaded)):
        ratio = result["ticks_per_s"] / base["ticks_per_s"]
        print(
            f"| engine | {label} | {result['ticks_per_s']:,.0f} | {ratio:.2f} | - | - "
            f"| {result['events']:,.0f} |"
        )
    base_r = bench_runner(ticks, 0, args.batch)
    loaded_r = bench_runner(ticks, args.triggers, args.batch)
    for label, result in (("0", base_r), (f"{args.triggers:,}", loaded_r)):
        ratio = result["ticks_per_s"] / base_r["ticks_per_s"]
        print(
            f"| runner | {label} | {result['ticks_per_s']:,.0f} | {ratio:.2f} "
            f"| {result['ms_per_batch']:.1f} | {result['snapshot_kb']:,.0f} "
            f"| {result['events']:,.0f} |"
        )
    print(
        f"\nregistering {args.triggers:,} triggers in one micro-batch: "
        f"{loaded_r['register_s']:.2f} s"
    )
    snap = bench_snapshot(ticks, args.triggers)
    print(
        f"snapshot with {args.triggers:,} triggers: first {snap['first_ms']:.0f} ms "
        f"({snap['first_kb']:,.0f} KB, specs included), unchanged set "
        f"{snap['unchanged_ms']:.0f} ms ({snap['unchanged_kb']:,.0f} KB), "
        f"restore {snap['load_ms']:.0f} ms"
    )


if __name__ == "__main__":
    main()
