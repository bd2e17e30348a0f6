"""Tick publication: ``market.ticks`` -> ``{ticker}|tick``, outside Spark.

A Kafka consumer thread in the PUB server process decodes each tick and hands
it to the PUB at once (why not Spark or the driver: docs/adr/0002). Live, not
durable: it starts at the end of the topic; a trade delivered twice is
published once if its first copy is among the last 200,000 seen.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from google.protobuf.message import Message

from mdproto import topics
from mdproto.messages import Tick
from pipeline import records
from pipeline.config import Settings

log = logging.getLogger(__name__)
SendMany = Callable[[Iterable[tuple[str, Message]]], int]
STATS_INTERVAL_S = 10.0
STALL_S = 0.25


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


class TickPublisher:
    """The consumer thread. `start`, then `wait_assigned` before producers are told
    the pipeline is ready (earlier ticks are behind the starting offset)."""

    def __init__(self, settings: Settings, send_many: SendMany, recent: int = 200_000) -> None:
        k = settings.kafka
        self._conf: dict[str, Any] = {
            "bootstrap.servers": k.bootstrap_servers,
            "group.id": f"{settings.spark.app_name}-tick-relay-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "latest",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,
        }
        self._topic = k.topic_ticks
        self._send_many = send_many
        self._recent = RecentKeys(recent)
        self._stop = threading.Event()
        self._assigned = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tick-relay", daemon=True)
        self.error: BaseException | None = None
        self.published = 0

    def start(self) -> None:
        self._thread.start()

    def wait_assigned(self, timeout_s: float = 60.0) -> None:
        if not self._assigned.wait(timeout_s):
            raise RuntimeError(f"tick relay got no partitions of {self._topic} in {timeout_s} s")

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        from confluent_kafka import Consumer

        consumer = Consumer(self._conf)
        consumer.subscribe([self._topic], on_assign=lambda _c, _p: self._assigned.set())
        window_start, window_count, worst_age_ms = time.monotonic(), 0, 0.0
        try:
            while not self._stop.is_set():
                asked = time.monotonic()
                messages = consumer.consume(num_messages=10_000, timeout=0.05)
                waited = time.monotonic() - asked
                if waited > STALL_S:
                    log.warning("tick relay: consume() took %.0f ms (asked for 50)", waited * 1000)
                if not messages:
                    continue
                fresh = self._publish(messages)
                busy = time.monotonic() - asked - waited
                if busy > STALL_S:
                    log.warning("tick relay: %d ticks took %.0f ms", len(messages), busy * 1000)
                window_count += len(fresh)
                if fresh and fresh[-1].ingested_at_ms:
                    age_ms = time.time() * 1000 - fresh[-1].ingested_at_ms
                    worst_age_ms = max(worst_age_ms, age_ms)
                if time.monotonic() - window_start >= STATS_INTERVAL_S:
                    log.info(
                        "tick relay: %d ticks published in the last %.0f s, oldest at "
                        "publication %.0f ms after ingestion",
                        window_count,
                        time.monotonic() - window_start,
                        worst_age_ms,
                    )
                    window_start, window_count, worst_age_ms = time.monotonic(), 0, 0.0
        except BaseException as exc:
            self.error = exc
            log.exception("tick relay failed")
        finally:
            consumer.close()

    def _publish(self, messages: list[Any]) -> list[Tick]:
        """Decode, drop re-deliveries, publish; returns what was published."""
        values, partitions, offsets = [], [], []
        for m in messages:
            if m.error() is not None:
                log.warning("tick relay: %s", m.error())
                continue
            values.append(m.value())
            partitions.append(m.partition() or 0)
            offsets.append(m.offset() or 0)
        decoded = records.decode_tick_values(values, partitions, offsets)
        records.log_rejects("tick relay", decoded.rejects)
        fresh = [t for t in decoded.ticks if self._recent.first_time((t.ticker, t.trade_id))]
        self.published += self._send_many((topics.tick_topic(t.ticker), t) for t in fresh)
        return fresh
