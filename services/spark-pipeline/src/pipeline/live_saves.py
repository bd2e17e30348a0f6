"""Saving the live engine's state off its loop: taken between two batches, written by a
thread (docs/adr/0024-state-saves-off-the-loop.md).

A save round keeps ADR 0014's order, in numbered steps:

    loop thread, between two consume() batches      writer thread
    1. capture: each dirty ticks partition's state
       (offset, open candles, newest trade ids, CEP
       ticker states) and CEP's engine state, as
       plain data, with the Deliveries mark
       ---------------- Round ---------------------->
                                                     2. wait until Kafka acknowledged every
                                                        closed candle sent before the mark
                                                     3. encode and write each partition
                                                     4. every one written: CEP's engine
                                                        state, then the trigger offsets and
                                                        its batch id
       <--------------- Outcome --------------------
    5. collect: sizes to the metrics; what was not
       written is dirty again (retried a period later)

One round is in flight at a time. A revoke or a stop first waits for it, then runs
its own round in the loop thread (`Round.write` after a producer flush), so a
partition's state in the store is never older than one written before it.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.blobs import Blob, Folder
from pipeline.config import Settings
from pipeline.live_state import PartitionState, StateStore, StateStoreError

if TYPE_CHECKING:
    from pipeline.cep.stage import CepStage
    from pipeline.cep.state import EngineSnapshot

log = logging.getLogger(__name__)
Position = tuple[str, int]  # (topic, partition)
SNAPSHOT_FORMAT = 3
#: While a revoke or a stop waits for the round in flight, the producer is polled this
#: often.
DRAIN_POLL_S = 0.01


class Deliveries:
    """Closed candles sent to Kafka and not yet acknowledged, by sequence number: a
    round waits for those sent before its capture, not for those sent since (a flush
    would, and at a busy minute's end it would wait on every new candle too)."""

    def __init__(self) -> None:
        self._next = 0
        self._pending: set[int] = set()
        #: Every message below it is acknowledged (acknowledgements come nearly in order:
        #: it moves on in amortised O(1), where a scan of `_pending` per acknowledgement
        #: would cost a minute's end of 2,000 candles millions of steps).
        self._low = 0
        self._changed = threading.Condition()
        #: The first delivery Kafka refused (the engine stops on it).
        self.error: str | None = None

    def sent(self) -> Callable[[Any, Any], None]:
        """The `on_delivery` callback of the next message sent (loop thread only)."""
        with self._changed:
            seq = self._next
            self._next += 1
            self._pending.add(seq)
        return partial(self._acknowledged, seq)

    @property
    def mark(self) -> int:
        """Every message sent so far has a sequence number below this."""
        return self._next

    def _acknowledged(self, seq: int, err: Any, _msg: Any) -> None:
        with self._changed:
            if err is not None and self.error is None:
                self.error = str(err)
            self._pending.discard(seq)
            low = self._low
            while low < self._next and low not in self._pending:
                low += 1
            if low != self._low or self.error is not None:
                self._low = low
                self._changed.notify_all()

    def wait(self, mark: int, timeout_s: float) -> bool:
        """Whether every message below `mark` was acknowledged within `timeout_s` (the
        loop's `producer.poll` runs the callbacks meanwhile)."""
        with self._changed:
            self._changed.wait_for(lambda: self.error is not None or self._low >= mark, timeout_s)
            return self.error is None and self._low >= mark


@dataclass
class Snapshot:
    """The engine's own part, kept beside its CEP state: the next offset of each
    ``cep.triggers`` partition and the CEP batch whose state was saved with it."""

    offsets: dict[Position, int] = field(default_factory=dict)
    cep_batch: int | None = None


class SnapshotFile:
    """One JSON object, replaced whole (`blobs.Blob`): beside the checkpoints, local or
    in the S3 store."""

    def __init__(self, target: Path | Blob) -> None:
        self.blob = target if isinstance(target, Blob) else Blob.local(target)

    @classmethod
    def for_settings(cls, settings: Settings) -> SnapshotFile:
        folder = Folder.at(settings.checkpoint_for("live-engine"), settings.catalog)
        return cls(folder.child("snapshot.json"))

    def load(self) -> Snapshot | None:
        raw = self.blob.read()
        if raw is None:
            return None
        data = json.loads(raw)
        if data.get("format") != SNAPSHOT_FORMAT:
            log.warning("%s: snapshot format %s is not ours: ignored", self.blob, data["format"])
            return None
        offsets = {
            (topic, int(p)): int(o)
            for topic, parts in data["offsets"].items()
            for p, o in parts.items()
        }
        return Snapshot(offsets, data["cep_batch"])

    def save(self, snapshot: Snapshot) -> None:
        offsets: dict[str, dict[int, int]] = {}
        for (topic, p), o in snapshot.offsets.items():
            offsets.setdefault(topic, {})[p] = o
        body = {"format": SNAPSHOT_FORMAT, "offsets": offsets, "cep_batch": snapshot.cep_batch}
        self.blob.write(json.dumps(body, separators=(",", ":")).encode())


@dataclass(frozen=True)
class Targets:
    """Where a round writes: the partitions' store, CEP's snapshots, the engine's file."""

    store: StateStore
    file: SnapshotFile
    cep: CepStage | None = None


@dataclass
class Round:
    """Step 1's capture: everything a round writes, taken in the loop thread."""

    mark: int
    partitions: list[PartitionState]
    #: The engine's own snapshot, written last; None: a partitions-only round (a revoke).
    snapshot: Snapshot | None = None
    #: CEP's engine state if it changed since the last capture.
    cep_state: EngineSnapshot | None = None

    @property
    def keys(self) -> set[Position]:
        return {(s.topic, s.partition) for s in self.partitions}

    def write(self, to: Targets, deliveries: Deliveries, ack_timeout_s: float) -> Outcome:
        """Steps 2-4 (any thread)."""
        # 2. Kafka has every closed candle the states count as sent.
        if not deliveries.wait(self.mark, ack_timeout_s):
            log.warning("live engine: closed candles not yet acknowledged by Kafka; no save yet")
            return Outcome(unsaved=self.keys)
        # 3. Each partition's state.
        outcome = Outcome()
        for state in self.partitions:
            key = (state.topic, state.partition)
            try:
                outcome.sizes[key] = to.store.save(state)
            except StateStoreError as exc:
                log.warning("live engine: state of %s:%d not saved: %s", *key, exc)
                outcome.unsaved.add(key)
        if outcome.unsaved or self.snapshot is None:
            return outcome
        # 4. CEP's engine state, then the offsets and batch id it belongs to: a trigger
        # set newer than a partition's state would take a replayed tick's fire for a new
        # one, one older only reads trigger records again.
        try:
            if self.cep_state is not None and to.cep is not None:
                to.cep.write(self.cep_state)
            to.file.save(self.snapshot)
        except OSError as exc:  # the S3 store away (checkpoint_dir on it): retried
            log.warning("live engine: CEP snapshot not saved: %s", exc)
            return outcome
        outcome.snapshot_saved = True
        return outcome


@dataclass
class Outcome:
    """What a round wrote: state sizes by partition, and whether the engine's snapshot
    (with CEP's state) was."""

    sizes: dict[Position, int] = field(default_factory=dict)
    #: Partitions not written (Kafka had not acknowledged, or the store refused).
    unsaved: set[Position] = field(default_factory=set)
    snapshot_saved: bool = False
    #: What broke the writer thread (a bug): the loop raises it.
    error: BaseException | None = None


class Writer:
    """The thread that runs rounds' steps 2-4, one round at a time."""

    def __init__(self, to: Targets, deliveries: Deliveries, ack_timeout_s: float) -> None:
        self._to = to
        self._deliveries = deliveries
        self._ack_timeout_s = ack_timeout_s
        self._rounds: queue.Queue[Round | None] = queue.Queue()
        self._outcomes: queue.Queue[tuple[Round, Outcome]] = queue.Queue()
        self._in_flight = 0  # loop thread only
        self._thread = threading.Thread(target=self._run, name="live-engine-saves", daemon=True)
        self._thread.start()

    @property
    def idle(self) -> bool:
        return self._in_flight == 0

    def submit(self, round_: Round) -> None:
        self._in_flight += 1
        self._rounds.put(round_)

    def done(self) -> list[tuple[Round, Outcome]]:
        """Step 5's input: the rounds finished since the last call."""
        out = []
        while True:
            try:
                out.append(self._outcomes.get_nowait())
            except queue.Empty:
                break
        self._in_flight -= len(out)
        return out

    def drain(self, serve: Callable[[], object]) -> list[tuple[Round, Outcome]]:
        """Wait for the round in flight (before a revoke's or a stop's own round),
        calling `serve` meanwhile: the producer's poll, which runs the acknowledgements
        the round may be waiting for (else it would wait out its timeout)."""
        out: list[tuple[Round, Outcome]] = []
        while len(out) < self._in_flight:
            try:
                out.append(self._outcomes.get(timeout=DRAIN_POLL_S))
            except queue.Empty:
                serve()
        self._in_flight = 0
        return out

    def close(self, serve: Callable[[], object]) -> list[tuple[Round, Outcome]]:
        out = self.drain(serve)
        self._rounds.put(None)
        self._thread.join()
        return out

    def _run(self) -> None:
        while (round_ := self._rounds.get()) is not None:
            try:
                outcome = round_.write(self._to, self._deliveries, self._ack_timeout_s)
            except BaseException as exc:  # a bug: handed to the loop, which stops on it
                outcome = Outcome(unsaved=round_.keys, error=exc)
            self._outcomes.put((round_, outcome))
