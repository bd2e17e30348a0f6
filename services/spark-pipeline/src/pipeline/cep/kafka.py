"""The compacted trigger topic seen from the pipeline (confluent-kafka, driver only).

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

from mdproto.runtime.kafka import end_offsets, quiet_logger, read_to_end
from pipeline.cep.records import TriggerRecord, decode_batch

log = logging.getLogger(__name__)


class TombstoneWriter:
    """Asynchronous, idempotent producer of tombstones; failures are logged and counted."""

    def __init__(self, bootstrap: str, topic: str, options: dict[str, str] | None = None) -> None:
        from confluent_kafka import Producer

        conf: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "logger": quiet_logger("producer"),
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
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "spark-pipeline-cep-bootstrap",
            "enable.auto.commit": False,
            "logger": quiet_logger("consumer"),
        }
    )
    try:
        ends = end_offsets(consumer, topic, timeout_s)
        if ends is None:
            return []
        rows: dict[str, list[Any]] = {
            k: [] for k in ("topic", "key", "value", "timestamp", "partition", "offset")
        }
        deadline = time.monotonic() + timeout_s
        for msg in read_to_end(consumer, topic, ends):
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {topic} to its end within {timeout_s:g}s")
            if msg is None:
                continue
            rows["topic"].append(topic)
            rows["key"].append(msg.key())
            rows["value"].append(msg.value())
            rows["timestamp"].append(msg.timestamp()[1])
            rows["partition"].append(msg.partition() or 0)
            rows["offset"].append(msg.offset() or 0)
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
