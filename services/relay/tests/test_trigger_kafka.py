"""The Kafka trigger sink: directory rules (pure), then the real compacted topic (stack)."""

from __future__ import annotations

import queue
import time
import uuid
from typing import Any

import pytest

from infra.testing import free_port
from mdproto import envelope
from mdproto.messages import CEPCondition, CEPTriggerRequest
from relay.trigger_kafka import KafkaTriggerSink, TriggerDirectory
from relay.triggers import Stored, TriggerSinkError

NOW = 1_700_000_000_000


def register(trigger_id: str, client_id: str = "alice", **fields: Any) -> CEPTriggerRequest:
    return CEPTriggerRequest(
        trigger_id=trigger_id,
        client_id=client_id,
        action=CEPTriggerRequest.REGISTER,
        ticker="BINANCE:BTC/USDT",
        conditions=[CEPCondition(kind=CEPCondition.PRICE_ABOVE, threshold=100.0)],
        **fields,
    )


def cancel(trigger_id: str) -> CEPTriggerRequest:
    return CEPTriggerRequest(trigger_id=trigger_id, action=CEPTriggerRequest.CANCEL)


# --- directory -----------------------------------------------------------------------------


def test_directory_lists_a_clients_live_triggers_only() -> None:
    d = TriggerDirectory()
    d.apply("b", register("b"))
    d.apply("a", register("a"))
    d.apply("x", register("x", client_id="bob"))
    d.apply("old", register("old", expires_at_ms=NOW - 1))
    d.apply("b", cancel("b"))
    assert [r.trigger_id for r in d.for_client("alice", NOW)] == ["a"]
    assert [r.trigger_id for r in d.for_client("bob", NOW)] == ["x"]


def test_directory_reads_records_and_tombstones() -> None:
    d = TriggerDirectory()
    assert d.apply_record(b"t1", envelope.encode_record(register("t1")))
    assert d.get("t1") is not None
    assert d.apply_record(b"t1", None)  # the pipeline's tombstone for a finished trigger
    assert d.get("t1") is None
    assert not d.apply_record(b"t2", b"\x01\x7fjunk")
    assert not d.apply_record(None, None)


def test_a_record_read_after_a_newer_delivery_does_not_list_the_trigger_again() -> None:
    d = TriggerDirectory()
    d.apply_delivered(register("t1"), 0, 5)
    d.apply_delivered(cancel("t1"), 0, 6)  # acked OK: LIST must not show t1 from now on
    assert d.apply_record(b"t1", envelope.encode_record(register("t1")), (0, 5))
    assert d.get("t1") is None
    assert d.apply_record(b"t1", envelope.encode_record(cancel("t1")), (0, 6))
    d.apply_record(b"t1", envelope.encode_record(register("t1")), (0, 9))  # registered again
    assert d.get("t1") is not None


def test_a_delivery_the_reader_has_passed_is_not_applied_again() -> None:
    d = TriggerDirectory()
    assert d.apply_record(b"t1", envelope.encode_record(register("t1")), (1, 3))
    assert d.apply_record(b"t1", None, (1, 4))  # the pipeline's tombstone: t1 finished
    d.apply_delivered(register("t1"), 1, 3)  # the REGISTER's callback, late
    assert d.get("t1") is None


def test_records_of_another_partition_apply_in_arrival_order() -> None:
    d = TriggerDirectory()
    d.apply_delivered(register("t1"), 0, 5)
    assert d.apply_record(b"t1", None, (2, 1))  # no order across partitions: it applies
    assert d.get("t1") is None


def test_submit_before_start_is_a_sink_error() -> None:
    sink = KafkaTriggerSink("127.0.0.1:1", "cep.triggers")
    with pytest.raises(TriggerSinkError, match="not started"):
        sink.submit(register("t1"), lambda error: None)


class _FullProducer:
    def produce(self, *args: Any, **kwargs: Any) -> None:
        raise BufferError("Local: Queue full")

    def flush(self, timeout: float) -> int:
        return 0


def test_a_full_producer_queue_is_a_sink_error_not_a_crash() -> None:
    sink = KafkaTriggerSink("127.0.0.1:1", "cep.triggers")
    sink._producer = _FullProducer()
    with pytest.raises(TriggerSinkError, match="overloaded"):
        sink.submit(register("t1"), lambda error: None)
    assert sink.directory.get("t1") is None  # nothing stored, nothing listed


# --- real Kafka ------------------------------------------------------------------------------


def _read_topic(bootstrap: str, topic: str, count: int) -> list[tuple[bytes, bytes | None]]:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    out: list[tuple[bytes, bytes | None]] = []
    deadline = time.monotonic() + 30
    try:
        while len(out) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                out.append((msg.key(), msg.value()))
    finally:
        consumer.close()
    return out


@pytest.mark.stack
def test_records_reach_the_compacted_topic_keyed_by_trigger_id(local_stack: Any) -> None:
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.admin._config import ConfigResource

    bootstrap = local_stack.endpoints.kafka_bootstrap
    topic = f"cep.triggers.{uuid.uuid4().hex[:8]}"
    stored: queue.SimpleQueue[tuple[str, str | None]] = queue.SimpleQueue()
    sink = KafkaTriggerSink(bootstrap, topic).start()
    try:

        def report(trigger_id: str) -> Stored:
            return lambda error: stored.put((trigger_id, error))

        for request in (register("t1"), register("t2", client_id="bob"), cancel("t1")):
            sink.submit(request, report(request.trigger_id))
        # Each is reported stored, in order, and listed by then (read your writes).
        assert [stored.get(timeout=30) for _ in range(3)] == [
            ("t1", None),
            ("t2", None),
            ("t1", None),
        ]
        assert [r.trigger_id for r in sink.list("alice", NOW)] == []
        assert [r.trigger_id for r in sink.list("bob", NOW)] == ["t2"]
        records = _read_topic(bootstrap, topic, 3)
    finally:
        sink.close()
    by_key = [(key, envelope.decode_record(value, CEPTriggerRequest)) for key, value in records]
    assert sorted((k, r.action) for k, r in by_key) == [
        (b"t1", CEPTriggerRequest.REGISTER),
        (b"t1", CEPTriggerRequest.CANCEL),
        (b"t2", CEPTriggerRequest.REGISTER),
    ]
    assert sink.delivered == 3 and sink.failed == 0

    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    config = admin.describe_configs([resource])[resource].result(timeout=10)
    assert config["cleanup.policy"].value == "compact"

    # A restarted relay rebuilds its directory from the topic.
    again = KafkaTriggerSink(bootstrap, topic).start()
    try:
        assert again.wait_caught_up(30)
        assert [r.trigger_id for r in again.list("bob", NOW)] == ["t2"]
        assert again.list("alice", NOW) == []
    finally:
        again.close()


@pytest.mark.stack
def test_an_undeliverable_record_is_reported_not_stored_without_blocking(
    local_stack: Any,
) -> None:
    bootstrap = local_stack.endpoints.kafka_bootstrap
    topic = f"cep.triggers.{uuid.uuid4().hex[:8]}"
    stored: queue.SimpleQueue[str | None] = queue.SimpleQueue()
    sink = KafkaTriggerSink(
        bootstrap,
        topic,
        # The broker takes at most 1 MB records: this one is refused by the broker.
        producer_options={"message.max.bytes": 10_000_000},
    ).start()
    try:
        huge = register("big", client_id="x" * 8)
        huge.ticker = "BINANCE:" + "A" * 3_000_000 + "/USDT"
        sink.submit(huge, stored.put)
        error = stored.get(timeout=30)
    finally:
        sink.close()
    assert error is not None and error.startswith(f"not stored in Kafka topic {topic}: ")
    assert sink.failed == 1 and sink.directory.get("big") is None  # never listed


def test_a_broker_that_never_answers_fails_the_record_within_its_delivery_timeout() -> None:
    sink = KafkaTriggerSink(
        f"127.0.0.1:{free_port()}", "cep.triggers", delivery_timeout_s=1.0, timeout_s=0.5
    )
    stored: queue.SimpleQueue[str | None] = queue.SimpleQueue()
    sink.start()
    try:
        started = time.monotonic()
        sink.submit(register("t1"), stored.put)
        assert stored.empty()  # submit returned without waiting for the broker
        error = stored.get(timeout=10)
        took = time.monotonic() - started
    finally:
        sink.close()
    assert error is not None and "timed out" in error.lower(), error
    assert took < 5, took
