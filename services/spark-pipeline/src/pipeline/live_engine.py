"""The live engine: ``market.ticks`` -> ticks, candle previews and closed candles, outside Spark.

One Kafka consumer thread in the PUB server process decodes each tick once and
hands the PUB what it means at once (why outside Spark: docs/adr/0002 and
docs/pipeline-benchmarks.md "Lean pipeline"):

    market.ticks --decode--> Tick                      -> PUB {ticker}|tick (live only)
                             LiveCandles.add           -> PUB OHLC closed=false (previews)
                             LiveCandles.close_due     -> PUB OHLC closed=true / correction
                                                       -> Kafka market.ohlc.live (the
                                                          candles-store query MERGEs them)
    every live.snapshot_s: flush the producer, then snapshot (offsets + candles) to
    <checkpoint_dir>/live-engine/snapshot.json

Durability. The snapshot is written only after every closed candle before it was
acknowledged by Kafka, and it holds the next offset per partition. A restart
(or a kill -9) resumes from it: the ticks after it are read again, so their
candles close again with the same values (published again: at-least-once, as
before) and reach ``market.ohlc.live`` again (the MERGE is idempotent). Without
a snapshot the engine starts at ``kafka.starting_offsets``. A closed candle Kafka
refused ends the thread (so the PUB process, so the pipeline: the supervisor
restarts it from the snapshot) rather than leaving a hole in ``ohlc``.

Ticks are live, not durable: only those written after the engine started are
published (a backlog read from the snapshot counts in candles only); a trade
delivered twice is published once if its first copy is among the last 200,000.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf.message import Message

from mdproto import envelope, topics
from mdproto.messages import Tick
from pipeline import records
from pipeline.candle_close import Closing
from pipeline.cep.state import local_path
from pipeline.config import Settings
from pipeline.live_candles import LiveCandles

log = logging.getLogger(__name__)
SendMany = Callable[[Iterable[tuple[str, Message]]], int]
STATS_INTERVAL_S = 10.0
STALL_S = 0.25
SNAPSHOT_FORMAT = 1
#: Longest wait in consume(): the idle-close timer's resolution.
POLL_S = 0.05


class RecentKeys:
    """The last ``capacity`` keys seen: drops re-deliveries of a trade before publication."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._keys: OrderedDict[tuple[str, str], None] = OrderedDict()

    def first_time(self, key: tuple[str, str]) -> bool:
        if key in self._keys:
            return False
        self._keys[key] = None
        if len(self._keys) > self._capacity:
            self._keys.popitem(last=False)
        return True


@dataclass
class Snapshot:
    """What a restart resumes from: next offset per partition and every ticker's candles."""

    offsets: dict[int, int] = field(default_factory=dict)
    candles: dict[str, Any] = field(default_factory=dict)


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
            raise RuntimeError(f"{self.path}: snapshot format {data.get('format')} is not ours")
        return Snapshot({int(p): int(o) for p, o in data["offsets"].items()}, data["candles"])

    def save(self, snapshot: Snapshot) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        body = {"format": SNAPSHOT_FORMAT, "offsets": snapshot.offsets, "candles": snapshot.candles}
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as handle:
            json.dump(body, handle, separators=(",", ":"))
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(self.path)


class LiveEngine:
    """The consumer thread. `start`, then `wait_assigned` before producers are told the
    pipeline is ready (ticks written earlier are not published)."""

    def __init__(self, settings: Settings, send_many: SendMany, recent: int = 200_000) -> None:
        k, live = settings.kafka, settings.live
        self._bootstrap = k.bootstrap_servers
        self._topic = k.topic_ticks
        self._candle_topic = k.topic_live_candles
        self._starting = k.starting_offsets
        self._snapshot_s = live.snapshot_s
        self._file = SnapshotFile.for_settings(settings)
        self._cfg = Closing(tuple(live.periods), live.watermark_s, live.close_idle_s)
        self._send_many = send_many
        self._recent = RecentKeys(recent)
        self._stop = threading.Event()
        self._assigned = threading.Event()
        self._thread = threading.Thread(target=self._run, name="live-engine", daemon=True)
        self._delivery_error: str | None = None
        self.error: BaseException | None = None
        self.published = 0

    def start(self) -> None:
        self._thread.start()

    def wait_assigned(self, timeout_s: float = 60.0) -> None:
        if not self._assigned.wait(timeout_s):
            raise RuntimeError(f"live engine got no partitions of {self._topic} in {timeout_s} s")

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)

    # -- the thread ------------------------------------------------------------------

    def _run(self) -> None:
        from confluent_kafka import Consumer, Producer

        consumer = Consumer(
            {
                "bootstrap.servers": self._bootstrap,
                "group.id": f"pipeline-live-engine-{uuid.uuid4().hex[:8]}",  # never committed
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 100,  # the broker answers at once when a record arrives
            }
        )
        producer = Producer(
            {
                "bootstrap.servers": self._bootstrap,
                "enable.idempotence": True,  # acks=all, no duplicates or reordering by retries
                "linger.ms": 5,
                "message.timeout.ms": 300_000,  # a Kafka restart is bridged, not an error
            }
        )
        try:
            snapshot = self._file.load() or Snapshot()
            candles = LiveCandles.restore(self._cfg, snapshot.candles)
            positions, live_from = self._assign(consumer, snapshot.offsets)
            self._assigned.set()
            self._loop(consumer, producer, candles, positions, live_from)
            self._save(producer, candles, positions)  # a clean stop replays nothing
        except BaseException as exc:
            self.error = exc
            log.exception("live engine failed")
        finally:
            consumer.close()
            producer.flush(10)

    def _assign(
        self, consumer: Any, offsets: dict[int, int]
    ) -> tuple[dict[int, int], dict[int, int]]:
        """Assign every partition at the snapshot's offset (else `starting_offsets`);
        returns the next offsets and each partition's end now (ticks from there are live)."""
        from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, TopicPartition

        metadata = consumer.list_topics(self._topic, timeout=30)
        partitions = sorted(metadata.topics[self._topic].partitions)
        if not partitions:
            raise RuntimeError(f"topic {self._topic} has no partitions")
        live_from: dict[int, int] = {}
        positions: dict[int, int] = {}
        default = OFFSET_BEGINNING if self._starting == "earliest" else OFFSET_END
        assignment = []
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(self._topic, p), timeout=30)
            live_from[p] = high
            start = offsets.get(p)
            if start is None:
                positions[p] = low if default == OFFSET_BEGINNING else high
            else:
                positions[p] = max(start, low)  # retention may have removed the rest
            assignment.append(TopicPartition(self._topic, p, positions[p]))
        consumer.assign(assignment)
        behind = sum(live_from[p] - positions[p] for p in partitions)
        log.info(
            "live engine: %s from %s (%d records to catch up), snapshot %s",
            self._topic,
            positions,
            behind,
            "restored" if offsets else "none",
        )
        return positions, live_from

    def _loop(
        self,
        consumer: Any,
        producer: Any,
        candles: LiveCandles,
        positions: dict[int, int],
        live_from: dict[int, int],
    ) -> None:
        stats = _Stats()
        caught_up = all(positions[p] >= live_from[p] for p in positions)
        saved_at, dirty = time.monotonic(), False
        while not self._stop.is_set():
            if self._delivery_error is not None:
                raise RuntimeError(f"Kafka refused a closed candle: {self._delivery_error}")
            due = candles.next_due_ms(_now_ms()) if caught_up else None
            wait = POLL_S if due is None else min(POLL_S, max(due, 1) / 1000)
            asked = time.monotonic()
            messages = consumer.consume(num_messages=10_000, timeout=wait)
            stats.waited(time.monotonic() - asked)
            now_ms = _now_ms()
            ticks, fresh = self._decode(messages, positions, live_from)
            if not caught_up:
                caught_up = all(positions[p] >= live_from[p] for p in positions)
                if caught_up:
                    log.info("live engine: caught up; candles close on idle time from now")
            out: list[tuple[str, Message]] = [(topics.tick_topic(t.ticker), t) for t in fresh]
            previews = candles.add(ticks, now_ms)
            if caught_up:
                out += [(topics.ohlc_topic(c.ticker, c.period_seconds), c) for c in previews]
            closed = candles.close_due(now_ms, idle=caught_up)
            out += [(topics.ohlc_topic(c.ticker, c.period_seconds), c) for c in closed]
            if out:
                self.published += self._send_many(out)
            for c in closed:
                producer.produce(
                    self._candle_topic,
                    envelope.encode_record(c),
                    key=c.ticker.encode(),
                    on_delivery=self._delivered,
                )
            producer.poll(0)
            dirty = dirty or bool(ticks) or bool(closed)
            stats.busy(time.monotonic() - asked, len(messages), fresh)
            due_to_save = dirty and time.monotonic() - saved_at >= self._snapshot_s
            if due_to_save and self._save(producer, candles, positions):
                saved_at, dirty = time.monotonic(), False

    def _decode(
        self, messages: list[Any], positions: dict[int, int], live_from: dict[int, int]
    ) -> tuple[list[Tick], list[Tick]]:
        """Valid ticks of the messages, and those to publish (live, not re-delivered)."""
        values, partitions, offsets = [], [], []
        for m in messages:
            if m.error() is not None:
                log.warning("live engine: %s", m.error())
                continue
            p, o = m.partition() or 0, m.offset() or 0
            positions[p] = o + 1
            values.append(m.value())
            partitions.append(p)
            offsets.append(o)
        decoded = records.decode_tick_values(values, partitions, offsets)
        records.log_rejects("live engine", decoded.rejects)
        fresh = [
            t
            for t, (p, o) in zip(decoded.ticks, decoded.coordinates, strict=True)
            if o >= live_from.get(p, 0) and self._recent.first_time((t.ticker, t.trade_id))
        ]
        return decoded.ticks, fresh

    def _delivered(self, err: Any, _msg: Any) -> None:
        if err is not None and self._delivery_error is None:
            self._delivery_error = str(err)

    def _save(self, producer: Any, candles: LiveCandles, positions: dict[int, int]) -> bool:
        """Snapshot once Kafka has every closed candle so far; False: not yet (retried)."""
        pending = producer.flush(2.0)
        if pending or self._delivery_error is not None:
            log.warning("live engine: %d closed candles not yet in Kafka; snapshot later", pending)
            return False
        self._file.save(Snapshot(dict(positions), candles.snapshot()))
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


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
