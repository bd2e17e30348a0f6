"""Two live engines (`python -m pipeline.engine`) in one consumer group on real Kafka, their
state in the stack's S3 store (ADR 0014): both own partitions while ticks of several
tickers flow; one stops (SIGTERM: its revoke saves its partitions) or is killed (its
last periodic save), the other owns every partition, restores the moved windows and
closes them whole: no closed candle is missing, and a moved ticker's messages come
in the new owner's publisher epoch. Both killed at once and two new ones started
(issue 44 item 7's restart of all engines): the same, every ticker in a new epoch.
With CEP on, each trigger's ARMED and EXPIRED come once (from the owner of its
ticker's partition), and a ticker that moves keeps its PCT_MOVE window."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from candle_oracle import aggregate
from prometheus_client.parser import text_string_to_metric_families

from infra.testing import Subscriber, free_port, poll_until
from mdproto import contracts, envelope
from mdproto.messages import (
    OHLC,
    CEPCondition,
    CEPTriggerEvent,
    CEPTriggerRequest,
    NotifyPattern,
    Tick,
)
from mdproto.partitioning import partition_of
from mdproto.runtime.kafka import ensure_topics, spec
from pipeline.config import Settings
from pipeline.live_state import PartitionState, StateStore

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
        self.metrics_port = free_port()
        env = {
            **env,
            "PIPELINE_CHECKPOINT_DIR": str(workdir / "checkpoints"),
            "PIPELINE_METRICS_HOST": "127.0.0.1",
            "PIPELINE_LIVE__METRICS_PORT": str(self.metrics_port),
        }
        argv = [sys.executable, "-m", "pipeline.engine", "--ready-file", str(self.ready)]
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + WAIT_S
        while not self.ready.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"engine not ready:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)  # the ready file, polled

    def samples(self, name: str) -> dict[tuple[str, ...], float]:
        """`name`'s samples on the engine's /metrics, by their label values (engine
        first, the rest by label name)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode()
        return {
            (s.labels["engine"], *(v for k, v in sorted(s.labels.items()) if k != "engine")): (
                s.value
            )
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == name
        }

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


@pytest.mark.parametrize("how", ["close", "kill", "restart-all"])
def test_the_other_engine_takes_every_partition_and_closes_whole_candles(
    local_stack: Any, tmp_path: Path, how: str
) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    e = local_stack.endpoints
    topic, group = names()
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    sub = Subscriber(endpoint, [b""], wait_s=WAIT_S, bind=True)  # the relay's engine port
    env = engine_env(e, topic, group, endpoint, {"PIPELINE_CEP__ENABLED": "false"})
    admin = AdminClient({"bootstrap.servers": e.kafka_bootstrap})
    producer = Producer({"bootstrap.servers": e.kafka_bootstrap, "linger.ms": 5})

    def send(batch: list[Tick]) -> None:
        for t in batch:
            producer.produce(topic, key=t.ticker.encode(), value=envelope.encode_record(t))
        assert producer.flush(30) == 0

    a = Engine(tmp_path / "a", env)
    b = Engine(tmp_path / "b", env)
    engines = [a, b]
    try:
        a.wait_ready()
        b.wait_ready()
        wait_until(
            lambda: sorted(len(m) for m in members(admin, group, topic)) == [2, 2],
            "two engines with two partitions each",
        )
        # Each engine's own /metrics says what it owns, under a label of its own.
        wait_until(
            lambda: (
                [sorted(e.samples("pipeline_live_partitions_owned").values()) for e in (a, b)]
                == [[2.0, 2.0], [2.0, 2.0]]
            ),  # set as the engine's assignment callback runs
            "two ticks and two book partitions on each engine's /metrics",
        )
        owned = [e.samples("pipeline_live_partitions_owned") for e in (a, b)]
        assert {k[0] for k in owned[0]}.isdisjoint({k[0] for k in owned[1]})
        # Minutes 0 and 1 whole, minute 2 open (its first 25 s) on both engines.
        first = ticks(0, 150)
        send(first)

        sub.wait_for(lambda m: closed_at(m.message, B + 60_000), len(TICKERS))
        before = {c.ticker: c.publisher_epoch for c in closed(sub)}
        assert len(set(before.values())) == 2, "both engines closed candles"
        # The driver's corrections (a gap rebuild's) reach both engines; each ticker's
        # comes once, from its owner, in the epoch of its other messages.
        for ticker in TICKERS:
            fix = OHLC(ticker=ticker, period_seconds=60, open_time_ms=B - 60_000, close=1.0,
                       closed=True, correction=True)  # fmt: skip
            producer.produce(
                f"{topic}.corrections", key=ticker.encode(), value=envelope.encode_record(fix)
            )
        assert producer.flush(30) == 0
        fixes = sub.wait_for(
            lambda m: isinstance(m.message, OHLC) and m.message.correction, len(TICKERS)
        )
        assert sorted((m.message.ticker, m.message.publisher_epoch) for m in fixes) == sorted(
            before.items()
        )
        if how == "close":
            assert a.stop(signal.SIGTERM) == 0
        else:
            # What a kill leaves is the last periodic save: wait until it holds every record.
            wait_until(
                lambda: saved_offsets(e, group, topic) == ends(e.kafka_bootstrap, topic), "saved"
            )
            assert a.stop(signal.SIGKILL) == -signal.SIGKILL
        shares = [PARTITIONS]
        if how == "restart-all":
            assert b.stop(signal.SIGKILL) == -signal.SIGKILL
            a, b = Engine(tmp_path / "a2", env), Engine(tmp_path / "b2", env)
            engines += [a, b]
            a.wait_ready()
            b.wait_ready()
            shares = [2, 2]
        wait_until(
            lambda: sorted(len(m) for m in members(admin, group, topic)) == shares,
            f"the partitions shared {shares}",
        )

        # Minutes 2 (its rest) and 3, and a trade in minute 5 that closes minute 3.
        second = ticks(150, 240) + ticks(300, 301)
        send(second)
        sub.wait_for(lambda m: closed_at(m.message, B + 180_000), len(TICKERS))
        # b's metrics: all four partitions owned, their lag (librdkafka's statistics,
        # every 5 s) and saved state sizes, the restore of the moved ones.
        wait_until(lambda: metric_partitions(b, topic) == shares[-1], "b's lag and state series")
        [(label, _)] = [k for k in b.samples("pipeline_live_partitions_owned") if k[1] == topic]
        assert b.samples("pipeline_live_partitions_owned")[(label, topic)] == shares[-1]
        assert b.samples("pipeline_live_restored_partitions_total")[(label,)] >= 2
        assert b.samples("pipeline_live_restore_seconds_count")[(label,)] >= 1
        assert b.samples("pipeline_live_records_total")[(label, topic)] > 0
        assert b.samples("pipeline_live_publish_latency_seconds_count")[(label,)] > 0
        assert all(v > 0 for v in b.samples("pipeline_live_state_bytes").values())
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
        assert len(set(after.values())) == len(shares), "each engine left closes candles"
        moved = [t for t in TICKERS if before[t] != after[t]]
        assert moved, "the stopped engine's tickers moved to a new epoch"
        if how == "restart-all":
            assert moved == TICKERS
    finally:
        for engine in engines:
            engine.stop(signal.SIGKILL)
        sub.close()


def names() -> tuple[str, str]:
    """A fresh ticks topic (and its book and live-candle topics, created) and group."""
    tag = uuid.uuid4().hex[:8]
    return f"ls-{tag}.ticks", f"ls-{tag}.engines"


def engine_env(
    e: Any, topic: str, group: str, endpoint: str, extra: dict[str, str]
) -> dict[str, str]:
    """The engines' environment (their topics created): `topic`'s book and live-candle
    topics beside it, the stack's catalog and S3 store, `endpoint` as the relay."""
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
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    env.update(
        {
            "PIPELINE_KAFKA__BOOTSTRAP_SERVERS": e.kafka_bootstrap,
            "PIPELINE_KAFKA__TOPIC_TICKS": topic,
            "PIPELINE_KAFKA__TOPIC_BOOK": f"{topic}.book",
            "PIPELINE_KAFKA__TOPIC_LIVE_CANDLES": f"{topic}.live-candles",
            "PIPELINE_KAFKA__TOPIC_LIVE_CORRECTIONS": f"{topic}.corrections",
            "PIPELINE_KAFKA__STARTING_OFFSETS": "earliest",
            **e.catalog_env("PIPELINE_CATALOG__"),
            "PIPELINE_LIVE__GROUP_ID": group,
            "PIPELINE_LIVE__PERIODS": "[60]",
            "PIPELINE_LIVE__WATERMARK_S": "5",
            "PIPELINE_LIVE__CLOSE_IDLE_S": "3600",  # windows close by event time only
            "PIPELINE_LIVE__SNAPSHOT_S": "0.5",
            "PIPELINE_LIVE__RELAY_NICENESS": "0",
            "PIPELINE_LIVE__RELAY_ENGINE_ENDPOINTS": json.dumps([endpoint]),
            **extra,
        }
    )
    return env


def metric_partitions(engine: Engine, topic: str) -> int:
    """Partitions of `topic` with both a lag and a state size on the engine's /metrics
    (lag every 5 s from librdkafka, state at each save): polled."""
    lag = {k[1] for k in engine.samples("pipeline_live_kafka_lag_offsets") if k[2] == topic}
    state = {k[1] for k in engine.samples("pipeline_live_state_bytes")}
    return len(lag & state)


def closed_at(message: object, open_time_ms: int) -> bool:
    return isinstance(message, OHLC) and message.closed and message.open_time_ms == open_time_ms


def closed(sub: Subscriber) -> list[OHLC]:
    """The closed candles of the trades' minutes received, in arrival order (not the
    driver's stand-in corrections, of the minute before)."""
    return [
        m.message
        for m in sub.received
        if isinstance(m.message, OHLC) and m.message.closed and m.message.open_time_ms >= B
    ]


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
    """Each ticks partition's offset in its saved state (the S3 store)."""
    return {p: s.offset for p, s in saved_states(endpoints, group, topic).items()}


def saved_states(endpoints: Any, group: str, topic: str) -> dict[int, PartitionState]:
    """Each ticks partition's saved state in the S3 store (a torn read, beside the
    engine writing it, is read again by `StateStore.load`)."""
    settings = Settings.model_validate(
        {"catalog": endpoints.catalog_settings().model_dump(), "live": {"group_id": group}}
    )
    store = StateStore.for_settings(settings)
    states = {p: store.load(topic, p) for p in range(PARTITIONS)}
    return {p: s for p, s in states.items() if s is not None}


def test_cep_events_come_from_one_engine_and_a_moved_ticker_keeps_its_window(
    local_stack: Any, tmp_path: Path
) -> None:
    """Every engine reads every trigger: each ARMED and EXPIRED still comes once (from
    the owner of the ticker's partition), and a PCT_MOVE window filled on one engine
    fires on the engine its ticker moves to."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    e = local_stack.endpoints
    topic, group = names()
    triggers = f"{topic}.cep-triggers"
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    sub = Subscriber(endpoint, [b""], wait_s=WAIT_S, bind=True)
    extra = {
        "PIPELINE_CEP__ENABLED": "true",
        "PIPELINE_KAFKA__TOPIC_CEP_TRIGGERS": triggers,
        "PIPELINE_CEP__TIMER_S": "0.2",
    }
    env = engine_env(e, topic, group, endpoint, extra)
    admin = AdminClient({"bootstrap.servers": e.kafka_bootstrap})
    producer = Producer({"bootstrap.servers": e.kafka_bootstrap, "linger.ms": 5})
    # One ticker per ticks partition, by the rule the engines compute.
    by_partition: dict[int, str] = {}
    for i in range(1000):
        by_partition.setdefault(
            partition_of(f"BINANCE:K{i}/USDT", PARTITIONS), f"BINANCE:K{i}/USDT"
        )
        if len(by_partition) == PARTITIONS:
            break
    tickers = [by_partition[p] for p in range(PARTITIONS)]
    placed: dict[str, int] = {}

    def delivered(err: Any, msg: Any) -> None:
        assert err is None, err
        if msg.topic() == topic:
            placed[msg.key().decode()] = msg.partition()

    def send(where: str, key: str, message: Any) -> None:
        value = envelope.encode_record(message)
        producer.produce(where, key=key.encode(), value=value, on_delivery=delivered)

    def trade(ticker: str, price: float) -> Tick:
        now = int(time.time() * 1000)
        return Tick(
            ticker=ticker, trade_id=uuid.uuid4().hex, price=price, amount=1.0, timestamp_ms=now
        )

    a = Engine(tmp_path / "a", env)
    b = Engine(tmp_path / "b", env)
    try:
        a.wait_ready()
        b.wait_ready()
        wait_until(
            lambda: sorted(len(m) for m in members(admin, group, topic)) == [2, 2],
            "two engines with two partitions each",
        )
        now = int(time.time() * 1000)
        pct = CEPCondition(kind=CEPCondition.PCT_MOVE, threshold=5.0, window_seconds=600)
        never = CEPCondition(kind=CEPCondition.PRICE_ABOVE, threshold=1e9)
        for p, ticker in enumerate(tickers):
            # Sentinels s*: once an engine published its own one's expiry, it went past
            # every e*'s expiry (processing order), so a duplicate would be here by then.
            for trigger_id, fields in (
                (f"w{p}", {"conditions": [pct], "repeating": True}),
                (f"e{p}", {"conditions": [never], "expires_at_ms": now + 8000}),
                (f"s{p}", {"conditions": [never], "expires_at_ms": now + 10_000}),
            ):
                request = CEPTriggerRequest(
                    trigger_id=trigger_id, client_id="stack", ticker=ticker, **fields
                )
                request.action = CEPTriggerRequest.REGISTER
                request.notify = NotifyPattern.NOTIFY_PER_REQUEST
                send(triggers, trigger_id, request)
        assert producer.flush(30) == 0
        cep_events(sub, "ARMED", [f"w{p}" for p in range(PARTITIONS)])
        for ticker in tickers:
            send(topic, ticker, trade(ticker, 100.0))
        assert producer.flush(30) == 0
        assert placed == {t: partition_of(t, PARTITIONS) for t in tickers}, "the rule drifted"

        cep_events(sub, "EXPIRED", [f"s{p}" for p in range(PARTITIONS)])
        counts = cep_counts(sub)
        for p in range(PARTITIONS):
            assert counts.get((f"e{p}", "EXPIRED")) == 1, (p, counts)
            assert counts.get((f"s{p}", "EXPIRED")) == 1, (p, counts)
            assert counts.get((f"w{p}", "ARMED")) == 1, (p, counts)
            assert counts.get((f"e{p}", "ARMED"), 0) <= 1, (p, counts)

        # Every window holds its 100 in the saved states; then a leaves (its revoke
        # saves), b owns every partition and restores the windows of a's tickers.
        wait_until(
            lambda: saved_offsets(e, group, topic) == ends(e.kafka_bootstrap, topic), "saved"
        )
        states = saved_states(e, group, topic)
        assert {p: s.cep[tickers[p]]["last_price"] for p, s in states.items()} == dict.fromkeys(
            range(PARTITIONS), 100.0
        )
        assert a.stop(signal.SIGTERM) == 0
        wait_until(
            lambda: [len(m) for m in members(admin, group, topic)] == [PARTITIONS], "b owns all"
        )
        for ticker in tickers:
            send(topic, ticker, trade(ticker, 106.0))
        assert producer.flush(30) == 0
        fired = cep_events(sub, "FIRED", [f"w{p}" for p in range(PARTITIONS)])
        assert {(f.fire_count, f.values["ref_price"]) for f in fired} == {(1, 100.0)}
    finally:
        for engine in (a, b):
            engine.stop(signal.SIGKILL)
        sub.close()


def cep_events(sub: Subscriber, kind: str, trigger_ids: list[str]) -> list[CEPTriggerEvent]:
    """The first `kind` event of each of `trigger_ids`, once each arrived."""
    wanted = CEPTriggerEvent.Kind.Value(kind)
    out = []
    for trigger_id in trigger_ids:
        [first, *_] = sub.wait_for(
            lambda m, t=trigger_id: (
                isinstance(m.message, CEPTriggerEvent)
                and m.message.kind == wanted
                and m.message.trigger_id == t
            )
        )
        assert isinstance(first.message, CEPTriggerEvent)
        out.append(first.message)
    return out


def cep_counts(sub: Subscriber) -> dict[tuple[str, str], int]:
    """How many events of each (trigger id, kind) arrived, from any engine."""
    counts: dict[tuple[str, str], int] = {}
    for m in sub.received:
        if isinstance(m.message, CEPTriggerEvent):
            key = (m.message.trigger_id, CEPTriggerEvent.Kind.Name(m.message.kind))
            counts[key] = counts.get(key, 0) + 1
    return counts
