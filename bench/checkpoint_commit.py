"""Micro-batch commit time with Spark's checkpoint on a local disk vs on the S3 store.

Issue #44 item 5 (docs/adr/0022). On a fresh local stack (Kafka, SeaweedFS S3), in
one Spark driver started by the pipeline's own `session.build_session` with an
``s3a://`` checkpoint_dir (so the pipeline's jars and `session.s3a_conf` settings):

1. one topic holding ``--batches`` x ``--per-batch`` records;
2. the same query for each variant: Kafka source (``maxOffsetsPerTrigger``) ->
   foreachBatch that counts the batch's rows on the driver (next to nothing, so the
   checkpoint's share shows), ``availableNow``, a fresh checkpoint per run;
3. variants, interleaved ``--reps`` times so a load change hits each alike:
   ``local`` (a directory on this disk, Spark's default FileContext manager: write a
   temporary file, rename), ``local-fs`` (that directory with Spark's FileSystem-based
   manager, the pipeline's setting for a local checkpoint_dir, docs/adr/0027),
   ``s3a-rename`` (the S3 store with that same default
   manager: on S3 a rename is a copy and a delete) and ``s3a-abortable`` (the S3 store
   with spark-hadoop-cloud's AbortableStreamBasedCheckpointFileManager, the
   pipeline's setting: the file written in place, its upload aborted on failure);
4. beside Spark, the store alone: ``--raw`` writes of a 400-byte object (an offset
   log entry's size) by pyarrow, locally (write, fsync, rename: `blobs.Blob`) and as
   one PUT to the S3 store, and a PUT + COPY + DELETE (what a rename costs there);
5. per batch from Spark's progress events (``durationMs``): ``walCommit`` (the offset
   log entry written before the batch), ``commitOffsets`` (the commit log entry after
   it), their sum, and the whole trigger; batch 0 (it also writes the query's metadata)
   is left out. Medians and p90 over all batches of all reps, per variant.

    .venv/bin/python bench/checkpoint_commit.py [--batches 40] [--per-batch 100]
        [--reps 4] [--raw 200] [--stack-dir .data]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from confluent_kafka import Producer
from pipeline_common import stack

from infra.artifacts import spark_jars
from infra.localstack import StackEndpoints

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

DEFAULT_MANAGER = "org.apache.spark.sql.execution.streaming.FileContextBasedCheckpointFileManager"
VARIANTS = ("local", "local-fs", "s3a-rename", "s3a-abortable")
STEPS = ("walCommit", "commitOffsets", "checkpoint", "triggerExecution")


@dataclass
class Samples:
    """Per step, the milliseconds of every measured batch of one variant."""

    ms: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in STEPS})
    runs_s: list[float] = field(default_factory=list)
    #: Each run's median checkpoint ms: load from other processes only adds, so the
    #: quietest run's is the nearest to the cost itself.
    run_medians: list[float] = field(default_factory=list)

    def add(self, progress: dict[str, Any]) -> None:
        d = progress["durationMs"]
        wal, commit = float(d.get("walCommit", 0)), float(d.get("commitOffsets", 0))
        self.ms["walCommit"].append(wal)
        self.ms["commitOffsets"].append(commit)
        self.ms["checkpoint"].append(wal + commit)
        self.ms["triggerExecution"].append(float(d.get("triggerExecution", 0)))


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1] if len(values) > 1 else values[0]


def produce(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(count):
        producer.produce(topic, value=f"{i:08d}".encode())
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0


def one_run(
    session: SparkSession, bootstrap: str, topic: str, checkpoint: str, per_batch: int
) -> tuple[list[dict[str, Any]], float]:
    """The query once on a fresh checkpoint; its progress events and wall time."""
    counted: list[int] = []

    def count(frame: DataFrame, _batch_id: int) -> None:
        counted.append(frame.count())

    stream = (
        session.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(per_batch))
        .load()
    )
    started = time.perf_counter()
    query = (
        stream.writeStream.foreachBatch(count)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(f"query failed: {query.exception()}")
    return [p for p in query.recentProgress if p.get("batchId", 0) > 0], elapsed


def raw_writes(e: StackEndpoints, tmp: str, count: int) -> dict[str, list[float]]:
    """Milliseconds per write of a small object: local (atomic replace), one S3 PUT,
    and a PUT followed by a server-side copy and a delete (S3A's rename)."""
    from pyarrow import fs

    from pipeline.blobs import Blob

    s3 = fs.S3FileSystem(**e.s3_filesystem_options())
    data = b"v1\n" + b"x" * 397
    prefix = f"{e.s3_bucket}/bench/raw-{uuid.uuid4().hex[:8]}"
    timed: dict[str, list[float]] = {"local": [], "s3-put": [], "s3-put+copy+delete": []}
    for i in range(count):
        started = time.perf_counter()
        Blob.local(Path(tmp) / "raw" / f"{i}").write(data)
        timed["local"].append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        Blob(s3, f"{prefix}/put/{i}").write(data)
        timed["s3-put"].append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        Blob(s3, f"{prefix}/tmp/{i}").write(data)
        s3.move(f"{prefix}/tmp/{i}", f"{prefix}/renamed/{i}")  # pyarrow: copy, then delete
        timed["s3-put+copy+delete"].append((time.perf_counter() - started) * 1000)
    return timed


def run(args: argparse.Namespace) -> None:
    from pipeline.config import load_settings
    from pipeline.session import LOCAL_CHECKPOINT_MANAGER, build_session

    with stack(args.stack_dir) as endpoints, tempfile.TemporaryDirectory() as tmp:
        e: StackEndpoints = endpoints
        tag = uuid.uuid4().hex[:8]
        settings = load_settings(
            catalog=e.catalog_settings().model_dump(),
            spark={"master": "local[2]", "jars": [str(j) for j in spark_jars()]},
            checkpoint_dir=f"s3a://{e.s3_bucket}/bench/checkpoints-{tag}",
        )
        spark = build_session(settings)
        try:
            topic = f"bench-checkpoints-{tag}"
            produce(e.kafka_bootstrap, topic, args.batches * args.per_batch)
            sessions = {v: spark.newSession() for v in VARIANTS}
            for v in ("local", "s3a-rename"):
                sessions[v].conf.set(
                    "spark.sql.streaming.checkpointFileManagerClass", DEFAULT_MANAGER
                )
            sessions["local-fs"].conf.set(
                "spark.sql.streaming.checkpointFileManagerClass", LOCAL_CHECKPOINT_MANAGER
            )
            raw = raw_writes(e, tmp, args.raw)
            samples = {v: Samples() for v in VARIANTS}
            for rep in range(args.reps):
                for v in VARIANTS:
                    where = (
                        f"{tmp}/{v}-{rep}"
                        if v.startswith("local")
                        else settings.checkpoint_for(f"{v}-{rep}")
                    )
                    progress, elapsed = one_run(
                        sessions[v], e.kafka_bootstrap, topic, where, args.per_batch
                    )
                    for p in progress:
                        samples[v].add(p)
                    samples[v].runs_s.append(elapsed)
                    med = statistics.median(samples[v].ms["checkpoint"][-len(progress) :])
                    samples[v].run_medians.append(med)
                    print(
                        f"rep {rep} {v:<14} {len(progress)} batches in {elapsed:.1f} s, "
                        f"checkpoint median {med:.0f} ms",
                        flush=True,
                    )
        finally:
            spark.stop()
    print()
    print(
        f"{args.reps} reps x {args.batches} batches of {args.per_batch} records (batch 0 "
        f"left out), load {os.getloadavg()[0]:.2f} (1 min)"
    )
    print()
    print(report(samples))
    print()
    print("| store alone (400 bytes) | p50 / p90 ms |")
    print("|---|---|")
    for name, values in raw.items():
        print(f"| {name} | {statistics.median(values):.1f} / {p90(values):.1f} |")


def report(samples: dict[str, Samples]) -> str:
    head = "| variant | " + " | ".join(f"{s} p50 / p90 ms" for s in STEPS)
    head += " | checkpoint p50, quietest run ms | run s |"
    lines = [head, "|" + "---|" * (len(STEPS) + 3)]
    for v, s in samples.items():
        cells = [f"{statistics.median(s.ms[k]):.0f} / {p90(s.ms[k]):.0f}" for k in STEPS]
        run_s = statistics.median(s.runs_s)
        quietest = min(s.run_medians)
        lines.append(f"| {v} | " + " | ".join(cells) + f" | {quietest:.0f} | {run_s:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stack-dir", type=Path, help="use the stack started with this dir")
    for flag, default, meaning in (
        ("--batches", 40, "micro-batches per run"),
        ("--per-batch", 100, "records per micro-batch (maxOffsetsPerTrigger)"),
        ("--reps", 4, "runs per variant, interleaved"),
        ("--raw", 200, "writes of the store alone"),
    ):
        parser.add_argument(flag, type=int, default=default, help=meaning)
    run(parser.parse_args())


if __name__ == "__main__":
    main()
