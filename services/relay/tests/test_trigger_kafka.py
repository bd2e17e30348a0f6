"""The Kafka trigger sink: directory rules (pure), then the real compacted topic (stack)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from mdproto import envelope
from mdproto.messages import CEPCondition, CEPTriggerRequest
from relay.trigger_kafka import KafkaTriggerSink, TriggerDirectory
from relay.triggers import TriggerSinkError

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


def test_submit_before_start_is_a_sink_error() -> None:
    sink = KafkaTriggerSink("127.0.0.1:1", "cep.triggers")
    with pytest.raises(TriggerSinkError, match="not started"):
        sink.submit(register("t1"))


class _FullProducer:
    def produce(self, *args: Any, **kwargs: Any) -> None:
        raise BufferError("Local: Queue full")

    def flush(self, timeout: float) -> int:
        return 0


def test_a_full_producer_queue_is_a_sink_error_not_a_crash() -> None:
    sink = KafkaTriggerSink("127.0.0.1:1", "cep.triggers")
    sink._producer = _FullProducer()
    with pytest.raises(TriggerSinkError, match="overloaded"):
        sink.submit(register("t1"))
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
    errors: list[int] = []
    sink = KafkaTriggerSink(bootstrap, topic, on_error=lambda: errors.append(1)).start()
    try:
        started = time.perf_counter()
        sink.submit(register("t1"))
        sink.submit(register("t2", client_id="bob"))
        sink.submit(cancel("t1"))
        assert time.perf_counter() - started < 0.05  # never waits for the broker
        assert [r.trigger_id for r in sink.list("alice", NOW)] == []  # read your writes
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
    assert sink.delivered == 3 and errors == []

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
def test_undeliverable_records_are_counted_without_blocking(local_stack: Any) -> None:
    bootstrap = local_stack.endpoints.kafka_bootstrap
    topic = f"cep.triggers.{uuid.uuid4().hex[:8]}"
    errors: list[int] = []
    sink = KafkaTriggerSink(
        bootstrap,
        topic,
        on_error=lambda: errors.append(1),
        # The broker takes at most 1 MB records: this one is refused after the ack.
        producer_options={"message.max.bytes": 10_000_000},
    ).start()
    try:
        huge = register("big", client_id="x" * 8)
        huge.ticker = "BINANCE:" + "A" * 3_000_000 + "/USDT"
        started = time.perf_counter()
        sink.submit(huge)
        assert time.perf_counter() - started < 0.5
        deadline = time.monotonic() + 30
        while not errors and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        sink.close()
    assert errors == [1] and sink.failed == 1
