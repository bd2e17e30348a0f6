"""Spark on the local stack: Kafka source -> Iceberg (REST catalog) -> read by pyiceberg.

Uses Structured Streaming with ``availableNow`` and a checkpoint, as the
pipeline does, and checks that a second run only picks up new records.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from confluent_kafka import Producer
from pyiceberg.catalog import load_catalog

from infra.localstack import LocalStack

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.stack, pytest.mark.spark, pytest.mark.heavy(seconds=80)]


def _produce(bootstrap: str, topic: str, values: list[str]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for v in values:
        producer.produce(topic, key=v.encode(), value=v.encode())
    assert producer.flush(30) == 0


def _run_once(spark: SparkSession, bootstrap: str, topic: str, table: str, ckpt: Path) -> None:
    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr(
            "CAST(key AS STRING) AS k",
            "CAST(value AS STRING) AS v",
            "partition",
            "offset",
            "timestamp AS ts",
        )
    )
    query = (
        stream.writeStream.format("iceberg")
        .outputMode("append")
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .toTable(table)
    )
    assert query.awaitTermination(300)
    assert query.exception() is None


def test_kafka_to_iceberg_with_spark(
    local_stack: LocalStack, spark: SparkSession, tmp_path: Path
) -> None:
    e = local_stack.endpoints
    topic = f"spark-in-{uuid.uuid4().hex[:8]}"
    namespace = f"spark_{uuid.uuid4().hex[:8]}"
    table = f"{e.catalog_name}.{namespace}.events"
    _produce(e.kafka_bootstrap, topic, [f"a{i}" for i in range(20)])

    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {e.catalog_name}.{namespace}")
    spark.sql(
        f"CREATE TABLE {table} (k STRING, v STRING, partition INT, offset BIGINT, ts TIMESTAMP)"
        " USING iceberg"
    )
    ckpt = tmp_path / "checkpoint"
    _run_once(spark, e.kafka_bootstrap, topic, table, ckpt)
    assert spark.table(table).count() == 20

    # The checkpoint remembers the Kafka offsets: a rerun adds only new records.
    _produce(e.kafka_bootstrap, topic, [f"b{i}" for i in range(5)])
    _run_once(spark, e.kafka_bootstrap, topic, table, ckpt)

    catalog = load_catalog(e.catalog_name, **e.pyiceberg_catalog_properties())
    rows = catalog.load_table(f"{namespace}.events").scan().to_arrow()
    values = sorted(rows.column("v").to_pylist())
    assert values == sorted([f"a{i}" for i in range(20)] + [f"b{i}" for i in range(5)])
    assert rows.num_rows == 25
