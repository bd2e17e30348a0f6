"""The live engine: ``market.ticks`` (+ ``cep.triggers``) -> everything live, outside Spark.

One Kafka consumer thread decodes each record once and hands the PUB what it means
at once (why outside Spark: docs/adr/0002 and docs/pipeline-benchmarks.md "Lean
pipeline"):

    market.ticks --decode--> Tick (not repaired)       -> PUB {ticker}|tick (live only)
                             LiveCandles.add           -> PUB OHLC closed=false (previews)
                             LiveCandles.close_due     -> PUB OHLC closed=true / correction
                                                       -> Kafka market.ohlc.live (the
                                                          candles-store query MERGEs them)
    + cep.triggers   ------> CepStage (docs/cep.md)    -> PUB CEPTriggerEvent, tombstones
    + market.book    --decode--> BookSnapshot/BookDelta -> PUB {ticker}|book (live only)
    every live.book_snapshot_s: a BookSnapshot of each order book that changed
    every live.snapshot_s: take each changed ticks partition's state with its tickers'
    CEP state, and CEP's state; a writer thread stores them once Kafka has the closed
    candles (`live_state.StateStore`, S3 by default), then the CEP state and its batch
    id (<checkpoint_dir>/live-engine/snapshot.json): `live_saves`

Sharded (docs/adr/0014-sharded-live-engine.md). ``market.ticks`` and ``market.book``
are read through the consumer group ``live.group_id``: every engine process (the
pipeline's PUB process, and each ``python -m pipeline.engine``) owns a share of
their partitions, handed out by Kafka (range assignor). On a revoke the engine
flushes its producer and saves the revoked partitions' state (open candles of their
tickers, recent trade ids, next offset); the assignment that follows keeps what came
back, drops the rest, restores the other assigned partitions' state and seeks to
its offsets. ``cep.triggers`` is read whole
by every engine with its own consumer (no group); a trigger's events not caused by a
tick come only from the owner of its ticker's ticks partition (`_Run.owns`), and each
ticker's CEP state travels in its partition's state.

Durability. A partition's state is written only after every closed candle before it
was acknowledged by Kafka, and it holds the partition's next offset. Its next owner
(this engine after a restart or a kill -9, or another one) resumes from it: the
records after it are read again, so their candles close again with the same values
(published again: at-least-once, as CEP events are) and reach ``market.ohlc.live``
again (the MERGE is idempotent). Without a state, candles start at
``kafka.starting_offsets``, CEP evaluates ticks from ``cep.ticks_starting_offsets``
and reads every trigger record. A closed candle Kafka refused ends the thread (so
its process: the supervisor restarts it) rather than leaving a hole in ``ohlc``.

Ticks are live, not durable: only those written after the partition was assigned
are published (a backlog read from the state counts in candles only); a trade
delivered twice is published once if its first copy is among its partition's last
100,000 (the newest 10,000 travel with the state). Order books likewise:
``market.book`` is read from its end at every assignment and never saved; the
outlet keeps each book (``live_books.py``) and forgets those of revoked partitions.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from google.protobuf.message import Message

from mdproto import ProtocolError, envelope, partitioning, topics
from mdproto.messages import BookDelta, BookSnapshot, Tick
from mdproto.recent import RecentKeys
from mdproto.runtime.kafka import assigned_consumer_config, consume_ready
from pipeline import records
from pipeline.candle_close import Closing, TickerCandles
from pipeline.cep.records import Coordinates
from pipeline.config import Settings
from pipeline.corrections import CorrectionsReader, owned
from pipeline.gc_pacing import GcPacing
from pipeline.live_books import BookRecord
from pipeline.live_candles import LiveCandles
from pipeline.live_metrics import EngineMetrics
from pipeline.live_saves import (
    Deliveries,
    Outcome,
    Position,
    Round,
    Snapshot,
    SnapshotFile,
    Targets,
    Writer,
)
from pipeline.live_state import RECENT_SAVED, PartitionState, StateStore

if TYPE_CHECKING:
    from pipeline.cep.stage import CepStage

log = logging.getLogger(__name__)
SendMany = Callable[[Iterable[tuple[str, Message]]], int]
STATS_INTERVAL_S = 10.0
STALL_S = 0.25
#: Longest wait for a record: the idle-close and CEP timers' resolution.
POLL_S = 0.05
PARTITIONS_WITHIN_S = 30.0  # a new topic's partitions reach the metadata within this
#: Trade ids remembered per ticks partition (redeliveries dropped).
RECENT_CAPACITY = 100_000
#: How long a revoke waits for Kafka to acknowledge the closed candles before it saves.
REVOKE_FLUSH_S = 30.0
#: How long a save round waits for them (a round not acknowledged is retried later).
SAVE_ACK_S = 2.0


class EngineOutlet(Protocol):
    """Where order-book records go, and who forgets the last values of tickers that
    moved to another engine: the PUB's outlet."""

    def send_books(self, records: Iterable[BookRecord]) -> int: ...

    def send_book_snapshots(self) -> int: ...

    def forget(self, tickers: Collection[str]) -> None: ...


def group_consumer_config(s: Settings) -> dict[str, Any]:
    """The engines' group consumer: offsets are the state's, never committed."""
    return {
        "bootstrap.servers": s.kafka.bootstrap_servers,
        "group.id": s.live_group_id,
        # range: each topic's partitions spread evenly, and partition i of market.ticks
        # and of market.book (both keyed by ticker) on the same engine. The sticky
        # assignors balance the total count: one engine got every ticks partition, the
        # other every book partition. range is eager: a rebalance revokes everything,
        # and `on_assign` keeps what came back (no reload, no forgotten book).
        "partition.assignment.strategy": "range",
        "session.timeout.ms": round(s.live.session_timeout_s * 1000),
        "heartbeat.interval.ms": max(100, round(s.live.session_timeout_s * 1000 / 3)),
        "enable.auto.commit": False,
        # librdkafka's fetch wait (500 ms): a waiting fetch is answered the moment a
        # record arrives; a shorter one adds only idle requests (ADR 0011).
    }


class LiveEngine:
    """The consumer thread. `start`, then `wait_assigned` before producers are told the
    pipeline is ready (ticks written earlier are not published)."""

    def __init__(
        self, settings: Settings, send_many: SendMany, books: EngineOutlet | None = None
    ) -> None:
        self._settings = settings
        self._send_many = send_many
        self._books = books
        self._stop = threading.Event()
        self._assigned = threading.Event()
        self._thread = threading.Thread(target=self._run, name="live-engine", daemon=True)
        self.error: BaseException | None = None
        #: Its Prometheus series (`live_metrics`), updated by the thread once per batch.
        self.metrics = EngineMetrics.for_settings(settings)

    def start(self) -> None:
        self._thread.start()

    def wait_assigned(self, timeout_s: float = 60.0) -> None:
        """Returns once the group gave this engine its first assignment (all partitions
        when it is the only engine); raises at once with the engine's own error if it
        failed first, not after the timeout with a guess."""
        deadline = time.monotonic() + timeout_s
        while not self._assigned.wait(0.1):
            if self.error is not None:
                raise RuntimeError(f"live engine failed at start: {self.error}") from self.error
            if time.monotonic() >= deadline:
                group = self._settings.live_group_id
                raise RuntimeError(
                    f"live engine got no assignment in group {group} in {timeout_s} s"
                )

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    # -- the thread ------------------------------------------------------------------

    def _run(self) -> None:
        from confluent_kafka import Consumer, Producer

        s = self._settings
        consumer = Consumer(group_consumer_config(s) | self.metrics.consumer_config())
        triggers = None
        if s.cep.enabled:
            triggers = Consumer(
                assigned_consumer_config(s.kafka.bootstrap_servers, "pipeline-cep-triggers")
            )
        producer = Producer(
            {
                "bootstrap.servers": s.kafka.bootstrap_servers,
                "enable.idempotence": True,  # acks=all, no duplicates or reordering by retries
                "linger.ms": 5,
                "message.timeout.ms": 300_000,  # a Kafka restart is bridged, not an error
            }
        )
        cep: CepStage | None = None
        corrections: CorrectionsReader | None = None
        try:
            if s.live.enabled:
                corrections = CorrectionsReader.open(s, _partitions)
            file = SnapshotFile.for_settings(s)
            snapshot = file.load() or Snapshot()
            if s.cep.enabled:
                from pipeline.cep.stage import CepStage

                next_batch = 0 if snapshot.cep_batch is None else snapshot.cep_batch + 1
                cep = CepStage(s, self._send_many, next_batch=next_batch)
            books = self._books if s.live.enabled else None
            store = StateStore.for_settings(s)
            run = _Run(s, consumer, producer, store, file, snapshot, cep, self._send_many, books)
            run.triggers = triggers
            run.corrections = corrections
            run.on_assigned = self._assigned.set
            run.metrics = self.metrics
            run.start()
            run.loop(self._stop)
            run.save()  # a clean stop reads nothing again
            run.close()
        except BaseException as exc:
            self.error = exc
            log.exception("live engine failed")
        finally:
            producer.flush(10)
            consumer.close()  # leaves the group: a revoke (saved if Kafka has every candle)
            if triggers is not None:
                triggers.close()
            if corrections is not None:
                corrections.close()
            if cep is not None:
                cep.close()


def _partitions(consumer: Any, topic: str, timeout_s: float = PARTITIONS_WITHIN_S) -> list[int]:
    """The topic's partitions, once the broker's metadata names them: a topic created
    a moment ago (CEP's, by this very start) can be listed with none yet."""
    deadline = time.monotonic() + timeout_s
    while True:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is not None and meta.error is None and meta.partitions:
            return sorted(meta.partitions)
        if time.monotonic() >= deadline:
            error = meta.error if meta is not None else "not listed"
            raise RuntimeError(f"topic {topic} has no partitions after {timeout_s:g} s: {error}")
        time.sleep(0.2)  # the broker's metadata, polled


class _Run:
    """One run of the engine's thread: its consumers, producer, owned partitions and state.

    ``positions`` holds the next offset of every owned partition (ticks and book): a
    record of a partition not in it was revoked during the poll that returned it.
    """

    def __init__(
        self,
        s: Settings,
        consumer: Any,
        producer: Any,
        store: StateStore,
        file: SnapshotFile,
        snapshot: Snapshot,
        cep: CepStage | None,
        send_many: SendMany,
        books: EngineOutlet | None = None,
    ) -> None:
        self.consumer = consumer
        self.producer = producer
        self.store = store
        self.snapshot = snapshot
        self.cep = cep
        self.send_many = send_many
        self.books = books
        #: The ``cep.triggers`` consumer (no group), set by the caller when CEP is on.
        self.triggers: Any = None
        #: The driver's candle corrections (`corrections`), set by the caller when live.
        self.corrections: CorrectionsReader | None = None
        self.on_assigned: Callable[[], None] | None = None
        self.metrics = EngineMetrics.for_settings(s)
        self.book_topic = s.kafka.topic_book
        self.book_snapshot_s = s.live.book_snapshot_s
        self.snapshot_s = s.live.snapshot_s
        self.gather_s = s.live.gather_s
        self.gc_full_s = s.live.gc_full_s
        self.ticks_topic = s.kafka.topic_ticks
        self.candle_topic = s.kafka.topic_live_candles
        self.trigger_topic = s.kafka.topic_cep_triggers
        self.tick_start = (
            s.kafka.starting_offsets if s.live.enabled else s.cep.ticks_starting_offsets
        )
        self.group_id = s.live_group_id
        #: Closed candles sent and not yet acknowledged; the saves' writer (started by
        #: the first periodic save).
        self.deliveries = Deliveries()
        self.targets = Targets(store, file, cep)
        self.writer: Writer | None = None
        cfg = Closing(tuple(s.live.periods), s.live.watermark_s, s.live.close_idle_s)
        previews_ms = round(s.live.preview_interval_s * 1000)
        self.candles = LiveCandles(cfg, preview_every_ms=previews_ms) if s.live.enabled else None
        self.positions: dict[Position, int] = {}
        self.trigger_positions: dict[Position, int] = {}
        #: Each owned ticks partition's end when it was assigned: ticks are live from there.
        self.live_from: dict[Position, int] = {}
        self.recent: dict[int, RecentKeys[tuple[str, str]]] = {}
        #: The tickers seen in each owned partition (ticks or book), and the reverse
        #: (ticks partitions; book partitions).
        self.tickers: dict[Position, set[str]] = {}
        self.partition_of: dict[str, Position] = {}
        self.book_of: dict[str, Position] = {}
        #: Revoked in this rebalance, state saved: kept if the assignment gives them back.
        self.revoked: set[Position] = set()
        #: Ticks partitions whose state changed since it was last saved.
        self.dirty: set[Position] = set()
        # CEP evaluates ticks from where a partition resumes (its saved state), or (new CEP
        # state, no saved partition) from its end with cep.ticks_starting_offsets "latest":
        # old ticks never meet triggers.
        self.fresh_cep = snapshot.cep_batch is None and s.cep.ticks_starting_offsets == "latest"
        self.cep_from: dict[Position, int] = {}
        self.caught_up = True
        #: Between a revoke (or the start) and the assignment that follows: no engine
        #: owns a ticker then, so trigger records wait and expiries are kept.
        self.rebalancing = True
        #: How many partitions ``market.ticks`` has (the ownership rule's modulus):
        #: listed at the start, and again after each assignment, outside the poll.
        self.tick_partitions = 0
        self.recount = False
        #: When the state and the books' snapshots were last saved / sent; whether CEP
        #: state changed since its last save.
        self.saved_at = self.book_snapshot_at = time.monotonic()
        self.cep_dirty = False
        if cep is not None:
            cep.set_owner(self.owns)

    def owns(self, ticker: str) -> bool:
        """Whether this engine publishes the ticker's CEP events not caused by a tick
        (ARMED, CANCELLED, EXPIRED): it owns the ``market.ticks`` partition the ticker's
        key goes to (`mdproto.partitioning`), so exactly one engine does."""
        if self.rebalancing or not self.tick_partitions:
            return False
        partition = partitioning.partition_of(ticker, self.tick_partitions)
        return (self.ticks_topic, partition) in self.positions

    def start(self) -> None:
        """Read the triggers whole, join the group (assignments arrive in the poll)."""
        if self.triggers is not None:
            self._assign_triggers()
        self.tick_partitions = len(_partitions(self.consumer, self.ticks_topic))
        subscribed = [self.ticks_topic] + ([self.book_topic] if self.books is not None else [])
        self.consumer.subscribe(
            subscribed, on_assign=self.on_assign, on_revoke=self.on_revoke, on_lost=self.on_lost
        )
        log.info("live engine: joining group %s on %s", self.group_id, subscribed)

    def _assign_triggers(self) -> None:
        """Every ``cep.triggers`` partition at the snapshot's offset, else the earliest."""
        from confluent_kafka import TopicPartition

        assignment = []
        for p in _partitions(self.triggers, self.trigger_topic):
            low, _high = _watermarks(self.triggers, TopicPartition(self.trigger_topic, p))
            saved = self.snapshot.offsets.get((self.trigger_topic, p))
            position = low if saved is None else max(saved, low)
            self.trigger_positions[(self.trigger_topic, p)] = position
            assignment.append(TopicPartition(self.trigger_topic, p, position))
        self.triggers.assign(assignment)

    # -- rebalance callbacks (run inside the poll: poll() or consume()) -------------
    # They never call the group consumer's list_topics(): confluent-kafka's blocking
    # calls on a handle end its per-thread call state, and the next callback of the
    # same poll then aborts the process (CallState_get: Assertion `cs != NULL').

    def on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        """Keep each partition this engine had before the rebalance (its state is still
        here: read on from its position); restore every other ticks partition's state
        and seek to its offset, book partitions from their end (books are live only);
        drop what was revoked and did not come back."""
        started, restored = self.metrics.monotonic(), 0
        kept = self.revoked & {(tp.topic, tp.partition) for tp in partitions}
        self._drop(sorted(self.revoked - kept))
        self.revoked = set()
        self.recount = True  # the topic may have grown: listed once the poll returns
        cep_states: dict[int, dict[str, Any]] = {}  # newly assigned ticks partitions
        for tp in partitions:
            key = (tp.topic, tp.partition)
            if key in kept:
                tp.offset = self.positions[key]
                continue
            low, high = _watermarks(consumer, tp)
            self.tickers[key] = set()
            if tp.topic == self.book_topic:
                position = high
            else:
                state = self.store.load(tp.topic, tp.partition)
                restored += state is not None
                position = self._restore(key, state, low, high)
                cep_states[tp.partition] = state.cep if state is not None else {}
            self.positions[key] = tp.offset = position
        consumer.assign(partitions)
        self.rebalancing = False
        if self.cep is not None and cep_states:
            self._restore_cep(cep_states)
        self.metrics.owned(self.positions)
        self.metrics.restored(started, restored)
        self.caught_up = self._caught_up()
        behind = sum(self.live_from[k] - self.positions[k] for k in self.live_from)
        log.info(
            "live engine: assigned %s (%d restored from %s), %d tick records to catch up",
            sorted(f"{tp.topic}:{tp.partition}@{tp.offset}" for tp in partitions),
            restored,
            self.store.root,
            behind,
        )
        if self.on_assigned is not None:
            self.on_assigned()

    def _restore(self, key: Position, state: PartitionState | None, low: int, high: int) -> int:
        """A ticks partition's state into the engine; returns where to read it from."""
        recent = RecentKeys[tuple[str, str]](RECENT_CAPACITY)
        if state is None:
            position = low if self.tick_start == "earliest" else high
        else:
            position = max(state.offset, low)  # retention may have removed the rest
            for k in state.recent:
                recent.first_time(k)
            if self.candles is not None:
                for ticker, d in state.candles.items():
                    self.candles.put(ticker, TickerCandles.from_dict(d, self.candles.cfg))
                    self._owns(key, ticker)
        self.recent[key[1]] = recent
        self.live_from[key] = high
        # A saved partition carries its tickers' CEP state: evaluated from its offset, even
        # by an engine whose own CEP state is new (a trade written meanwhile meets triggers).
        self.cep_from[key] = high if self.fresh_cep and state is None else position
        return position

    def _restore_cep(self, states: dict[int, dict[str, Any]]) -> None:
        """CEP's state of the tickers of newly assigned ticks partitions: what this
        engine had of them is forgotten, what their partitions' states hold restored."""
        assert self.cep is not None
        n = self.tick_partitions

        def moved(ticker: str) -> bool:
            return partitioning.partition_of(ticker, n) in states

        self.cep.restore_tickers(moved, {t: d for c in states.values() for t, d in c.items()})
        for p, tickers in states.items():
            for ticker in tickers:
                self._owns((self.ticks_topic, p), ticker)

    def _owns(self, key: Position, ticker: str) -> None:
        self.tickers[key].add(ticker)
        if key[0] == self.book_topic:
            self.book_of[ticker] = key
            return
        self.partition_of[ticker] = key
        n = self.tick_partitions
        if n and partitioning.partition_of(ticker, n) != key[1]:
            log.warning(
                "live engine: %s in %s:%d, the ownership rule says %d: CEP events not "
                "caused by its ticks may come from another engine (mdproto.partitioning)",
                ticker,
                *key,
                partitioning.partition_of(ticker, n),
            )

    def on_revoke(self, _consumer: Any, partitions: list[Any]) -> None:
        """Save the revoked ticks partitions' state once Kafka has every closed candle
        (else the next owner reads again from the last save). The state stays until the
        assignment that follows: what comes back is kept, the rest dropped there."""
        keys = [(tp.topic, tp.partition) for tp in partitions]
        self.rebalancing = True
        self.revoked |= {k for k in keys if k in self.positions}
        ticks = [k for k in keys if k[0] == self.ticks_topic and k in self.positions]
        if ticks and self._save_now(ticks, whole=False, flush_s=REVOKE_FLUSH_S).unsaved:
            log.warning(
                "live engine: %s revoked and not all saved: the next owner reads again "
                "from the last save",
                ticks,
            )
        log.info("live engine: revoked %s", sorted(f"{t}:{p}" for t, p in keys))

    def on_lost(self, _consumer: Any, partitions: list[Any]) -> None:
        """Lost (this engine was too slow for the session): another engine owns them
        already, from their last save; nothing saved."""
        keys = [(tp.topic, tp.partition) for tp in partitions]
        self.rebalancing = True
        self._drain()  # a round in flight ends before the new owner's first save
        self.revoked -= set(keys)
        self._drop(keys)
        self.metrics.owned(self.positions)
        log.warning("live engine: lost %s", sorted(f"{t}:{p}" for t, p in keys))

    def _drop(self, keys: list[Position]) -> None:
        gone: set[str] = set()
        for key in keys:
            tickers = self.tickers.pop(key, set())
            gone |= tickers
            self.positions.pop(key, None)
            self.dirty.discard(key)
            if key[0] != self.ticks_topic:
                for ticker in tickers:
                    self.book_of.pop(ticker, None)
                continue
            self.live_from.pop(key, None)
            self.cep_from.pop(key, None)
            self.recent.pop(key[1], None)
            for ticker in tickers:
                self.partition_of.pop(ticker, None)
                if self.candles is not None:
                    self.candles.drop(ticker)
        if self.books is not None and gone:
            self.books.forget(gone)
        self.caught_up = self._caught_up()

    def _caught_up(self) -> bool:
        return all(self.positions.get(k, 0) >= end for k, end in self.live_from.items())

    # -- the loop --------------------------------------------------------------------

    def loop(self, stop: threading.Event) -> None:
        stats = _Stats()
        pacing = GcPacing(self.gc_full_s)
        pacing.start()
        try:
            while not stop.is_set():
                self._step(stats)
                pacing.batch_done()  # the batch's objects are unreachable by now
        finally:
            pacing.stop()

    def _step(self, stats: _Stats) -> None:
        """One batch (`consume_ready`): publish what it means, save the state when due."""
        if self.deliveries.error is not None:
            raise RuntimeError(f"Kafka refused a closed candle: {self.deliveries.error}")
        if self.writer is not None:
            for round_, outcome in self.writer.done():
                self._collect(round_, outcome)
        candles = self.candles
        due = candles.next_due_ms(_now_ms()) if candles is not None and self.caught_up else None
        wait = POLL_S if due is None else min(POLL_S, max(due, 1) / 1000)
        asked = time.monotonic()
        got = consume_ready(self.consumer, 10_000, wait, min(self.gather_s, wait))
        messages = [m for m in got if self._ok(m)]
        if self.recount:
            self.tick_partitions = len(_partitions(self.consumer, self.ticks_topic))
            self.recount = False
        triggers = self._trigger_records()
        self._publish_corrections()
        stats.waited(time.monotonic() - asked)
        consumed = len(messages)
        if self.books is not None:
            messages = self._books(messages)
            if time.monotonic() - self.book_snapshot_at >= self.book_snapshot_s:
                self.books.send_book_snapshots()
                self.book_snapshot_at = time.monotonic()
        now_ms = _now_ms()
        if not self.caught_up and self._caught_up():
            self.caught_up = True
            log.info("live engine: caught up; candles close on idle time from now")
        ticks = live_only(self._decode(messages))
        fresh: list[Tick] = []
        if candles is not None:
            fresh, _closed = self._candles(candles, ticks, now_ms)
        if self.cep is not None:
            if candles is None:  # else `_candles` learnt whose tickers they are
                for t, (_, p, _) in ticks:
                    if t.ticker not in self.partition_of:
                        self._owns((self.ticks_topic, p), t.ticker)
            self.cep.feed(triggers, [t for t in ticks if self._for_cep(t[1])])
        self.producer.poll(0)
        stats.busy(time.monotonic() - asked, len(messages), fresh)
        live_ms = ticks[0][1][0] if fresh and self.caught_up else None
        self.metrics.batch(len(messages), consumed - len(messages), live_ms)
        self.cep_dirty = self.cep_dirty or bool(triggers or ticks)
        due = time.monotonic() - self.saved_at >= self.snapshot_s
        if due and (self.dirty or self.cep_dirty) and (self.writer is None or self.writer.idle):
            if self.writer is None:
                self.writer = Writer(self.targets, self.deliveries, SAVE_ACK_S)
            self.writer.submit(self._capture(sorted(self.dirty), whole=True))
            self.saved_at = time.monotonic()  # what fails is dirty again, retried a period later

    def _ok(self, m: Any) -> bool:
        if m.error() is not None:
            log.warning("live engine: %s", m.error())
            return False
        key = (m.topic(), m.partition() or 0)
        if key not in self.positions or key in self.revoked:
            return False  # revoked during the poll that returned it
        self.positions[key] = (m.offset() or 0) + 1
        if key[0] == self.ticks_topic:
            self.dirty.add(key)
        return True

    def _trigger_records(self) -> list[Any]:
        """The ``cep.triggers`` records waiting (never waits: triggers are rare); none
        while no engine owns a ticker (`rebalancing`): they wait for the owner."""
        if self.triggers is None or self.rebalancing:
            return []
        out = []
        for m in self.triggers.consume(1000, timeout=0):
            if m.error() is not None:
                log.warning("live engine: %s", m.error())
                continue
            self.trigger_positions[(m.topic(), m.partition() or 0)] = (m.offset() or 0) + 1
            out.append(m)
        return out

    def _publish_corrections(self) -> None:
        """The driver's corrections of this engine's tickers, published in its epoch; none
        taken while no engine owns a ticker (`rebalancing`): they wait for the owner."""
        if self.corrections is None or self.rebalancing:
            return
        out = owned(self.corrections.take(), self.owns)
        if out:
            self.send_many(out)

    def _books(self, messages: list[Any]) -> list[Any]:
        """Publish the ``market.book`` records among `messages`; returns the others."""
        assert self.books is not None
        book = [m for m in messages if m.topic() == self.book_topic]
        if not book:
            return messages
        decoded = decode_book_records([m.value() for m in book])
        for m in book:
            key = m.key()
            if key is not None:
                ticker = key.decode(errors="replace")
                if ticker not in self.book_of:
                    self._owns((m.topic(), m.partition() or 0), ticker)
        self.books.send_books(decoded)
        return [m for m in messages if m.topic() != self.book_topic]

    def _for_cep(self, where: Coordinates) -> bool:
        """A tick from where CEP's state starts?"""
        _, partition, offset = where
        return offset >= self.cep_from.get((self.ticks_topic, partition), 0)

    def _candles(
        self, candles: LiveCandles, ticks: list[tuple[Tick, Coordinates]], now_ms: int
    ) -> tuple[list[Tick], list[Any]]:
        """Publish the live ticks, the previews and the closed candles; closed candles to
        Kafka. Returns (published ticks, closed candles)."""
        live_from, topic, partition_of, recent = (
            self.live_from, self.ticks_topic, self.partition_of, self.recent
        )  # fmt: skip
        fresh = []
        out: list[tuple[str, Message]] = []
        for t, (_, p, o) in ticks:
            ticker = t.ticker
            if ticker not in partition_of:
                self._owns((topic, p), ticker)
            if o >= live_from.get((topic, p), 0) and recent[p].first_time((ticker, t.trade_id)):
                fresh.append(t)
                out.append((topics.tick_topic(ticker), t))
        previews = candles.add((t for t, _ in ticks), now_ms)
        if self.caught_up:
            out += [(topics.ohlc_topic(c.ticker, c.period_seconds), c) for c in previews]
        closed = candles.close_due(now_ms, idle=self.caught_up)
        out += [(topics.ohlc_topic(c.ticker, c.period_seconds), c) for c in closed]
        if out:
            self.send_many(out)
        for c in closed:
            owner = self.partition_of.get(c.ticker)
            if owner is not None:
                self.dirty.add(owner)  # its open windows changed without a new offset
            self.producer.produce(
                self.candle_topic,
                envelope.encode_record(c),
                key=c.ticker.encode(),
                on_delivery=self.deliveries.sent(),
            )
        return fresh, closed

    def _decode(self, messages: list[Any]) -> list[tuple[Tick, Coordinates]]:
        """The valid ticks of the messages, each with its (Kafka time, partition, offset)."""
        partitions = [m.partition() or 0 for m in messages]
        offsets = [m.offset() or 0 for m in messages]
        times = [m.timestamp()[1] for m in messages]
        decoded = records.decode_tick_values([m.value() for m in messages], partitions, offsets)
        if decoded.rejects:
            records.log_rejects("live engine", decoded.rejects)
            time_at = dict(zip(zip(partitions, offsets, strict=True), times, strict=True))
            times = [time_at[c] for c in decoded.coordinates]
        return [
            (t, (kafka_time, p, o))
            for t, (p, o), kafka_time in zip(decoded.ticks, decoded.coordinates, times, strict=True)
        ]

    def _flushed(self, timeout_s: float) -> bool:
        """Whether Kafka acknowledged every closed candle so far (their callbacks run here)."""
        pending = self.producer.flush(timeout_s)
        if pending or self.deliveries.error is not None:
            log.warning("live engine: %d closed candles not yet in Kafka; no save yet", pending)
            return False
        return True

    # -- saves (live_saves: captured here, written by its thread) ----------------------

    def _capture(self, keys: list[Position], *, whole: bool) -> Round:
        """Step 1: the `keys` partitions' states and, for a `whole` round (not a revoke's),
        CEP's state and the engine's snapshot; the partitions are clean until step 5
        says otherwise."""
        candles = self.candles.tickers if self.candles is not None else {}
        states = []
        for key in keys:
            tickers = self.tickers.get(key, set())
            recent = self.recent.get(key[1])
            states.append(
                PartitionState(
                    key[0],
                    key[1],
                    self.positions[key],
                    {t: candles[t].to_dict() for t in tickers if t in candles},
                    recent.newest(RECENT_SAVED) if recent is not None else [],
                    self.cep.ticker_states(tickers) if self.cep is not None else {},
                )
            )
        self.dirty -= set(keys)
        round_ = Round(self.deliveries.mark, states)
        if whole:
            cep_batch, round_.cep_state = self.cep.capture() if self.cep else (None, None)
            round_.snapshot = Snapshot(dict(self.trigger_positions), cep_batch)
            self.cep_dirty = False
        return round_

    def _collect(self, round_: Round, outcome: Outcome) -> None:
        """Step 5: what was not written is dirty again (if still owned)."""
        if outcome.error is not None:
            raise RuntimeError(f"the live engine's state writer failed: {outcome.error}")
        for (_, partition), size in outcome.sizes.items():
            self.metrics.state_saved(partition, size)
        self.dirty |= {k for k in outcome.unsaved if k in self.positions}
        if round_.snapshot is not None and not outcome.snapshot_saved:
            self.cep_dirty = True
            if round_.cep_state is not None and self.cep is not None:
                self.cep.unsaved()

    def _serve(self) -> None:
        self.producer.poll(0)

    def _drain(self) -> None:
        if self.writer is not None:
            for round_, outcome in self.writer.drain(self._serve):
                self._collect(round_, outcome)

    def _save_now(self, keys: list[Position], *, whole: bool, flush_s: float) -> Outcome:
        """A round written in the loop thread (a revoke, a stop), after the one in flight."""
        self._drain()
        if not self._flushed(flush_s):
            return Outcome(unsaved=set(keys))
        round_ = self._capture(keys, whole=whole)
        outcome = round_.write(self.targets, self.deliveries, 0.0)
        self._collect(round_, outcome)
        return outcome

    def save(self) -> bool:
        """Every changed partition and then the engine's snapshot, now (a clean stop);
        False: Kafka has not every closed candle yet, or the store refused a part."""
        self._drain()  # first: a round in flight that failed makes its partitions dirty again
        outcome = self._save_now(sorted(self.dirty), whole=True, flush_s=SAVE_ACK_S)
        return not self.dirty and outcome.snapshot_saved

    def close(self) -> None:
        """Wait for the round in flight and end the writer thread."""
        if self.writer is not None:
            for round_, outcome in self.writer.close(self._serve):
                self._collect(round_, outcome)
            self.writer = None


class _Stats:
    """Stalls logged at once; a summary every STATS_INTERVAL_S."""

    def __init__(self) -> None:
        self.start, self.count, self.worst_age_ms = time.monotonic(), 0, 0.0

    def waited(self, seconds: float) -> None:
        if seconds > STALL_S:
            log.warning("live engine: consume() took %.0f ms", seconds * 1000)

    def busy(self, seconds: float, records_: int, fresh: list[Tick]) -> None:
        if seconds > STALL_S and records_:
            log.warning("live engine: %d records took %.0f ms", records_, seconds * 1000)
        self.count += len(fresh)
        if fresh and fresh[0].ingested_at_ms:
            self.worst_age_ms = max(self.worst_age_ms, _now_ms() - fresh[0].ingested_at_ms)
        if time.monotonic() - self.start >= STATS_INTERVAL_S:
            if self.count:
                log.info(
                    "live engine: %d ticks published in the last %.0f s, oldest at "
                    "publication %.0f ms after ingestion",
                    self.count,
                    time.monotonic() - self.start,
                    self.worst_age_ms,
                )
            self.start, self.count, self.worst_age_ms = time.monotonic(), 0, 0.0


def live_only(ticks: list[tuple[Tick, Coordinates]]) -> list[tuple[Tick, Coordinates]]:
    """The trades the feed delivered live. A repaired one (``Tick.repaired``: fetched over
    REST to fill a recorded market's gap, minutes late by design) is no live trade: not
    published, not counted in candles (no preview, no correction, no incomplete mark) and
    not checked against triggers. ticks-persist stores it; the gap's candles are rebuilt
    from ``ticks`` (gap_rebuilds.py)."""
    return [t for t in ticks if not t[0].repaired]


def decode_book_records(values: Iterable[bytes | None]) -> list[BookRecord]:
    """The BookSnapshot and BookDelta records among Kafka values; others logged, dropped."""
    out: list[BookRecord] = []
    for value in values:
        try:
            record = envelope.decode_record(value or b"")
        except ProtocolError as exc:
            log.error("live engine: dropped a book record: %s", exc)
            continue
        if not isinstance(record, BookSnapshot | BookDelta) or not record.ticker:
            log.error("live engine: dropped a %s (no book, or no ticker)", record.DESCRIPTOR.name)
            continue
        out.append(record)
    return out


def _watermarks(consumer: Any, partition: Any, timeout_s: float = 60.0) -> tuple[int, int]:
    """(low, high) offsets of a partition; retried while its leader is being elected
    (a topic preflight has just created answers NOT_LEADER_FOR_PARTITION for a moment)."""
    from confluent_kafka import KafkaError, KafkaException

    electing = {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
    }
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            low, high = consumer.get_watermark_offsets(partition, timeout=10)
            return int(low), int(high)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            retriable = error is not None and (error.code() in electing or error.retriable())
            if not retriable or time.monotonic() > deadline:
                raise
            log.info(
                "live engine: %s [%d] not ready yet: %s",
                partition.topic,
                partition.partition,
                error,
            )
            time.sleep(0.2)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
