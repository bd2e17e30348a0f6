"""The live engine as a member of a consumer group (ADR 0014), against a scripted group
consumer: a revoked partition's state (open candles, recent trade ids, next offset) is
saved and dropped; its next owner restores it, seeks to its offset, and closes the
candles the first owner opened with every trade in them."""

from __future__ import annotations

import json
import threading
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

import fake_kafka
import pytest
from google.protobuf.message import Message
from pyarrow import fs

from mdproto import envelope
from mdproto.messages import OHLC, Tick
from pipeline.config import Settings
from pipeline.live_books import BookRecord
from pipeline.live_engine import _Run
from pipeline.live_metrics import EngineMetrics
from pipeline.live_saves import Deliveries, Round, Snapshot, SnapshotFile, Targets, Writer
from pipeline.live_state import FORMAT, PartitionState, StateStore, StateStoreError

TOPIC = "market.ticks"
X, Y = "BINANCE:BTC/USDT", "BINANCE:ETH/USDT"  # X in partition 0, Y in partition 1
B = 1_704_067_200_000  # 2024-01-01T00:00:00Z


def tick(ticker: str, trade_id: str, price: float, at_ms: int) -> Tick:
    return Tick(ticker=ticker, trade_id=trade_id, price=price, amount=1.0, timestamp_ms=at_ms)


class _Outlet:
    """Books are not exercised; records which tickers an engine was told to forget."""

    def __init__(self) -> None:
        self.forgotten: list[str] = []

    def send_books(self, records: Iterable[BookRecord]) -> int:
        return 0

    def send_book_snapshots(self) -> int:
        return 0

    def forget(self, tickers: Collection[str]) -> None:
        self.forgotten += sorted(tickers)


class Engine:
    """One engine's run against the shared Kafka log and state store."""

    def __init__(self, tmp_path: Path, name: str, log: dict[int, list[bytes]]) -> None:
        self.settings = Settings.model_validate(
            {
                "checkpoint_dir": str(tmp_path / name),
                "kafka": {"topic_ticks": TOPIC, "starting_offsets": "earliest"},
                "live": {"periods": [60], "watermark_s": 10, "close_idle_s": 3600},
                "cep": {"enabled": False},
            }
        )
        self.log = log
        self.store = StateStore(fs.LocalFileSystem(), str(tmp_path / "state"))
        self.sent: list[Message] = []
        self.outlet = _Outlet()
        self.producer = fake_kafka.Producer()
        self.name = name
        self.tmp_path = tmp_path
        self.consumer: fake_kafka.GroupConsumer | None = None
        self.corrections: Any = None

    def send_many(self, items: Any) -> int:
        self.sent.extend(m for _, m in items)
        return len(self.sent)

    def run(self, *script: fake_kafka.Step, metrics: EngineMetrics | None = None) -> _Run:
        stop = threading.Event()
        self.consumer = fake_kafka.GroupConsumer(TOPIC, list(script), stop, self.log, at_ms=B)
        file = SnapshotFile(self.tmp_path / self.name / "snapshot.json")
        run = _Run(
            self.settings,
            self.consumer,
            self.producer,
            self.store,
            file,
            Snapshot(),
            None,
            self.send_many,
            self.outlet,
        )
        if metrics is not None:
            run.metrics = metrics
        run.corrections = self.corrections
        run.start()
        run.loop(stop)
        return run

    def closed(self) -> list[tuple[str, int, int, float]]:
        return [
            (c.ticker, c.open_time_ms, c.trade_count, c.high)
            for c in self.sent
            if isinstance(c, OHLC) and c.closed
        ]


def test_a_moved_partition_is_restored_and_its_candles_close_whole(tmp_path: Path) -> None:
    log: dict[int, list[bytes]] = {}
    a, b = Engine(tmp_path, "a", log), Engine(tmp_path, "b", log)
    first = [tick(Y, "y1", 100.0, B + 1_000), tick(Y, "y2", 105.0, B + 2_000)]
    run_a = a.run(
        fake_kafka.Assign([0, 1]),
        fake_kafka.Ticks(0, [tick(X, "x1", 50.0, B + 1_000)]),
        fake_kafka.Ticks(1, first),
        fake_kafka.Revoke([0, 1]),  # eager: everything, then what stays comes back
        fake_kafka.Assign([0]),
        fake_kafka.Ticks(0, [tick(X, "x2", 51.0, B + 61_000)]),  # closes X's first minute
    )
    assert a.outlet.forgotten == [Y]
    assert a.consumer is not None and a.consumer.seeks == [[(0, 0), (1, 0)], [(0, 1)]]
    assert run_a.candles is not None and set(run_a.candles.tickers) == {X}
    assert a.closed() == [(X, B, 1, 50.0)]
    saved = b.store.load(TOPIC, 1)
    assert saved is not None and saved.offset == 2
    assert {k for k in saved.recent} == {(Y, "y1"), (Y, "y2")}

    # B takes partition 1 over: it resumes after y2, and Y's window has both trades.
    run_b = b.run(
        fake_kafka.Assign([1]),
        fake_kafka.Ticks(1, [tick(Y, "y3", 99.0, B + 3_000), tick(Y, "y4", 98.0, B + 62_000)]),
    )
    assert b.consumer is not None and b.consumer.seeks == [[(1, 2)]]
    assert b.closed() == [(Y, B, 3, 105.0)]
    assert run_b.candles is not None and set(run_b.candles.tickers) == {Y}
    assert [t.trade_id for t in b.sent if isinstance(t, Tick)] == ["y3", "y4"]


class _Corrections:
    """`CorrectionsReader` without Kafka: every engine reads the same records."""

    def __init__(self, *messages: Message) -> None:
        self.records: list[bytes | None] = [envelope.encode_record(m) for m in messages]

    def take(self) -> list[bytes | None]:
        taken, self.records = self.records, []
        return taken


def test_a_correction_is_published_by_the_engine_owning_its_ticker(tmp_path: Path) -> None:
    """The driver's corrections reach every engine; each publishes its own tickers' only,
    so a ticker's topics keep one publisher and one epoch (docs/protocol.md)."""
    log: dict[int, list[bytes]] = {}
    d = "BINANCE:DOGE/USDT"  # its key goes to partition 0 of 2, X's to 1 (`partitioning`)
    fixes = [
        OHLC(ticker=t, period_seconds=60, open_time_ms=B, close=c, closed=True, correction=True)
        for t, c in ((X, 1.0), (d, 2.0))
    ]
    for name, partition, ticker in (("a", 0, d), ("b", 1, X)):
        engine = Engine(tmp_path, name, log)
        engine.corrections = _Corrections(*fixes, Tick(ticker=X))  # a tick: skipped
        engine.run(fake_kafka.Assign([partition]), fake_kafka.Ticks(partition, []))
        assert [(m.ticker, m.correction) for m in engine.sent] == [(ticker, True)]


def test_a_revoke_before_kafka_has_the_candles_saves_nothing(tmp_path: Path) -> None:
    log: dict[int, list[bytes]] = {}
    a = Engine(tmp_path, "a", log)
    a.producer.holding = True  # Kafka does not acknowledge the closed candle
    a.run(
        fake_kafka.Assign([0]),
        fake_kafka.Ticks(0, [tick(X, "x1", 50.0, B + 1_000), tick(X, "x2", 51.0, B + 61_000)]),
        fake_kafka.Revoke([0]),
        fake_kafka.Assign([]),
    )
    assert a.store.load(TOPIC, 0) is None
    assert a.outlet.forgotten == [X]


class _Outage(StateStore):
    """A store that refuses every save while `down` (the S3 store unreachable)."""

    down = True

    def save(self, state: PartitionState) -> int:
        if self.down:
            raise StateStoreError("cannot write the live engine's state: connection refused")
        return super().save(state)


def test_a_store_outage_keeps_the_engine_live_and_saves_once_it_is_back(tmp_path: Path) -> None:
    log: dict[int, list[bytes]] = {}
    a = Engine(tmp_path, "a", log)
    store = _Outage(fs.LocalFileSystem(), str(tmp_path / "state"))
    a.store = store
    run = a.run(
        fake_kafka.Assign([0]),
        fake_kafka.Ticks(0, [tick(X, "x1", 50.0, B + 1_000), tick(X, "x2", 51.0, B + 61_000)]),
    )
    assert a.closed() == [(X, B, 1, 50.0)]  # the live path went on
    assert run.save() is False and run.dirty == {(TOPIC, 0)}
    assert store.load(TOPIC, 0) is None
    store.down = False
    assert run.save() is True and not run.dirty
    saved = store.load(TOPIC, 0)
    assert saved is not None and saved.offset == 2


def test_a_state_of_another_format_is_ignored(tmp_path: Path) -> None:
    store = StateStore(fs.LocalFileSystem(), str(tmp_path))
    state = PartitionState(TOPIC, 3, 42, {}, [(X, "1")])
    store.save(state)
    assert store.load(TOPIC, 3) == state
    (tmp_path / TOPIC / "3.json").write_text(json.dumps({"format": FORMAT + 1}))
    assert store.load(TOPIC, 3) is None
    assert store.load(TOPIC, 4) is None


def test_the_state_location_defaults_to_the_warehouse_bucket() -> None:
    s = Settings.model_validate({"kafka": {"topic_ticks": "t1"}})
    store = StateStore.for_settings(s)
    assert store.root == "warehouse/live-engine/live-engine.t1"
    with pytest.raises(RuntimeError, match="s3:// or a local path"):
        StateStore.for_settings(Settings.model_validate({"live": {"state_location": "gs://x"}}))


class _Steps:
    """A monotonic clock that moves `step` seconds at every reading."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 100.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_the_metrics_follow_batches_assignments_saves_and_restores(tmp_path: Path) -> None:
    """One update per batch and per rebalance: records by topic, the publish latency
    from the Kafka time (the fake's B), partitions owned, the saved state's size, and
    the restore of a partition that moved here."""
    log: dict[int, list[bytes]] = {}
    a, b = Engine(tmp_path, "a", log), Engine(tmp_path, "b", log)
    ma = EngineMetrics(TOPIC, "market.book", engine="a", wall_ms=lambda: B + 250)
    run_a = a.run(
        fake_kafka.Assign([0, 1]),
        fake_kafka.Ticks(0, [tick(X, "x1", 50.0, B + 1_000), tick(X, "x2", 51.0, B + 2_000)]),
        fake_kafka.Ticks(1, [tick(Y, "y1", 100.0, B + 1_000)]),
        fake_kafka.Revoke([0, 1]),
        fake_kafka.Assign([0]),
        metrics=ma,
    )
    assert run_a.save() is True

    def a_value(name: str, **labels: str) -> float | None:
        return ma.registry.get_sample_value(name, {"engine": "a", **labels})

    assert a_value("pipeline_live_records_total", topic=TOPIC) == 3
    assert a_value("pipeline_live_publish_latency_seconds_count") == 2  # one per batch
    assert a_value("pipeline_live_publish_latency_seconds_sum") == 0.5
    assert a_value("pipeline_live_partitions_owned", topic=TOPIC) == 1
    assert a_value("pipeline_live_restored_partitions_total") == 0  # nothing saved before
    size = (tmp_path / "state" / TOPIC / "0.json").stat().st_size
    assert a_value("pipeline_live_state_bytes", partition="0") == size
    assert a_value("pipeline_live_state_bytes", partition="1") is None  # moved away

    mb = EngineMetrics(TOPIC, "market.book", engine="b", monotonic=_Steps(0.75))
    b.run(fake_kafka.Assign([1]), metrics=mb)
    restore = {"engine": "b"}
    assert mb.registry.get_sample_value("pipeline_live_restore_seconds_count", restore) == 1
    assert mb.registry.get_sample_value("pipeline_live_restore_seconds_sum", restore) == 0.75
    assert mb.registry.get_sample_value("pipeline_live_restored_partitions_total", restore) == 1


class _Gated(StateStore):
    """A store whose saves wait for `gate` (a slow S3 store)."""

    gate: threading.Event

    def save(self, state: PartitionState) -> int:
        assert self.gate.wait(30), "the test never opened the gate"
        return super().save(state)


def test_a_periodic_save_is_written_while_the_loop_goes_on(tmp_path: Path) -> None:
    """ADR 0024: the loop takes the state and goes on; the writer thread stores it."""
    a = Engine(tmp_path, "a", {})
    live = a.settings.live.model_copy(update={"snapshot_s": 0.001})  # due at every batch
    a.settings = a.settings.model_copy(update={"live": live})
    store = _Gated(fs.LocalFileSystem(), str(tmp_path / "state"))
    store.gate = threading.Event()
    a.store = store
    run = a.run(
        fake_kafka.Assign([0]),
        fake_kafka.Ticks(0, [tick(X, "x1", 50.0, B + 1_000)]),  # a save is due: taken
        fake_kafka.Ticks(0, [tick(X, "x2", 51.0, B + 61_000)]),
        fake_kafka.Ticks(0, [tick(X, "x3", 52.0, B + 62_000)]),
    )
    # Every batch was published while the first save waited for the store.
    assert [t.trade_id for t in a.sent if isinstance(t, Tick)] == ["x1", "x2", "x3"]
    assert a.closed() == [(X, B, 1, 50.0)]
    assert store.load(TOPIC, 0) is None
    store.gate.set()
    run.close()
    saved = store.load(TOPIC, 0)
    assert saved is not None and saved.offset == 1  # the state as taken after x1
    assert run.dirty == {(TOPIC, 0)}  # the later batches are the next round's
    assert run.save() is True
    again = store.load(TOPIC, 0)
    assert again is not None and again.offset == 3


def test_a_round_waits_for_the_candles_sent_before_it_and_no_later_ones() -> None:
    deliveries = Deliveries()
    first = deliveries.sent()
    mark = deliveries.mark
    later = deliveries.sent()
    assert deliveries.wait(mark, 0.0) is False
    first(None, None)
    assert deliveries.wait(mark, 0.0) is True  # `later` is not waited for
    assert deliveries.wait(deliveries.mark, 0.0) is False
    later("broker down", None)
    assert deliveries.wait(deliveries.mark, 0.0) is False and deliveries.error == "broker down"


def test_acknowledgements_out_of_order_count_once_every_earlier_one_came() -> None:
    deliveries = Deliveries()
    callbacks = [deliveries.sent() for _ in range(3)]
    callbacks[2](None, None)
    callbacks[0](None, None)
    assert deliveries.wait(1, 0.0) is True
    assert deliveries.wait(3, 0.0) is False  # the second is still out
    callbacks[1](None, None)
    assert deliveries.wait(3, 0.0) is True


def test_a_drain_serves_the_acknowledgements_its_round_waits_for(tmp_path: Path) -> None:
    """A revoke runs inside the poll: while it waits for the round in flight, only it
    can poll the producer, so it does (else the round would wait out its timeout)."""
    deliveries = Deliveries()
    acknowledge = deliveries.sent()  # a closed candle sent before the capture
    store = StateStore(fs.LocalFileSystem(), str(tmp_path / "state"))
    targets = Targets(store, SnapshotFile(tmp_path / "snapshot.json"))
    writer = Writer(targets, deliveries, ack_timeout_s=600)
    writer.submit(Round(deliveries.mark, [PartitionState(TOPIC, 0, 7)], Snapshot()))
    polls: list[int] = []

    def serve() -> None:
        polls.append(1)
        acknowledge(None, None)

    [(_, outcome)] = writer.close(serve)
    assert polls and not outcome.unsaved and outcome.snapshot_saved
    saved = store.load(TOPIC, 0)
    assert saved is not None and saved.offset == 7


def test_a_batch_gathers_for_live_gather_s_only_once_a_tick_is_there(tmp_path: Path) -> None:
    """librdkafka's consume(n, t) holds what it has until n records or t: each tick waited
    out the engine's whole poll. The engine waits for a first record, then `gather_s`."""
    engine = Engine(tmp_path, "a", {})
    live = engine.settings.live.model_copy(update={"gather_s": 0.004})
    engine.settings = engine.settings.model_copy(update={"live": live})
    engine.run(
        fake_kafka.Assign([0]),
        fake_kafka.Ticks(0, [tick(X, "x1", 50.0, B + 1_000), tick(X, "x2", 51.0, B + 2_000)]),
    )
    assert engine.consumer is not None
    waits = engine.consumer.waits
    # The assignment's poll returns nothing: no gather; the ticks' poll: one gather of 4 ms.
    assert [call for call, _ in waits] == ["poll", "poll", "consume", "poll"]
    assert all(0 < t <= 0.05 for call, t in waits if call == "poll")
    assert [t for call, t in waits if call == "consume"] == [0.004]
    assert [m.trade_id for m in engine.sent if isinstance(m, Tick)] == ["x1", "x2"]
