"""Checkpoints and engine state on the stack's S3 store (SeaweedFS), where any host
reaches them (docs/adr/0022).

A streaming query with its checkpoint on ``s3a://`` (hadoop-aws and Spark's abortable-
stream checkpoint manager, settings from the pipeline's ``catalog.s3_*`` through
`session.s3a_conf`) is stopped and started again: it goes on from its checkpoint, so
its sink, which appends whatever it is given, holds every record once. CEP's snapshots,
the engine's own snapshot and the pending gap rebuilds round-trip through the same
store (`blobs`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from confluent_kafka import Producer
from pyarrow import fs

from infra.localstack import LocalStack
from pipeline.blobs import Folder
from pipeline.cep.engine import Engine
from pipeline.cep.state import SnapshotStore
from pipeline.config import Settings
from pipeline.gap_rebuilds import Pending, PendingFile
from pipeline.gaps import Gap
from pipeline.live_saves import Snapshot, SnapshotFile
from pipeline.session import s3a_conf

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = [pytest.mark.stack, pytest.mark.spark, pytest.mark.heavy(seconds=60)]

HADOOP_PREFIX = "spark.hadoop."


def settings_on_s3(local_stack: LocalStack, prefix: str) -> Settings:
    """The pipeline's settings on this stack, its checkpoints under ``prefix`` in the
    warehouse bucket."""
    e = local_stack.endpoints
    return Settings.model_validate(
        {
            "catalog": {
                "s3_endpoint": e.s3_endpoint,
                "s3_access_key": e.s3_access_key,
                "s3_secret_key": e.s3_secret_key,
                "s3_region": e.s3_region,
            },
            "checkpoint_dir": f"s3a://{e.s3_bucket}/{prefix}",
        }
    )


def s3a_session(spark: SparkSession, settings: Settings) -> SparkSession:
    """A session of the shared test context with the pipeline's s3a settings: Hadoop's
    as session settings (copied into each query's Hadoop configuration), the
    checkpoint manager for this session's queries only."""
    session = spark.newSession()
    for key, value in s3a_conf(settings).items():
        session.conf.set(key.removeprefix(HADOOP_PREFIX), value)
    return session


def produce(bootstrap: str, topic: str, values: list[str]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for v in values:
        producer.produce(topic, key=v.encode(), value=v.encode())
    assert producer.flush(30) == 0


class AppendingSink:
    """Appends every row it is handed, with its batch id: a batch handed twice (a
    query that did not resume from its checkpoint) shows as values seen twice."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, str]] = []

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        self.rows += [(batch_id, r.v) for r in frame.select("v").collect()]

    @property
    def values(self) -> list[str]:
        return sorted(v for _, v in self.rows)


def run_until_caught_up(
    session: SparkSession, bootstrap: str, topic: str, checkpoint: str, sink: AppendingSink
) -> None:
    """Start the query on `checkpoint`, wait until it has processed what Kafka holds
    (Spark's own readiness: `processAllAvailable`), stop it."""
    stream = (
        session.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "10")  # several batches, several commits
        .load()
        .selectExpr("CAST(value AS STRING) AS v")
    )
    query = (
        stream.writeStream.foreachBatch(sink)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert query.exception() is None


@pytest.fixture
def s3(local_stack: LocalStack) -> Iterator[fs.S3FileSystem]:
    yield fs.S3FileSystem(**local_stack.endpoints.s3_filesystem_options())


def listed(s3: fs.S3FileSystem, root: str) -> list[str]:
    infos = s3.get_file_info(fs.FileSelector(root, recursive=True, allow_not_found=True))
    return sorted(i.path.removeprefix(root + "/") for i in infos if i.type == fs.FileType.File)


def test_a_query_checkpointed_on_s3a_resumes_where_it_stopped(
    local_stack: LocalStack, spark: SparkSession, s3: fs.S3FileSystem
) -> None:
    e = local_stack.endpoints
    tag = uuid.uuid4().hex[:8]
    settings = settings_on_s3(local_stack, f"tests/s3-checkpoints-{tag}")
    session = s3a_session(spark, settings)
    topic = f"s3-checkpoints-{tag}"
    checkpoint = settings.checkpoint_for("resume")
    first = [f"a{i:02d}" for i in range(30)]
    produce(e.kafka_bootstrap, topic, first)

    before = AppendingSink()
    run_until_caught_up(session, e.kafka_bootstrap, topic, checkpoint, before)
    assert before.values == first
    last_batch = max(b for b, _ in before.rows)
    assert last_batch >= 2  # maxOffsetsPerTrigger: several batches, each committed

    # The checkpoint is in the S3 store, not on this host: offsets and commits per batch.
    root = f"{e.s3_bucket}/tests/s3-checkpoints-{tag}/resume"
    objects = listed(s3, root)
    assert "metadata" in objects
    assert f"offsets/{last_batch}" in objects and f"commits/{last_batch}" in objects

    second = [f"b{i:02d}" for i in range(20)]
    produce(e.kafka_bootstrap, topic, second)
    after = AppendingSink()
    run_until_caught_up(session, e.kafka_bootstrap, topic, checkpoint, after)

    # Resumed: only the new records, in batches numbered on from the last commit.
    assert after.values == second
    assert min(b for b, _ in after.rows) == last_batch + 1
    stored = before.values + after.values
    assert sorted(stored) == sorted(first + second) and len(set(stored)) == len(stored)


def test_engine_snapshots_and_pending_rebuilds_round_trip_through_the_s3_store(
    local_stack: LocalStack, s3: fs.S3FileSystem
) -> None:
    """What the live engine and the gap rebuilds keep beside the checkpoints goes to the
    S3 store with an s3a:// checkpoint_dir: read back by a new process on any host."""
    e = local_stack.endpoints
    tag = uuid.uuid4().hex[:8]
    settings = settings_on_s3(local_stack, f"tests/engine-state-{tag}")

    folder = Folder.at(settings.checkpoint_for("live-engine"), settings.catalog).folder("cep")
    assert not folder.is_local
    store = SnapshotStore(folder, keep=2)
    for batch_id in range(4):
        engine = Engine()
        engine.stats["marker"] = batch_id
        store.save(batch_id, engine)
    root = f"{e.s3_bucket}/tests/engine-state-{tag}/live-engine/cep"
    assert len([o for o in listed(s3, root) if o.endswith(".snapshot")]) == 2  # pruned
    loaded = SnapshotStore(folder).load_before(4)
    assert loaded is not None and loaded[0] == 3 and loaded[1].stats["marker"] == 3

    snapshot_file = SnapshotFile.for_settings(settings)
    assert snapshot_file.load() is None
    snapshot_file.save(Snapshot({("cep.triggers", 0): 17}, 3))
    assert SnapshotFile.for_settings(settings).load() == Snapshot({("cep.triggers", 0): 17}, 3)

    gap = Gap("g1", "BINANCE:BTC/USDT", "1", "9", 0, 60_000, 7, 61_000)
    PendingFile.for_settings(settings).save([Pending(gap, 0, {(60, 0)})])
    assert PendingFile.for_settings(settings).load() == [(gap, {(60, 0)})]
    assert "gap-rebuilds/pending.json" in listed(s3, f"{e.s3_bucket}/tests/engine-state-{tag}")
