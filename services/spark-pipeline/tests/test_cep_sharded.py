"""CEP in sharded live engines (ADR 0014), at the live engine's level: an engine owns
the tickers whose key goes to its ``market.ticks`` partitions (`mdproto.partitioning`),
nobody owns any during a rebalance, and a ticker's CEP state is saved with its
partition's state and restored by the partition's next owner. The rule's use in the
runner: test_cep_runner.py; the engine's per-ticker state: test_cep_engine.py."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import fake_kafka
from pyarrow import fs

from mdproto import envelope
from mdproto.messages import (
    CEPCondition,
    CEPTriggerRequest,
    NotifyPattern,
    Tick,
)
from mdproto.partitioning import partition_of
from pipeline.cep.engine import Engine
from pipeline.cep.model import spec_from_request
from pipeline.config import Settings
from pipeline.live_engine import _Run
from pipeline.live_saves import Snapshot, SnapshotFile
from pipeline.live_state import StateStore

TICKER = "BINANCE:BTC/USDT"
T0 = 1_700_000_040_000
S = 1000


# --- the ownership rule in the live engine ------------------------------------------------


def test_the_engine_owns_the_tickers_whose_key_goes_to_its_partitions(tmp_path: Path) -> None:
    settings = Settings.model_validate(
        {
            "checkpoint_dir": str(tmp_path),
            "kafka": {"topic_ticks": "market.ticks"},
            "cep": {"enabled": False},
        }
    )
    tickers = [f"BINANCE:C{i}/USDT" for i in range(8)]
    mine = [t for t in tickers if partition_of(t, 4) in (1, 3)]
    assert 0 < len(mine) < len(tickers)
    stop = threading.Event()
    consumer = fake_kafka.GroupConsumer("market.ticks", [], stop, partitions=4)
    store = StateStore(fs.LocalFileSystem(), str(tmp_path / "state"))
    run = _Run(
        settings,
        consumer,
        fake_kafka.Producer(),
        store,
        SnapshotFile(tmp_path / "snapshot.json"),
        Snapshot(),
        None,
        lambda items: 0,
    )
    run.start()
    assert not any(run.owns(t) for t in tickers)  # before the first assignment: nobody
    tps = [fake_kafka.TopicPartition("market.ticks", p) for p in (1, 3)]
    run.on_assign(consumer, tps)
    assert [t for t in tickers if run.owns(t)] == mine
    run.on_revoke(consumer, tps)
    assert not any(run.owns(t) for t in tickers)  # until the assignment that follows
    run.on_assign(consumer, tps[:1])
    assert [t for t in tickers if run.owns(t)] == [t for t in mine if partition_of(t, 4) == 1]


class CepDouble:
    """The live engine's CEP stage around a bare `Engine` (no Kafka): what `_Run` saves
    with a partition and restores on its next owner."""

    def __init__(self) -> None:
        self.engine = Engine()
        pct = CEPCondition(kind=CEPCondition.PCT_MOVE, threshold=5.0, window_seconds=60)
        request = CEPTriggerRequest(
            trigger_id="p1",
            client_id="alice",
            action=CEPTriggerRequest.REGISTER,
            ticker=TICKER,
            conditions=[pct],
            repeating=True,
            notify=NotifyPattern.NOTIFY_PER_REQUEST,
        )
        self.engine.register(spec_from_request(request, T0), T0)

    def set_owner(self, owns: object) -> None:
        pass

    def ticker_states(self, tickers: Iterable[str]) -> dict[str, dict[str, object]]:
        return self.engine.ticker_states(tickers)

    def restore_tickers(self, forget: Callable[[str], bool], states: dict[str, Any]) -> None:
        self.engine.forget_tickers(forget)
        self.engine.restore_tickers(states)

    def feed(self, triggers: object, ticks: list[tuple[Tick, object]]) -> None:
        for t, _ in ticks:
            self.engine.on_tick(t.ticker, t.trade_id, t.timestamp_ms, t.price, t.amount, T0)

    def checkpoint(self) -> None:
        return None


class Engines:
    """Live engines of one group, one after another, on one fake Kafka log and state store,
    each with its own (new) snapshot file and `CepDouble`."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.settings = Settings.model_validate(
            {
                "checkpoint_dir": str(tmp_path),
                "kafka": {"topic_ticks": "market.ticks", "starting_offsets": "earliest"},
                "live": {"periods": [60], "watermark_s": 10, "close_idle_s": 3600},
            }
        )
        self.log: dict[int, list[bytes]] = {}
        self.store = StateStore(fs.LocalFileSystem(), str(tmp_path / "state"))

    def run(self, name: str, script: list[fake_kafka.Step], cep: CepDouble) -> CepDouble:
        stop = threading.Event()
        consumer = fake_kafka.GroupConsumer("market.ticks", script, stop, self.log, at_ms=T0)
        file = SnapshotFile(self.tmp_path / name / "snapshot.json")
        run = _Run(
            self.settings, consumer, fake_kafka.Producer(), self.store, file, Snapshot(), cep,
            lambda i: 0,
        )  # type: ignore[arg-type]  # fmt: skip
        run.start()
        run.loop(stop)
        return cep


def test_the_live_engine_saves_a_tickers_window_with_its_partition_and_the_next_owner_has_it(
    tmp_path: Path,
) -> None:
    p = partition_of(TICKER, 2)
    engines = Engines(tmp_path)
    store = engines.store

    def engine(name: str, script: list[fake_kafka.Step]) -> CepDouble:
        return engines.run(name, script, CepDouble())

    trade = Tick(ticker=TICKER, trade_id="a", price=100.0, amount=1.0, timestamp_ms=T0)
    first = engine(
        "a", [fake_kafka.Assign([p]), fake_kafka.Ticks(p, [trade]), fake_kafka.Revoke([p])]
    )
    assert first.engine.ticker_states([TICKER])[TICKER]["last_price"] == 100.0
    saved = store.load("market.ticks", p)
    assert saved is not None and saved.cep[TICKER]["last_price"] == 100.0

    second = engine("b", [fake_kafka.Assign([p])])
    [event] = second.engine.on_tick(TICKER, "b", T0 + 10 * S, 107.0, 1.0, T0)
    assert (event.fire_count, event.values["ref_price"]) == (1, 100.0)


def test_a_trade_written_before_the_next_owner_is_assigned_meets_its_triggers(
    tmp_path: Path,
) -> None:
    """A trade that lands between the last owner's save and the next owner's assignment
    is before the partition's end when the new owner looks: that owner's CEP state
    is new, but the partition's is not, so the trade is evaluated from the saved
    offset. It is not skipped as old."""
    p = partition_of(TICKER, 2)
    engines = Engines(tmp_path)
    fired: list[Any] = []

    class Recording(CepDouble):
        def feed(self, triggers: object, ticks: list[tuple[Tick, object]]) -> None:
            for t, _ in ticks:
                fired.extend(
                    self.engine.on_tick(t.ticker, t.trade_id, t.timestamp_ms, t.price, 1.0, T0)
                )

    def engine(name: str, script: list[fake_kafka.Step]) -> None:
        engines.run(name, script, Recording())

    trade = Tick(ticker=TICKER, trade_id="a", price=100.0, amount=1.0, timestamp_ms=T0)
    engine("a", [fake_kafka.Assign([p]), fake_kafka.Ticks(p, [trade]), fake_kafka.Revoke([p])])
    later = Tick(ticker=TICKER, trade_id="b", price=107.0, amount=1.0, timestamp_ms=T0 + 10 * S)
    engines.log[p].append(envelope.encode_record(later))  # produced while nobody owns it
    fired.clear()
    engine("b", [fake_kafka.Assign([p]), fake_kafka.Ticks(p, [])])
    assert [(e.fire_count, e.values["ref_price"]) for e in fired] == [(1, 100.0)]
