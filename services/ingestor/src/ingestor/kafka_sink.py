"""Kafka adapter: the only module that imports confluent_kafka.

- `KafkaSink`: one idempotent producer for every record the ingestor writes.
  `produce` never blocks the event loop (librdkafka queues the record); a task
  serves delivery callbacks with `poll(0)` every few milliseconds, so callbacks
  run on the loop thread and resolve asyncio futures directly. It also knows
  whether Kafka takes records (`problem`: all brokers down, or a delivery
  failed; cleared by a delivery or a `probe`), which the ingestor reports to
  the relay so that requests are refused instead of fetched into nowhere.
- `PartitionTail`: reads one partition from a point in time on a background
  thread and hands records to the loop (used for the claims topic).
- `GroupSlots`: this process's share of a topic's partitions in a consumer group
  (the recording slots): Kafka's group protocol spreads them over the members and
  moves a dead member's within its session timeout; each partition is read from its
  start when it arrives (its records are the slot's state) and then followed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
)
from confluent_kafka import TopicPartition as _TopicPartition
from google.protobuf.message import Message

from ingestor.config import KafkaSettings
from mdproto import envelope, partitioning
from mdproto.messages import OHLCBatch
from mdproto.runtime.kafka import TopicSpec, consume_ready, ensure_topics, quiet_logger

log = logging.getLogger(__name__)


class DeliveryError(Exception):
    """Kafka did not accept a record (after librdkafka's own retries)."""


@dataclass
class SinkStats:
    produced: int = 0
    delivered: int = 0
    failed: int = 0


#: Between two polls while records await their acks: a request's final marker is sent
#: once its rows are acknowledged, and the pipeline's micro-batch that sees the rows
#: without the marker answers a batch later.
BUSY_POLL_S = 0.002


def poll_delay(in_flight: int, idle_s: float) -> float:
    """How long the loop waits before serving delivery callbacks again: soon while
    ``in_flight`` records (librdkafka's ``len(producer)``) await their acks, else the
    configured interval."""
    return min(BUSY_POLL_S, idle_s) if in_flight else idle_s


class KafkaSink:
    """Idempotent producer: records of one key keep their order, retries never duplicate."""

    def __init__(
        self,
        settings: KafkaSettings,
        client_id: str,
        on_health_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.settings = settings
        self._on_health_change = on_health_change
        #: Why Kafka does not take records right now; None while it does.
        self.problem: str | None = None
        self._fatal = False  # the idempotent producer gave up for good: no probe clears it
        conf: dict[str, Any] = {
            "bootstrap.servers": settings.bootstrap_servers,
            "client.id": client_id,
            "enable.idempotence": True,  # implies acks=all, in-order, no duplicates on retry
            "acks": "all",
            "linger.ms": 5,
            "compression.type": "lz4",
            "message.timeout.ms": int(settings.delivery_timeout_s * 1000),
            "error_cb": self._on_error,  # served by poll() on the loop thread
            # Its reconnect lines would repeat every few ms in an outage: `problem` and
            # one log line per change say it instead.
            "logger": quiet_logger("ingestor-producer"),
        }
        conf.update(settings.producer)
        # Pinned: the live engines compute a ticker's partition with the same rule
        # (`mdproto.partitioning`), so an extra setting cannot move it.
        conf["partitioner"] = partitioning.PARTITIONER
        self._producer = Producer(conf)
        self._poller: asyncio.Task[None] | None = None
        self._closed = False
        self.stats = SinkStats()
        self._last_error_log = 0.0

    async def start(self, topics: Sequence[TopicSpec] = ()) -> None:
        """Start serving delivery callbacks; create missing topics first if asked."""
        if topics:
            await asyncio.to_thread(
                ensure_topics,
                self.settings.bootstrap_servers,
                topics,
                partitions=self.settings.topic_partitions,
                replication=self.settings.replication_factor,
                timeout_s=15.0,
            )
        if self._poller is None:
            self._poller = asyncio.create_task(self._poll_loop(), name="kafka-poll")

    async def _poll_loop(self) -> None:
        while True:
            self._producer.poll(0)
            await asyncio.sleep(poll_delay(len(self._producer), self.settings.poll_interval_s))

    async def enqueue(
        self, topic: str, key: str, value: bytes, *, partition: int | None = None
    ) -> asyncio.Future[int]:
        """Queue one record; returns its delivery future (the offset, or DeliveryError).

        Two awaits, two meanings: this one is back-pressure (it waits, without
        blocking the loop, while librdkafka's queue is full), the future is the
        delivery, so callers can keep many records in flight.
        """
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def on_delivery(err: Any, msg: Any) -> None:
            self._count(err)
            if future.done():  # the caller cancelled it
                return
            if err is not None:
                future.set_exception(DeliveryError(f"{topic}: {err}"))
            else:
                future.set_result(msg.offset())

        try:
            await self._queue(topic, key, value, on_delivery, partition)
        except KafkaException as exc:
            future.set_exception(DeliveryError(f"{topic}: {exc}"))
        return future

    async def deliver(
        self, topic: str, key: str, value: bytes, *, partition: int | None = None
    ) -> int:
        """Queue one record and wait for its offset."""
        delivery = await self.enqueue(topic, key, value, partition=partition)
        return await delivery

    async def _queue(
        self,
        topic: str,
        key: str,
        value: bytes,
        on_delivery: Callable[[Any, Any], None],
        partition: int | None,
    ) -> None:
        kwargs: dict[str, Any] = {"key": key.encode(), "value": value, "on_delivery": on_delivery}
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                self._producer.produce(topic, **kwargs)
            except BufferError:
                self._producer.poll(0)
                await asyncio.sleep(0.005)
            except KafkaException:
                self.stats.failed += 1
                raise
            else:
                self.stats.produced += 1
                return

    def _count(self, err: Any, _msg: Any = None) -> None:
        if err is None:
            self.stats.delivered += 1
            self._set_problem(None)
            return
        self.stats.failed += 1
        self._set_problem(f"a delivery failed: {err}")
        now = time.monotonic()
        if now - self._last_error_log > 5.0:  # at most one line per 5 s
            self._last_error_log = now
            log.error("Kafka delivery failed (%d so far): %s", self.stats.failed, err)

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            self._fatal = True
        if err.code() == KafkaError._ALL_BROKERS_DOWN or err.fatal():
            self._set_problem(f"{err.str()} ({self.settings.bootstrap_servers})")

    def _set_problem(self, problem: str | None) -> None:
        if (problem is None) == (self.problem is None):
            return
        self.problem = problem
        if problem is None:
            log.info("Kafka takes records again")
        else:
            log.error("Kafka does not take records: %s", problem)
        self._on_health_change()

    async def probe(self, timeout_s: float = 2.0) -> None:
        """Ask a broker for metadata; clears `problem` when one answers (no record is
        written while the relay refuses this ingestor's work, so nothing else would)."""
        if self._fatal:
            return
        try:
            await asyncio.to_thread(self._producer.list_topics, timeout=timeout_s)
        except KafkaException as exc:
            log.info("Kafka probe failed: %s", exc)
        else:
            self._set_problem(None)

    async def send_batch(self, key: str, record: OHLCBatch) -> asyncio.Future[int]:
        return await self.enqueue(
            self.settings.topic_ohlc_batches, key, envelope.encode_record(record)
        )

    async def send_tick(self, key: str, record: Message) -> None:
        """Ticks are not tracked: a failure is only counted (stats, a log line per 5 s)."""
        value = envelope.encode_record(record)
        with contextlib.suppress(KafkaException):  # counted in _queue
            await self._queue(self.settings.topic_ticks, key, value, self._count, None)

    async def send_tick_tracked(self, key: str, record: Message) -> asyncio.Future[int]:
        """A tick whose delivery is awaited (a recorded feed's checkpoint depends on it)."""
        return await self.enqueue(self.settings.topic_ticks, key, envelope.encode_record(record))

    async def send_recording(
        self, key: str, record: Message, partition: int
    ) -> asyncio.Future[int]:
        """A RecordingCheckpoint or TradeGap into its slot's partition of market.recording."""
        value = envelope.encode_record(record)
        return await self.enqueue(self.settings.topic_recording, key, value, partition=partition)

    async def send_book(self, key: str, record: Message) -> None:
        """Book snapshots and deltas, like ticks: a failure is only counted. A lost delta
        is healed downstream by the next snapshot (docs/protocol.md "Order books")."""
        value = envelope.encode_record(record)
        with contextlib.suppress(KafkaException):  # counted in _queue
            await self._queue(self.settings.topic_book, key, value, self._count, None)

    async def send_market(self, key: str, record: Message) -> asyncio.Future[int]:
        return await self.enqueue(self.settings.topic_markets, key, envelope.encode_record(record))

    async def drain(self, timeout_s: float) -> int:
        """Deliver what is queued (serving callbacks on the loop); records left after timeout."""
        deadline = time.monotonic() + timeout_s
        while len(self._producer) > 0 and time.monotonic() < deadline:
            self._producer.poll(0)
            await asyncio.sleep(0.01)
        self._producer.poll(0)
        return len(self._producer)

    async def close(self, timeout_s: float = 10.0) -> None:
        """Deliver what is queued (up to `timeout_s`), then release the client."""
        if self._closed:
            return
        left = await self.drain(timeout_s)
        if left:
            log.error("%d Kafka records undelivered at shutdown", left)
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
            self._poller = None
        self._closed = True
        await asyncio.to_thread(self._producer.close)


def _consume(consumer: Consumer, topic: str) -> list[Any]:
    """The next records (up to 500, once one is there; [] after 0.1 s), errors logged and
    left out (a consumer thread's loop body)."""
    try:
        messages = consume_ready(consumer, 500, 0.1)
    except KafkaException as exc:
        log.warning("reading %s failed: %s", topic, exc)
        return []
    records = []
    for m in messages:
        error = m.error()
        if error is None:
            records.append(m)
        elif error.code() != KafkaError._PARTITION_EOF:
            log.warning("reading %s: %s", topic, error)
    return records


@dataclass(frozen=True, slots=True)
class TailRecord:
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int


class PartitionTail:
    """Reads one partition from `start_ms` on, in a thread; delivers batches on the loop."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partition: int,
        group_id: str,
        on_records: Callable[[list[TailRecord]], None],
    ) -> None:
        self._topic = topic
        self._partition = partition
        self._on_records = on_records
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group_id,
                "enable.auto.commit": False,
                # librdkafka's fetch wait: the broker answers a waiting fetch the moment a
                # claim arrives, so a shorter one only adds idle requests (ADR 0011).
                "enable.partition.eof": False,
            }
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.start_offset = -1

    async def start(self, start_ms: int, timeout_s: float = 15.0) -> None:
        """Assign the partition at the first offset with timestamp >= start_ms (or the end)."""
        loop = asyncio.get_running_loop()

        def locate() -> int:
            tp = _TopicPartition(self._topic, self._partition, start_ms)
            found = self._consumer.offsets_for_times([tp], timeout=timeout_s)[0]
            offset = found.offset
            if offset < 0:  # nothing that recent: start at the current end
                _, high = self._consumer.get_watermark_offsets(
                    _TopicPartition(self._topic, self._partition), timeout=timeout_s
                )
                offset = high if high >= 0 else OFFSET_END
            return int(offset)

        def assign() -> int:
            # A topic created a moment ago may not have a leader yet: retry briefly.
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    offset = locate()
                    break
                except KafkaException as exc:
                    if time.monotonic() > deadline:
                        raise
                    log.debug("locating %s: %s; retrying", self._topic, exc)
                    time.sleep(0.2)
            self._consumer.assign([_TopicPartition(self._topic, self._partition, offset)])
            return offset

        self.start_offset = await asyncio.to_thread(assign)

        def run() -> None:
            while not self._stop.is_set():
                batch = [
                    TailRecord(m.offset() or 0, m.key(), m.value(), m.timestamp()[1])
                    for m in _consume(self._consumer, self._topic)
                ]
                if batch:
                    try:
                        loop.call_soon_threadsafe(self._on_records, batch)
                    except RuntimeError:  # the loop closed under us: shutting down
                        return

        self._thread = threading.Thread(target=run, name=f"tail-{self._topic}", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5.0)
        await asyncio.to_thread(self._consumer.close)


@dataclass(frozen=True, slots=True)
class SlotRecord:
    partition: int
    key: bytes | None
    value: bytes | None


class SlotEvents(Protocol):
    """What `GroupSlots` tells the loop, in the order it happened."""

    def slot_records(self, records: list[SlotRecord]) -> None: ...

    def slot_restored(self, partition: int) -> None:
        """Every record the partition held when it was assigned has been delivered."""

    def slot_revoked(self, partition: int) -> None: ...


class GroupSlots:
    """One consumer in group `group_id` on `topic`, on its own thread.

    Cooperative-sticky assignment: a member joining or leaving moves only the
    partitions that must move, so the other slots' feeds never stop.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        group_id: str,
        events: SlotEvents,
        *,
        session_timeout_s: float,
        client_id: str,
    ) -> None:
        self._topic = topic
        self._events = events
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group_id,
                "client.id": client_id,
                "partition.assignment.strategy": "cooperative-sticky",
                "session.timeout.ms": int(session_timeout_s * 1000),
                "heartbeat.interval.ms": max(100, int(session_timeout_s * 1000 / 6)),
                "enable.auto.commit": False,  # a slot is always read from its start
                "auto.offset.reset": "earliest",
                "enable.partition.eof": False,
                "logger": quiet_logger(f"slots-{group_id}"),
            }
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # partition -> its end offset when assigned (None until read, outside the callback)
        self._restoring: dict[int, int | None] = {}
        self.owned: set[int] = set()  # read on the loop thread only through `events`

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._consumer.subscribe(
            [self._topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_revoke,
        )
        self._thread = threading.Thread(target=self._run, name=f"slots-{self._topic}", daemon=True)
        self._thread.start()

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop closed under us: shutting down
            self._stop.set()

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        # Nothing here may raise: confluent-kafka re-raises a callback's error from
        # consume() unnormalised, which kills the thread. The end offsets are read
        # in `_check_restored`, where a broker hiccup is only retried.
        for tp in partitions:
            tp.offset = OFFSET_BEGINNING
            self._restoring[tp.partition] = None
        consumer.incremental_assign(partitions)
        log.info("recording slots assigned: %s", sorted(tp.partition for tp in partitions))

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        for tp in partitions:
            self._restoring.pop(tp.partition, None)
            self._post(self._events.slot_revoked, tp.partition)
        with contextlib.suppress(KafkaException):
            consumer.incremental_unassign(partitions)
        log.info("recording slots revoked: %s", sorted(tp.partition for tp in partitions))

    def _run(self) -> None:
        while not self._stop.is_set():
            batch = [
                SlotRecord(m.partition() or 0, m.key(), m.value())
                for m in _consume(self._consumer, self._topic)
            ]
            if batch:
                self._post(self._events.slot_records, batch)
            self._check_restored()

    def _check_restored(self) -> None:
        if not self._restoring:
            return
        for partition, end in self._restoring.items():
            if end is None:
                try:
                    _, high = self._consumer.get_watermark_offsets(
                        _TopicPartition(self._topic, partition), timeout=1.0, cached=False
                    )
                except KafkaException as exc:
                    log.debug("end of %s[%d] not known yet: %s", self._topic, partition, exc)
                    return
                self._restoring[partition] = max(0, high)
        tps = [_TopicPartition(self._topic, p) for p in self._restoring]
        try:
            positions = self._consumer.position(tps)
        except KafkaException:
            return
        for tp in positions:
            end = self._restoring.get(tp.partition)
            if end is not None and (end == 0 or tp.offset >= end):
                del self._restoring[tp.partition]
                self._post(self._events.slot_restored, tp.partition)

    async def stop(self) -> None:
        """Leave the group at once (the slots move to the others without a timeout)."""
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5.0)
        await asyncio.to_thread(self._consumer.close)
