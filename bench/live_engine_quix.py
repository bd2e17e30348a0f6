"""Quix Streams beside the in-house live engine on the same Kafka (issue #44 item 3, ADR 0016).

Three contenders read the same Tick records (mdproto protobuf, keyed by ticker) from a
3-partition topic on the bench's local Kafka, each in a process of its own:

- ``bare``: a confluent-kafka consumer that decodes every record, nothing else (the
  baseline); ``bare-qv`` is the same code in .venv-quix (Quix's older librdkafka).
- ``engine``: the in-house live engine (pipeline/live_engine.py, unchanged) started
  standalone: CEP and books off, live.periods [60], closed candles to a Kafka topic;
  its ``send_many`` encodes every tick/preview/candle as the PUB server would (no socket).
- ``quix``: a Quix Streams 3.28.1 app: a custom Tick deserializer, event time = trade
  time, a 60 s tumbling window per ticker (open/high/low/close by trade time, volume,
  trade_count), RocksDB state with its changelog topic, ``final(closing_strategy=
  "partition")``, closed candles encoded as mdproto OHLC records to a Kafka topic.

Measurements (contenders alternate, each ``--reps`` times; load average beside each):

1. Saturation: a backlog of ``--backlog`` ticks over ``--tickers`` tickers (trade times
   spread over ``--span-min`` minutes, so windows close during the drain); records/s
   and records per CPU second (the process's, all threads) from its first record to
   the ``--backlog``-th.
2. Recovery: ``--markers`` new ticks after the drain; the time from a restarted
   worker's start (its library's imports included) to having processed them all: the
   bare consumer's group re-join, the engine's per-partition state (ADR 0014; a local
   path here), Quix with its local RocksDB kept and Quix with an empty state dir
   (state restored from the changelog topic, as on another host after a rebalance).
3. Steady rate: ``--rate`` ticks/s over the tickers, trade time = wall clock; tick lag
   at the processor (p50/p99 of processing time - ingested_at) and closed-candle
   latency (arrival of the closed candle on the output topic - window end) of the
   first minute boundary at least 20 s after the contender starts (each run goes on
   ``--tail-s`` past it: a candle later than that is not counted).

Quix runs from its own virtualenv (bench/requirements-quix.txt: its pins conflict with
the project's confluent-kafka and pydantic), made on first use.

    nice -n 10 .venv/bin/python bench/live_engine_quix.py [--backlog 200000] [--tickers 1000]
        [--rate 2000] [--reps 2] [--phases throughput recovery steady] [--stack-dir .data]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pipeline.config import Settings

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-quix"
REQUIREMENTS = ROOT / "bench" / "requirements-quix.txt"
#: constraints.txt lines replaced by requirements-quix.txt's older pins.
UNPINNED = ("confluent-kafka==", "pydantic==", "pydantic_core==", "pydantic-settings==")
PERIOD_S = 60
THROUGHPUT = ["bare", "engine", "quix", "bare-qv"]
RECOVERY = ["bare", "engine", "quix-local", "quix-restore"]
STEADY = ["bare", "engine", "quix"]
FETCH_WAIT_MS = 500  # librdkafka's, the engine's since ADR 0011 "Fetch wait"; every contender's


# -- workers: run in a child interpreter, print one JSON line ------------------------------


class Flag(Protocol):
    """A `threading.Event` or a `multiprocessing` one."""

    def is_set(self) -> bool: ...


class SharedCount(Protocol):
    """A `multiprocessing.Value`: what another process reads of the count."""

    value: int


class Probe:
    """Counts processed records; wall and CPU clocks at the first and at the last one.

    Done at `count` records, at wall time `until`, or (`shared`) once told to stop."""

    def __init__(self, count: int, until: float, since_ms: int) -> None:
        self.count, self.until, self.since_ms = count, until, since_ms
        self.stop: Flag | None = None
        self.progress: SharedCount | None = None
        self.started = time.monotonic()
        self.n = 0
        self.first: tuple[float, float] | None = None
        self.last = (self.started, time.process_time())
        self.lags: list[int] = []

    def shared(self, stop: Flag, progress: SharedCount) -> Probe:
        """Also done once `stop` is set; the count kept in `progress` as it grows, and the
        last clocks those of the last record (read per batch), not of the stop."""
        self.stop, self.progress = stop, progress
        return self

    def seen(self, n: int, ingested_ms: Iterable[int]) -> bool:
        """Record `n` records (their ingestion times); True once the run is done."""
        if n:
            if self.first is None:
                self.first = (time.monotonic(), time.process_time())
            self.n += n
            if self.progress is not None:
                self.progress.value = self.n
                self.last = (time.monotonic(), time.process_time())
            if self.since_ms:
                now = time.time_ns() // 1_000_000
                self.lags.extend(now - i for i in ingested_ms if i >= self.since_ms)
        done = (
            (bool(self.count) and self.n >= self.count)
            or (bool(self.until) and time.time() >= self.until)
            or (self.stop is not None and self.stop.is_set())
        )
        if done and self.progress is None:  # not per record: Quix calls this once per record
            self.last = (time.monotonic(), time.process_time())
        return done

    def result(self) -> dict[str, Any]:
        first = self.first or self.last
        lags = sorted(self.lags)
        return {
            "records": self.n,
            "wall_s": self.last[0] - first[0],
            "cpu_s": self.last[1] - first[1],
            "to_first_s": first[0] - self.started,
            "to_done_s": self.last[0] - self.started,
            "last_at": self.last[0],  # time.monotonic(): one clock for every process
            "lag_n": len(lags),
            "lag_p50": quantile(lags, 50),
            "lag_p99": quantile(lags, 99),
            "lag_max": float(lags[-1]) if lags else math.nan,
        }


def quantile(ordered: list[int] | list[float], q: float) -> float:
    if not ordered:
        return math.nan
    return float(ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))])


def run_bare(a: argparse.Namespace, probe: Probe) -> None:
    """Decode every record; with ``a.pub`` also send each tick on a PUB bound there
    (encode_pub on its tick topic: live_engine_scale.py's floor)."""
    from confluent_kafka import Consumer

    from mdproto import envelope
    from mdproto.messages import Tick

    consumer = Consumer(
        {
            "bootstrap.servers": a.bootstrap,
            "group.id": a.group,
            "auto.offset.reset": a.offset,
            "fetch.wait.max.ms": FETCH_WAIT_MS,
        }
    )
    consumer.subscribe([a.topic])
    send = tick_publisher(a.pub, a.sndhwm) if a.pub else None
    done = False
    while not done:
        values = [m.value() for m in consumer.consume(10_000, 0.05) if m.error() is None]
        ticks = [envelope.decode_record(v or b"", Tick) for v in values]
        if send is not None:
            send(ticks)
        done = probe.seen(len(ticks), (t.ingested_at_ms for t in ticks))
    consumer.close()  # commits: the recovery run resumes after what was read


def tick_publisher(endpoint: str, sndhwm: int) -> Callable[[list[Any]], None]:
    """A PUB bound on `endpoint`; the function sends each tick on its tick topic."""
    import zmq

    from mdproto import envelope, topics

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, sndhwm)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(endpoint)

    def send(ticks: list[Any]) -> None:
        for t in ticks:
            pub.send_multipart(envelope.encode_pub(topics.tick_topic(t.ticker), t))

    return send


def run_engine(a: argparse.Namespace, probe: Probe) -> None:
    """The live engine as the PUB server runs it, its per-batch stats hook counting."""
    from google.protobuf.message import Message

    from mdproto import envelope
    from pipeline import live_engine

    done = count_engine_batches(probe)

    def send_many(items: Iterable[tuple[str, Message]]) -> int:
        return sum(1 for topic, message in items if envelope.encode_pub(topic, message))

    engine = live_engine.LiveEngine(engine_settings(a), send_many)
    engine.start()
    engine.wait_assigned()
    while not done.wait(0.5):
        if not engine.alive:
            raise RuntimeError(f"live engine stopped: {engine.error}")
        if a.until and time.time() >= a.until + 5:  # a quiet stream: no batch to stop on
            break
    engine.stop()  # saves the snapshot the recovery run starts from


def count_engine_batches(probe: Probe) -> threading.Event:
    """Count the records of every consume() batch of the live engines this process starts
    (through their per-batch stats hook); the event is set once the probe is done."""
    from mdproto.messages import Tick
    from pipeline import live_engine

    done = threading.Event()
    base: Any = live_engine._Stats  # the hook every consume() batch passes through

    class Counting(base):  # type: ignore[misc]
        def busy(self, seconds: float, records_: int, fresh: list[Tick]) -> None:
            super().busy(seconds, records_, fresh)
            if probe.seen(records_, (t.ingested_at_ms for t in fresh)):
                done.set()

    live_engine._Stats = Counting  # type: ignore[misc]
    return done


def engine_settings(a: argparse.Namespace) -> Settings:
    """The engine standalone: candles of PERIOD_S only, CEP and books off, closed candles
    to ``a.out``, group ``a.group``, its per-partition state under ``a.state``."""
    from pipeline.config import CepConfig, KafkaConfig, LiveConfig, Settings

    return Settings(
        kafka=KafkaConfig(
            bootstrap_servers=a.bootstrap,
            topic_ticks=a.topic,
            topic_live_candles=a.out,
            starting_offsets=a.offset,
        ),
        # Its consumer group and per-partition state (ADR 0014) on a local path: the
        # bench stack is Kafka alone (the platform's default is the S3 store).
        live=LiveConfig(periods=[PERIOD_S], group_id=a.group, state_location=a.state),
        cep=CepConfig(enabled=False),
        checkpoint_dir=a.state,
    )


def run_quix(a: argparse.Namespace, probe: Probe) -> None:
    from datetime import timedelta

    from quixstreams import Application  # type: ignore[import-not-found]
    from quixstreams.dataframe.windows import (  # type: ignore[import-not-found]
        Count,
        Earliest,
        Latest,
        Max,
        Min,
        Sum,
    )
    from quixstreams.models.serializers import Deserializer  # type: ignore[import-not-found]

    from mdproto import envelope
    from mdproto.messages import OHLC, Tick

    class TickDeserializer(Deserializer):  # type: ignore[misc]
        """mdproto Tick record -> the dict Quix's aggregations read."""

        def __call__(self, value: bytes, ctx: Any) -> dict[str, Any]:
            t = envelope.decode_record(value, Tick)
            return {
                "price": t.price,
                "amount": t.amount,
                "ts": t.timestamp_ms,
                "ingested": t.ingested_at_ms,
            }

    app = Application(
        broker_address=a.bootstrap,
        consumer_group=a.group,
        auto_offset_reset=a.offset,
        state_dir=a.state,
        loglevel="INFO",
        consumer_extra_config={"fetch.wait.max.ms": FETCH_WAIT_MS},
    )
    ticks = app.topic(
        a.topic,
        value_deserializer=TickDeserializer(),
        key_deserializer="str",
        timestamp_extractor=lambda value, _headers, _ts, _type: value["ts"],
    )
    candles = app.topic(a.out, value_serializer="bytes", key_serializer="str")

    def count(value: dict[str, Any]) -> None:
        if probe.seen(1, (value["ingested"],)):
            app.stop()

    def to_ohlc(w: dict[str, Any], ticker: str, _ts: int, _headers: Any) -> bytes:
        return envelope.encode_record(
            OHLC(
                ticker=ticker,
                period_seconds=PERIOD_S,
                open_time_ms=w["start"],
                open=w["open"],
                high=w["high"],
                low=w["low"],
                close=w["close"],
                volume=w["volume"],
                trade_count=w["trade_count"],
                closed=True,
            )
        )

    sdf = app.dataframe(ticks).update(count)
    sdf = (
        sdf.tumbling_window(timedelta(seconds=PERIOD_S))
        .agg(
            open=Earliest("price"),
            high=Max("price"),
            low=Min("price"),
            close=Latest("price"),
            volume=Sum("amount"),
            trade_count=Count(),
        )
        .final(closing_strategy="partition")
    )
    sdf.apply(to_ohlc, metadata=True).to_topic(candles)
    app.run()


def worker(a: argparse.Namespace) -> None:
    probe = Probe(a.count, a.until, a.since_ms)
    {"bare": run_bare, "engine": run_engine, "quix": run_quix}[a.worker](a, probe)
    print(json.dumps(probe.result()), flush=True)


# -- the orchestrator (.venv) --------------------------------------------------------------


class Bench:
    """One run's Kafka, topics, work directory and the contenders' processes."""

    def __init__(self, args: argparse.Namespace, bootstrap: str, tmp: Path) -> None:
        self.args, self.bootstrap, self.tmp = args, bootstrap, tmp
        self.tag = uuid.uuid4().hex[:6]
        self.runs = 0
        self.tickers = [f"BENCH:T{i:04d}/USDT" for i in range(args.tickers)]

    @cached_property
    def quix_python(self) -> Path:
        """.venv-quix's python, made on first use."""
        from pipeline_common import ensure_venv

        return ensure_venv(VENV, REQUIREMENTS, UNPINNED)

    def topic(self, name: str, partitions: int = 3) -> str:
        from confluent_kafka.admin import AdminClient
        from confluent_kafka.cimpl import NewTopic

        full = f"bench-{self.tag}.{name}"
        admin = AdminClient({"bootstrap.servers": self.bootstrap})  # alive until done
        futures = admin.create_topics(
            [NewTopic(full, num_partitions=partitions, replication_factor=1)]
        )
        for future in futures.values():
            future.result(30)
        return full

    def spawn(
        self, kind: str, topic: str, out: str, group: str, state: Path, **opts: Any
    ) -> dict[str, Any]:
        """Run a worker to its end; its JSON result plus the load average before it."""
        python = sys.executable
        if kind.startswith("quix") or kind == "bare-qv":
            python = str(self.quix_python)
        argv = [
            *(python, __file__, "--worker", kind.split("-")[0]),
            *("--bootstrap", self.bootstrap, "--topic", topic, "--out", out),
            *("--group", group, "--state", str(state)),
            *(f"--{k.replace('_', '-')}={v}" for k, v in opts.items()),
        ]
        load = os.getloadavg()[0]
        self.runs += 1
        log = self.tmp / f"{self.runs:02d}-{kind}-{group}.log"
        with log.open("wb") as err:
            done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=err, timeout=1800)
        if done.returncode != 0:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
            raise RuntimeError(f"{kind} worker failed ({done.returncode}):\n{tail}")
        result: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
        result["load1"] = load
        # Quix logs each record it drops as late (a window of its partition already closed).
        result["late"] = log.read_text(errors="replace").count("Skipping window processing")
        return result

    def produce_backlog(
        self, topic: str, n: int, end_ms: int, span_ms: int, producer: Any = None
    ) -> None:
        """`n` ticks round-robin over the tickers, trade times evenly over `span_ms`;
        through `producer` if given (e.g. a transactional one, in its transaction)."""
        from confluent_kafka import Producer

        from mdproto import envelope
        from mdproto.messages import TakerSide, Tick

        # Idempotence: a retried batch never lands behind a later one (trade-time order).
        p = producer or Producer(
            {"bootstrap.servers": self.bootstrap, "linger.ms": 20, "enable.idempotence": True}
        )
        start_ms, now = end_ms - span_ms, time.time_ns() // 1_000_000
        run = uuid.uuid4().hex[:6]
        for i in range(n):
            ticker = self.tickers[i % len(self.tickers)]
            tick = Tick(
                ticker=ticker,
                trade_id=f"{run}-{i}",
                price=100.0 + i % 17,
                amount=0.5,
                timestamp_ms=start_ms + i * span_ms // n,
                side=TakerSide.BUY,
                ingested_at_ms=now,
            )
            while True:
                try:
                    p.produce(topic, key=ticker.encode(), value=envelope.encode_record(tick))
                    break
                except BufferError:
                    p.poll(0.05)
            if i % 10_000 == 0:
                p.poll(0)
        p.flush(60)


def run(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from pipeline_common import stack, workdir

    with stack(args.stack_dir, kafka_only=True) as endpoints, workdir(args.workdir) as tmp:
        bench = Bench(args, endpoints.kafka_bootstrap, Path(tmp))
        print(f"load average at start: {os.getloadavg()}", flush=True)
        if "throughput" in args.phases or "recovery" in args.phases:
            throughput_and_recovery(bench)
        if "steady" in args.phases:
            steady(bench)


def order(names: list[str], rep: int) -> list[str]:
    """Alternate: every other repetition runs the contenders in reverse."""
    return names if rep % 2 == 0 else names[::-1]


def throughput_and_recovery(bench: Bench) -> None:
    args = bench.args
    topic = bench.topic("backlog")
    minute = int(time.time()) // PERIOD_S * PERIOD_S * 1000
    started = time.monotonic()
    bench.produce_backlog(topic, args.backlog, minute, args.span_min * PERIOD_S * 1000)
    print(f"backlog: {args.backlog} ticks in {time.monotonic() - started:.1f} s", flush=True)
    last: dict[str, tuple[str, Path, str]] = {}  # contender -> (group, state, out topic)
    results: dict[str, list[dict[str, Any]]] = {}
    for rep in range(args.reps):
        for kind in order(THROUGHPUT, rep):
            group, state = f"{kind}-{rep}-{bench.tag}", bench.tmp / f"state-{kind}-{rep}"
            out = bench.topic(f"out-{kind}-{rep}")
            r = bench.spawn(kind, topic, out, group, state, count=args.backlog, offset="earliest")
            results.setdefault(kind, []).append(r)
            last[kind] = (group, state, out)
            print(
                f"  drain {kind:8} {r['records'] / r['wall_s']:9,.0f} rec/s  "
                f"{r['records'] / max(r['cpu_s'], 1e-9):9,.0f} rec/CPU-s  "
                f"wall {r['wall_s']:5.1f} s cpu {r['cpu_s']:5.1f} s  load1 {r['load1']:.1f}  "
                f"late-dropped {r['late']}",
                flush=True,
            )
    print_throughput(results)
    if "recovery" not in args.phases:
        return
    print(f"quix changelog records: {changelog_records(bench, last['quix'][0])}", flush=True)
    recovery: dict[str, list[dict[str, Any]]] = {}
    for rep in range(args.reps):
        for kind in order(RECOVERY, rep):
            minute += PERIOD_S * 1000
            bench.produce_backlog(topic, args.markers, minute, PERIOD_S * 1000)
            group, state, out = last[kind.split("-")[0]]
            if kind == "quix-restore":
                state = bench.tmp / f"state-restore-{rep}"  # empty: as on another host
                shutil.rmtree(state, ignore_errors=True)
            r = bench.spawn(kind, topic, out, group, state, count=args.markers, offset="earliest")
            recovery.setdefault(kind, []).append(r)
            print(
                f"  restart {kind:12} {args.markers} new records processed "
                f"{r['to_done_s']:.2f} s after start (first at {r['to_first_s']:.2f} s)  "
                f"load1 {r['load1']:.1f}",
                flush=True,
            )
    print()
    print(f"{'restart':<14} {'to first s':>10} {'to all s':>9}  (medians)")
    for kind, rs in recovery.items():
        print(
            f"{kind:<14} {med([r['to_first_s'] for r in rs]):10.2f} "
            f"{med([r['to_done_s'] for r in rs]):9.2f}"
        )


def print_throughput(results: dict[str, list[dict[str, Any]]]) -> None:
    print()
    print(f"{'drain':<10} {'rec/s':>10} {'rec/CPU-s':>10} {'x bare':>7} {'x bare/CPU':>10} load1")
    rate = {k: med([r["records"] / r["wall_s"] for r in rs]) for k, rs in results.items()}
    per_cpu = {k: med([r["records"] / r["cpu_s"] for r in rs]) for k, rs in results.items()}
    for kind, rs in results.items():
        loads = "/".join(f"{r['load1']:.1f}" for r in rs)
        print(
            f"{kind:<10} {rate[kind]:10,.0f} {per_cpu[kind]:10,.0f} "
            f"{rate[kind] / rate['bare']:7.2f} {per_cpu[kind] / per_cpu['bare']:10.2f} {loads}"
        )
    print()


def changelog_records(bench: Bench, group: str) -> int:
    """Records in the Quix group's changelog topics (what an empty state dir restores)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bench.bootstrap, "group.id": f"probe-{bench.tag}"})
    total = 0
    for name, meta in c.list_topics(timeout=10).topics.items():
        if name.startswith("changelog__") and group in name:
            for p in meta.partitions:
                low, high = c.get_watermark_offsets(TopicPartition(name, p), timeout=10)
                total += high - low
    c.close()
    return total


def steady(bench: Bench) -> None:
    """Each contender live at `--rate`: tick lag and the closed candles of one boundary."""
    import multiprocessing as mp

    from pipeline_common import produce_ticks

    args = bench.args
    topic = bench.topic("steady")
    ctx = mp.get_context("spawn")
    done = ctx.Queue()
    runs = args.reps * len(STEADY)
    producer = ctx.Process(
        target=produce_ticks,
        args=(
            bench.bootstrap,
            topic,
            bench.tickers,
            args.rate,
            runs * (80.0 + args.tail_s) + 60,
            done,
        ),
    )
    producer.start()
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        for rep in range(args.reps):
            for kind in order(STEADY, rep):
                boundary = (int(time.time()) + 20) // PERIOD_S * PERIOD_S + PERIOD_S
                out = bench.topic(f"steady-out-{kind}-{rep}")
                listener = CandleListener(bench.bootstrap, out, boundary * 1000)
                r = bench.spawn(
                    kind,
                    topic,
                    out,
                    f"steady-{kind}-{rep}-{bench.tag}",
                    bench.tmp / f"steady-{kind}-{rep}",
                    offset="latest",
                    until=boundary + args.tail_s,
                    since_ms=(boundary - 12) * 1000,
                )
                r.update(listener.stop())
                results.setdefault(kind, []).append(r)
                print(
                    f"  steady {kind:7} tick lag p50 {r['lag_p50']:.0f} p99 {r['lag_p99']:.0f} "
                    f"max {r['lag_max']:.0f} ms (n {r['lag_n']}); closed candles "
                    f"{r['candles']} p50 {r['candle_p50']:.0f} p99 {r['candle_p99']:.0f} "
                    f"max {r['candle_max']:.0f} ms after the window; load1 {r['load1']:.1f}",
                    flush=True,
                )
    finally:
        producer.terminate()
        producer.join(10)
    print()
    print(f"{'steady':<8} {'tick p50':>8} {'tick p99':>8} {'candle p50':>10} {'candle p99':>10}")
    for kind, rs in results.items():
        print(
            f"{kind:<8} {med([r['lag_p50'] for r in rs]):8.0f} "
            f"{med([r['lag_p99'] for r in rs]):8.0f} "
            f"{med([r['candle_p50'] for r in rs]):10.0f} "
            f"{med([r['candle_p99'] for r in rs]):10.0f}"
        )


class CandleListener:
    """A thread reading the closed candles of the window ending at `end_ms` from `topic`."""

    def __init__(self, bootstrap: str, topic: str, end_ms: int) -> None:
        from confluent_kafka import OFFSET_END, Consumer, TopicPartition

        self.end_ms = end_ms
        self.latencies: list[float] = []
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "unused",  # assigned, never committed
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10,
            }
        )
        self.consumer.assign([TopicPartition(topic, p, OFFSET_END) for p in range(3)])
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self) -> None:
        from mdproto import envelope
        from mdproto.messages import OHLC

        while not self.halt.is_set():
            for m in self.consumer.consume(1000, 0.05):
                now = time.time_ns() / 1e6
                if m.error() is not None:
                    continue
                c = envelope.decode_record(m.value() or b"", OHLC)
                if (
                    c.closed
                    and not c.correction
                    and c.open_time_ms + PERIOD_S * 1000 == self.end_ms
                ):
                    self.latencies.append(now - self.end_ms)

    def stop(self) -> dict[str, Any]:
        self.halt.set()
        self.thread.join(10)
        self.consumer.close()
        lat = sorted(self.latencies)
        return {
            "candles": len(lat),
            "candle_p50": quantile(lat, 50),
            "candle_p99": quantile(lat, 99),
            "candle_max": lat[-1] if lat else math.nan,
        }


def med(values: list[float]) -> float:
    values = sorted(values)
    return (values[(len(values) - 1) // 2] + values[len(values) // 2]) / 2 if values else math.nan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker", choices=["bare", "engine", "quix"], help=argparse.SUPPRESS)
    for name in ("--bootstrap", "--topic", "--out", "--group", "--state"):
        parser.add_argument(name, help=argparse.SUPPRESS)
    parser.add_argument("--offset", default="earliest", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--until", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--since-ms", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--pub", help=argparse.SUPPRESS)  # bare: no PUB here
    parser.add_argument("--sndhwm", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--backlog", type=int, default=200_000)
    parser.add_argument("--tickers", type=int, default=1000)
    parser.add_argument("--span-min", type=int, default=10, help="backlog trade-time span")
    parser.add_argument("--markers", type=int, default=1000, help="records after a restart")
    parser.add_argument("--rate", type=int, default=2000, help="steady ticks/s")
    parser.add_argument(
        "--tail-s", type=float, default=25.0, help="steady: run on after the window end"
    )
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument(
        "--phases",
        nargs="+",
        default=["throughput", "recovery", "steady"],
        choices=["throughput", "recovery", "steady"],
    )
    parser.add_argument("--stack-dir", type=Path, help="use the stack started with this dir")
    parser.add_argument("--workdir", type=Path, help="keep the workers' logs here")
    args = parser.parse_args()
    if args.worker:
        worker(args)
    else:
        run(args)


if __name__ == "__main__":
    main()
