"""The CEP batch body and timer: engine + snapshots + outputs, no Kafka, no sockets.

    batch N (Arrow rows of cep.triggers + market.ticks, from the live engine's consumer)
      -> engine state before N (in memory if N-1 ran here, else the newest
         snapshot below N, else rebuilt from the compacted trigger topic)
      -> advance(now): expiries, idle candles
      -> records in Kafka-timestamp order: REGISTER / CANCEL / tombstone / tick
      -> notices -> CEPTriggerEvent on each trigger's topic (PUB)
      -> finished triggers -> tombstones (Kafka)
      -> snapshot N: with `snapshot_each_batch` (if anything changed), else when the
         caller saves its offsets (`capture`), so state and offsets agree

A timer calls `advance` between batches so expiries and idle candles
do not wait for the next record. The lock serialises it with the batches.
Events are at-least-once: a batch re-run after a crash publishes its events
again (same trigger_id and fire_count, so a client can drop the repeat).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

import pyarrow as pa
from google.protobuf.message import Message

from mdproto.messages import CEPTriggerRequest
from pipeline.cep.engine import Engine
from pipeline.cep.model import InvalidTrigger, Notice, spec_from_request
from pipeline.cep.records import CepBatch, TickRecord, TriggerRecord, decode_batch
from pipeline.cep.state import EngineSnapshot, SnapshotStore
from pipeline.records import log_rejects

log = logging.getLogger(__name__)

Publish = Callable[[Iterable[tuple[str, Message]]], int]
Retire = Callable[[list[str]], None]
Bootstrap = Callable[[], list[TriggerRecord]]
_T = TypeVar("_T")


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class BatchReport:
    batch_id: int
    triggers: int
    ticks: int
    rejects: int
    notices: int
    active: int
    snapshot_bytes: int
    elapsed_ms: float


class CepRunner:
    def __init__(
        self,
        *,
        store: SnapshotStore,
        trigger_topic: str,
        publish: Publish,
        retire: Retire,
        bootstrap: Bootstrap | None = None,
        new_engine: Callable[[], Engine] = Engine,
        clock: Callable[[], int] = wall_ms,
        summary_s: float = 10.0,
        snapshot_each_batch: bool = True,
    ) -> None:
        self._store = store
        self._topic = trigger_topic
        self._publish = publish
        self._retire = retire
        self._bootstrap = bootstrap
        self._new_engine = new_engine
        self._clock = clock
        self._lock = threading.Lock()
        self._engine: Engine | None = None
        self._last_batch: int | None = None
        #: The batch `with_engine` loaded the engine for, until that batch runs.
        self._loaded_for: int | None = None
        self._dirty = False
        self._each_batch = snapshot_each_batch
        self.published = 0
        #: Whether this process publishes a ticker's events (sharded live engines: the
        #: owner of its ticks partition, ADR 0014). Others' events are dropped here, and
        #: their expiries wait (`Engine.advance`).
        self.owns: Callable[[str], bool] = lambda _ticker: True
        self.last_report: BatchReport | None = None
        # Totals since start, logged every `summary_s` (bench/cep_pipeline.py reads them).
        self.totals = {"batches": 0, "ticks": 0, "events": 0, "runner_ms": 0.0}
        self._summary_s = summary_s
        self._next_summary = time.monotonic() + summary_s

    @property
    def engine(self) -> Engine | None:
        return self._engine

    def __call__(self, kafka: pa.Table, batch_id: int) -> BatchReport:
        """Process one batch of Kafka rows of both topics."""
        return self.run(decode_batch(kafka, self._topic, now_ms=self._clock()), batch_id)

    def run(self, batch: CepBatch, batch_id: int) -> BatchReport:
        """Process one batch of decoded, ordered inputs."""
        started = time.perf_counter()
        with self._lock:
            engine = self._engine_for(batch_id)
            now = self._clock()
            notices = engine.advance(now, self.owns)
            log_rejects(f"cep batch {batch_id}", batch.rejects)
            for record in batch.inputs:
                if isinstance(record, TickRecord):
                    t = record.tick
                    notices += engine.on_tick(
                        t.ticker, t.trade_id, t.timestamp_ms, t.price, t.amount, now
                    )
                else:
                    notices += self._apply(engine, record, now)
            self._emit(engine, notices)
            changed = self._dirty or bool(batch.inputs) or bool(notices)
            size = 0
            if changed and self._each_batch:
                size = self._store.save(batch_id, engine)
                changed = False
            self._dirty = changed
            self._last_batch, self._loaded_for = batch_id, None
        report = BatchReport(
            batch_id,
            batch.triggers,
            batch.ticks,
            len(batch.rejects),
            len(notices),
            len(engine),
            size,
            (time.perf_counter() - started) * 1000,
        )
        self.last_report = report
        self._account(report)
        if batch.triggers or notices:
            log.info(
                "cep batch %d: %d trigger record(s), %d tick(s), %d event(s), %d active, "
                "snapshot %d bytes, %.0f ms",
                batch_id,
                report.triggers,
                report.ticks,
                report.notices,
                report.active,
                size,
                report.elapsed_ms,
            )
        return report

    def _account(self, report: BatchReport) -> None:
        totals = self.totals
        totals["batches"] += 1
        totals["ticks"] += report.ticks
        totals["events"] += report.notices
        totals["runner_ms"] += report.elapsed_ms
        if time.monotonic() < self._next_summary:
            return
        self._next_summary = time.monotonic() + self._summary_s
        per_1k = totals["runner_ms"] / totals["ticks"] * 1000 if totals["ticks"] else 0.0
        log.info(
            "cep totals: %d batches, %d ticks, %d events, runner %.0f ms (%.1f ms per 1,000 "
            "ticks), %d active triggers",
            totals["batches"],
            totals["ticks"],
            totals["events"],
            totals["runner_ms"],
            per_1k,
            report.active,
        )

    def capture(self) -> tuple[int | None, EngineSnapshot | None]:
        """The batch id the state after the last batch belongs to (None: nothing ran
        yet) and, if it changed since the last capture, that state encoded for the
        caller to `SnapshotStore.write` with its offsets (else None). A capture whose
        write failed is given back with `unsaved`."""
        with self._lock:
            if self._engine is None or self._last_batch is None:
                return None, None
            if not self._dirty:
                return self._last_batch, None
            self._dirty = False
            return self._last_batch, self._store.encode(self._last_batch, self._engine)

    def unsaved(self) -> None:
        """A captured state was not written: the next capture encodes it again."""
        with self._lock:
            self._dirty = True

    def on_timer(self) -> int:
        """Expiries and idle candles between micro-batches; returns the events published."""
        with self._lock:
            engine = self._engine
            if engine is None:
                return 0
            notices = engine.advance(self._clock(), self.owns)
            if notices:
                self._emit(engine, notices)
                self._dirty = True
            return len(notices)

    def _last_batch_plus_one(self) -> int | None:
        return None if self._last_batch is None else self._last_batch + 1

    def with_engine(self, batch_id: int, work: Callable[[Engine], _T]) -> _T:
        """`work` on the engine batch `batch_id` would run on (loaded if need be), under
        the lock: per-ticker state saved or restored with a ticks partition."""
        with self._lock:
            return work(self._engine_for(batch_id))

    def _engine_for(self, batch_id: int) -> Engine:
        if self._engine is not None and batch_id in (self._last_batch_plus_one(), self._loaded_for):
            return self._engine
        self._loaded_for = batch_id
        loaded = self._store.load_before(batch_id)
        if loaded is not None:
            snapshot_id, engine = loaded
            log.info(
                "cep: resuming batch %d from snapshot %d (%d triggers)",
                batch_id,
                snapshot_id,
                len(engine),
            )
        else:
            engine = self._new_engine()
            if batch_id > 0 and self._bootstrap is not None:
                # Spark is past the trigger records but no state survived: re-read them.
                latest = {r.trigger_id: r for r in self._bootstrap()}  # compaction's view
                now = self._clock()
                notices = [
                    notice
                    for record in latest.values()
                    if record.request is not None
                    and record.request.action == CEPTriggerRequest.REGISTER
                    for notice in self._apply(engine, record, now)
                ]
                self._emit(engine, notices)
                log.warning(
                    "cep: no usable snapshot before batch %d; rebuilt %d trigger(s) from the "
                    "trigger topic (window state and fire counts start afresh)",
                    batch_id,
                    len(engine),
                )
        self._engine = engine
        return engine

    def _apply(self, engine: Engine, record: TriggerRecord, now: int) -> list[Notice]:
        request = record.request
        if request is None or request.action == CEPTriggerRequest.CANCEL:
            return engine.cancel(record.trigger_id, now)
        try:
            spec = spec_from_request(request, record.time_ms)
        except InvalidTrigger as exc:
            log.error("cep: trigger %s refused: %s", record.trigger_id, exc)
            return engine.cancel(record.trigger_id, now)  # an invalid update removes the old
        return engine.register(spec, now)

    def _emit(self, engine: Engine, notices: list[Notice]) -> None:
        others = {n.trigger_id for n in notices if not self.owns(n.ticker)}
        if others:  # another engine's ticker: it publishes (and tombstones) them
            notices = [n for n in notices if n.trigger_id not in others]
        if notices:
            self.published += self._publish((n.topic, n.to_message()) for n in notices)
            for notice in notices:
                log.debug(
                    "cep event %s %s on %s", notice.kind.name, notice.trigger_id, notice.topic
                )
        retired = [r for r in engine.drain_retired() if r not in others]
        if retired:
            self._retire(retired)
