"""Kafka-backed `TriggerSink`: validated trigger requests -> compacted topic `cep.triggers`.

    submit(REGISTER/CANCEL) -> produce(key=trigger_id, value=CEPTriggerRequest record)
        (async: the relay's loop never waits for the broker; a poll thread runs the
         delivery callbacks: the directory takes the record, then `stored` is called,
         and the relay acks OK; a failure, or no delivery within `delivery_timeout_s`,
         calls `stored` with the reason and the relay acks ERROR sink_error)
    consumer thread: cep.triggers from the beginning -> TriggerDirectory -> LIST answers

The producer is idempotent with acks=all, so retries never duplicate or
reorder a trigger's records. Compaction keeps the last record per trigger_id:
a CANCEL (or the pipeline's tombstone for a finished trigger) replaces the
REGISTER. The directory is a cache of that topic, rebuilt on every start, so
the relay keeps no state of its own.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import Any

from mdproto import ProtocolError, contracts, envelope
from mdproto.messages import CEPTriggerRequest
from mdproto.runtime import kafka
from relay.triggers import Stored, TriggerSinkError

log = logging.getLogger(__name__)


class TriggerDirectory:
    """The registered triggers as the compacted topic says (thread-safe).

    Two threads feed it: the delivery callbacks apply the relay's own records as soon as
    the broker has them (a LIST right after an OK must show them), and the reader
    applies every record of the topic, later. Records of one trigger share its key's
    partition, so their offsets order them: the reader skips a record older than one a
    delivery applied, and a delivery the reader has already passed is not applied again
    (a CANCEL acked, then its REGISTER read, listed the trigger again until the reader
    reached the CANCEL).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._triggers: dict[str, CEPTriggerRequest] = {}
        self._per_ticker: Counter[str] = Counter()
        #: Per partition, the offset the reader reads next.
        self._read: dict[int, int] = {}
        #: Per trigger, the (partition, offset) of a delivered record the reader has not
        #: reached yet.
        self._ahead: dict[str, tuple[int, int]] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._triggers)

    def apply(self, trigger_id: str, request: CEPTriggerRequest | None) -> None:
        """A record for `trigger_id`: a REGISTER (re)places it, anything else removes it."""
        with self._lock:
            self._apply(trigger_id, request)

    def apply_delivered(self, request: CEPTriggerRequest, partition: int, offset: int) -> None:
        """The relay's own record, now in the topic at (partition, offset): applied unless
        the reader has passed it (what it read there is as new or newer)."""
        with self._lock:
            if offset < self._read.get(partition, 0):
                return
            self._ahead[request.trigger_id] = (partition, offset)
            self._apply(request.trigger_id, request)

    def _apply(self, trigger_id: str, request: CEPTriggerRequest | None) -> None:
        old = self._triggers.pop(trigger_id, None)
        if old is not None:
            self._per_ticker[old.ticker] -= 1
            if not self._per_ticker[old.ticker]:
                del self._per_ticker[old.ticker]
        if request is not None and request.action == CEPTriggerRequest.REGISTER:
            self._triggers[trigger_id] = request
            self._per_ticker[request.ticker] += 1

    def tickers(self) -> set[str]:
        """Tickers with at least one registered trigger."""
        with self._lock:
            return set(self._per_ticker)

    def apply_record(
        self,
        key: bytes | None,
        value: bytes | None,
        position: tuple[int, int] | None = None,
    ) -> bool:
        """A raw Kafka record the reader took at `position` (partition, offset); False
        (and ignored) if it does not decode."""
        trigger_id = key.decode("utf-8", "replace") if key else ""
        request: CEPTriggerRequest | None = None
        if value is not None:
            try:
                request = envelope.decode_record(value, CEPTriggerRequest)
            except ProtocolError as exc:
                log.warning("cep.triggers: undecodable record for %r: %s", trigger_id, exc)
                return False
            trigger_id = request.trigger_id or trigger_id
        if not trigger_id:
            return False
        with self._lock:
            if position is not None and self._stale(trigger_id, *position):
                return True
            self._apply(trigger_id, request)
        return True

    def _stale(self, trigger_id: str, partition: int, offset: int) -> bool:
        """Whether the reader's record at (partition, offset) is older than what a
        delivery applied; either way the reader is past it now."""
        self._read[partition] = offset + 1
        ahead = self._ahead.get(trigger_id)
        if ahead is None or ahead[0] != partition:  # another partition: no order to go by
            return False
        if offset < ahead[1]:
            return True
        del self._ahead[trigger_id]
        return False

    def get(self, trigger_id: str) -> CEPTriggerRequest | None:
        with self._lock:
            return self._triggers.get(trigger_id)

    def for_client(self, client_id: str, now_ms: int) -> list[CEPTriggerRequest]:
        """The client's triggers that have not expired, by trigger_id."""
        with self._lock:
            found = [
                r
                for r in self._triggers.values()
                if r.client_id == client_id and not (r.expires_at_ms and r.expires_at_ms <= now_ms)
            ]
        return sorted(found, key=lambda r: r.trigger_id)


class KafkaTriggerSink:
    """Stores triggers in Kafka without blocking the caller; answers LIST from the topic."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        delivery_timeout_s: float = 10.0,
        producer_options: dict[str, Any] | None = None,
        partitions: int = 3,
        replication: int = 1,
        timeout_s: float = 10.0,
        directory: TriggerDirectory | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self._delivery_timeout_s = delivery_timeout_s
        self._producer_options = producer_options or {}
        self._partitions = partitions
        self._replication = replication
        self._timeout_s = timeout_s
        self.directory = directory or TriggerDirectory()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._fatal: str | None = None
        self._producer: Any = None
        self._caught_up = threading.Event()
        self.produced = 0
        self.delivered = 0
        self.failed = 0

    # --- lifecycle -------------------------------------------------------------------

    def start(self) -> KafkaTriggerSink:
        """Create the topic if needed, then start the producer and the directory reader."""
        from confluent_kafka import Producer

        try:
            kafka.ensure_topics(
                self.bootstrap,
                [kafka.spec(contracts.KAFKA_CEP_TRIGGERS, self.topic)],
                partitions=self._partitions,
                replication=self._replication,
                timeout_s=self._timeout_s,
            )
        except Exception as exc:  # the producer still queues; the pipeline retries
            log.error("cannot create Kafka topic %s: %s; continuing", self.topic, exc)
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 2,
            # A client waits for its ack: fail the record rather than keep it waiting.
            "message.timeout.ms": round(self._delivery_timeout_s * 1000),
            "error_cb": self._on_kafka_error,
            "logger": kafka.quiet_logger("producer"),
            **self._producer_options,
        }
        self._producer = Producer(conf)
        for name, target in (("poll", self._poll_loop), ("directory", self._read_loop)):
            thread = threading.Thread(target=target, name=f"cep-sink-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        log.info("CEP triggers go to Kafka topic %s at %s", self.topic, self.bootstrap)
        return self

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        if self._producer is not None:
            left = self._producer.flush(5.0)
            if left:
                log.error("%d CEP trigger record(s) not delivered at shutdown", left)
                self.failed += left
            self._producer = None

    def wait_caught_up(self, timeout_s: float) -> bool:
        """True once the directory has read the topic to where it ended at start."""
        return self._caught_up.wait(timeout_s)

    # --- TriggerSink -------------------------------------------------------------------

    def submit(self, request: CEPTriggerRequest, stored: Stored) -> None:
        if self._producer is None:
            raise TriggerSinkError("the trigger store is not started")
        if self._fatal is not None:
            raise TriggerSinkError(f"the trigger store failed: {self._fatal}")
        try:
            self._producer.produce(
                self.topic,
                key=request.trigger_id.encode(),
                value=envelope.encode_record(request),
                on_delivery=lambda err, msg: self._delivered(request, stored, err, msg),
            )
        except BufferError:
            raise TriggerSinkError("the trigger store is overloaded; retry later") from None
        except Exception as exc:  # KafkaException: e.g. a fatal producer state
            raise TriggerSinkError(f"the trigger store refused the record: {exc}") from None
        self.produced += 1

    def list(self, client_id: str, now_ms: int) -> list[CEPTriggerRequest]:
        return self.directory.for_client(client_id, now_ms)

    def tickers(self) -> set[str]:
        return self.directory.tickers()

    # --- threads -------------------------------------------------------------------------

    def _delivered(self, request: CEPTriggerRequest, stored: Stored, err: Any, msg: Any) -> None:
        if err is None:
            self.delivered += 1
            # Before the ack: a LIST right after an OK REGISTER must show it.
            self.directory.apply_delivered(request, msg.partition(), msg.offset())
            stored(None)
            return
        self.failed += 1
        log.error("CEP trigger %s not stored in %s: %s", request.trigger_id, self.topic, err)
        stored(f"not stored in Kafka topic {self.topic}: {err.str()}")

    def _on_kafka_error(self, err: Any) -> None:
        if err.fatal():
            self._fatal = err.str()
            log.error("CEP trigger producer failed for good: %s", err.str())
        else:
            log.debug("CEP trigger producer: %s", err.str())

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            producer = self._producer
            if producer is None:
                return
            producer.poll(0.1)

    def _read_loop(self) -> None:
        from confluent_kafka import Consumer

        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": "relay-cep-directory",
                "enable.auto.commit": False,
                "logger": kafka.quiet_logger("consumer"),
            }
        )
        try:
            ends = kafka.wait_end_offsets(consumer, self.topic, self._stop)
            for msg in kafka.read_to_end(consumer, self.topic, ends or {}):
                if self._stop.is_set():
                    return
                if msg is not None:
                    self.directory.apply_record(msg.key(), msg.value(), _position(msg))
            self._caught_up.set()
            log.info("CEP directory loaded: %d trigger(s)", len(self.directory))
            while not self._stop.is_set():
                msg = consumer.poll(0.2)
                if msg is not None and msg.error() is None:
                    self.directory.apply_record(msg.key(), msg.value(), _position(msg))
        finally:
            consumer.close()


def _position(msg: Any) -> tuple[int, int]:
    return msg.partition() or 0, msg.offset() or 0
