"""Shared pieces of the pipeline benchmarks: a stack, the pipeline process, a tick producer.

The pipeline runs as `python -m pipeline` (the production entry point) in its own
process group, configured through PIPELINE_* variables like `make run` does.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.queues import Queue
from pathlib import Path
from typing import TYPE_CHECKING

from infra.localstack import StackConfig, StackEndpoints, start_on_free_ports
from infra.localstack.components import Component, Kafka, make_components
from infra.testing import free_port, pipeline_env
from mdproto.messages import TakerSide, Tick

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pipeline.config import Settings

WAIT_S = 300.0
TICK_S = os.sysconf("SC_CLK_TCK")
ROOT = Path(__file__).resolve().parent.parent


def _kafka_alone(config: StackConfig, endpoints: StackEndpoints) -> list[Component]:
    return [Kafka(config, endpoints)]


@contextlib.contextmanager
def stack(stack_dir: Path | None, *, kafka_only: bool = False) -> Iterator[StackEndpoints]:
    """A running stack: the one in ``stack_dir`` (started by the CLI) or a fresh one
    (with ``kafka_only``, just the broker: its S3 and catalog endpoints then answer nothing)."""
    if stack_dir is not None:
        yield StackEndpoints.load(stack_dir)
        return
    with tempfile.TemporaryDirectory(prefix="pipeline-bench-stack-") as tmp:
        local = start_on_free_ports(
            Path(tmp), components=_kafka_alone if kafka_only else make_components
        )
        try:
            yield local.endpoints
        finally:
            local.down()


@contextlib.contextmanager
def workdir(keep: Path | None) -> Iterator[str]:
    """``keep`` (created) if given, else a temporary directory removed afterwards."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield str(keep)
        return
    with tempfile.TemporaryDirectory(prefix="pipeline-bench-") as tmp:
        yield tmp


@dataclass
class PipelineProcess:
    """`python -m pipeline` on a private namespace, topics, checkpoint dir and PUB port."""

    endpoints: StackEndpoints
    workdir: Path
    env_overrides: dict[str, str] = field(default_factory=dict)
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    pub_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def namespace(self) -> str:
        return f"bench_{self.tag}"

    @property
    def batches_topic(self) -> str:
        return f"bench-{self.tag}.ohlc.batches"

    @property
    def ticks_topic(self) -> str:
        return f"bench-{self.tag}.ticks"

    @property
    def pub_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.pub_port}"

    @property
    def log_file(self) -> Path:
        return self.workdir / f"pipeline-{self.tag}.log"

    def start(self) -> None:
        env = pipeline_env(
            self.endpoints,
            namespace=self.namespace,
            batches_topic=self.batches_topic,
            ticks_topic=self.ticks_topic,
            checkpoint_dir=self.workdir / f"checkpoints-{self.tag}",
            pub_endpoint=self.pub_endpoint,
            ready_file=self.workdir / f"ready-{self.tag}.json",
        )
        env.update(self.env_overrides)
        self.process = start_until_ready(
            [sys.executable, "-m", "pipeline"],
            env,
            self.log_file,
            self.workdir / f"ready-{self.tag}.json",
            "pipeline",
        )

    def stop(self) -> None:
        if self.process is not None:
            stop_group(self.process)
        self.process = None

    def log_lines(self, needle: str) -> list[str]:
        return [
            line
            for line in self.log_file.read_text(errors="replace").splitlines()
            if needle in line
        ]


def start_until_ready(
    argv: list[str], env: dict[str, str], log_file: Path, ready_file: Path, what: str
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own process group (output to ``log_file``) and return once it
    wrote ``ready_file``; if it exits first or WAIT_S passes, stop it and raise with its log."""
    with log_file.open("wb") as log:
        process = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + WAIT_S
    while not ready_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-40:])
            stop_group(process)
            raise RuntimeError(f"{what} did not start:\n{tail}")
        time.sleep(0.2)
    return process


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, up to 60 s to exit, then SIGKILL whatever is left of its process group."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(60)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def produce_ticks(
    bootstrap: str,
    topic: str,
    tickers: list[str],
    rate: float,
    seconds: float,
    done: Queue[int] | None = None,
    produced: Queue[list[tuple[str, int]]] | None = None,
    *,
    run: str | None = None,
) -> dict[str, float]:
    """`rate` ticks/s round-robin over `tickers` (a ticker listed twice trades twice as
    often) for `seconds` (`infra.tick_load.paced`); report the count (and, with `produced`, every
    tick's (ticker, trade time) in produce order). Trade time and `ingested_at_ms` = wall
    clock at produce time; trade ids `{run}-{n}` (default: a random run).

    Returns what it achieved: ``sent``, ``started`` and ``ended`` (wall clock, first and
    last send) and ``cpu_s``, this process's CPU (all threads) over the run and flush:
    a rate it cannot offer shows as fewer ticks sent, not as a longer run."""
    from confluent_kafka import Producer

    from infra.tick_load import paced, send

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1, "acks": "1"})
    run = run or uuid.uuid4().hex[:6]
    sent = 0
    times: list[tuple[str, int]] = []
    cpu, wall = time.process_time(), time.time()
    for numbers in paced(rate, seconds):
        for n in numbers:
            now = time.time_ns() // 1_000_000
            ticker = tickers[n % len(tickers)]
            tick = Tick(
                ticker=ticker,
                trade_id=f"{run}-{n}",
                price=100.0 + n % 17,
                amount=0.5,
                timestamp_ms=now,
                side=TakerSide.BUY,
                ingested_at_ms=now,
            )
            send(p, topic, tick)
            if produced is not None:
                times.append((ticker, now))
        sent = numbers.stop
        p.poll(0)
    ended = time.time()
    p.flush(30)
    if produced is not None:
        produced.put(times)
    if done is not None:
        done.put(sent)
    return {"sent": sent, "started": wall, "ended": ended, "cpu_s": time.process_time() - cpu}


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK_S


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def start_simulator(tmp: Path, *options: str) -> tuple[subprocess.Popen[bytes], str]:
    """The exchange simulator in its own process (its own interpreter: no GIL shared
    with what is measured), Binance's weight limit off, plus `options`; its base URL."""
    ready = tmp / "sim.url"
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "infra.exchange_sim", "--port", "0"),
            *("--weight-limit", "0", "--ready-file", str(ready), *options),
        ],
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not (ready.exists() and ready.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("exchange simulator did not start")
        time.sleep(0.05)
    return proc, ready.read_text().strip()


def ensure_venv(venv: Path, requirements: Path, unpinned: tuple[str, ...]) -> Path:
    """A benchmark's own virtualenv (a package whose pins conflict with the project's):
    ``requirements`` plus constraints.txt minus the lines starting with ``unpinned``,
    ``mdproto`` editable; (re)installed when either file changed. Returns its python."""
    constraints = [
        line
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if not line.lower().startswith(unpinned)
    ]
    digest = hashlib.sha256(
        (requirements.read_text() + "\n".join(constraints)).encode()
    ).hexdigest()
    python, marker = venv / "bin" / "python", venv / ".installed"
    if python.exists() and marker.exists() and marker.read_text() == digest:
        return python
    print(f"making {venv} ({requirements.name}), a few minutes on first use", flush=True)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as fh:
        fh.write("\n".join(constraints) + "\n")
    try:
        subprocess.run(
            [
                *(str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q"),
                *("-c", fh.name, "-r", str(requirements), "-e", f"{ROOT / 'proto'}[kafka]"),
            ],
            check=True,
        )
    finally:
        os.unlink(fh.name)
    marker.write_text(digest)
    return python


def local_session(
    endpoints: StackEndpoints, namespace: str, scratch: Path
) -> tuple[Settings, SparkSession]:
    """The pipeline's Spark session (``local[2]``, the jars of `infra.artifacts`) on the
    stack's catalog with ``namespace``, and its settings; the seconds it took printed."""
    from infra.artifacts import spark_jars
    from pipeline.config import load_settings
    from pipeline.session import build_session

    settings = load_settings(
        catalog={**endpoints.catalog_settings().model_dump(), "namespace": namespace},
        spark={
            "master": "local[2]",
            "jars": [str(j) for j in spark_jars()],
            "scratch_dir": str(scratch / "spark-scratch"),
        },
    )
    started = time.perf_counter()
    spark = build_session(settings)
    print(f"Spark session up in {time.perf_counter() - started:.0f} s (not timed)", flush=True)
    return settings, spark
