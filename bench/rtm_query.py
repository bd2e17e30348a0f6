"""The Spark side of bench/pipeline_ticks_rtm.py: Kafka ticks -> foreach writer -> ZeroMQ PUSH.

Runs in the benchmark's own virtualenv (.venv-rtm, a newer pyspark than the
project pins), so it imports only pyspark, pyzmq and mdproto (never `infra`).
One query per process, with either trigger:

- ``rtm``: Real-time Mode (`RealTimeTrigger`, output mode update). pyspark 4.1's
  `DataStreamWriter.trigger()` has no ``realTime`` argument, so the JVM trigger is
  set through py4j when the Python one is missing.
- ``microbatch``: ``processingTime`` (the pipeline's 0.1 s).

Two sinks, both on Real-time Mode's sink allowlist in 4.1
(`RealTimeModeAllowlist`: console, memory, `ForeachWriterTable`, Kafka):

- ``--push``: PySpark's `foreach` writer: each Spark task decodes the record with
  mdproto and sends the PUB envelope on a PUSH socket that connects to the
  benchmark's PULL -> PUB forwarder (tasks of several partitions cannot bind one
  PUB endpoint; a PUSH queues until connected, so nothing is lost at a batch
  boundary);
- ``--out-topic``: Spark's Kafka sink (JVM only, no Python worker) to a second
  topic, which the benchmark's bridge then publishes: the stand-in for a sink
  that does not cross into Python.

    .venv-rtm/bin/python bench/rtm_query.py --mode rtm --bootstrap H:P --topic T
        (--push tcp://127.0.0.1:N | --out-topic T2) --checkpoint DIR --ready FILE
"""

from __future__ import annotations

import argparse
import inspect
import json
import time
from pathlib import Path
from typing import Any

KAFKA_PACKAGE = "org.apache.spark:spark-sql-kafka-0-10_2.13:{version}"


class TickPublisher:
    """PySpark foreach writer: one PUSH socket per task, one PUB envelope per record."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.socket: Any = None

    def open(self, partition_id: int, epoch_id: int) -> bool:
        import zmq

        self.socket = zmq.Context.instance().socket(zmq.PUSH)
        self.socket.setsockopt(zmq.SNDHWM, 100_000)
        self.socket.connect(self.endpoint)
        return True

    def process(self, row: Any) -> None:
        from mdproto import envelope, topics
        from mdproto.messages import Tick

        tick = envelope.decode_record(bytes(row.value), Tick)
        self.socket.send_multipart(envelope.encode_pub(topics.tick_topic(tick.ticker), tick))

    def close(self, error: BaseException | None) -> None:
        if self.socket is not None:
            self.socket.close(linger=2000)  # deliver what is queued
        if error is not None:
            raise error


def start_query(args: argparse.Namespace) -> Any:
    import pyspark
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(args.master).appName(f"rtm-bench-{args.mode}")
    conf = {
        **json.loads(args.conf_json),
        "spark.jars.packages": KAFKA_PACKAGE.format(version=pyspark.__version__),
    }
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    source = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", "latest")
        .option("kafka.fetch.max.wait.ms", "10")  # as the bridge's consumer
        .load()
        .select("key", "value")
    )
    if args.out_topic:
        sink = (
            source.writeStream.format("kafka")
            .option("kafka.bootstrap.servers", args.bootstrap)
            .option("topic", args.out_topic)
            .option("kafka.linger.ms", "0")
            .option("kafka.acks", "1")
        )
    else:
        sink = source.writeStream.foreach(TickPublisher(args.push))
    writer = (
        sink.outputMode("update")
        .option("checkpointLocation", args.checkpoint)
        .queryName(f"ticks-{args.mode}")
    )
    if args.mode == "microbatch":
        writer = writer.trigger(processingTime=f"{args.trigger_s} seconds")
    elif "realTime" in inspect.signature(writer.trigger).parameters:
        writer = writer.trigger(realTime=f"{args.trigger_s} seconds")  # type: ignore[call-overload]
    else:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        trigger = jvm.org.apache.spark.sql.execution.streaming.RealTimeTrigger.apply(
            f"{args.trigger_s} seconds"
        )
        writer._jwrite = writer._jwrite.trigger(trigger)
    return writer.start()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=["rtm", "microbatch"], required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    sink = parser.add_mutually_exclusive_group(required=True)
    sink.add_argument("--push", help="foreach sink: endpoint of the PULL -> PUB forwarder")
    sink.add_argument("--out-topic", help="Kafka sink: the topic the bridge then reads")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--ready", type=Path, required=True, help="written once the query runs")
    parser.add_argument("--master", default="local[4]")
    parser.add_argument(
        "--trigger-s", type=float, default=0.1, help="micro-batch interval / RTM batch duration"
    )
    parser.add_argument("--conf-json", default="{}", help="extra Spark conf as a JSON object")
    args = parser.parse_args()
    import pyspark

    query = start_query(args)
    # A running query has resolved its starting offsets once its first progress is in.
    deadline = time.monotonic() + 300
    while query.lastProgress is None and query.isActive and time.monotonic() < deadline:
        time.sleep(0.2)
    if not query.isActive:
        raise SystemExit(f"query stopped: {query.exception()}")
    args.ready.write_text(json.dumps({"spark": pyspark.__version__, "mode": args.mode}))
    print(f"ready: spark {pyspark.__version__}, {args.mode}", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main()
