"""What the pipeline's query listener costs per micro-batch (docs/pipeline-benchmarks.md).

Every micro-batch of every query sends its progress to the driver's one query listener
(`pipeline.progress.ProgressLogger`: a log line and the metrics). Here one streaming
query (a rate-micro-batch source into the no-op sink, a batch every `--trigger-ms`) runs in a local
Spark with the pipeline's jars, `--seconds` per run, in turn:

- **none**: no listener, the floor;
- **pyspark**: the listener over PySpark's own adapter, which builds each progress field by
  field over py4j;
- **json**: the listener as the pipeline registers it, each progress taken as one JSON string
  (`pipeline.progress.JsonEvents`).

Reported per run: micro-batches, and CPU ms per batch of the driver JVM and of this Python
process (/proc); then each listener's median cost per batch over the floor's.

    .venv/bin/python bench/query_listener.py [--reps 3] [--seconds 10] [--trigger-ms 100]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline_common import cpu_seconds
from pyspark.sql import SparkSession
from pyspark.sql.streaming.listener import StreamingQueryListener

from pipeline.progress import ProgressLogger
from pipeline.session import jvm_pid

JARS = Path(__file__).resolve().parent.parent / ".cache" / "spark"


class PySparkAdapter(ProgressLogger):
    """The same listener, its events built by PySpark's own adapter (the base's way)."""

    _jlistener = StreamingQueryListener._jlistener


@dataclass
class Run:
    mode: str
    batches: int
    jvm_cpu_s: float
    python_cpu_s: float

    def per_batch_ms(self) -> float:
        return (self.jvm_cpu_s + self.python_cpu_s) / max(1, self.batches) * 1000


def one_run(spark: SparkSession, jvm: int, mode: str, seconds: float, trigger_ms: int) -> Run:
    listener = {"none": None, "pyspark": PySparkAdapter(), "json": ProgressLogger()}[mode]
    if listener is not None:
        spark.streams.addListener(listener)
    query = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", 10)
        .load()
        .writeStream.format("noop")
        .queryName(f"bench-{mode}")
        .trigger(processingTime=f"{trigger_ms} milliseconds")
        .start()
    )
    try:
        while query.lastProgress is None:  # started: its first batch is behind it
            time.sleep(0.05)
        first = query.lastProgress["batchId"]
        jvm0, py0 = cpu_seconds(jvm), time.process_time()
        time.sleep(seconds)
        jvm1, py1 = cpu_seconds(jvm), time.process_time()
        batches = query.lastProgress["batchId"] - first
    finally:
        query.stop()
        if listener is not None:
            spark.streams.removeListener(listener)
    return Run(mode, batches, jvm1 - jvm0, py1 - py0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--trigger-ms", type=int, default=100)
    args = parser.parse_args()
    jars = sorted(str(p) for p in JARS.glob("*.jar"))
    spark = (
        SparkSession.builder.master("local[1]")
        .config("spark.jars", ",".join(jars))
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    jvm = jvm_pid(spark)
    assert jvm is not None, "the driver JVM's pid"
    modes = ("none", "pyspark", "json")
    for mode in modes:  # warm-up: the JIT, the classes each path loads
        one_run(spark, jvm, mode, args.seconds / 2, args.trigger_ms)
    runs: list[Run] = []
    print("| run | listener | batches | JVM CPU ms/batch | Python CPU ms/batch |")
    print("|---:|---|---:|---:|---:|")
    for rep in range(args.reps):
        for mode in modes:
            r = one_run(spark, jvm, mode, args.seconds, args.trigger_ms)
            runs.append(r)
            n = max(1, r.batches)
            print(
                f"| {rep + 1} | {mode} | {r.batches} | {r.jvm_cpu_s / n * 1000:.1f}"
                f" | {r.python_cpu_s / n * 1000:.1f} |",
                flush=True,
            )
    floor = statistics.median(r.per_batch_ms() for r in runs if r.mode == "none")
    print(f"\n{len(jars)} jars added; floor (no listener) {floor:.1f} CPU ms per batch")
    for mode in modes[1:]:
        cost = statistics.median(r.per_batch_ms() for r in runs if r.mode == mode) - floor
        print(f"{mode}: +{cost:.1f} CPU ms per batch (JVM and Python, median)")
    spark.stop()


if __name__ == "__main__":
    main()
