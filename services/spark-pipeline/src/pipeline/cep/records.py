"""One batch of CEP's two Kafka topics -> engine inputs in order.

The live engine reads `cep.triggers` and `market.ticks` with one consumer.
Records are put in Kafka-timestamp order (a trigger before a tick of the same
millisecond), so a trigger sees exactly the ticks written after its REGISTER
record, whichever batch they land in. Bad records never raise: they are
returned as `Reject`s with their coordinates (the records stay in Kafka).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from mdproto import ProtocolError, envelope, topics
from mdproto.error_codes import BAD_TICK, BAD_TRIGGER
from mdproto.messages import CEPTriggerRequest, Tick
from pipeline.records import Reject, kafka_coordinates, kafka_timestamps_ms, tick_problem


@dataclass(frozen=True, slots=True)
class TriggerRecord:
    """A record of the trigger topic: a request, or a tombstone (request None)."""

    trigger_id: str
    request: CEPTriggerRequest | None
    time_ms: int


@dataclass(frozen=True, slots=True)
class TickRecord:
    tick: Tick
    time_ms: int


@dataclass(slots=True)
class CepBatch:
    inputs: list[TriggerRecord | TickRecord] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)
    triggers: int = 0
    ticks: int = 0


#: (Kafka timestamp ms, partition, offset) of a record
Coordinates = tuple[int, int, int]


def decode_batch(kafka: pa.Table, trigger_topic: str, *, now_ms: int = 0) -> CepBatch:
    """Kafka rows (topic, key, value, timestamp, partition, offset) -> ordered inputs."""
    n = kafka.num_rows
    names = kafka.schema.names
    topic_col = kafka.column("topic").to_pylist() if "topic" in names else [""] * n
    keys = kafka.column("key").to_pylist() if "key" in names else [None] * n
    values = kafka.column("value").to_pylist()
    partitions, offsets = kafka_coordinates(kafka)
    stamps = kafka_timestamps_ms(kafka, n, now_ms)
    triggers: list[tuple[bytes | None, bytes | None, Coordinates]] = []
    ticks: list[tuple[Tick, Coordinates]] = []
    rejects: list[Reject] = []
    for i in range(n):
        where = (stamps[i], partitions[i], offsets[i])
        if topic_col[i] == trigger_topic:
            triggers.append((keys[i], values[i], where))
            continue
        try:
            tick = envelope.decode_record(values[i] or b"", Tick)
        except ProtocolError as exc:
            rejects.append(Reject(partitions[i], offsets[i], exc.code, exc.reason))
            continue
        problem = tick_problem(tick)
        if problem:
            rejects.append(Reject(partitions[i], offsets[i], BAD_TICK, problem))
            continue
        ticks.append((tick, where))
    batch = ordered_batch(triggers, ticks)
    batch.rejects[:0] = rejects
    return batch


def ordered_batch(
    triggers: list[tuple[bytes | None, bytes | None, Coordinates]],
    ticks: list[tuple[Tick, Coordinates]],
) -> CepBatch:
    """Trigger records (key, value, where) and validated ticks -> inputs in Kafka-timestamp
    order, a trigger before a tick of the same millisecond (the live engine decodes its
    ticks once and hands them over here)."""
    keyed: list[tuple[tuple[int, int, int, int], TriggerRecord | TickRecord]] = []
    out = CepBatch()
    for key, value, (stamp, partition, offset) in triggers:
        record = _trigger(key, value, stamp)
        if isinstance(record, str):
            out.rejects.append(Reject(partition, offset, BAD_TRIGGER, record))
            continue
        out.triggers += 1
        keyed.append(((stamp, 0, partition, offset), record))
    for tick, (stamp, partition, offset) in ticks:
        out.ticks += 1
        keyed.append(((stamp, 1, partition, offset), TickRecord(tick, stamp)))
    keyed.sort(key=lambda item: item[0])
    out.inputs = [record for _, record in keyed]
    return out


def _trigger(key: bytes | None, value: bytes | None, stamp: int) -> TriggerRecord | str:
    key_id = key.decode("utf-8", "replace") if key else ""
    if value is None:  # tombstone: the trigger is gone
        if not topics.is_valid_id(key_id):
            return f"tombstone with key {key_id!r}: not a trigger id"
        return TriggerRecord(key_id, None, stamp)
    try:
        request = envelope.decode_record(value, CEPTriggerRequest)
    except ProtocolError as exc:
        return f"{exc.code}: {exc.reason}"
    trigger_id = request.trigger_id or key_id
    if not topics.is_valid_id(trigger_id):
        return f"trigger_id {trigger_id!r} is not a valid id"
    if key_id and key_id != trigger_id:
        return f"record key {key_id!r} differs from trigger_id {trigger_id!r}"
    return TriggerRecord(trigger_id, request, stamp)
