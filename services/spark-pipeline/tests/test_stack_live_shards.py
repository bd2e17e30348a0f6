"""Two live engines (`python -m pipeline.engine`) in one consumer group on real Kafka, their
state in the stack's S3 store (ADR 0014): both own partitions while ticks of several
tickers flow; one stops (SIGTERM: its revoke saves its partitions) or is killed (its
last periodic save), the other owns every partition, restores the moved windows and
closes them whole: no closed candle is missing, and a moved ticker's messages come
in the new owner's publisher epoch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from candle_oracle import aggregate

from infra.testing import Subscriber, free_port, poll_until
from mdproto import contracts, envelope
from mdproto.messages import OHLC, Tick
from mdproto.runtime.kafka import ensure_topics, spec
from pipeline.config import Settings
from pipeline.live_state import StateStore

pytestmark = [pytest.mark.stack, pytest.mark.heavy(seconds=120)]

PARTITIONS = 4
TICKERS = [f"BINANCE:C{i}/USDT" for i in range(8)]
B = 1_704_067_200_000  # 2024-01-01T00:00:00Z
WAIT_S = 120.0


class Engine:
    """One `python -m pipeline.engine` process with its own checkpoint dir and log."""

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.ready = workdir / "ready"
        self.log = workdir / "engine.log"
        env = {**env, "PIPELINE_CHECKPOINT_DIR": str(workdir / "checkpoints")}
        argv = [sys.executable, "-m", "pipeline.engine", "--ready-file", str(self.ready)]
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + WAIT_S
        while not self.ready.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"engine not ready:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)  # the ready file, polled

    def stop(self, sig: int) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(60)


def members(admin: Any, group: str, topic: str) -> list[set[int]]:
    """Each member's partitions of `topic`, as the group coordinator has them now."""
    [future] = admin.describe_consumer_groups([group]).values()
    description = future.result(timeout=30)
    return [
        {tp.partition for tp in m.assignment.topic_partitions if tp.topic == topic}
        for m in description.members
    ]


def wait_until(check: Any, what: str) -> None:
    """The group's state has nothing to block on: polled (`poll_until`)."""
    poll_until(what, check, WAIT_S, interval_s=0.5)


def ticks(first_s: int, last_s: int) -> list[Tick]:
    """One trade per ticker every 5 s of event time."""
    return [
        Tick(
            ticker=ticker,
            trade_id=f"{k}-{s}",
            price=100.0 + k + (s * 7919 % 23),
            amount=0.25 * (1 + s % 3),
            timestamp_ms=B + s * 1000,
        )
        for s in range(first_s, last_s, 5)
        for k, ticker in enumerate(TICKERS)
    ]


@pytest.mark.parametrize("how", ["close", "kill"])
def test_the_other_engine_takes_every_partition_and_closes_whole_candles(
    local_stack: Any, tmp_path: Path, how: str
) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    e = local_stack.endpoints
    tag = uuid.uuid4().hex[:8]
    topic, group = f"ls-{tag}.ticks", f"ls-{tag}.engines"
    ensure_topics(
        e.kafka_bootstrap,
        [spec(contracts.KAFKA_TICKS, topic), spec(contracts.KAFKA_BOOK, f"{topic}.book")],
        partitions=PARTITIONS,
        replication=1,
        timeout_s=30,
    )
    ensure_topics(
        e.kafka_bootstrap,
        [spec(contracts.KAFKA_LIVE_CANDLES, f"{topic}.live-candles")],
        partitions=1,
        replication=1,
        timeout_s=30,
    )
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    sub = Subscriber(endpoint, [b""], wait_s=WAIT_S, bind=True)  # the relay's engine port
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    env.update(
        {
            "PIPELINE_KAFKA__BOOTSTRAP_SERVERS": e.kafka_bootstrap,
            "PIPELINE_KAFKA__TOPIC_TICKS": topic,
            "PIPELINE_KAFKA__TOPIC_BOOK": f"{topic}.book",
            "PIPELINE_KAFKA__TOPIC_LIVE_CANDLES": f"{topic}.live-candles",
            "PIPELINE_KAFKA__STARTING_OFFSETS": "earliest",
            **e.catalog_env("PIPELINE_CATALOG__"),
            "PIPELINE_CEP__ENABLED": "false",
            "PIPELINE_LIVE__GROUP_ID": group,
            "PIPELINE_LIVE__PERIODS": "[60]",
            "PIPELINE_LIVE__WATERMARK_S": "5",
            "PIPELINE_LIVE__CLOSE_IDLE_S": "3600",  # windows close by event time only
            "PIPELINE_LIVE__SNAPSHOT_S": "0.5",
            "PIPELINE_LIVE__RELAY_NICENESS": "0",
            "PIPELINE_LIVE__RELAY_ENGINE_ENDPOINTS": json.dumps([endpoint]),
        }
    )
    admin = AdminClient({"bootstrap.servers": e.kafka_bootstrap})
    producer = Producer({"bootstrap.servers": e.kafka_bootstrap, "linger.ms": 5})

    def send(batch: list[Tick]) -> None:
        for t in batch:
            producer.produce(topic, key=t.ticker.encode(), value=envelope.encode_record(t))
        assert producer.flush(30) == 0

    a = Engine(tmp_path / "a", env)
    b = Engine(tmp_path / "b", env)
    try:
        a.wait_ready()
        b.wait_ready()
        wait_until(
            lambda: sorted(len(m) for m in members(admin, group, topic)) == [2, 2],
            "two engines with two partitions each",
        )
        # Minutes 0 and 1 whole, minute 2 open (its first 25 s) on both engines.
        first = ticks(0, 150)
        send(first)

        sub.wait_for(lambda m: closed_at(m.message, B + 60_000), len(TICKERS))
        before = {c.ticker: c.publisher_epoch for c in closed(sub)}
        assert len(set(before.values())) == 2, "both engines closed candles"
        if how == "kill":
            # What a kill leaves is the last periodic save: wait until it holds every record.
            wait_until(
                lambda: saved_offsets(e, group, topic) == ends(e.kafka_bootstrap, topic), "saved"
            )
            assert a.stop(signal.SIGKILL) == -signal.SIGKILL
        else:
            assert a.stop(signal.SIGTERM) == 0
        wait_until(
            lambda: [len(m) for m in members(admin, group, topic)] == [PARTITIONS], "b owns all"
        )

        # Minutes 2 (its rest) and 3, and a trade in minute 5 that closes minute 3.
        second = ticks(150, 240) + ticks(300, 301)
        send(second)
        sub.wait_for(lambda m: closed_at(m.message, B + 180_000), len(TICKERS))
        expected = {
            (c.ticker, c.open_time_ms): c
            for c in aggregate(first + second, [60])
            if c.open_time_ms < B + 240_000
        }
        published = {(c.ticker, c.open_time_ms): c for c in closed(sub)}
        assert set(published) == set(expected), "a closed candle is missing"
        for key, c in expected.items():
            got = published[key]
            assert (got.trade_count, got.high, got.low, got.volume) == (
                c.trade_count,
                c.high,
                c.low,
                c.volume,
            ), key
        after = {c.ticker: c.publisher_epoch for c in closed(sub) if c.open_time_ms == B + 180_000}
        assert len(set(after.values())) == 1, "one engine closes everything now"
        moved = [t for t in TICKERS if before[t] != after[t]]
        assert moved, "the stopped engine's tickers moved to a new epoch"
    finally:
        for engine in (a, b):
            engine.stop(signal.SIGKILL)
        sub.close()


def closed_at(message: object, open_time_ms: int) -> bool:
    return isinstance(message, OHLC) and message.closed and message.open_time_ms == open_time_ms


def closed(sub: Subscriber) -> list[OHLC]:
    """The closed candles received, in arrival order."""
    return [m.message for m in sub.received if isinstance(m.message, OHLC) and m.message.closed]


def ends(bootstrap: str, topic: str) -> dict[int, int]:
    """Each ticks partition's next offset in Kafka."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ends-{uuid.uuid4()}"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(PARTITIONS)
        }
    finally:
        consumer.close()


def saved_offsets(endpoints: Any, group: str, topic: str) -> dict[int, int]:
    """Each ticks partition's offset in its saved state (the S3 store); {} when a read
    met an object the engine was writing at that moment (this poll runs beside it)."""
    settings = Settings.model_validate(
        {"catalog": endpoints.catalog_settings().model_dump(), "live": {"group_id": group}}
    )
    store = StateStore.for_settings(settings)
    try:
        states = {p: store.load(topic, p) for p in range(PARTITIONS)}
    except ValueError:  # a torn read: json.JSONDecodeError
        return {}
    return {p: s.offset for p, s in states.items() if s is not None}
