"""CPU cost of the platform at rest and under load, per process (issue 26).

Why: the pipeline alone was seen holding most of this machine's two cores with
no data, which slows every stack test and leaves nothing for the PUB path. This
bench says which process spends it, at which load, so a change (``--env``,
``--pipeline-src``) can be judged by the cores it saves.

What: one `python -m pipeline` (production queries, private topics and namespace,
pipeline_common.PipelineProcess) on a fresh stack or the one in ``--stack-dir``,
left idle ``--settle`` s after it is ready. Then for each case in order, on the
same pipeline, a producer thread in this process writes ticks to the pipeline's
ticks topic (its `market.ticks`) paced in real time (trade k at start + k/rate,
trade time = wall clock); after ``--warmup`` s, CPU (utime + stime + reaped
children's, /proc/<pid>/stat, every process by pid, see Sampler) is counted over
``--window`` s. Cores = CPU seconds / wall seconds, for:

- the pipeline's process group and descendants, split by command line into the
  Spark JVM, the Python driver, the `pyspark.daemon` workers (their own process
  group), the PUB server (the driver's multiprocessing spawn child), the rest;
- the stack's components, each its own process group (pid files under
  ``<data dir>/run``): Kafka, the Iceberg REST catalog and its PostgreSQL, the
  S3 store (SeaweedFS). On a shared ``--stack-dir`` they include others' use.

Cases: ``N`` = N live tickers at 1 trade/s each; ``R/s`` = R trades/s over
``--spread`` (100) tickers; ``0`` = no ticks. Goal (issue 26): at rest with 10
live tickers the whole pipeline <= 0.15 core.

    .venv/bin/python bench/pipeline_cost.py [--cases 0 10 100 10000/s]
        [--settle 30] [--warmup 20] [--window 60] [--reps 1] [--env K=V ...]
        [--unset VAR ...] [--pipeline-src DIR] [--stack-dir .data] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pipeline_candles import tickers
from pipeline_common import PipelineProcess, start_until_ready, workdir

from infra.localstack import StackEndpoints, start_on_free_ports
from infra.localstack.process import PidFile
from infra.testing import pipeline_env
from mdproto import envelope
from mdproto.messages import TakerSide, Tick

DEFAULT_CASES = ["0", "10", "100", "10000/s"]
GOAL_CASE = "10"
GOAL_CORES = 0.15
SAMPLE_S = 0.5
CLK_TCK = os.sysconf("SC_CLK_TCK")

#: Stack component (pid file name) -> row label.
STACK_COMPONENTS = {
    "kafka": "Kafka",
    "iceberg-rest": "catalog: Iceberg REST",
    "catalog-db": "catalog: PostgreSQL",
    "seaweedfs": "S3: SeaweedFS",
}
PIPELINE_PARTS = [
    "pipeline: Spark JVM",
    "pipeline: Python driver",
    "pipeline: pyspark.daemon workers",
    "pipeline: PUB server",
    "pipeline: other",
]
PIPELINE_TOTAL = "pipeline total"
PLATFORM_TOTAL = "platform total"
BENCH = "bench process (producer, sampler; not platform)"
STARTED = "started: "


@dataclass(frozen=True)
class Case:
    name: str
    tickers: list[str]
    rate: float  # trades/s over all tickers


def parse_case(text: str, spread: int) -> Case:
    if text.endswith("/s"):
        return Case(text, tickers(spread), float(text[:-2]))
    n = int(text)
    return Case(text, tickers(n), float(n))


# -- stack ------------------------------------------------------------------------


@contextlib.contextmanager
def stack(stack_dir: Path | None) -> Iterator[tuple[StackEndpoints, Path]]:
    """Endpoints and data dir of the stack in ``stack_dir``, or of a fresh one."""
    if stack_dir is not None:
        yield StackEndpoints.load(stack_dir), stack_dir
        return
    with tempfile.TemporaryDirectory(prefix="pipeline-cost-stack-") as tmp:
        local = start_on_free_ports(Path(tmp))
        try:
            yield local.endpoints, local.config.data_dir
        finally:
            local.down()


def stack_roots(data_dir: Path) -> dict[int, str]:
    """Process-group leader pid -> label, for every running stack component."""
    roots = {}
    for name, label in STACK_COMPONENTS.items():
        record = PidFile(data_dir / "run" / f"{name}.pid").read()
        if record is None or not record.alive:
            print(f"warning: {name} is not running (no live pid file)", flush=True)
            continue
        roots[record.pid] = label
    return roots


# -- CPU from /proc ---------------------------------------------------------------


@dataclass
class ProcStat:
    ppid: int
    pgid: int
    own: int  # utime + stime, clock ticks (all threads, live and exited)
    kids: int  # cutime + cstime: children this process reaped

    @property
    def total(self) -> int:
        return self.own + self.kids


Key = tuple[int, int]  # (pid, start time): a reused pid is another process


def scan() -> dict[Key, ProcStat]:
    """Parent, group and CPU ticks of every process (zombies included)."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After "(comm)": state ppid pgrp ... utime stime cutime cstime (11-14) ... start (19).
        found[(int(entry.name), int(fields[19]))] = ProcStat(
            int(fields[1]),
            int(fields[2]),
            int(fields[11]) + int(fields[12]),
            int(fields[13]) + int(fields[14]),
        )
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def pipeline_part(pid: int, driver: int) -> str:
    if pid == driver:
        return "pipeline: Python driver"
    argv = cmdline(pid).split("\0")
    text = " ".join(argv)
    if Path(argv[0]).name == "java":
        return "pipeline: Spark JVM"
    if "pyspark.daemon" in text or "pyspark.worker" in text:
        return "pipeline: pyspark.daemon workers"
    if "spawn_main" in text:
        return "pipeline: PUB server"
    return "pipeline: other"


def reaper(key: Key, last: dict[Key, ProcStat], end: dict[Key, ProcStat]) -> Key | None:
    """The nearest ancestor of a dead process alive at the end (its cutime holds the dead)."""
    pid = last[key].ppid
    for _ in range(64):
        up = next((k for k in end if k[0] == pid), None)
        if up is not None:
            return up
        up = next((k for k in last if k[0] == pid), None)
        if up is None:
            return None
        pid = last[up].ppid
    return None


class Sampler:
    """CPU per component over a window, every CPU second counted once.

    A component's CPU = the change of own + reaped children's CPU (cutime) summed
    over its processes alive at the end: a process that died meanwhile is in the
    CPU of the ancestor that reaped it, which counts for the dead one's component
    when all its dead children have one (the JVM reaping `pyspark.daemon`s). The
    0.5 s samples find and label (by command line) processes that live briefly.
    """

    def __init__(self, driver: int, stack: dict[int, str]) -> None:
        self.driver = driver
        self.stack = stack
        self.labels: dict[Key, str | None] = {}

    def label_new(self, stats: dict[Key, ProcStat]) -> list[Key]:
        """Label the processes not seen before (None: not the platform's); return them."""
        by_pid = {pid: s for (pid, _), s in stats.items()}
        new = list(stats.keys() - self.labels.keys())
        for key in new:
            found = None
            for p in self._lineage(key[0], by_pid):
                if p == self.driver or by_pid[p].pgid == self.driver:
                    found = pipeline_part(key[0], self.driver)
                    break
                if p in self.stack or by_pid[p].pgid in self.stack:
                    found = self.stack.get(p) or self.stack[by_pid[p].pgid]
                    break
            self.labels[key] = found
        return new

    @staticmethod
    def _lineage(pid: int, by_pid: dict[int, ProcStat]) -> Iterator[int]:
        while pid in by_pid and pid > 1:
            yield pid
            pid = by_pid[pid].ppid

    def measure(self, seconds: float) -> dict[str, float]:
        """Cores per label over ``seconds``, and processes started per label."""
        first = scan()
        self.label_new(first)
        last, end = dict(first), first
        started: dict[str, int] = {}
        t0 = time.monotonic()
        bench_cpu = time.process_time()
        while (left := t0 + seconds - time.monotonic()) > 0:
            time.sleep(min(SAMPLE_S, left))
            end = scan()
            for key in self.label_new(end):
                if (label := self.labels[key]) is not None:
                    started[label] = started.get(label, 0) + 1
            last.update(end)  # the dead keep their last sample
        wall = time.monotonic() - t0
        ticks = dict.fromkeys([*PIPELINE_PARTS, *self.stack.values()], 0)
        zero = ProcStat(0, 0, 0, 0)
        gone = [k for k in last.keys() - end.keys() if self.labels.get(k) is not None]
        dead = {key: reaper(key, last, end) for key in gone}
        for key, stat in end.items():
            if (label := self.labels.get(key)) is None:
                continue
            before = first.get(key, zero)
            ticks[label] += stat.own - before.own
            # Reaped children's CPU goes to their component when they have just one.
            reaped = [c for c, r in dead.items() if r == key]
            kinds = {self.labels[c] for c in reaped}
            target = label
            if len(kinds) == 1:
                target = kinds.pop() or label
            ticks[target] += stat.kids - before.kids
            ticks[target] -= sum(first[c].total for c in reaped if c in first)
        for key, r in dead.items():  # no watched ancestor left: their last samples
            if r is None and (label := self.labels[key]) is not None:
                ticks[label] += last[key].total - first.get(key, zero).total
        cores = {label: t / CLK_TCK / wall for label, t in ticks.items()}
        cores[PIPELINE_TOTAL] = sum(cores[p] for p in PIPELINE_PARTS)
        cores[PLATFORM_TOTAL] = cores[PIPELINE_TOTAL] + sum(cores[s] for s in self.stack.values())
        cores[BENCH] = (time.process_time() - bench_cpu) / wall
        cores.update({f"{STARTED}{label}": float(n) for label, n in started.items()})
        return cores


# -- ticks ------------------------------------------------------------------------


class PacedProducer(threading.Thread):
    """Trade k at start + k/rate (real time, round-robin over the tickers), until stopped."""

    def __init__(self, bootstrap: str, topic: str, case: Case) -> None:
        super().__init__(name=f"producer-{case.name}", daemon=True)
        self.bootstrap, self.topic, self.case = bootstrap, topic, case
        self.sent = 0
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._produce()
        except BaseException as exc:
            self.error = exc

    def _produce(self) -> None:
        from confluent_kafka import Producer

        p = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5, "acks": "1"})
        names, rate, run = self.case.tickers, self.case.rate, uuid.uuid4().hex[:6]
        started = time.monotonic()
        while not self.stopping.is_set():
            due = int((time.monotonic() - started) * rate) + 1
            while self.sent < due:
                now = time.time_ns() // 1_000_000
                ticker = names[self.sent % len(names)]
                tick = Tick(
                    ticker=ticker,
                    trade_id=f"{run}-{self.sent}",
                    price=100.0 + self.sent % 17,
                    amount=0.5,
                    timestamp_ms=now,
                    side=TakerSide.BUY,
                    ingested_at_ms=now,
                )
                p.produce(self.topic, key=ticker.encode(), value=envelope.encode_record(tick))
                self.sent += 1
            p.poll(0)
            next_at = started + self.sent / rate
            self.stopping.wait(max(0.001, min(0.1, next_at - time.monotonic())))
        p.flush(30)

    def stop(self) -> None:
        self.stopping.set()
        self.join(60)
        if self.error is not None:
            raise RuntimeError(f"producer failed: {self.error!r}") from self.error


# -- run --------------------------------------------------------------------------


def check_alive(pipeline: PipelineProcess) -> None:
    assert pipeline.process is not None
    if pipeline.process.poll() is not None:
        tail = "\n".join(pipeline.log_file.read_text(errors="replace").splitlines()[-40:])
        raise RuntimeError(f"pipeline exited ({pipeline.process.returncode}):\n{tail}")


@dataclass
class CostPipeline(PipelineProcess):
    """A PipelineProcess whose environment can lose variables (``--unset``: an older
    ``--pipeline-src`` refuses settings keys a newer harness sets), checked first."""

    unset: list[str] = field(default_factory=list)
    origin: str = ""

    def start(self) -> None:
        ready = self.workdir / f"ready-{self.tag}.json"
        env = pipeline_env(
            self.endpoints,
            namespace=self.namespace,
            batches_topic=self.batches_topic,
            ticks_topic=self.ticks_topic,
            checkpoint_dir=self.workdir / f"checkpoints-{self.tag}",
            pub_endpoint=self.pub_endpoint,
            ready_file=ready,
        )
        env.update(self.env_overrides)
        for name in self.unset:
            env.pop(name, None)
        # Which package runs, and does it accept this environment (before Spark starts)?
        check = "import pipeline, pipeline.config as c; c.load_settings(); print(pipeline.__file__)"
        out = subprocess.run(
            [sys.executable, "-c", check], env=env, capture_output=True, text=True, check=False
        )
        if out.returncode != 0:
            raise SystemExit(f"the pipeline refuses its settings:\n{out.stderr[-2000:]}")
        self.origin = out.stdout.strip()
        self.process = start_until_ready(
            [sys.executable, "-m", "pipeline"], env, self.log_file, ready, "pipeline"
        )


def run_case(
    pipeline: PipelineProcess, sampler: Sampler, case: Case, args: argparse.Namespace
) -> dict[str, float]:
    producer = None
    if case.rate > 0:
        producer = PacedProducer(pipeline.endpoints.kafka_bootstrap, pipeline.ticks_topic, case)
        producer.start()
    try:
        time.sleep(args.warmup)
        check_alive(pipeline)
        sent = producer.sent if producer else 0
        load = os.getloadavg()[0]
        cores = sampler.measure(args.window)
        cores["ticks/s"] = ((producer.sent if producer else 0) - sent) / args.window
        cores["load"] = (load + os.getloadavg()[0]) / 2
    finally:
        if producer is not None:
            producer.stop()
    check_alive(pipeline)
    return cores


def run(args: argparse.Namespace) -> None:
    cases = [parse_case(c, args.spread) for c in args.cases]
    overrides = dict(kv.split("=", 1) for kv in args.env)
    if args.pipeline_src is not None:
        src = args.pipeline_src.resolve()
        if not (src / "pipeline" / "__init__.py").is_file():
            raise SystemExit(f"--pipeline-src {src}: no pipeline/__init__.py there")
        path = os.environ.get("PYTHONPATH")
        overrides["PYTHONPATH"] = f"{src}{os.pathsep}{path}" if path else str(src)
    results: dict[str, list[dict[str, float]]] = {}
    with stack(args.stack_dir) as (endpoints, data_dir), workdir(args.workdir) as tmp:
        roots = stack_roots(data_dir)
        for rep in range(args.reps):
            pipeline = CostPipeline(endpoints, Path(tmp), overrides, unset=args.unset)
            try:
                started = time.monotonic()
                pipeline.start()
                assert pipeline.process is not None
                print(
                    f"rep {rep + 1}: pipeline ready in {time.monotonic() - started:.0f} s "
                    f"(pid {pipeline.process.pid}, {pipeline.origin}, log {pipeline.log_file})",
                    flush=True,
                )
                sampler = Sampler(pipeline.process.pid, roots)
                time.sleep(args.settle)
                for case in cases:
                    r = run_case(pipeline, sampler, case, args)
                    results.setdefault(case.name, []).append(r)
                    print(
                        f"  case {case.name}: pipeline {r[PIPELINE_TOTAL]:.2f} cores, "
                        f"platform {r[PLATFORM_TOTAL]:.2f}, {r['ticks/s']:.0f} ticks/s, "
                        f"load {r['load']:.1f}",
                        flush=True,
                    )
            finally:
                pipeline.stop()
    report(results, list(roots.values()), overrides, args)


def report(
    results: dict[str, list[dict[str, float]]],
    stack_labels: list[str],
    overrides: dict[str, str],
    args: argparse.Namespace,
) -> None:
    def med(case: str, row: str) -> float:
        return statistics.median(r[row] for r in results[case])

    env = " ".join([*(f"{k}={v}" for k, v in overrides.items()), *(f"-{k}" for k in args.unset)])
    print(
        f"\nCPU in cores over {args.window:.0f} s after a {args.warmup:.0f} s warm-up per "
        f"case (first case {args.settle:.0f} s after ready), median of {args.reps} rep(s), "
        f"{os.cpu_count()} cores; pipeline env: {env or '(defaults)'}\n"
    )
    spread = args.reps > 1
    print("| case | component | cores |" + (" min-max |" if spread else ""))
    print("|---|---|---:|" + ("---:|" if spread else ""))
    rows = [*PIPELINE_PARTS, PIPELINE_TOTAL, *stack_labels, PLATFORM_TOTAL, BENCH]
    for case in results:
        for row in rows:
            name = f"**{row}**" if row in (PIPELINE_TOTAL, PLATFORM_TOTAL) else row
            line = f"| {case} | {name} | {med(case, row):.3f} |"
            if spread:
                values = [r[row] for r in results[case]]
                line += f" {min(values):.3f}-{max(values):.3f} |"
            print(line)
    print()
    for case in results:
        keys = sorted({k for r in results[case] for k in r if k.startswith(STARTED)})
        born = ", ".join(
            f"{k.removeprefix(STARTED)} {statistics.median(r.get(k, 0) for r in results[case]):.0f}"
            for k in keys
        )
        print(
            f"case {case}: pipeline {med(case, PIPELINE_TOTAL):.3f} cores "
            f"(platform {med(case, PLATFORM_TOTAL):.3f}; {med(case, 'ticks/s'):.0f} ticks/s "
            f"produced; load {med(case, 'load'):.1f}; processes started in the window: "
            f"{born or 'none'})"
        )
    goal = f"goal (issue 26): at rest with 10 live tickers the pipeline <= {GOAL_CORES} core"
    if GOAL_CASE not in results:
        print(f"{goal}: case {GOAL_CASE} not run")
        return
    got = med(GOAL_CASE, PIPELINE_TOTAL)
    verdict = (
        "met"
        if got <= GOAL_CORES
        else f"missed by {got - GOAL_CORES:.3f} core ({got / GOAL_CORES:.1f}x)"
    )
    print(f"{goal}: {got:.3f} -> {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--cases", nargs="+", default=DEFAULT_CASES, help="N (tickers at 1/s) or R/s"
    )
    parser.add_argument("--spread", type=int, default=100, help="tickers of an R/s case")
    parser.add_argument("--window", type=float, default=60.0, help="seconds of CPU sampling")
    parser.add_argument(
        "--settle", type=float, default=30.0, help="idle seconds after ready, before the cases"
    )
    parser.add_argument(
        "--warmup", type=float, default=20.0, help="seconds of a case before its window"
    )
    parser.add_argument("--reps", type=int, default=1, help="fresh pipelines, all cases each")
    parser.add_argument(
        "--env", action="append", default=[], metavar="K=V", help="extra pipeline env"
    )
    parser.add_argument(
        "--unset", action="append", default=[], metavar="VAR", help="drop from pipeline env"
    )
    parser.add_argument(
        "--pipeline-src", type=Path, help="run the pipeline package from DIR (PYTHONPATH)"
    )
    parser.add_argument("--stack-dir", type=Path, help="use the stack started with this dir")
    parser.add_argument("--workdir", type=Path, help="keep the pipeline's logs here")
    args = parser.parse_args()
    for kv in args.env:
        if "=" not in kv:
            parser.error(f"--env {kv}: expected K=V")
    run(args)


if __name__ == "__main__":
    main()
