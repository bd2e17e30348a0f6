"""The compacted trigger topic seen from the pipeline (confluent-kafka, driver only).

- `ensure_topic`: create `cep.triggers` with cleanup.policy=compact before
  anything writes to it (the broker would otherwise auto-create it
  uncompacted);
- `TombstoneWriter`: when the engine finishes a trigger (one-shot fired,
  expired), a tombstone (key trigger_id, no value) removes its REGISTER from
  the compacted topic, so a rebuild from the topic never revives it and the
  relay's LIST stops showing it;
- `read_all`: every live record of the topic, for rebuilding the trigger
  set when no engine snapshot is usable.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from pipeline.cep.records import TriggerRecord, decode_batch

log = logging.getLogger(__name__)

COMPACT = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.1"}


def _quiet(name: str) -> logging.Logger:
    logger = logging.getLogger(f"pipeline.cep.librdkafka.{name}")
    logger.setLevel(logging.CRITICAL)
    return logger


def ensure_topic(
    bootstrap: str, topic: str, *, partitions: int, replication: int, timeout_s: float
) -> bool:
    """Create the compacted trigger topic if missing; True if this call created it."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.admin._config import ConfigResource
    from confluent_kafka.cimpl import NewTopic

    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": _quiet("admin")}
    admin = AdminClient(conf)
    new = NewTopic(topic, num_partitions=partitions, replication_factor=replication, config=COMPACT)
    future = admin.create_topics([new], operation_timeout=timeout_s)[topic]
    try:
        future.result(timeout=timeout_s)
        log.info("created compacted Kafka topic %s (%d partitions)", topic, partitions)
        return True
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    try:
        configs = admin.describe_configs([resource])[resource].result(timeout=timeout_s)
        policy = configs["cleanup.policy"].value
    except Exception as exc:  # informational only
        log.debug("cannot read %s's config: %s", topic, exc)
        return False
    if "compact" not in str(policy):
        log.warning(
            "Kafka topic %s has cleanup.policy=%s, not compact: cancelled triggers are never "
            "removed and old registrations expire with retention",
            topic,
            policy,
        )
    return False


class TombstoneWriter:
    """Asynchronous, idempotent producer of tombstones; failures are logged and counted."""

    def __init__(self, bootstrap: str, topic: str, options: dict[str, str] | None = None) -> None:
        from confluent_kafka import Producer

        conf: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "logger": _quiet("producer"),
            **(options or {}),
        }
        self._producer = Producer(conf)
        self.topic = topic
        self.sent = 0
        self.failed = 0

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failed += 1
            log.error("tombstone for trigger %r not written: %s", msg.key(), err)

    def retire(self, trigger_ids: list[str]) -> None:
        for trigger_id in trigger_ids:
            try:
                self._producer.produce(
                    self.topic, key=trigger_id.encode(), value=None, on_delivery=self._delivered
                )
                self.sent += 1
            except BufferError:
                self.failed += 1
                log.error("tombstone for trigger %s dropped: producer queue full", trigger_id)
        self._producer.poll(0)

    def close(self, timeout_s: float = 5.0) -> None:
        left = self._producer.flush(timeout_s)
        if left:
            log.warning("%d tombstone(s) not delivered at shutdown", left)


def read_all(bootstrap: str, topic: str, timeout_s: float = 30.0) -> list[TriggerRecord]:
    """The topic from the beginning to its current end, decoded in Kafka order."""
    import pyarrow as pa
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "spark-pipeline-cep-bootstrap",
            "enable.auto.commit": False,
            "logger": _quiet("consumer"),
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if metadata is None or metadata.error is not None:
            return []
        parts = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in metadata.partitions]
        ends = {
            tp.partition: consumer.get_watermark_offsets(tp, timeout=timeout_s)[1] for tp in parts
        }
        consumer.assign(parts)
        todo = {p for p, end in ends.items() if end > 0}
        rows: dict[str, list[Any]] = {
            k: [] for k in ("topic", "key", "value", "timestamp", "partition", "offset")
        }
        deadline = time.monotonic() + timeout_s
        while todo and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            partition, offset = msg.partition() or 0, msg.offset() or 0
            rows["topic"].append(topic)
            rows["key"].append(msg.key())
            rows["value"].append(msg.value())
            rows["timestamp"].append(msg.timestamp()[1])
            rows["partition"].append(partition)
            rows["offset"].append(offset)
            if offset + 1 >= ends[partition]:
                todo.discard(partition)
        if todo:
            raise TimeoutError(f"could not read {topic} to its end within {timeout_s:g}s")
    finally:
        consumer.close()
    table = pa.table(
        {
            "topic": pa.array(rows["topic"], pa.string()),
            "key": pa.array(rows["key"], pa.binary()),
            "value": pa.array(rows["value"], pa.binary()),
            "timestamp": pa.array(rows["timestamp"], pa.int64()),
            "partition": pa.array(rows["partition"], pa.int32()),
            "offset": pa.array(rows["offset"], pa.int64()),
        }
    )
    batch = decode_batch(table, topic)
    for reject in batch.rejects:
        log.error("trigger topic %s: dropped %s", topic, reject)
    return [r for r in batch.inputs if isinstance(r, TriggerRecord)]
