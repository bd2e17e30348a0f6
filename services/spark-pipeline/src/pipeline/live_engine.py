"""The live engine: ``market.ticks`` (+ ``cep.triggers``) -> everything live, outside Spark.

One Kafka consumer thread in the PUB server process decodes each record once and
hands the PUB what it means at once (why outside Spark: docs/adr/0002 and
docs/pipeline-benchmarks.md "Lean pipeline"):

    market.ticks --decode--> Tick (not repaired)       -> PUB {ticker}|tick (live only)
                             LiveCandles.add           -> PUB OHLC closed=false (previews)
                             LiveCandles.close_due     -> PUB OHLC closed=true / correction
                                                       -> Kafka market.ohlc.live (the
                                                          candles-store query MERGEs them)
    + cep.triggers   ------> CepStage (docs/cep.md)    -> PUB CEPTriggerEvent, tombstones
    + market.book    --decode--> BookSnapshot/BookDelta -> PUB {ticker}|book (live only)
    every live.book_snapshot_s: a BookSnapshot of each order book that changed
    every live.snapshot_s: flush the producer, save the CEP state, then the snapshot
    (offsets + open candles + CEP batch id) to <checkpoint_dir>/live-engine/snapshot.json
    (its format and why: docs/adr/0012-live-engine-snapshot.md)

Durability. The snapshot is written only after every closed candle before it was
acknowledged by Kafka, and it holds the next offset of every partition. A restart
(or a kill -9) resumes from it: the records after it are read again, so their
candles close again with the same values (published again: at-least-once, as
CEP events are) and reach ``market.ohlc.live`` again (the MERGE is idempotent).
Without a snapshot, candles start at ``kafka.starting_offsets``, CEP evaluates
ticks from ``cep.ticks_starting_offsets`` and reads every trigger record. A closed
candle Kafka refused ends the thread (so the PUB process, so the pipeline: the
supervisor restarts it from the snapshot) rather than leaving a hole in ``ohlc``.

Ticks are live, not durable: only those written after the engine started are
published (a backlog read from the snapshot counts in candles only); a trade
delivered twice is published once if its first copy is among the last 200,000.
Order books likewise: ``market.book`` is read from its end at every start and never
saved in the snapshot; the outlet keeps each book (``live_books.py``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from google.protobuf.message import Message

from mdproto import ProtocolError, envelope, topics
from mdproto.messages import BookDelta, BookSnapshot, Tick
from mdproto.recent import RecentKeys
from pipeline import records
from pipeline.candle_close import Closing
from pipeline.cep.records import Coordinates
from pipeline.cep.state import local_path, replace_file
from pipeline.config import Settings
from pipeline.live_books import BookRecord
from pipeline.live_candles import LiveCandles

if TYPE_CHECKING:
    from pipeline.cep.stage import CepStage

log = logging.getLogger(__name__)
SendMany = Callable[[Iterable[tuple[str, Message]]], int]
Position = tuple[str, int]  # (topic, partition)
STATS_INTERVAL_S = 10.0
STALL_S = 0.25
SNAPSHOT_FORMAT = 2
#: Longest wait in consume(): the idle-close and CEP timers' resolution.
POLL_S = 0.05
PARTITIONS_WITHIN_S = 30.0  # a new topic's partitions reach the metadata within this


class BookOutlet(Protocol):
    """Where order-book records go: the PUB's outlet, which keeps the books."""

    def send_books(self, records: Iterable[BookRecord]) -> int: ...

    def send_book_snapshots(self) -> int: ...


@dataclass
class Snapshot:
    """What a restart resumes from: next offset per (topic, partition), every ticker's
    open candles (None: candles off) and the CEP batch whose state was saved with it."""

    offsets: dict[Position, int] = field(default_factory=dict)
    candles: dict[str, Any] | None = None
    cep_batch: int | None = None


class SnapshotFile:
    """One JSON file, replaced atomically (write, fsync, rename)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def for_settings(cls, settings: Settings) -> SnapshotFile:
        return cls(local_path(settings.checkpoint_for("live-engine")) / "snapshot.json")

    def load(self) -> Snapshot | None:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        if data.get("format") != SNAPSHOT_FORMAT:
            log.warning("%s: snapshot format %s is not ours: ignored", self.path, data["format"])
            return None
        offsets = {
            (topic, int(p)): int(o)
            for topic, parts in data["offsets"].items()
            for p, o in parts.items()
        }
        return Snapshot(offsets, data["candles"], data["cep_batch"])

    def save(self, snapshot: Snapshot) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        offsets: dict[str, dict[int, int]] = {}
        for (topic, p), o in snapshot.offsets.items():
            offsets.setdefault(topic, {})[p] = o
        body = {
            "format": SNAPSHOT_FORMAT,
            "offsets": offsets,
            "candles": snapshot.candles,
            "cep_batch": snapshot.cep_batch,
        }
        replace_file(self.path, json.dumps(body, separators=(",", ":")).encode())


class LiveEngine:
    """The consumer thread. `start`, then `wait_assigned` before producers are told the
    pipeline is ready (ticks written earlier are not published)."""

    def __init__(
        self, settings: Settings, send_many: SendMany, books: BookOutlet | None = None
    ) -> None:
        self._settings = settings
        self._send_many = send_many
        self._books = books
        self._stop = threading.Event()
        self._assigned = threading.Event()
        self._thread = threading.Thread(target=self._run, name="live-engine", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def wait_assigned(self, timeout_s: float = 60.0) -> None:
        """Returns once every partition is assigned; raises at once with the engine's own
        error if it failed first, not after the timeout with a guess."""
        deadline = time.monotonic() + timeout_s
        while not self._assigned.wait(0.1):
            if self.error is not None:
                raise RuntimeError(f"live engine failed at start: {self.error}") from self.error
            if time.monotonic() >= deadline:
                topic = self._settings.kafka.topic_ticks
                raise RuntimeError(f"live engine got no partitions of {topic} in {timeout_s} s")

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)

    # -- the thread ------------------------------------------------------------------

    def _run(self) -> None:
        from confluent_kafka import Consumer, Producer

        s = self._settings
        consumer = Consumer(
            {
                "bootstrap.servers": s.kafka.bootstrap_servers,
                "group.id": f"pipeline-live-engine-{uuid.uuid4().hex[:8]}",  # never committed
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 100,  # the broker answers at once when a record arrives
            }
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
        try:
            file = SnapshotFile.for_settings(s)
            snapshot = file.load() or Snapshot()
            if s.cep.enabled:
                from pipeline.cep.stage import CepStage

                next_batch = 0 if snapshot.cep_batch is None else snapshot.cep_batch + 1
                cep = CepStage(s, self._send_many, next_batch=next_batch)
            books = self._books if s.live.enabled else None
            run = _Run(s, consumer, producer, file, snapshot, cep, self._send_many, books)
            self._assigned.set()
            run.loop(self._stop)
            run.save()  # a clean stop reads nothing again
        except BaseException as exc:
            self.error = exc
            log.exception("live engine failed")
        finally:
            consumer.close()
            producer.flush(10)
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
    """One run of the engine's thread: its consumer, producer, positions and state."""

    def __init__(
        self,
        s: Settings,
        consumer: Any,
        producer: Any,
        file: SnapshotFile,
        snapshot: Snapshot,
        cep: CepStage | None,
        send_many: SendMany,
        books: BookOutlet | None = None,
    ) -> None:
        self.consumer = consumer
        self.producer = producer
        self.file = file
        self.cep = cep
        self.send_many = send_many
        self.books = books
        self.book_topic = s.kafka.topic_book
        self.book_snapshot_s = s.live.book_snapshot_s
        self.recent = RecentKeys[tuple[str, str]](200_000)
        self.snapshot_s = s.live.snapshot_s
        self.ticks_topic = s.kafka.topic_ticks
        self.candle_topic = s.kafka.topic_live_candles
        self.delivery_error: str | None = None
        cfg = Closing(tuple(s.live.periods), s.live.watermark_s, s.live.close_idle_s)
        self.candles = LiveCandles.restore(cfg, snapshot.candles or {}) if s.live.enabled else None
        self.positions, self.live_from = self._assign(s, snapshot)
        # CEP evaluates ticks from its saved state's offsets, or (new state) from
        # cep.ticks_starting_offsets: "latest" never evaluates old ticks against triggers.
        fresh_cep = snapshot.cep_batch is None and s.cep.ticks_starting_offsets == "latest"
        self.cep_from = dict(self.live_from) if fresh_cep else {}
        self.caught_up = self._caught_up()

    def _assign(
        self, s: Settings, snapshot: Snapshot
    ) -> tuple[dict[Position, int], dict[Position, int]]:
        """Assign every partition at the snapshot's offset, else the configured start;
        returns the next offsets and each ticks partition's end now (live from there)."""
        from confluent_kafka import TopicPartition

        starts = {self.ticks_topic: s.kafka.starting_offsets}
        if not s.live.enabled:
            starts[self.ticks_topic] = s.cep.ticks_starting_offsets
        if self.cep is not None:
            starts[self.cep.trigger_topic] = "earliest"  # every registration
        if self.books is not None:
            starts[self.book_topic] = "latest"  # live only: never from the snapshot
        positions: dict[Position, int] = {}
        live_from: dict[Position, int] = {}
        assignment = []
        for topic, start in starts.items():
            for p in _partitions(self.consumer, topic):
                low, high = _watermarks(self.consumer, TopicPartition(topic, p))
                if topic == self.ticks_topic:
                    live_from[(topic, p)] = high
                saved = None if topic == self.book_topic else snapshot.offsets.get((topic, p))
                if saved is not None:
                    position = max(saved, low)  # retention may have removed the rest
                else:
                    position = low if start == "earliest" else high
                positions[(topic, p)] = position
                assignment.append(TopicPartition(topic, p, position))
        self.consumer.assign(assignment)
        behind = sum(live_from[k] - positions[k] for k in live_from)
        log.info(
            "live engine: reading %s (%d tick records to catch up), snapshot %s",
            {f"{t}:{p}": o for (t, p), o in positions.items()},
            behind,
            "restored" if snapshot.offsets else "none",
        )
        return positions, live_from

    def _caught_up(self) -> bool:
        return all(self.positions[k] >= end for k, end in self.live_from.items())

    def loop(self, stop: threading.Event) -> None:
        candles = self.candles
        stats = _Stats()
        saved_at, dirty = time.monotonic(), False
        book_snapshot_at = time.monotonic()
        while not stop.is_set():
            if self.delivery_error is not None:
                raise RuntimeError(f"Kafka refused a closed candle: {self.delivery_error}")
            due = candles.next_due_ms(_now_ms()) if candles is not None and self.caught_up else None
            wait = POLL_S if due is None else min(POLL_S, max(due, 1) / 1000)
            asked = time.monotonic()
            messages = [m for m in self.consumer.consume(10_000, timeout=wait) if self._ok(m)]
            stats.waited(time.monotonic() - asked)
            if self.books is not None:
                messages = self._books(messages)
                if time.monotonic() - book_snapshot_at >= self.book_snapshot_s:
                    self.books.send_book_snapshots()
                    book_snapshot_at = time.monotonic()
            now_ms = _now_ms()
            if not self.caught_up and self._caught_up():
                self.caught_up = True
                log.info("live engine: caught up; candles close on idle time from now")
            ticks = live_only(self._decode([m for m in messages if m.topic() == self.ticks_topic]))
            fresh: list[Tick] = []
            if candles is not None:
                fresh, closed = self._candles(candles, ticks, now_ms)
                dirty = dirty or bool(closed)
            if self.cep is not None:
                triggers = [m for m in messages if m.topic() != self.ticks_topic]
                self.cep.feed(triggers, [t for t in ticks if self._for_cep(t[1])])
            dirty = dirty or bool(messages)
            self.producer.poll(0)
            stats.busy(time.monotonic() - asked, len(messages), fresh)
            due_to_save = dirty and time.monotonic() - saved_at >= self.snapshot_s
            if due_to_save and self.save():
                saved_at, dirty = time.monotonic(), False

    def _ok(self, m: Any) -> bool:
        if m.error() is not None:
            log.warning("live engine: %s", m.error())
            return False
        self.positions[(m.topic(), m.partition() or 0)] = (m.offset() or 0) + 1
        return True

    def _books(self, messages: list[Any]) -> list[Any]:
        """Publish the ``market.book`` records among `messages`; returns the others."""
        assert self.books is not None
        book = [m for m in messages if m.topic() == self.book_topic]
        if not book:
            return messages
        self.books.send_books(decode_book_records([m.value() for m in book]))
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
        recent, live_from = self.recent, self.live_from
        fresh = [
            t
            for t, (_, p, o) in ticks
            if o >= live_from.get((self.ticks_topic, p), 0)
            and recent.first_time((t.ticker, t.trade_id))
        ]
        out: list[tuple[str, Message]] = [(topics.tick_topic(t.ticker), t) for t in fresh]
        previews = candles.add((t for t, _ in ticks), now_ms)
        if self.caught_up:
            out += [(topics.ohlc_topic(c.ticker, c.period_seconds), c) for c in previews]
        closed = candles.close_due(now_ms, idle=self.caught_up)
        out += [(topics.ohlc_topic(c.ticker, c.period_seconds), c) for c in closed]
        if out:
            self.send_many(out)
        for c in closed:
            self.producer.produce(
                self.candle_topic,
                envelope.encode_record(c),
                key=c.ticker.encode(),
                on_delivery=self._delivered,
            )
        return fresh, closed

    def _delivered(self, err: Any, _msg: Any) -> None:
        if err is not None and self.delivery_error is None:
            self.delivery_error = str(err)

    def _decode(self, messages: list[Any]) -> list[tuple[Tick, Coordinates]]:
        """The valid ticks of the messages, each with its (Kafka time, partition, offset)."""
        stamps = {(m.partition() or 0, m.offset() or 0): m.timestamp()[1] for m in messages}
        decoded = records.decode_tick_values(
            [m.value() for m in messages], [p for p, _ in stamps], [o for _, o in stamps]
        )
        records.log_rejects("live engine", decoded.rejects)
        return [
            (t, (stamps[c], *c)) for t, c in zip(decoded.ticks, decoded.coordinates, strict=True)
        ]

    def save(self) -> bool:
        """Snapshot once Kafka has every closed candle so far; False: not yet (retried)."""
        pending = self.producer.flush(2.0)
        if pending or self.delivery_error is not None:
            log.warning("live engine: %d closed candles not yet in Kafka; snapshot later", pending)
            return False
        cep_batch = self.cep.checkpoint() if self.cep is not None else None
        candles = self.candles.snapshot() if self.candles is not None else None
        offsets = {k: o for k, o in self.positions.items() if k[0] != self.book_topic}
        self.file.save(Snapshot(offsets, candles, cep_batch))
        return True


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
        if fresh and fresh[-1].ingested_at_ms:
            self.worst_age_ms = max(self.worst_age_ms, _now_ms() - fresh[-1].ingested_at_ms)
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
