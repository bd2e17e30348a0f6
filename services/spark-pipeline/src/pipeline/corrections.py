"""Candle corrections from the driver, published by the live engine that owns the ticker.

Why: a ticker's live topics have one publisher, the engine owning its ``market.ticks``
partition, in that engine's epoch (docs/protocol.md, "Epochs across a rebalance"). The
gap rebuild (`gap_rebuilds`, on the driver) has corrections for those topics; sent
through the pipeline's own PUB server they would come in engine 1's epoch whatever
engine owns the ticker, and each subscriber of another engine's ticker would see its
publisher change twice and resync twice.

    driver: `CorrectionsProducer.send` -> Kafka ``market.ohlc.corrections`` (OHLC,
      key = ticker, one partition)
    every engine: `CorrectionsReader` (no group, from the topic's end when it starts)
      -> `owned` (pure: the engine's ownership rule) -> the engine's ``send_many``

Corrections are live messages, not state: an engine reads them from where the topic
ends as it starts, and none while it owns no ticker (a rebalance): they wait in Kafka
for the assignment, as ``cep.triggers`` records do.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, Self

from google.protobuf.message import Message

from mdproto import ProtocolError, contracts, envelope, topics
from mdproto.messages import OHLC
from mdproto.runtime.kafka import assigned_consumer_config, ensure_topics, spec
from pipeline.config import Settings

log = logging.getLogger(__name__)

#: How long the driver waits for Kafka to take a rebuild's corrections.
SEND_TIMEOUT_S = 10.0


def owned(records: Iterable[bytes | None], owns: Callable[[str], bool]) -> list[tuple[str, OHLC]]:
    """The corrections among ``records`` whose ticker this engine owns, with their topics;
    a record that is not an OHLC is logged and skipped."""
    out = []
    for value in records:
        try:
            message = envelope.decode_record(value or b"", OHLC)
        except ProtocolError as exc:
            log.warning("live engine: a corrections record skipped: %s", exc)
            continue
        if owns(message.ticker):
            out.append((topics.ohlc_topic(message.ticker, message.period_seconds), message))
    return out


class CorrectionsProducer:
    """The driver's side: `send` has the gap rebuild's ``publish`` signature."""

    def __init__(self, settings: Settings) -> None:
        from confluent_kafka import Producer

        self._topic = settings.kafka.topic_live_corrections
        self._producer = Producer(
            {"bootstrap.servers": settings.kafka.bootstrap_servers, "linger.ms": 5}
        )

    def send(self, items: Iterable[tuple[str, Message]]) -> int:
        """Hand the corrections to the engines; raises when Kafka has not taken them all
        within SEND_TIMEOUT_S (the rebuild is stored: only the live copies are late)."""
        count = 0
        for _topic, message in items:
            assert isinstance(message, OHLC)
            key = message.ticker.encode()
            self._producer.produce(self._topic, envelope.encode_record(message), key=key)
            count += 1
        left = self._producer.flush(SEND_TIMEOUT_S)
        if left:
            raise RuntimeError(f"{left} of {count} corrections not in Kafka in {SEND_TIMEOUT_S} s")
        return count

    def close(self) -> None:
        self._producer.flush(SEND_TIMEOUT_S)


class CorrectionsReader:
    """An engine's side: every partition of the topic from its end, no group (each engine
    reads them all and publishes its own tickers')."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer

    @classmethod
    def open(cls, settings: Settings, partitions: Callable[[Any, str], list[int]]) -> Self:
        """The topic created if missing (an engine may start before the pipeline's
        preflight), then read from the end of each of its ``partitions(consumer, topic)``."""
        from confluent_kafka import OFFSET_END, Consumer, TopicPartition

        k = settings.kafka
        topic = k.topic_live_corrections
        ensure_topics(
            k.bootstrap_servers,
            [spec(contracts.KAFKA_LIVE_CORRECTIONS, topic)],
            partitions=k.topic_partitions,
            replication=k.replication_factor,
            timeout_s=k.connect_timeout_s,
        )
        consumer = Consumer(assigned_consumer_config(k.bootstrap_servers, "pipeline-corrections"))
        consumer.assign([TopicPartition(topic, p, OFFSET_END) for p in partitions(consumer, topic)])
        return cls(consumer)

    def take(self) -> list[bytes | None]:
        """The records waiting (never waits)."""
        out = []
        for m in self._consumer.consume(1000, timeout=0):
            if m.error() is not None:
                log.warning("live engine: %s", m.error())
                continue
            out.append(m.value())
        return out

    def close(self) -> None:
        self._consumer.close()
