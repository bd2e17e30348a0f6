"""Shared pieces of the pipeline benchmarks: a stack, the pipeline process, a tick producer.

The pipeline runs as `python -m pipeline` (the production entry point) in its own
process group, configured through PIPELINE_* variables like `make run` does.
"""

from __future__ import annotations

import contextlib
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

from infra.localstack import StackEndpoints, start_on_free_ports
from infra.testing import free_port, pipeline_env
from mdproto import envelope
from mdproto.messages import TakerSide, Tick

WAIT_S = 300.0


@contextlib.contextmanager
def stack(stack_dir: Path | None) -> Iterator[StackEndpoints]:
    """A running stack: the one in ``stack_dir`` (started by the CLI) or a fresh one."""
    if stack_dir is not None:
        yield StackEndpoints.load(stack_dir)
        return
    with tempfile.TemporaryDirectory(prefix="pipeline-bench-stack-") as tmp:
        local = start_on_free_ports(Path(tmp))
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
        with self.log_file.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "pipeline"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        ready = self.workdir / f"ready-{self.tag}.json"
        deadline = time.monotonic() + WAIT_S
        while not ready.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(self.log_file.read_text(errors="replace").splitlines()[-40:])
                self.stop()
                raise RuntimeError(f"pipeline did not start:\n{tail}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process = None

    def log_lines(self, needle: str) -> list[str]:
        return [
            line
            for line in self.log_file.read_text(errors="replace").splitlines()
            if needle in line
        ]


def produce_ticks(
    bootstrap: str,
    topic: str,
    tickers: list[str],
    rate: int,
    seconds: float,
    done: Queue[int],
    produced: Queue[list[tuple[str, int]]] | None = None,
) -> None:
    """`rate` ticks/s round-robin over `tickers` for `seconds`, in 10 ms slices; report the
    count (and, with `produced`, every tick's (ticker, trade time) in produce order).
    Trade time and `ingested_at_ms` = wall clock at produce time."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1, "acks": "1"})
    run = uuid.uuid4().hex[:6]
    sent = 0
    times: list[tuple[str, int]] = []
    started = time.monotonic()
    while (elapsed := time.monotonic() - started) < seconds:
        due = int(elapsed * rate) + 1
        while sent < due:
            now = time.time_ns() // 1_000_000
            ticker = tickers[sent % len(tickers)]
            tick = Tick(
                ticker=ticker,
                trade_id=f"{run}-{sent}",
                price=100.0 + sent % 17,
                amount=0.5,
                timestamp_ms=now,
                side=TakerSide.BUY,
                ingested_at_ms=now,
            )
            p.produce(topic, key=ticker.encode(), value=envelope.encode_record(tick))
            times.append((ticker, now))
            sent += 1
        p.poll(0)
        time.sleep(0.005)
    p.flush(30)
    if produced is not None:
        produced.put(times)
    done.put(sent)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
