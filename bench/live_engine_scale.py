"""The live path with 1 and with 2 engine processes, each against the bare consumer
(issue #44 "Done when"; ADR 0014).

On the bench stack's Kafka alone, a ticks topic of 6 partitions, ``--tickers`` tickers
traded in a Zipf mix (``--skew``, the exchange simulator's universe law: a few hot
tickers, a long tail) and candles of 60 s, each contender runs as K processes
(``--engines``, default 1 and 2) in one consumer group:

- ``engine``: the real ``pipeline.live_engine.LiveEngine`` with live_engine_quix.py's
  settings (state on a local path, CEP and books off, closed candles to a Kafka topic),
  publishing through ``pub_server.Outlet(xpub, Sequencer()).send_many`` on a real XPUB
  bound on a free local port, the subscriptions answered as ``pipeline.engine`` does;
- ``bare``: a confluent-kafka consumer in the same group that decodes every record and
  sends each tick on a PUB (live_engine_quix.py's ``run_bare``): the floor.

For each contender and K:

1. **Saturation.** A backlog of ``--backlog`` ticks (the tickers in turn, trade times
   over ``--span-min`` minutes, so candles close during the drain) is written in one
   Kafka transaction, committed once the K processes own their partitions: records/s
   from the commit to the last record of the K, and records per CPU-second (/proc). The
   producer plays no part in it.
2. **Steps of offered rate** (``--rates``), each ``--warmup`` + ``--seconds`` long and
   placed so that a minute boundary falls in the middle of the measured seconds (so a
   step takes a minute). Producer processes (``--producer-rate`` ticks/s each at most;
   trade time = wall clock, keyed by ticker) offer the rate; what they achieved and the
   CPU they took is reported. A subscriber process connected to every contender
   process's PUB, subscribed to every ticker's ticks and 60 s candles, takes tick
   latency (receive - ``ingested_at_ms``) and closed-candle latency (receive - window end)
   of the boundary's closed, non-correction candles. A step **meets** when tick p99 <=
   250 ms, every produced tick was received, and (engine) candle p99 <= 1 s with a closed
   candle for every ticker that traded in the minute. Steps stop at the first miss
   (``--all-steps``: go on; a missed step leaves a backlog to the next).

   Candle p99 is judged *from when the engine's close rule lets a window close*
   (``--candle-from due``): a ticker's first trade after the boundary, or, for a ticker
   with none within ``live.close_idle_s`` (1 s), the boundary + 1 s (closed on idle
   time). The long tail of a Zipf mix at a few thousand trades/s has tickers quiet for
   over a second, whose candles come >= 1 s after the window end by design at any load;
   from the window end (``--candle-from end``) the goal then cannot be met. Both figures
   are reported, with the count of idle-closed candles.
3. **Correctness guard.** After the steps, every minute up to the last step's boundary
   must have exactly one closed candle per ticker that traded in it (no loss, no
   duplicate), counted in the subscriber; if not, the run says so and exits 1.

Reported: a markdown table per step (offered/achieved rate, tick p50/p99, candle p99,
received %, CPU seconds of each contender process, producers' and subscriber's CPU,
load), the saturation table and the headline: the highest rate met per contender and
K, 2 engines / 1 engine and engine / bare. The same as JSON and CSV under ``--out``.

    nice -n 10 .venv/bin/python bench/live_engine_scale.py
        [--rates 5000 10000 20000 30000 40000 60000] [--seconds 20] [--warmup 5]
        [--engines 1 2] [--contenders bare engine] [--tickers 1000] [--skew 1.0]
        [--backlog 200000] [--stack-dir .data] [--out .data/live-engine-scale]

A step takes a minute (it waits for its boundary), a contender's saturation under one:
at the defaults a run takes 15-30 minutes (4 runs of up to 6 steps; each stops at its
first miss). Tiny sizes for a try (~8 minutes): ``--rates 2000 4000 --seconds 6
--warmup 2 --tickers 200 --backlog 20000``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import logging
import math
import multiprocessing as mp
import os
import queue
import random
import sys
import time
from array import array
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any

import zmq
from live_engine_quix import (
    PERIOD_S,
    Bench,
    Flag,
    Probe,
    SharedCount,
    count_engine_batches,
    engine_settings,
    quantile,
    run_bare,
)
from pipeline_common import cpu_seconds, produce_ticks, stack, workdir

from infra.testing import free_port
from mdproto import envelope, partitioning, topics
from mdproto.messages import OHLC, Tick

ROOT = Path(__file__).resolve().parent.parent
PARTITIONS = 6
MINUTE_MS = PERIOD_S * 1000
TICK_P99_MS = 250.0
CANDLE_P99_MS = 1000.0
#: The bare PUB's high-water mark: the pipeline's ``pub_sndhwm`` default, the engine's.
SNDHWM = 100_000
#: Slots of a producer's ticker cycle: a ticker's share of them follows its weight.
CYCLE = 20_000
#: Producers start this long before their first tick (a spawned interpreter's imports).
LEAD_S = 4.0
#: Minutes that ended this long ago are closed by the engine (close_idle_s is 1 s).
CLOSED_AFTER_MS = 3_000
TICK_SUFFIX = f"|{topics.TICK}".encode()
#: The timeline's resolution: each step's tick latency per this many ms of receive time.
BUCKET_MS = 100


# -- contender processes ------------------------------------------------------------------


def contender(
    kind: str,
    a: argparse.Namespace,
    stop: Flag,
    progress: SharedCount,
    results: Queue[dict[str, Any]],
    log_file: str,
) -> None:
    """One contender process: consume until `stop`, count records in `progress`; put its
    Probe's result (first and last record, CPU between them)."""
    logging.basicConfig(
        filename=log_file, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s"
    )
    probe = Probe(0, 0.0, 0).shared(stop, progress)
    try:
        {"bare": run_bare, "engine": run_engine_pub}[kind](a, probe)
    except BaseException as exc:
        logging.exception("%s failed", kind)
        results.put({"error": f"{kind}: {exc!r}"})
        raise
    results.put(probe.result())


def run_engine_pub(a: argparse.Namespace, probe: Probe) -> None:
    """The live engine publishing as ``python -m pipeline.engine`` does (`engine.serve`),
    its XPUB bound on ``a.pub`` rather than connected to a relay."""
    from pipeline.live_engine import LiveEngine
    from pipeline.pub_server import SUBSCRIPTION_CHECK_MS, Outlet, Sequencer, xpub_socket

    settings = engine_settings(a)
    done = count_engine_batches(probe)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    xpub = xpub_socket(ctx, settings.pub_sndhwm)
    xpub.bind(a.pub)
    outlet = Outlet(xpub, Sequencer())
    engine = LiveEngine(settings, outlet.send_many)
    engine.start()
    try:
        engine.wait_assigned()
        while engine.alive and not done.wait(SUBSCRIPTION_CHECK_MS / 1000):
            outlet.answer_subscriptions()
        if not engine.alive:
            raise RuntimeError(f"live engine stopped: {engine.error}")
    finally:
        engine.stop()
        ctx.destroy(linger=0)


class Team:
    """K contender processes of one kind in one consumer group, each with its PUB."""

    def __init__(
        self, bench: ScaleBench, kind: str, k: int, topic: str, out: str, group: str
    ) -> None:
        ctx = mp.get_context("spawn")
        self.kind, self.group, self.bootstrap = kind, group, bench.bootstrap
        self.stop = ctx.Event()
        self.results: Queue[dict[str, Any]] = ctx.Queue()
        self.progress = [ctx.Value("q", 0) for _ in range(k)]
        self.endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(k)]
        self.logs = [bench.tmp / f"{group}-{i}.log" for i in range(k)]
        state = bench.tmp / f"state-{group}"  # one store for the group, as S3 would be
        self.procs: list[BaseProcess] = []
        for i, endpoint in enumerate(self.endpoints):
            a = argparse.Namespace(
                bootstrap=bench.bootstrap,
                topic=topic,
                out=out,
                group=group,
                state=str(state),
                offset="earliest",
                pub=endpoint,
                sndhwm=SNDHWM,
            )
            args = (kind, a, self.stop, self.progress[i], self.results, str(self.logs[i]))
            self.procs.append(ctx.Process(target=contender, args=args, daemon=True))
        for p in self.procs:
            p.start()

    def check(self) -> None:
        """Raise, with its log, if a contender process ended."""
        for p, log_file in zip(self.procs, self.logs, strict=True):
            if not p.is_alive():
                tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-30:])
                raise RuntimeError(f"{self.kind} process ended ({p.exitcode}):\n{tail}")

    def records(self) -> int:
        return sum(int(v.value) for v in self.progress)

    def cpu(self) -> list[float]:
        return [cpu_seconds(p.pid or 0) for p in self.procs]

    def wait_settled(self, timeout_s: float = 120.0) -> None:
        """Return once the group is stable with every process owning partitions."""
        from confluent_kafka import ConsumerGroupState, KafkaException
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        deadline = time.monotonic() + timeout_s
        seen = "nothing"
        while time.monotonic() < deadline:
            self.check()
            try:  # a new group's coordinator may still be loading
                d = admin.describe_consumer_groups([self.group])[self.group].result(10)
            except KafkaException as exc:
                seen = str(exc)
            else:
                owners = [m for m in d.members if m.assignment.topic_partitions]
                if d.state == ConsumerGroupState.STABLE and len(owners) == len(self.procs):
                    return
                seen = f"{d.state}, {len(owners)} owners"
            time.sleep(0.2)
        raise RuntimeError(f"group {self.group} not settled in {timeout_s:g} s: {seen}")

    def finish(self, timeout_s: float = 90.0) -> list[dict[str, Any]]:
        """Stop every process; their Probe results."""
        self.stop.set()
        results = [self.results.get(timeout=timeout_s) for _ in self.procs]
        errors = [r["error"] for r in results if "error" in r]
        if errors:
            raise RuntimeError("; ".join(errors))
        return results

    def close(self) -> None:
        self.stop.set()
        for p in self.procs:
            p.join(30)
            if p.is_alive():
                p.terminate()


@contextlib.contextmanager
def team(bench: ScaleBench, kind: str, k: int, topic: str, out: str, group: str) -> Iterator[Team]:
    t = Team(bench, kind, k, topic, out, group)
    try:
        t.wait_settled()
        yield t
    finally:
        t.close()


# -- the subscriber process ---------------------------------------------------------------


class Tally:
    """What the subscriber received: tick latencies by trade-id run (the step), each
    ticker's first trade time in each minute, and each minute's closed candles.

    A closed candle's latency is receive time - window end. The engine closes a window
    on the ticker's first trade after it, or, if none comes, `idle_ms` after the end
    (``live.close_idle_s``): a quiet ticker's candle is that late by design, whatever the
    load. Its *due* latency counts from when the rule lets it close: the first later
    trade's time or the end + `idle_ms`, whichever is first."""

    def __init__(self, idle_ms: int) -> None:
        self.idle_ms = idle_ms
        self.ticks: defaultdict[str, array[float]] = defaultdict(lambda: array("d"))
        #: run -> receive time // BUCKET_MS -> [ticks, worst latency]: where the tail is
        self.buckets: defaultdict[str, dict[int, list[float]]] = defaultdict(dict)
        #: minute start -> ticker -> its earliest trade time in the minute
        self.first: defaultdict[int, dict[str, int]] = defaultdict(dict)
        #: minute end -> ticker -> receive time of each closed candle
        self.closed: defaultdict[int, defaultdict[str, list[float]]] = defaultdict(
            lambda: defaultdict(list)
        )

    def take(self, frames: list[bytes]) -> None:
        now = time.time_ns() / 1e6
        if frames[0].endswith(TICK_SUFFIX):
            t = envelope.decode(frames[1:], Tick)
            run, late = t.trade_id.partition("-")[0], now - t.ingested_at_ms
            self.ticks[run].append(late)
            bucket = self.buckets[run].setdefault(int(now // BUCKET_MS), [0, 0.0])
            bucket[0] += 1
            bucket[1] = max(bucket[1], late)
            first = self.first[t.timestamp_ms // MINUTE_MS * MINUTE_MS]
            first[t.ticker] = min(first.get(t.ticker, t.timestamp_ms), t.timestamp_ms)
            return
        c = envelope.decode(frames[1:], OHLC)
        if c.closed and not c.correction:
            self.closed[c.open_time_ms + MINUTE_MS][c.ticker].append(now)

    def counts(self) -> dict[str, int]:
        return {run: len(lat) for run, lat in self.ticks.items()}

    def latency(self, run: str) -> dict[str, float]:
        ordered = sorted(self.ticks.get(run, ()))
        return {
            "received": len(ordered),
            "p50": quantile(ordered, 50),
            "p99": quantile(ordered, 99),
            "max": ordered[-1] if ordered else math.nan,
        }

    def timeline(self, run: str) -> list[tuple[int, int, float]]:
        """(bucket start ms, ticks received in it, the worst of their latencies), in order."""
        return [(b * BUCKET_MS, int(n), late) for b, (n, late) in sorted(self.buckets[run].items())]

    def minutes(self) -> dict[int, dict[str, Any]]:
        """Per minute (its end, ms): closed candles against the tickers that traded."""
        out = {}
        for end in sorted({start + MINUTE_MS for start in self.first} | self.closed.keys()):
            traded = self.first.get(end - MINUTE_MS, {}).keys()
            closed: dict[str, list[float]] = self.closed.get(end, {})
            later = self.first.get(end, {})
            due = {t: min(later.get(t, end + self.idle_ms), end + self.idle_ms) for t in closed}
            latency = sorted(times[0] - end for times in closed.values())
            beyond = sorted(times[0] - due[t] for t, times in closed.items())
            out[end] = {
                "traded": len(traded),
                "candles": sum(len(times) for times in closed.values()),
                "missing": len(traded - closed.keys()),
                "duplicated": sum(len(times) - 1 for times in closed.values()),
                "unexpected": len(closed.keys() - traded),
                "idle_closed": sum(1 for t in closed if due[t] == end + self.idle_ms),
                "p50": quantile(latency, 50),
                "p99": quantile(latency, 99),
                "max": latency[-1] if latency else math.nan,
                "due_p99": quantile(beyond, 99),
            }
        return out


def subscriber(
    endpoints: list[str],
    tickers: list[str],
    idle_ms: int,
    commands: Queue[Any],
    replies: Queue[Any],
) -> None:
    """A SUB on every contender's PUB (each ticker's ticks and 60 s candles) keeping a
    `Tally`; answers ``(method, *args)`` commands with the Tally's answer, ends on None."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 0)
    # Subscriptions go to a PUB through the send pipe: past its HWM (1,000) they are lost.
    sub.setsockopt(zmq.SNDHWM, 0)
    for ticker in tickers:
        sub.setsockopt(zmq.SUBSCRIBE, topics.tick_topic(ticker).encode())
        sub.setsockopt(zmq.SUBSCRIBE, topics.ohlc_topic(ticker, PERIOD_S).encode())
    for endpoint in endpoints:
        sub.connect(endpoint)
    tally = Tally(idle_ms)
    replies.put("ready")
    while True:
        if sub.poll(50):
            for _ in range(10_000):
                try:
                    tally.take(sub.recv_multipart(zmq.NOBLOCK))
                except zmq.Again:
                    break
        try:
            command = commands.get_nowait()
        except queue.Empty:
            continue
        if command is None:
            break
        name, *args = command
        replies.put(getattr(tally, name)(*args))
    ctx.destroy(linger=0)


class Subscriber:
    """The subscriber process, asked through its command queue."""

    def __init__(self, endpoints: list[str], tickers: list[str], idle_ms: int) -> None:
        ctx = mp.get_context("spawn")
        self.commands: Queue[Any] = ctx.Queue()
        self.replies: Queue[Any] = ctx.Queue()
        args = (endpoints, tickers, idle_ms, self.commands, self.replies)
        self.proc = ctx.Process(target=subscriber, args=args, daemon=True)
        self.proc.start()
        self.replies.get(timeout=60)
        time.sleep(1.0)  # its subscriptions reach every PUB before the first tick

    def ask(self, *command: Any) -> Any:
        self.commands.put(command)
        try:
            return self.replies.get(timeout=120)
        except queue.Empty:
            raise RuntimeError(f"subscriber did not answer {command[0]}") from None

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid or 0)

    def wait_for(self, run: str, count: int, quiet_s: float, timeout_s: float) -> int:
        """Ticks of `run` received once `count` are, or none came for `quiet_s`."""
        deadline, last, since = time.monotonic() + timeout_s, -1, time.monotonic()
        while True:
            n = int(self.ask("counts").get(run, 0))
            if n != last:
                last, since = n, time.monotonic()
            if n >= count or time.monotonic() - since > quiet_s or time.monotonic() > deadline:
                return n
            time.sleep(0.5)

    def close(self) -> None:
        self.commands.put(None)
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.terminate()


@contextlib.contextmanager
def subscribed(endpoints: list[str], tickers: list[str], idle_ms: int) -> Iterator[Subscriber]:
    s = Subscriber(endpoints, tickers, idle_ms)
    try:
        yield s
    finally:
        s.close()


# -- producers ----------------------------------------------------------------------------


class ScaleBench(Bench):
    """live_engine_quix's Bench (Kafka, topics, tickers, backlog) with each ticker's
    share of the trades, hottest first: the simulator universe's Zipf law."""

    def __init__(self, args: argparse.Namespace, bootstrap: str, tmp: Path) -> None:
        from infra.exchange_sim.universe import Universe
        from pipeline.config import LiveConfig

        super().__init__(args, bootstrap, tmp)
        self.shares = Universe(len(self.tickers), rate=1.0, skew=args.skew).rates()
        self.idle_ms = round(LiveConfig().close_idle_s * 1000)  # the engines' (defaults)


def mixes(
    tickers: list[str], shares: list[float], rate: float, cap: float
) -> list[tuple[list[str], float]]:
    """Each producer's ticker cycle and rate, as few producers as offer `rate` with none
    over `cap`: producer j of n takes the tickers of rank j, j + n, ... (a ticker is
    produced by one process: its trades stay in order); a ticker fills about
    ``share * CYCLE`` slots of its producer's cycle, at least one, in shuffled order."""
    n = next(
        n
        for n in range(1, len(tickers) + 1)
        if n == len(tickers) or round(max(sum(shares[j::n]) for j in range(n)) * rate) <= cap
    )
    out = []
    for j in range(n):
        mine = range(j, len(tickers), n)
        cycle = [tickers[i] for i in mine for _ in range(max(1, round(shares[i] * CYCLE)))]
        random.Random(j).shuffle(cycle)
        out.append((cycle, rate * sum(shares[i] for i in mine)))
    return out


def offer(
    bootstrap: str,
    topic: str,
    cycle: list[str],
    rate: float,
    start_at: float,
    warmup: float,
    seconds: float,
    run: str,
    out: Queue[dict[str, float]],
) -> None:
    """One producer process of a step: from `start_at` (wall clock), warm-up ticks (trade
    ids ``w...``), then the measured ones (``s...``); puts what it achieved."""
    time.sleep(max(0.0, start_at - time.time()))
    produce_ticks(bootstrap, topic, cycle, rate, warmup, run=f"w{run}")
    out.put(produce_ticks(bootstrap, topic, cycle, rate, seconds, run=f"s{run}"))


def schedule(now: float, warmup: float, seconds: float) -> tuple[float, int]:
    """(when the producers start, the minute boundary in the middle of the measured part)."""
    boundary = math.ceil((now + LEAD_S + warmup + seconds / 2) / PERIOD_S) * PERIOD_S
    return boundary - seconds / 2 - warmup, boundary


def sleep_until(t: float, check: Callable[[], None]) -> None:
    while (left := t - time.time()) > 0:
        check()
        time.sleep(min(left, 1.0))


# -- one step, one contender and K ------------------------------------------------------------


@dataclass
class Step:
    """One offered rate, one contender and K: what was offered, received and how late."""

    contender: str
    engines: int
    offered: int
    achieved: float = 0.0
    sent: int = 0
    received: int = 0
    tick_p50: float = math.nan
    tick_p99: float = math.nan
    tick_max: float = math.nan
    boundary: int = 0  # the minute's end, epoch ms
    traded: int = 0  # tickers that traded in that minute
    candles: int = 0  # their closed candles received by the step's end
    idle_closed: int = 0  # of those, closed by idle time (no trade within close_idle_s)
    candle_p50: float = math.nan  # receive - window end
    candle_p99: float = math.nan
    candle_due_p99: float = math.nan  # receive - when the close rule allowed it (Tally)
    producers: int = 0
    producer_cores: float = 0.0
    cpu_s: list[float] = field(default_factory=list)  # each contender process, measured part
    subscriber_cpu_s: float = 0.0
    load1: float = 0.0
    judge_due: bool = True  # candle p99 judged from when the close rule allowed it
    #: (s from the boundary, ticks, worst latency ms) per BUCKET_MS of receive time
    timeline: list[tuple[float, int, float]] = field(default_factory=list)
    met: bool = False
    why: str = ""

    def judge(self) -> None:
        misses = []
        if self.received != self.sent:
            misses.append(f"received {self.received} of {self.sent}")
        if not self.tick_p99 <= TICK_P99_MS:
            misses.append(f"tick p99 {self.tick_p99:.0f} ms")
        if self.contender == "engine" and self.candles < self.traded:
            misses.append(f"{self.candles} of {self.traded} closed candles")
        candle_p99 = self.candle_due_p99 if self.judge_due else self.candle_p99
        if self.contender == "engine" and not candle_p99 <= CANDLE_P99_MS:
            misses.append(f"candle p99 {candle_p99:.0f} ms")
        self.met, self.why = not misses, "; ".join(misses)


@dataclass
class Run:
    """One contender with K processes: its steps, its drain, what the guard found."""

    contender: str
    engines: int
    steps: list[Step] = field(default_factory=list)
    saturation: dict[str, Any] = field(default_factory=dict)
    guarded: int = 0  # minutes the guard checked
    guard: list[str] = field(default_factory=list)  # those with lost/duplicate candles

    @property
    def top(self) -> int:
        """The highest offered rate met (0: none)."""
        return max((s.offered for s in self.steps if s.met), default=0)

    @property
    def label(self) -> str:
        """`top` as shown: ">= top" when no step missed (the limit lies above)."""
        return f"{'>= ' if all(s.met for s in self.steps) else ''}{self.top:,}"


def step(
    args: argparse.Namespace, bench: ScaleBench, topic: str, t: Team, sub: Subscriber, index: int
) -> Step:
    """Offer `args.rates[index]` around the next minute boundary it can reach; judge it."""
    s = Step(t.kind, len(t.procs), args.rates[index], judge_due=args.candle_from == "due")
    start_at, boundary = schedule(time.time(), args.warmup, args.seconds)
    s.boundary = boundary * 1000
    mix = mixes(bench.tickers, bench.shares, s.offered, args.producer_rate)
    ctx = mp.get_context("spawn")
    offers: Queue[dict[str, float]] = ctx.Queue()
    producers = []
    for j, (cycle, rate) in enumerate(mix):
        when = (start_at, args.warmup, args.seconds)
        what = (bench.bootstrap, topic, cycle, rate, *when, f"{index}-{j}", offers)
        producers.append(ctx.Process(target=offer, args=what, daemon=True))
        producers[-1].start()
    sleep_until(start_at + args.warmup, t.check)
    before = [*t.cpu(), sub.cpu()]
    sleep_until(start_at + args.warmup + args.seconds, t.check)
    after = [*t.cpu(), sub.cpu()]
    *s.cpu_s, s.subscriber_cpu_s = (b - a for a, b in zip(before, after, strict=True))
    s.load1 = os.getloadavg()[0]
    offered(s, [offers.get(timeout=120) for _ in mix])
    for p in producers:
        p.join(30)
    sub.wait_for(f"s{index}", s.sent, quiet_s=args.drain_s, timeout_s=4 * args.drain_s)
    received(s, sub.ask("latency", f"s{index}"), sub.ask("minutes").get(s.boundary))
    s.timeline = [
        ((at - s.boundary) / 1000, n, late) for at, n, late in sub.ask("timeline", f"s{index}")
    ]
    s.judge()
    return s


def offered(s: Step, achieved: list[dict[str, float]]) -> None:
    """What the producers achieved, and their CPU in cores."""
    s.producers, s.sent = len(achieved), sum(int(o["sent"]) for o in achieved)
    wall = max(o["ended"] for o in achieved) - min(o["started"] for o in achieved)
    s.achieved = s.sent / max(wall, 1e-9)
    s.producer_cores = sum(o["cpu_s"] for o in achieved) / max(wall, 1e-9)


def received(s: Step, ticks: dict[str, float], minute: dict[str, Any] | None) -> None:
    """The subscriber's figures: the step's ticks and its boundary's closed candles."""
    s.received = int(ticks["received"])
    s.tick_p50, s.tick_p99, s.tick_max = ticks["p50"], ticks["p99"], ticks["max"]
    if minute is not None:
        s.traded, s.candles = minute["traded"], minute["traded"] - minute["missing"]
        s.idle_closed, s.candle_p50 = minute["idle_closed"], minute["p50"]
        s.candle_p99, s.candle_due_p99 = minute["p99"], minute["due_p99"]


def steps(args: argparse.Namespace, bench: ScaleBench, run: Run) -> None:
    """The steps of offered rate on the live path, then the guard on every closed minute."""
    kind, k = run.contender, run.engines
    topic = bench.topic(f"live-{kind}{k}", PARTITIONS)
    out = bench.topic(f"live-candles-{kind}{k}", PARTITIONS)
    group = f"live-{kind}{k}-{bench.tag}"
    with (
        team(bench, kind, k, topic, out, group) as t,
        subscribed(t.endpoints, bench.tickers, bench.idle_ms) as sub,
    ):
        for index in range(len(args.rates)):
            s = step(args, bench, topic, t, sub, index)
            run.steps.append(s)
            print(step_row(s), flush=True)
            if not s.met and not args.all_steps:
                break
        if kind == "engine":
            last = len(run.steps) - 1
            sub.wait_for(f"s{last}", run.steps[-1].sent, quiet_s=args.drain_s, timeout_s=180)
            closed_by = run.steps[-1].boundary  # later minutes are still open
            sleep_until((closed_by + CLOSED_AFTER_MS) / 1000, t.check)
            minutes = {end: m for end, m in sub.ask("minutes").items() if end <= closed_by}
            run.guarded, run.guard = len(minutes), guard(minutes)
            print_guard(run)
        t.finish()


def guard(minutes: dict[int, dict[str, Any]]) -> list[str]:
    """The minutes without exactly one closed candle per ticker that traded in them."""
    return [
        f"minute ending {time.strftime('%H:%M:%S', time.gmtime(end / 1000))}: "
        f"{m['traded']} tickers traded, {m['candles']} closed candles, {m['missing']} "
        f"missing, {m['duplicated']} duplicated, {m['unexpected']} for tickers not seen"
        for end, m in minutes.items()
        if m["missing"] or m["duplicated"] or m["unexpected"]
    ]


def print_guard(run: Run) -> None:
    lost = any(s.received < s.sent for s in run.steps)
    caveat = "; ticks were lost: a ticker none of whose got through is unchecked" if lost else ""
    print(f"  guard: {run.guarded} minutes checked, {len(run.guard)} wrong{caveat}", flush=True)
    for line in run.guard:
        print(f"  GUARD: {line}", flush=True)


def saturation(args: argparse.Namespace, bench: ScaleBench, run: Run) -> None:
    """Drain a backlog that appears at once (a transaction committed when the group has
    settled): records/s from the commit to the last record of the K processes; each
    process's CPU (/proc) over the same time."""
    from confluent_kafka import Producer

    kind, k = run.contender, run.engines
    topic = bench.topic(f"backlog-{kind}{k}", PARTITIONS)
    out = bench.topic(f"backlog-candles-{kind}{k}", PARTITIONS)
    producer = Producer(
        {
            "bootstrap.servers": bench.bootstrap,
            "transactional.id": f"bench-{bench.tag}-{kind}{k}",
            "linger.ms": 20,
            "transaction.timeout.ms": 600_000,
        }
    )
    producer.init_transactions(60)
    producer.begin_transaction()
    end_ms = int(time.time()) // PERIOD_S * MINUTE_MS
    bench.produce_backlog(topic, args.backlog, end_ms, args.span_min * MINUTE_MS, producer)
    with team(bench, kind, k, topic, out, f"backlog-{kind}{k}-{bench.tag}") as t:
        before, committed = t.cpu(), time.monotonic()
        producer.commit_transaction(60)
        deadline = committed + 600
        while t.records() < args.backlog and time.monotonic() < deadline:
            t.check()
            time.sleep(0.05)
        cpu = [b - a for a, b in zip(before, t.cpu(), strict=True)]
        results = t.finish()
    records = sum(r["records"] for r in results)
    wall = max(r["last_at"] for r in results) - committed
    run.saturation = {
        "records": records,
        "wall_s": wall,
        "rate": records / max(wall, 1e-9),
        "records_per_process": [r["records"] for r in results],
        "cpu_s": cpu,
        "per_cpu_s": records / max(sum(cpu), 1e-9),
        "load1": os.getloadavg()[0],
    }
    print(
        f"  drain {kind} x{k}: {records:,} records in {wall:.1f} s = "
        f"{run.saturation['rate']:,.0f}/s; per process {run.saturation['records_per_process']}"
        f", CPU {'/'.join(f'{c:.1f}' for c in cpu)} s; load1 {run.saturation['load1']:.1f}",
        flush=True,
    )
    if records != args.backlog:
        raise RuntimeError(f"{kind} x{k} drained {records} of {args.backlog} records")


# -- report -------------------------------------------------------------------------------


def fmt(v: float, digits: int = 0) -> str:
    return "-" if math.isnan(v) else f"{v:,.{digits}f}"


STEP_HEADER = (
    "| contender | K | offered /s | achieved /s | producers (cores) | tick p50 ms "
    "| tick p99 ms | candle p99 ms from end | from due | closed candles (idle) | received % "
    "| CPU s per process | subscriber CPU s | load1 | meets | worst 100 ms (from the boundary) |\n"
    "|---|---:|---:|---:|---|---:|---:|---:|---:|---|---:|---|---:|---:|---|---|"
)


def step_row(s: Step) -> str:
    engine = s.contender == "engine"
    candles = f"{s.candles}/{s.traded} ({s.idle_closed})" if engine else "-"
    received = 100 * s.received / s.sent if s.sent else math.nan
    return (
        f"| {s.contender} | {s.engines} | {s.offered:,} | {s.achieved:,.0f} "
        f"| {s.producers} ({s.producer_cores:.2f}) | {fmt(s.tick_p50)} | {fmt(s.tick_p99)} "
        f"| {fmt(s.candle_p99) if engine else '-'} | {fmt(s.candle_due_p99) if engine else '-'} "
        f"| {candles} | {fmt(received, 2)} | {' / '.join(f'{c:.1f}' for c in s.cpu_s)} "
        f"| {s.subscriber_cpu_s:.1f} | {s.load1:.1f} | {'yes' if s.met else 'no: ' + s.why} "
        f"| {worst(s.timeline)} |"
    )


def worst(timeline: list[tuple[float, int, float]], n: int = 3) -> str:
    """The `n` worst buckets of a step's timeline, as "+12.3 s 410 ms" (from the boundary)."""
    top = sorted(timeline, key=lambda b: b[2], reverse=True)[:n]
    return ", ".join(f"{at:+.1f} s {late:,.0f} ms" for at, _, late in sorted(top))


def tables(runs: list[Run]) -> None:
    """The steps and the drains as markdown tables."""
    print(f"\n{STEP_HEADER}")
    for r in runs:
        for s in r.steps:
            print(step_row(s))
    print("\n| drain | K | records/s | records per process | CPU s per process | per CPU-s |")
    print("|---|---:|---:|---|---|---:|")
    for r in runs:
        d = r.saturation
        if d:
            print(
                f"| {r.contender} | {r.engines} | {d['rate']:,.0f} "
                f"| {' / '.join(f'{n:,}' for n in d['records_per_process'])} "
                f"| {' / '.join(f'{c:.1f}' for c in d['cpu_s'])} | {d['per_cpu_s']:,.0f} |"
            )


def ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) else math.nan


def headline(args: argparse.Namespace, runs: list[Run]) -> dict[str, Any]:
    """The highest rate met per contender and K, the ratios, and what the generator (the
    producers) and the subscriber took at each top step; printed and returned."""
    top = {(r.contender, r.engines): r.top for r in runs}
    drain = {(r.contender, r.engines): r.saturation.get("rate", math.nan) for r in runs}
    engines = ratio(top.get(("engine", 2), 0), top.get(("engine", 1), 0))
    drains = ratio(drain.get(("engine", 2), math.nan), drain.get(("engine", 1), math.nan))
    vs_bare = {k: ratio(top.get(("engine", k), 0), top.get(("bare", k), 0)) for k in args.engines}
    label = {(r.contender, r.engines): r.label for r in runs}
    print("\n| highest rate met /s | " + " | ".join(f"K={k}" for k in args.engines) + " |")
    print("|---|" + "---:|" * len(args.engines))
    for c in args.contenders:
        print(f"| {c} | " + " | ".join(label.get((c, k), "-") for k in args.engines) + " |")
    generator = {}
    for r in runs:
        s = next((s for s in r.steps if s.met and s.offered == r.top), None)
        if s is not None:
            generator[f"{r.contender} x{r.engines}"] = {
                "producers": s.producers,
                "producer_cores": s.producer_cores,
                "subscriber_cores": s.subscriber_cpu_s / args.seconds,
                "contender_cores": [c / args.seconds for c in s.cpu_s],
            }
            print(
                f"at {r.contender} x{r.engines}'s top ({s.offered:,}/s): {s.producers} "
                f"producer(s) took {s.producer_cores:.2f} cores, the subscriber "
                f"{s.subscriber_cpu_s / args.seconds:.2f}, each contender process "
                + " / ".join(f"{c / args.seconds:.2f}" for c in s.cpu_s)
            )
    if "engine" in args.contenders:
        print(
            f"2 engines / 1 engine: {fmt(engines, 2)} (drain: {fmt(drains, 2)}; goal >= 1.7 "
            "where the cores allow); engine / bare: "
            + ", ".join(f"K={k} {fmt(v, 2)}" for k, v in vs_bare.items())
        )
    if any(v.startswith(">=") for v in label.values()):
        print("(>=: no step missed, the limit lies higher: add rates; a ratio with it is a bound)")
    return {
        "top_rate_met": {f"{c} x{k}": v for (c, k), v in label.items()},
        "engines_2_over_1": engines,
        "drain_engines_2_over_1": drains,
        "engine_over_bare": vs_bare,
        "generator_at_top": generator,
    }


def plain(v: Any) -> Any:
    """`v` for JSON and CSV: floats rounded to 3 places, NaN as None (no figure)."""
    if isinstance(v, float):
        return None if math.isnan(v) else round(v, 3)
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [plain(x) for x in v]
    return str(v) if isinstance(v, Path) else v


def write(out: Path, args: argparse.Namespace, runs: list[Run], headline: dict[str, Any]) -> None:
    """``steps.csv`` (a row per step), ``timeline.csv`` (each step's tick latency per
    100 ms, from its minute boundary: for plotting) and ``result.json`` (everything)."""
    out.mkdir(parents=True, exist_ok=True)
    rows = [
        plain({k: v for k, v in asdict(s).items() if k != "timeline"})
        | {"cpu_s": " / ".join(f"{c:.2f}" for c in s.cpu_s)}
        for r in runs
        for s in r.steps
    ]
    with (out / "timeline.csv").open("w", newline="") as fh:
        lines = csv.writer(fh)
        lines.writerow(["contender", "engines", "offered", "s_from_boundary", "ticks", "worst_ms"])
        for r in runs:
            for s in r.steps:
                for at, n, late in s.timeline:
                    lines.writerow([s.contender, s.engines, s.offered, at, n, round(late, 1)])
    with (out / "steps.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["contender"])
        writer.writeheader()
        writer.writerows(rows)
    body = {
        "args": vars(args),
        "cores": os.cpu_count(),
        "runs": [asdict(r) for r in runs],
        "headline": headline,
    }
    (out / "result.json").write_text(json.dumps(plain(body), indent=1))
    print(f"\nresults: {out / 'result.json'}, {out / 'steps.csv'}, {out / 'timeline.csv'}")


# -- main ---------------------------------------------------------------------------------


def describe_mix(bench: ScaleBench) -> None:
    per = [0.0] * PARTITIONS
    for ticker, share in zip(bench.tickers, bench.shares, strict=True):
        per[partitioning.partition_of(ticker, PARTITIONS)] += share
    half = PARTITIONS // 2
    print(
        f"{len(bench.tickers)} tickers, skew {bench.args.skew}: hottest "
        f"{100 * bench.shares[0]:.1f} % of the trades; per partition "
        f"{' '.join(f'{100 * p:.1f}' for p in per)} %; 2 engines (range assignor) "
        f"{100 * sum(per[:half]):.1f} / {100 * sum(per[half:]):.1f} %",
        flush=True,
    )


def run(args: argparse.Namespace) -> int:
    with stack(args.stack_dir, kafka_only=True) as endpoints, workdir(args.workdir) as tmp:
        bench = ScaleBench(args, endpoints.kafka_bootstrap, Path(tmp))
        print(f"load average at start: {os.getloadavg()}; {os.cpu_count()} cores", flush=True)
        describe_mix(bench)
        print(STEP_HEADER, flush=True)
        runs = []
        started = time.monotonic()
        for k in args.engines:
            for kind in args.contenders:
                r = Run(kind, k)
                runs.append(r)
                print(f"{kind} x{k}", flush=True)
                if args.backlog:
                    saturation(args, bench, r)
                steps(args, bench, r)
        tables(runs)
        write(args.out, args, runs, headline(args, runs))
        print(f"run took {(time.monotonic() - started) / 60:.1f} min")
    failed = [f"{r.contender} x{r.engines}: {g}" for r in runs for g in r.guard]
    if failed:
        print("\nCORRECTNESS FAILURE: closed candles lost or duplicated:", file=sys.stderr)
        for line in failed:
            print(f"  {line}", file=sys.stderr)
        return 1
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--rates", type=int, nargs="+", default=[5000, 10000, 20000, 30000, 40000, 60000]
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="measured, per step")
    parser.add_argument("--warmup", type=float, default=5.0, help="before each step")
    parser.add_argument("--engines", type=int, nargs="+", default=[1, 2], help="K processes")
    parser.add_argument(
        "--contenders", nargs="+", default=["bare", "engine"], choices=["bare", "engine"]
    )
    parser.add_argument("--tickers", type=int, default=1000)
    parser.add_argument("--skew", type=float, default=1.0, help="Zipf exponent; 0: even")
    parser.add_argument("--producer-rate", type=int, default=40_000, help="per producer process")
    parser.add_argument("--backlog", type=int, default=200_000, help="saturation; 0: none")
    parser.add_argument("--span-min", type=int, default=10, help="backlog trade-time span")
    parser.add_argument(
        "--drain-s", type=float, default=10.0, help="wait this long for a step's last ticks"
    )
    parser.add_argument("--all-steps", action="store_true", help="go on after a miss")
    parser.add_argument(
        "--candle-from",
        choices=["due", "end"],
        default="due",
        help="judge candle p99 from when the close rule allowed it (due) or the window end",
    )
    parser.add_argument("--stack-dir", type=Path, help="use the stack started with this dir")
    parser.add_argument("--workdir", type=Path, help="keep the processes' logs here")
    parser.add_argument("--out", type=Path, default=ROOT / ".data" / "live-engine-scale")
    raise SystemExit(run(parser.parse_args()))


if __name__ == "__main__":
    main()
