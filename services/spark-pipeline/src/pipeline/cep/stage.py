"""CEP inside the live engine: its consumer's records -> `CepRunner` -> events on the PUB.

    live engine consumer (market.ticks + cep.triggers, one poll)
      -> CepStage.feed: the poll's trigger records and decoded ticks as one batch
      -> CepRunner: engine, events (PUB, no hop), tombstones (Kafka)
      -> CepStage.capture / write: engine snapshot, saved with the live engine's offsets

Why here and not in a Spark query: see docs/cep.md ("Evaluation"). The batch id
is the engine's own counter, saved in the live engine's snapshot with the
offsets it belongs to, so a restart resumes the state that matches the records
it reads again (`state.SnapshotStore.load_before`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from mdproto import contracts
from mdproto.messages import Tick
from mdproto.runtime.kafka import ensure_topics, spec
from pipeline.blobs import Folder
from pipeline.cep import kafka
from pipeline.cep.engine import Engine
from pipeline.cep.records import Coordinates, ordered_batch
from pipeline.cep.runner import CepRunner, Publish
from pipeline.cep.state import EngineSnapshot, SnapshotStore
from pipeline.config import Settings

log = logging.getLogger(__name__)


class CepStage:
    """The CEP runner as the live engine drives it: `feed` per poll, `on_timer`,
    `capture` with the partitions' states and `write` before the engine saves its
    offsets, `close` at the end."""

    def __init__(self, settings: Settings, publish: Publish, *, next_batch: int) -> None:
        cep, k = settings.cep, settings.kafka
        ensure_topics(
            k.bootstrap_servers,
            [spec(contracts.KAFKA_CEP_TRIGGERS, k.topic_cep_triggers)],
            partitions=k.topic_partitions,
            replication=k.replication_factor,
            timeout_s=k.connect_timeout_s,
        )
        self.trigger_topic = k.topic_cep_triggers
        self._writer = kafka.TombstoneWriter(k.bootstrap_servers, k.topic_cep_triggers)
        # Beside the checkpoints: in the S3 store with an s3a:// checkpoint_dir.
        directory = Folder.at(settings.checkpoint_for("live-engine"), settings.catalog).folder(
            "cep"
        )

        def new_engine() -> Engine:
            return Engine(
                candle_grace_ms=round(cep.candle_grace_s * 1000),
                dedupe_capacity=cep.dedupe_capacity,
            )

        self._store = SnapshotStore(directory, keep=cep.snapshots_kept)
        self._runner = CepRunner(
            store=self._store,
            trigger_topic=k.topic_cep_triggers,
            publish=publish,
            retire=self._writer.retire,
            bootstrap=lambda: kafka.read_all(k.bootstrap_servers, k.topic_cep_triggers),
            new_engine=new_engine,
            snapshot_each_batch=False,
        )
        self._next_batch = next_batch
        self._timer_s = cep.timer_s
        self._next_timer = time.monotonic() + cep.timer_s

    def feed(self, triggers: Sequence[Any], ticks: Sequence[tuple[Tick, Coordinates]]) -> None:
        """One batch: trigger records (confluent-kafka messages) and the poll's decoded
        ticks from where CEP's state starts."""
        if triggers or ticks:
            records = [(m.key(), m.value(), _where(m)) for m in triggers]
            self._runner.run(ordered_batch(records, list(ticks)), self._next_batch)
            self._next_batch += 1
        if time.monotonic() >= self._next_timer:
            self._next_timer = time.monotonic() + self._timer_s
            self._runner.on_timer()

    def set_owner(self, owns: Callable[[str], bool]) -> None:
        """Which tickers' events this engine publishes (`CepRunner.owns`)."""
        self._runner.owns = owns

    def ticker_states(self, tickers: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The CEP state of `tickers` (JSON), saved with their ticks partition."""
        return self._runner.with_engine(
            self._next_batch, lambda engine: engine.ticker_states(tickers)
        )

    def restore_tickers(
        self, forget: Callable[[str], bool], states: dict[str, dict[str, Any]]
    ) -> None:
        """A ticks partition newly assigned: forget what this engine has of its tickers
        (`forget`), then take their saved state."""

        def work(engine: Engine) -> None:
            engine.forget_tickers(forget)
            engine.restore_tickers(states)

        self._runner.with_engine(self._next_batch, work)

    def capture(self) -> tuple[int | None, EngineSnapshot | None]:
        """`CepRunner.capture`: taken in the loop with the partitions' states."""
        return self._runner.capture()

    def write(self, snapshot: EngineSnapshot) -> int:
        """Store a captured snapshot (any thread); the bytes written."""
        return self._store.write(snapshot)

    def unsaved(self) -> None:
        self._runner.unsaved()

    def close(self) -> None:
        self._writer.close()


def _where(m: Any) -> Coordinates:
    return (m.timestamp()[1], m.partition() or 0, m.offset() or 0)
