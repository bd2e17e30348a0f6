"""CEP micro-batches without Spark: record order, snapshots, restarts, tombstones, timer."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pytest
from google.protobuf.message import Message

from mdproto import envelope
from mdproto.messages import (
    CEPCondition,
    CEPTriggerEvent,
    CEPTriggerRequest,
    NotifyPattern,
    Tick,
)
from pipeline.blobs import BlobError, Folder
from pipeline.cep.engine import Engine
from pipeline.cep.model import TriggerSpec, spec_from_request
from pipeline.cep.records import TickRecord, TriggerRecord, decode_batch
from pipeline.cep.runner import CepRunner
from pipeline.cep.state import SnapshotStore
from pipeline.config import CatalogConfig

TOPIC = "cep.triggers"
TICKS = "market.ticks"
TICKER = "BINANCE:BTC/USDT"
T0 = 1_700_000_040_000


def register(trigger_id: str, threshold: float, **fields: object) -> CEPTriggerRequest:
    values: dict[str, object] = {
        "trigger_id": trigger_id,
        "client_id": "alice",
        "action": CEPTriggerRequest.REGISTER,
        "ticker": TICKER,
        "conditions": [CEPCondition(kind=CEPCondition.PRICE_ABOVE, threshold=threshold)],
        "notify": NotifyPattern.NOTIFY_PER_REQUEST,
    }
    values.update(fields)
    return CEPTriggerRequest(**values)  # type: ignore[arg-type]


def spec_for(trigger_id: str) -> TriggerSpec:
    return spec_from_request(register(trigger_id, 100.0), T0)


def tick(trade_id: str, price: float, t: int = T0) -> Tick:
    return Tick(ticker=TICKER, trade_id=trade_id, price=price, amount=1.0, timestamp_ms=t)


Row = tuple[str, bytes | None, bytes | None, int]  # topic, key, value, kafka ms


def rows(
    *records: tuple[str, Message | None, int] | tuple[str, Message | None, int, str],
) -> pa.Table:
    """(topic, message or None for a tombstone, kafka timestamp[, key]) -> Kafka rows."""
    out: list[Row] = []
    for record in records:
        topic, message, stamp = record[0], record[1], record[2]
        key = record[3] if len(record) > 3 else None  # type: ignore[misc]
        if isinstance(message, CEPTriggerRequest):
            key = key or message.trigger_id
        elif isinstance(message, Tick):
            key = message.ticker
        value = envelope.encode_record(message) if message is not None else None
        out.append((topic, key.encode() if key else None, value, stamp))
    return pa.table(
        {
            "topic": pa.array([r[0] for r in out], pa.string()),
            "key": pa.array([r[1] for r in out], pa.binary()),
            "value": pa.array([r[2] for r in out], pa.binary()),
            "timestamp": pa.array([r[3] * 1000 for r in out], pa.timestamp("us", tz="UTC")),
            "partition": pa.array([0] * len(out), pa.int32()),
            "offset": pa.array(range(len(out)), pa.int64()),
        }
    )


class Outputs:
    def __init__(self) -> None:
        self.events: list[tuple[str, CEPTriggerEvent]] = []
        self.retired: list[str] = []
        self.now = T0

    def publish(self, items: Iterable[tuple[str, Message]]) -> int:
        batch = [(topic, m) for topic, m in items if isinstance(m, CEPTriggerEvent)]
        self.events += batch
        return len(batch)

    def retire(self, ids: list[str]) -> None:
        self.retired += ids

    def kinds(self) -> list[tuple[str, str]]:
        return [(e.trigger_id, CEPTriggerEvent.Kind.Name(e.kind)) for _, e in self.events]


def runner(tmp_path: Path, out: Outputs, **kw: object) -> CepRunner:
    return CepRunner(
        store=SnapshotStore(tmp_path / "snapshots"),
        trigger_topic=TOPIC,
        publish=out.publish,
        retire=out.retire,
        clock=lambda: out.now,
        **kw,  # type: ignore[arg-type]
    )


# --- decoding ----------------------------------------------------------------------------


def test_records_are_ordered_by_kafka_time_triggers_first_on_ties() -> None:
    table = rows(
        (TICKS, tick("1", 99.0), T0 + 5),
        (TOPIC, register("t1", 100.0), T0 + 5),
        (TICKS, tick("0", 98.0), T0 + 1),
        (TOPIC, None, T0 + 7, "gone"),
    )
    batch = decode_batch(table, TOPIC)
    kinds = [
        r.trigger_id if isinstance(r, TriggerRecord) else r.tick.trade_id for r in batch.inputs
    ]
    assert kinds == ["0", "t1", "1", "gone"]
    assert (batch.triggers, batch.ticks, batch.rejects) == (2, 2, [])
    tombstone = batch.inputs[-1]
    assert isinstance(tombstone, TriggerRecord) and tombstone.request is None
    first = batch.inputs[0]
    assert isinstance(first, TickRecord) and first.time_ms == T0 + 1


def test_bad_records_are_rejected_with_their_coordinates() -> None:
    table = rows(
        (TICKS, tick("1", -5.0), T0),
        (TOPIC, register("t1", 100.0), T0, "other-key"),
        (TOPIC, tick("x", 1.0), T0, "t2"),
    )
    batch = decode_batch(table, TOPIC)
    assert batch.inputs == []
    assert [(r.offset, r.code) for r in batch.rejects] == [
        (0, "bad_tick"),
        (1, "bad_trigger"),
        (2, "bad_trigger"),
    ]
    assert "differs" in batch.rejects[1].reason and "unexpected_type" in batch.rejects[2].reason


# --- runner --------------------------------------------------------------------------------


def test_register_fire_retire_and_snapshot(tmp_path: Path) -> None:
    out = Outputs()
    run = runner(tmp_path, out)
    report = run(rows((TOPIC, register("t1", 100.0), T0), (TICKS, tick("a", 99.0), T0 + 1)), 0)
    assert (report.triggers, report.ticks, report.active) == (1, 1, 1)
    assert out.kinds() == [("t1", "ARMED")]
    run(rows((TICKS, tick("b", 101.0, T0 + 2), T0 + 2)), 1)
    assert out.kinds()[-1] == ("t1", "FIRED")
    topic, event = out.events[-1]
    assert topic == "CEP:t1" and event.final and event.values["price"] == 101.0
    assert out.retired == ["t1"]
    names = sorted(p.name for p in (tmp_path / "snapshots").iterdir())
    assert [n[:20] for n in names if n.endswith(".snapshot")] == [f"{0:020d}", f"{1:020d}"]
    assert len([n for n in names if n.endswith(".defs")]) == 2  # the set changed in batch 1


def test_a_tick_written_before_the_registration_does_not_fire_it(tmp_path: Path) -> None:
    out = Outputs()
    run = runner(tmp_path, out)
    run(
        rows(
            (TICKS, tick("a", 99.0), T0),
            (TICKS, tick("b", 101.0), T0 + 1),
            (TOPIC, register("t1", 100.0), T0 + 2),
        ),
        0,
    )
    assert out.kinds() == [("t1", "ARMED")]


def test_restart_resumes_from_the_snapshot_and_rerun_batches_repeat_their_events(
    tmp_path: Path,
) -> None:
    out = Outputs()
    first = runner(tmp_path, out)
    first(rows((TOPIC, register("r", 100.0, repeating=True), T0)), 0)
    first(rows((TICKS, tick("a", 99.0), T0 + 1)), 1)
    batch2 = rows((TICKS, tick("b", 101.0), T0 + 2))
    first(batch2, 2)  # fires; then the "process dies" before Spark commits batch 2
    assert [e.fire_count for _, e in out.events if e.kind == CEPTriggerEvent.FIRED] == [1]

    restarted = runner(tmp_path, out)
    restarted(batch2, 2)  # Spark re-runs the uncommitted batch: state from snapshot 1
    fires = [e.fire_count for _, e in out.events if e.kind == CEPTriggerEvent.FIRED]
    assert fires == [1, 1]  # the same event again (same fire_count): at-least-once
    restarted(rows((TICKS, tick("c", 99.0), T0 + 3), (TICKS, tick("d", 100.5), T0 + 4)), 3)
    fires = [e.fire_count for _, e in out.events if e.kind == CEPTriggerEvent.FIRED]
    assert fires == [1, 1, 2]


def test_captured_state_matches_the_offsets_saved_with_it(tmp_path: Path) -> None:
    """The live engine's mode: no snapshot per batch; `capture` encodes the state it
    records with its offsets (in its loop), the store writes it later (its writer
    thread), and a restart from there replays only later batches."""
    out = Outputs()
    first = runner(tmp_path, out, snapshot_each_batch=False)
    store = SnapshotStore(tmp_path / "snapshots")
    first(rows((TOPIC, register("r", 100.0, repeating=True), T0)), 0)
    assert not list((tmp_path / "snapshots").glob("*.snapshot"))
    first(rows((TICKS, tick("a", 99.0), T0 + 1)), 1)
    saved, snapshot = first.capture()  # the engine writes its offsets with batch 1
    assert saved == 1 and snapshot is not None
    later = rows((TICKS, tick("b", 101.0), T0 + 2))
    first(later, 2)  # fires before the capture is written: the write holds batch 1's state
    store.write(snapshot)
    assert first.capture()[0] == 2

    restarted = runner(tmp_path, out, snapshot_each_batch=False)
    restarted(later, saved + 1)  # read again from the saved offsets
    fires = [e.fire_count for _, e in out.events if e.kind == CEPTriggerEvent.FIRED]
    assert fires == [1, 1]  # the same event again: at-least-once, no second ARMED
    assert [k for k in out.kinds() if k[1] == "ARMED"] == [("r", "ARMED")]


def test_an_unchanged_state_is_not_captured_again_unless_its_write_failed(tmp_path: Path) -> None:
    run = runner(tmp_path, Outputs(), snapshot_each_batch=False)
    assert run.capture() == (None, None)  # nothing ran yet
    run(rows((TOPIC, register("r", 100.0), T0)), 0)
    batch, snapshot = run.capture()
    assert batch == 0 and snapshot is not None and snapshot.definitions is not None
    assert run.capture() == (0, None)  # nothing changed since
    run.unsaved()  # its write failed (the S3 store away)
    batch, again = run.capture()
    assert again is not None and again.state == snapshot.state


def test_specs_are_encoded_until_a_write_stored_them(tmp_path: Path) -> None:
    engine = Engine()
    store = SnapshotStore(tmp_path)
    first = store.encode(0, engine)
    assert first.definitions is not None
    assert store.encode(1, engine).definitions is not None  # not written yet
    store.write(first)
    assert store.encode(2, engine).definitions is None
    assert store.load_before(1) is not None


def test_lost_snapshots_are_rebuilt_from_the_trigger_topic(tmp_path: Path) -> None:
    out = Outputs()
    records = [
        TriggerRecord("t1", register("t1", 100.0), T0),
        TriggerRecord("t2", register("t2", 50.0), T0),
        TriggerRecord("t2", None, T0 + 1),  # tombstoned
    ]
    run = runner(tmp_path, out, bootstrap=lambda: records)
    run(rows((TICKS, tick("a", 99.0), T0 + 2), (TICKS, tick("b", 101.0), T0 + 3)), 7)
    assert out.kinds() == [("t1", "ARMED"), ("t1", "FIRED")]


def test_cancel_and_invalid_update(tmp_path: Path) -> None:
    out = Outputs()
    run = runner(tmp_path, out)
    cancel = CEPTriggerRequest(trigger_id="t1", action=CEPTriggerRequest.CANCEL)
    broken = register("t2", 100.0, conditions=[])
    run(
        rows(
            (TOPIC, register("t1", 100.0), T0),
            (TOPIC, register("t2", 100.0), T0),
            (TOPIC, cancel, T0 + 1),
            (TOPIC, broken, T0 + 2),
            (TICKS, tick("a", 99.0), T0 + 3),
            (TICKS, tick("b", 101.0), T0 + 4),
        ),
        0,
    )
    assert out.kinds() == [
        ("t1", "ARMED"),
        ("t2", "ARMED"),
        ("t1", "CANCELLED"),
        ("t2", "CANCELLED"),
    ]
    assert out.retired == []


def test_timer_expires_between_batches_and_the_next_batch_snapshots_it(tmp_path: Path) -> None:
    out = Outputs()
    run = runner(tmp_path, out)
    assert run.on_timer() == 0  # nothing loaded yet
    run(rows((TOPIC, register("t1", 100.0, expires_at_ms=T0 + 1000), T0)), 0)
    out.now = T0 + 999
    assert run.on_timer() == 0
    out.now = T0 + 1000
    assert run.on_timer() == 1
    assert out.kinds()[-1] == ("t1", "EXPIRED") and out.events[-1][1].final
    assert out.retired == ["t1"]
    report = run(rows(), 1)
    assert report.active == 0 and report.snapshot_bytes > 0  # dirty from the timer


def test_snapshot_store_picks_the_newest_below_and_skips_torn_files(tmp_path: Path) -> None:
    from pipeline.cep.engine import Engine

    def snapshots() -> list[str]:
        return sorted(p.name[:20] for p in tmp_path.glob("*.snapshot"))

    store = SnapshotStore(tmp_path, keep=3)
    for batch_id in range(5):
        engine = Engine()  # a new lineage each time: definitions files of pruned ones go
        engine.stats["marker"] = batch_id
        store.save(batch_id, engine)
    assert snapshots() == [f"{i:020d}" for i in (2, 3, 4)]
    assert len(list(tmp_path.glob("*.defs"))) == 3
    loaded = store.load_before(4)
    assert loaded is not None and loaded[0] == 3 and loaded[1].stats["marker"] == 3
    [third] = tmp_path.glob(f"{3:020d}.*.snapshot")
    third.write_bytes(b"torn")
    loaded = store.load_before(4)
    assert loaded is not None and loaded[0] == 2
    assert store.load_before(2) is None
    store.save(1, Engine())  # a new run (checkpoint reset): later snapshots are stale
    assert snapshots() == [f"{1:020d}"] and len(list(tmp_path.glob("*.defs"))) == 1


def test_unchanged_triggers_are_not_written_again(tmp_path: Path) -> None:
    from pipeline.cep.engine import Engine

    store = SnapshotStore(tmp_path)
    engine = Engine()
    for i in range(1000):
        engine.register(spec_for(f"t{i}"), T0)
    first = store.save(0, engine)
    engine.on_tick(TICKER, "a", T0, 99.0, 1.0, T0)
    second = store.save(1, engine)
    assert second * 10 < first  # the specs were written once, with batch 0
    loaded = store.load_before(2)
    assert loaded is not None and len(loaded[1]) == 1000
    # A restored engine never reuses the crashed run's definition ids.
    assert loaded[1].definitions_id != engine.definitions_id
    store.save(2, loaded[1])
    again = store.load_before(3)
    assert again is not None and len(again[1]) == 1000


def test_snapshots_go_where_the_checkpoints_are(tmp_path: Path) -> None:
    """A local checkpoint_dir holds them in a folder, an s3a:// one in the S3 store
    (the catalog's), anything else is refused."""
    catalog = CatalogConfig(s3_endpoint="http://127.0.0.1:1")
    for location in (str(tmp_path), f"file://{tmp_path}"):
        folder = Folder.at(location, catalog)
        assert folder.is_local and folder.path == str(tmp_path)
    for scheme in ("s3a", "s3"):
        on_s3 = Folder.at(f"{scheme}://bucket/checkpoints/live-engine", catalog).folder("cep")
        assert not on_s3.is_local and on_s3.path == "bucket/checkpoints/live-engine/cep"
    with pytest.raises(BlobError, match="hdfs"):
        Folder.at("hdfs://nn/checkpoints", catalog)


# --- sharded engines (ADR 0014): events not caused by a tick come from the owner only ----


def owned(run: CepRunner, owner: list[bool]) -> CepRunner:
    """`run` owning TICKER while `owner[0]` is true (its ticks partition)."""
    run.owns = lambda ticker: owner[0] and ticker == TICKER
    return run


def test_only_the_owner_arms_expires_and_tombstones_a_trigger(tmp_path: Path) -> None:
    (a_out, a_owner), (b_out, b_owner) = (Outputs(), [True]), (Outputs(), [False])
    a = owned(runner(tmp_path / "a", a_out), a_owner)
    b = owned(runner(tmp_path / "b", b_out), b_owner)
    records = rows((TOPIC, register("t1", 100.0, expires_at_ms=T0 + 5000), T0))
    for run, out in ((a, a_out), (b, b_out)):
        run(records, 0)
        out.now = T0 + 6000
        run.on_timer()
    assert a_out.kinds() == [("t1", "ARMED"), ("t1", "EXPIRED")] and a_out.retired == ["t1"]
    assert b_out.kinds() == [] and b_out.retired == []
    assert b.engine is not None and "t1" in b.engine  # kept for its owner
    b(rows((TOPIC, None, T0 + 6000, "t1")), 1)  # the owner's tombstone: gone, silently
    assert "t1" not in b.engine
    assert b_out.kinds() == [] and b_out.retired == []


def test_an_expiry_due_while_its_owner_is_gone_is_published_by_the_next_owner(
    tmp_path: Path,
) -> None:
    out, owner = Outputs(), [False]
    run = owned(runner(tmp_path, out), owner)
    run(rows((TOPIC, register("t1", 100.0, expires_at_ms=T0 + 5000), T0)), 0)
    out.now = T0 + 6000
    assert run.on_timer() == 0  # the owner was killed before it expired it
    owner[0] = True  # its partition came here
    out.now = T0 + 7000
    assert run.on_timer() == 1
    assert out.kinds() == [("t1", "EXPIRED")] and out.retired == ["t1"]


def test_a_registration_already_expired_is_answered_by_the_owner_only(tmp_path: Path) -> None:
    (a_out, b_out) = (Outputs(), Outputs())
    records = rows((TOPIC, register("t1", 100.0, expires_at_ms=T0 - 1000), T0))
    owned(runner(tmp_path / "a", a_out), [True])(records, 0)
    owned(runner(tmp_path / "b", b_out), [False])(records, 0)
    assert (a_out.kinds(), a_out.retired) == ([("t1", "EXPIRED")], ["t1"])
    assert (b_out.kinds(), b_out.retired) == ([], [])
