"""CEP on the real stack: Kafka trigger records + ticks -> the live engine -> events on the
PUB, tombstones for finished triggers, state kept across a kill -9 of the pipeline."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from mdproto import envelope
from mdproto.messages import CEPCondition, CEPTriggerEvent, CEPTriggerRequest, NotifyPattern, Tick

pytestmark = [pytest.mark.stack, pytest.mark.spark, pytest.mark.heavy(seconds=130)]

TICKER = "BINANCE:CEP/USDT"


def register(trigger_id: str, threshold: float, *, repeating: bool) -> CEPTriggerRequest:
    return CEPTriggerRequest(
        trigger_id=trigger_id,
        client_id="stack",
        action=CEPTriggerRequest.REGISTER,
        ticker=TICKER,
        conditions=[CEPCondition(kind=CEPCondition.PRICE_ABOVE, threshold=threshold)],
        repeating=repeating,
        notify=NotifyPattern.NOTIFY_PER_REQUEST,
    )


def ticks(*prices: float) -> list[bytes]:
    now = int(time.time() * 1000)
    return [
        envelope.encode_record(
            Tick(
                ticker=TICKER, trade_id=uuid.uuid4().hex, price=p, amount=1.0, timestamp_ms=now + i
            )
        )
        for i, p in enumerate(prices)
    ]


def events(sub: Any, trigger_id: str, kind: int, count: int = 1) -> list[CEPTriggerEvent]:
    got = sub.wait_for(
        lambda m: (
            m.topic == f"CEP:{trigger_id}"
            and isinstance(m.message, CEPTriggerEvent)
            and m.message.kind == kind
        ),
        count=count,
    )
    return [m.message for m in got]


def tombstoned(bootstrap: str, topic: str, trigger_id: str, timeout_s: float = 60) -> bool:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"t-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None or msg.key() != trigger_id.encode():
                continue
            if msg.value() is None:
                return True
    finally:
        consumer.close()
    return False


def read_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """Each partition of `topic` -> its end offset (where the next record will go)."""
    from confluent_kafka import Consumer

    from mdproto.runtime.kafka import end_offsets

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex}"})
    try:
        ends = end_offsets(consumer, topic, timeout_s=10)
    finally:
        consumer.close()
    assert ends is not None, f"no metadata for {topic}"
    return ends


def wait_saved(
    state_dir: Path, snapshot: Path, ends: dict[int, int], timeout_s: float = 60
) -> None:
    """Until a save round holds every tick read so far: each ticks partition's saved state
    at its end offset (`ends`), and the engine's snapshot (CEP's state, written after the
    partitions in the same round) no older than those states.

    A kill -9 before that reads the fire's tick again (a second fire with the same count,
    by design: at-least-once events); this test is about the state after it. A file's time
    alone is no proof: a round captured before the fire may be written after it.
    """
    from pipeline.live_state import PartitionState

    deadline = time.monotonic() + timeout_s
    saved: dict[int, int] = {}
    while time.monotonic() < deadline:
        files = {int(f.stem): f for f in state_dir.glob("*/*/*.json")}
        states = {p: PartitionState.decode(f.read_bytes(), str(f)) for p, f in files.items()}
        saved = {p: s.offset for p, s in states.items() if s is not None}
        if all(saved.get(p, 0) >= end for p, end in ends.items() if end > 0) and (
            files
            and snapshot.exists()
            and snapshot.stat().st_mtime_ns >= max(f.stat().st_mtime_ns for f in files.values())
        ):
            return
        time.sleep(0.2)
    raise AssertionError(f"no save of offsets {ends} within {timeout_s} s (saved: {saved})")


def test_triggers_fire_tombstone_and_survive_a_crash(
    make_run: Any, tools: Any, tmp_path: Path
) -> None:
    trigger_topic = f"pt-{uuid.uuid4().hex[:8]}.cep"
    state_dir = tmp_path / "live-state"  # local, so that the test can read what was saved
    run = make_run(
        PIPELINE_KAFKA__TOPIC_CEP_TRIGGERS=trigger_topic,
        PIPELINE_LIVE__STATE_LOCATION=str(state_dir),
        PIPELINE_HISTORY__ENABLED="false",
        PIPELINE_MARKETS__ENABLED="false",
        PIPELINE_GAPS__ENABLED="false",
    )
    sub = tools.Subscriber(run.pub_endpoint)
    run.start()
    run.wait_ready()
    kafka = tools.Kafka(run.endpoints.kafka_bootstrap)
    try:
        tools.confirm_subscription(sub, kafka, run.ticks_topic)
        for trigger_id, repeating in (("once", False), ("again", True)):
            record = envelope.encode_record(register(trigger_id, 100.0, repeating=repeating))
            kafka.send(trigger_topic, [record], key=trigger_id)
            events(sub, trigger_id, CEPTriggerEvent.ARMED)
        kafka.send(run.ticks_topic, ticks(99.0, 101.0), key=TICKER)
        [once] = events(sub, "once", CEPTriggerEvent.FIRED)
        [again] = events(sub, "again", CEPTriggerEvent.FIRED)
        assert once.final and once.values["price"] == 101.0 and once.fire_count == 1
        assert not again.final and again.fire_count == 1
        assert tombstoned(run.endpoints.kafka_bootstrap, trigger_topic, "once")

        ends = read_offsets(run.endpoints.kafka_bootstrap, run.ticks_topic)
        wait_saved(state_dir, run.workdir / "checkpoints" / "live-engine" / "snapshot.json", ends)
        run.kill9()  # no shutdown: the next run resumes from the checkpoint
        run.start()
        run.wait_ready()
        tools.confirm_subscription(sub, kafka, run.ticks_topic)
        kafka.send(run.ticks_topic, ticks(99.0, 102.0), key=TICKER)
        fires = events(sub, "again", CEPTriggerEvent.FIRED, count=2)
        # fire_count 2: the engine state came back from the snapshot, not rebuilt.
        assert [e.fire_count for e in fires] == [1, 2]
        assert fires[-1].values["price"] == 102.0
        assert len(events(sub, "again", CEPTriggerEvent.ARMED)) == 1  # not re-armed
        assert not sub.matching(
            lambda m: m.topic == "CEP:once" and m.message.kind == CEPTriggerEvent.FIRED
            and m.message.values["price"] == 102.0
        )  # fmt: skip
    finally:
        sub.close()
        run.stop()
