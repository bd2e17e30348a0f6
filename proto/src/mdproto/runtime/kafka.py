"""Kafka plumbing shared by the services: one registry of topic specs, one way to
create them, one way to find a topic's end, one way to read a quiet topic promptly.

Why a registry: topics used to be created from five places with their own
layouts, so `cep.triggers` got whichever layout (and cleanup policy) started
first. confluent_kafka is imported lazily: mdproto must not need it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from mdproto import contracts

log = logging.getLogger(__name__)

COMPACT: Mapping[str, str] = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.1"}


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """How a topic is created; `partitions=None` takes the service's configured count."""

    name: str
    partitions: int | None = None
    config: Mapping[str, str] = field(default_factory=dict)

    def named(self, name: str) -> TopicSpec:
        """The same layout under a configured (e.g. test-private) name."""
        return dataclasses.replace(self, name=name)


TOPICS: Mapping[str, TopicSpec] = {
    spec.name: spec
    for spec in (
        TopicSpec(contracts.KAFKA_OHLC_BATCHES),
        TopicSpec(contracts.KAFKA_TICKS),
        # Deltas are many and live only: a day covers a pipeline outage; snapshots
        # outlive it in Iceberg (docs/protocol.md "Order books").
        TopicSpec(contracts.KAFKA_BOOK, config={"retention.ms": str(86_400_000)}),
        TopicSpec(contracts.KAFKA_LIVE_CANDLES),
        # Live messages only: an hour covers an engine's restart.
        TopicSpec(
            contracts.KAFKA_LIVE_CORRECTIONS, partitions=1, config={"retention.ms": str(3_600_000)}
        ),
        TopicSpec(contracts.KAFKA_MARKETS, config={"cleanup.policy": "compact"}),
        # One partition: the claim order is the arbitration (docs/protocol.md).
        TopicSpec(
            contracts.KAFKA_INGEST_CLAIMS, partitions=1, config={"retention.ms": str(86_400_000)}
        ),
        TopicSpec(contracts.KAFKA_CEP_TRIGGERS, config=COMPACT),
        # A partition per recording slot: the slot's checkpoints and gaps (compacted).
        TopicSpec(contracts.KAFKA_RECORDING, partitions=contracts.RECORDING_SLOTS, config=COMPACT),
    )
}


def assigned_consumer_config(bootstrap_servers: str, purpose: str) -> dict[str, Any]:
    """A consumer that assigns its partitions itself and commits nothing: its group id
    (librdkafka wants one) is used once, so no two processes share a position."""
    return {
        "bootstrap.servers": bootstrap_servers,
        "group.id": f"{purpose}-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        # librdkafka's fetch wait (500 ms): the broker answers a waiting fetch the moment
        # a record arrives; a shorter wait adds only idle requests (ADR 0011).
    }


def spec(default_name: str, name: str | None = None) -> TopicSpec:
    """The registry's spec for a topic, under its configured name."""
    return TOPICS[default_name].named(name or default_name)


def quiet_logger(name: str) -> logging.Logger:
    """A librdkafka logger that stays silent: its retries are noise; errors surface as
    exceptions or delivery reports."""
    logger = logging.getLogger(f"mdproto.librdkafka.{name}")
    logger.setLevel(logging.CRITICAL)
    return logger


def ensure_topics(
    bootstrap: str,
    specs: Iterable[TopicSpec],
    *,
    partitions: int,
    replication: int,
    timeout_s: float,
) -> list[str]:
    """Create the missing topics (the broker would auto-create them without their
    config); warn about an existing one whose cleanup.policy differs. Returns the
    names this call created; a topic created concurrently by another process is fine."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": quiet_logger("admin")}
    admin = AdminClient(conf)
    wanted = {s.name: s for s in specs}
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    new = [
        NewTopic(
            s.name,
            num_partitions=s.partitions or partitions,
            replication_factor=replication,
            config=dict(s.config),
        )
        for s in wanted.values()
        if s.name not in existing
    ]
    created: list[str] = []
    for name, future in (
        admin.create_topics(new, operation_timeout=timeout_s) if new else {}
    ).items():
        try:
            future.result(timeout=timeout_s)
            created.append(name)
            log.info("created Kafka topic %s %s", name, dict(wanted[name].config) or "")
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    for s in wanted.values():
        if s.name not in created and "cleanup.policy" in s.config:
            _check_policy(admin, s, timeout_s)
    return created


def _check_policy(admin: Any, spec: TopicSpec, timeout_s: float) -> None:
    from confluent_kafka.admin._config import ConfigResource

    resource = ConfigResource(ConfigResource.Type.TOPIC, spec.name)
    try:
        policy = admin.describe_configs([resource])[resource].result(timeout=timeout_s)
        actual = str(policy["cleanup.policy"].value)
    except Exception as exc:  # informational only
        log.debug("cannot read %s's config: %s", spec.name, exc)
        return
    if spec.config["cleanup.policy"] not in actual:
        log.warning(
            "Kafka topic %s has cleanup.policy=%s, not %s: records that should be replaced "
            "by key stay until retention removes them",
            spec.name,
            actual,
            spec.config["cleanup.policy"],
        )


def end_offsets(consumer: Any, topic: str, timeout_s: float) -> dict[int, int] | None:
    """High watermark of every partition, or None while the topic has no metadata yet."""
    from confluent_kafka import TopicPartition

    meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        return None
    return {
        p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)[1]
        for p in meta.partitions
    }


def wait_end_offsets(
    consumer: Any, topic: str, stop: threading.Event, *, poll_s: float = 0.5
) -> dict[int, int] | None:
    """`end_offsets`, retried until the topic exists and the broker answers (None: stopped).

    For readers that rebuild state from a compacted topic at start and must not
    fail while the broker or the topic is not there yet."""
    while not stop.is_set():
        try:
            ends = end_offsets(consumer, topic, timeout_s=2.0)
        except Exception as exc:  # broker not there yet: keep trying
            log.debug("waiting for Kafka topic %s: %s", topic, exc)
            ends = None
        if ends is not None:
            return ends
        stop.wait(poll_s)
    return None


def consume_ready(
    consumer: Any, max_messages: int, timeout_s: float, gather_s: float = 0.0
) -> list[Any]:
    """Up to `max_messages` records, returned as soon as one is there and `gather_s`
    more has passed ([] after `timeout_s` without any); error records included, as
    `consume` gives them.

    Why: librdkafka's ``consume(n, timeout)`` returns only once it holds n records or
    the timeout has passed, so a reader of a quiet topic got each record only at the
    end of its timeout (a claim verdict 0-100 ms late). ``poll`` returns the moment a
    record is there; ``consume(n - 1, gather_s)`` then takes what was fetched with it
    and what arrives within `gather_s`: a reader whose every batch has a fixed cost
    bounds how many batches a steady stream makes of it."""
    first = consumer.poll(timeout_s)
    if first is None:
        return []
    if max_messages <= 1:
        return [first]
    return [first, *consumer.consume(max_messages - 1, gather_s)]


def read_to_end(consumer: Any, topic: str, ends: Mapping[int, int]) -> Iterator[Any]:
    """Assign every partition from the beginning and yield records until each one
    reached its end in `ends` (then stop; the consumer stays assigned)."""
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
    todo = {p for p, end in ends.items() if end > 0}
    while todo:
        msg = consumer.poll(0.2)
        if msg is None or msg.error() is not None:
            yield None  # lets the caller check its deadline or stop flag
            continue
        yield msg
        partition, offset = msg.partition() or 0, msg.offset() or 0
        if offset + 1 >= ends.get(partition, 0):
            todo.discard(partition)
