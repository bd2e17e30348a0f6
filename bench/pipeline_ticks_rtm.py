"""Ticks through Spark Real-time Mode vs micro-batches vs the bare bridge (issue #17).

Cases over Kafka ticks topics of the same layout (3 partitions, as the
pipeline's), measured like bench/pipeline_ticks.py (same producer, subscriber,
warm-up and percentiles: latency = receive time - `Tick.ingested_at_ms`):

- ``bridge``: the bare confluent-kafka -> mdproto decode -> PUB process of
  bench/pipeline_ticks.py (the baseline);
- ``rtm``: a PySpark Structured Streaming query, Kafka source -> PySpark
  `foreach` writer (decode, PUB envelope) -> PUSH, with Real-time Mode's trigger
  (bench/rtm_query.py); a PULL -> PUB forwarder (`zmq.proxy`, in C) publishes,
  as the pipeline's PUB server does;
- ``microbatch``: the same query and sink with a ``processingTime`` trigger
  (the pipeline's 0.1 s) on the same Spark version;
- ``rtm-kafka`` / ``microbatch-kafka``: the same two triggers with Spark's Kafka
  sink (JVM only) to a second topic, which the bridge then publishes. This is the
  stand-in the Python sink needs: PySpark's `foreach` is allowed in Real-time
  Mode but hands rows to Python in batches of up to 1 MiB, so it waits for the
  batch's end (docs/pipeline-benchmarks.md (e)).

This is a measurement, not a pipeline change: Spark runs from its own virtualenv
``.venv-rtm`` (bench/requirements-rtm.txt: an exact pyspark pin; every other
package at the project's pins from constraints.txt, mdproto editable), made on
first use, and the Kafka connector comes from Maven Central via
``spark.jars.packages`` (cached in ~/.ivy2*). Every Spark query runs in its own
JVM (``--master``, default local[4]: Real-time Mode holds one task slot per
Kafka partition for the whole batch) for the whole run; cases and rates
alternate ``--reps`` times; p50/p99 are medians over reps. Only Kafka is started.

    .venv/bin/python bench/pipeline_ticks_rtm.py [--rates 100 10000] [--seconds 15]
        [--reps 2] [--cases bridge rtm-kafka ...] [--rtm-batch-s 5] [--conf k=v ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pipeline_common
import zmq
from pipeline_common import stack, start_until_ready, stop_group, workdir
from pipeline_ticks import bridge_running, fmt, measure, measurement_arguments, summary

from infra.spark import LOCAL_DEFAULTS
from infra.testing import free_port
from mdproto import contracts
from mdproto.runtime.kafka import ensure_topics, spec

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-rtm"
REQUIREMENTS = ROOT / "bench" / "requirements-rtm.txt"
# The project's own Spark pins; everything else keeps the project's versions.
UNPINNED = ("pyspark==", "py4j==")
CASES = ["bridge", "rtm", "microbatch", "rtm-kafka", "microbatch-kafka"]
# spark-sql-kafka 4.1.3 depends on spark-token-provider-kafka 4.1.3, which Maven Central does
# not have (nor 4.1.2/4.1.4; the project's pom does the same for 4.0.4): the nearest 4.1
# release replaces it, fetched by mvn into ~/.m2 and given to Spark as a jar.
TOKEN_PROVIDER = ("org.apache.spark", "spark-token-provider-kafka-0-10_2.13", "4.1.1")


def ensure_venv() -> Path:
    """.venv-rtm's python, (re)installed when requirements-rtm.txt or constraints.txt changed."""
    return pipeline_common.ensure_venv(VENV, REQUIREMENTS, UNPINNED)


def token_provider_jar() -> Path:
    """TOKEN_PROVIDER's jar in the local Maven repository, fetched once."""
    group, artifact, version = TOKEN_PROVIDER
    jar = Path.home().joinpath(
        ".m2", "repository", *group.split("."), artifact, version, f"{artifact}-{version}.jar"
    )
    if not jar.exists():
        subprocess.run(
            [
                *("mvn", "-B", "-q", "-s", str(ROOT / "infra" / "maven" / "settings.xml")),
                *("dependency:get", f"-Dartifact={':'.join(TOKEN_PROVIDER)}", "-Dtransitive=false"),
            ],
            check=True,
        )
    return jar


def forward(pull_endpoint: str, pub_endpoint: str) -> None:
    """PULL -> PUB in C (`zmq.proxy`), the pipeline's PUB server pattern; runs until killed."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pull, pub = ctx.socket(zmq.PULL), ctx.socket(zmq.PUB)
    pull.setsockopt(zmq.RCVHWM, 100_000)
    pub.setsockopt(zmq.SNDHWM, 100_000)
    pull.bind(pull_endpoint)
    pub.bind(pub_endpoint)
    zmq.proxy(pull, pub)


@contextlib.contextmanager
def spark_query(
    python: Path,
    case: str,
    bootstrap: str,
    topic: str,
    pub: str,
    tmp: Path,
    args: argparse.Namespace,
) -> Iterator[None]:
    """The query of ``case`` (bench/rtm_query.py in a JVM of its own) and, for the foreach
    sink, its PULL -> PUB forwarder on ``pub``; a ``-kafka`` case writes to ``topic``.out."""
    mode, kafka_sink = case.removesuffix("-kafka"), case.endswith("-kafka")
    sink: tuple[str, ...] = ("--out-topic", f"{topic}.out")
    if not kafka_sink:
        pull = f"tcp://127.0.0.1:{free_port()}"
        forwarder = mp.get_context("spawn").Process(target=forward, args=(pull, pub), daemon=True)
        forwarder.start()
        sink = ("--push", pull)
    env = {**os.environ, "PYSPARK_PYTHON": str(python), "PYSPARK_DRIVER_PYTHON": str(python)}
    conf = {
        **LOCAL_DEFAULTS,
        "spark.jars": str(token_provider_jar()),
        "spark.jars.excludes": ":".join(TOKEN_PROVIDER[:2]),
        **dict(kv.split("=", 1) for kv in args.conf),
    }
    trigger_s = args.rtm_batch_s if mode == "rtm" else args.trigger_s
    ready_file = tmp / f"{case}.ready"
    started = time.perf_counter()
    process = start_until_ready(
        [
            *(str(python), str(ROOT / "bench" / "rtm_query.py"), "--mode", mode),
            *("--bootstrap", bootstrap, "--topic", topic, *sink),
            *("--checkpoint", str(tmp / f"checkpoint-{case}"), "--ready", str(ready_file)),
            *("--master", args.master, "--trigger-s", str(trigger_s)),
            *("--conf-json", json.dumps(conf)),
        ],
        env,
        tmp / f"spark-{case}.log",
        ready_file,
        f"spark query {case}",
    )
    ready = json.loads(ready_file.read_text())
    print(
        f"{case}: Spark {ready['spark']} query running in {time.perf_counter() - started:.1f} s",
        flush=True,
    )
    try:
        yield
    finally:
        stop_group(process)
        if not kafka_sink:
            forwarder.kill()
            forwarder.join(10)


def run(args: argparse.Namespace) -> None:
    spark_cases = [c for c in args.cases if c != "bridge"]
    python = ensure_venv() if spark_cases else Path(sys.executable)
    tag = uuid.uuid4().hex[:8]
    with (
        stack(args.stack_dir, kafka_only=True) as endpoints,
        workdir(args.workdir) as tmpdir,
        contextlib.ExitStack() as running,
    ):
        tmp = Path(tmpdir)
        bootstrap = endpoints.kafka_bootstrap
        topics = {case: f"rtm-bench-{tag}.{case}" for case in args.cases}
        # The topic a bridge publishes from: the produced one, or a Kafka sink's output.
        bridged = {c: f"{t}.out" for c, t in topics.items() if c.endswith("-kafka")}
        if "bridge" in topics:
            bridged["bridge"] = topics["bridge"]
        ensure_topics(
            bootstrap,
            [spec(contracts.KAFKA_TICKS, t) for t in {*topics.values(), *bridged.values()}],
            partitions=args.partitions,
            replication=1,
            timeout_s=30,
        )
        pubs = {case: f"tcp://127.0.0.1:{free_port()}" for case in args.cases}
        cases = list(args.cases)
        for case in spark_cases:
            try:
                running.enter_context(
                    spark_query(python, case, bootstrap, topics[case], pubs[case], tmp, args)
                )
            except RuntimeError as exc:  # reported and skipped: the other cases still run
                print(f"{case}: NOT MEASURED, {exc}", flush=True)
                cases.remove(case)
        print(f"load average at start: {os.getloadavg()}", flush=True)
        results: dict[str, list[dict[str, float]]] = {}
        for _ in range(args.reps):
            for rate in args.rates:
                for case in cases:
                    with (
                        bridge_running(bootstrap, bridged[case], pubs[case])
                        if case in bridged
                        else contextlib.nullcontext()
                    ):
                        r = measure(
                            bootstrap, topics[case], pubs[case], rate, args.seconds, args.warmup
                        )
                    results.setdefault(f"{case} {rate}/s", []).append(r)
                    print(
                        f"  {case} {rate}/s: {fmt(r)} (load {os.getloadavg()[0]:.1f})", flush=True
                    )
        print(f"load average at end: {os.getloadavg()}")
        summary(results, args.rates, [c for c in cases if c != "bridge"], "bridge")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    measurement_arguments(parser, seconds=15.0)
    parser.add_argument("--cases", nargs="+", default=CASES, choices=CASES)
    parser.add_argument("--partitions", type=int, default=3, help="of each ticks topic")
    parser.add_argument("--master", default="local[4]")
    parser.add_argument("--trigger-s", type=float, default=0.1, help="micro-batch interval")
    parser.add_argument(
        "--rtm-batch-s", type=float, default=5.0, help="RTM batch duration (checkpoint interval)"
    )
    parser.add_argument("--conf", nargs="*", default=[], help="extra spark.x=y settings")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
