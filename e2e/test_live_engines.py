"""The sharded live engine on compose (ADR 0014, issue 44 item 7): three engines (the
pipeline's own and two `live-engine` replicas) share market.ticks/market.book while
10,000 trades/s flow; one replica is killed (SIGKILL). Asserted:

- its partitions are owned again within 10 s (Kafka's group description);
- no closed candle lost or stored twice: for every synthetic ticker, the kill's minute
  (wholly inside the load) is one row of Iceberg's ``ohlc`` with the count, volume and
  OHLC of the trades the producer sent in it; the simulator's markets likewise hold
  every model trade of that minute (their trades come through the ingestor);
- CEP keeps firing: a trigger on a ticker that moved fires once, on its new owner,
  when the producer moves that ticker's price after the kill;
- a subscriber of a simulator market that moved sees the publisher epoch change and
  resyncs (``kind="restart"``).

Load: a producer process (infra/tick_load.py, its own interpreter) writes synthetic
trades of 200 ``LOADGEN:`` tickers (a Zipf mix: a few hot, a long tail) straight into
``market.ticks`` through Kafka's host port, trade time = wall clock, at 10,000/s from
a few seconds before the kill's minute to just after it. The test fails if it offered
less than 95 % of that rate in the kill's minute (a starved machine would otherwise
pass a lighter test). Trades of the simulator's eight markets (~4/s) come through the
ingestor as before; the 80 injected trades/s over HTTP this test used to add are gone.

Measured in three runs on this 2-core machine beside the compose stack and other
sessions' Spark runs (load average 13-45): 9,993-10,000 trades/s offered in the kill's
minute (the producer 7-8 CPU-s over 68 s), partitions owned again 6.6, 6.7 and 9.1 s
after the kill, the test 149, 175 and 254 s without the scale up and down: it waits up
to a minute for the kill's minute to begin, then for its 200 candles in ``ohlc`` (57 s
after the minute's end at load 13-25, 113 s at 26-45: candles-store commits of ~200
candles, one Iceberg partition each, took 20-22 s and 49-64 s).
"""

from __future__ import annotations

import contextlib
import math
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from infra.compose_platform import ComposePlatform
from infra.exchange_sim.control import SimulatorControl
from infra.testing import poll_until
from infra.tick_load import EXCHANGE, JUMP_PRICE, LoadSpec, SentCandle, TickLoad, load_tickers
from mdclient import Client, ClientSettings
from mdclient.dispatch import SequenceEvent
from mdclient.frames import IcebergReader
from mdproto import contracts
from mdproto.messages import OHLC, CEPTriggerEvent, Tick
from mdproto.partitioning import partition_of
from mdproto.tables import Ohlc

pytestmark = [pytest.mark.e2e, pytest.mark.compose]

SERVICE = "live-engine"
#: Markets no other e2e test records, subscribed through the relay (model trades).
SYMBOLS = (
    "BTC/USDT",
    "ETH/USDT",
    "SOL/USDT",
    "BNB/USDT",
    "XRP/USDT",
    "ADA/USDT",
    "DOGE/USDT",
    "AVAX/USDT",
)
TICKERS = tuple(f"BINANCE:{s}" for s in SYMBOLS)
GROUP = f"live-engine.{contracts.KAFKA_TICKS}"
TOPICS = (contracts.KAFKA_TICKS, contracts.KAFKA_BOOK)
#: Issue 44: a dead engine's partitions are owned again within this.
REOWNED_WITHIN_S = 10.0
WAIT_S = 120.0
#: For the kill minute's candles in ``ohlc``: candles-store commits of ~200 candles (one
#: Iceberg partition per ticker) took up to 64 s each here at load 40; the minute was
#: whole 113 s after its end. Storage latency, not what this test judges.
STORED_WAIT_S = 300.0
MINUTE_MS = 60_000
#: Issue 44 item 7's load, over this many synthetic tickers.
LOAD_RATE = 10_000
LOAD_TICKERS = 200
#: Below this share of LOAD_RATE in the kill's minute the test did not test the load.
MIN_OFFERED = 0.95
#: The load starts this long before the kill's minute and stops this long after it.
LEAD_S, TAIL_S = 6.0, 2.0
#: A spawned producer's imports before its first trade.
SPAWN_S = 5.0
#: The kill comes this long into its minute: engines at load, most of the minute after.
KILL_AT_S = 5.0
#: The trigger's threshold: under every price of the load, under JUMP_PRICE.
THRESHOLD = 100_000


class Watch:
    """Every subscribed ticker's epochs (per message) and its sequence events."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.epochs: dict[str, list[int]] = defaultdict(list)
        self.events: list[SequenceEvent] = []

    def message(self, message: Tick | OHLC | Any) -> None:
        if isinstance(message, Tick | OHLC):
            with self.lock:
                seen = self.epochs[message.ticker]
                if not seen or seen[-1] != message.publisher_epoch:
                    seen.append(message.publisher_epoch)

    def sequence(self, event: SequenceEvent) -> None:
        with self.lock:
            self.events.append(event)

    def last_epoch(self, ticker: str) -> int | None:
        with self.lock:
            seen = self.epochs.get(ticker)
            return seen[-1] if seen else None

    def restarted(self, ticker: str) -> bool:
        with self.lock:
            return any(
                e.kind == "restart" and e.topic.startswith(f"{ticker}|") for e in self.events
            )


class Group:
    """The engines' consumer group as Kafka describes it; the last description is kept
    for the failure message (CI leaves nothing else to read)."""

    def __init__(self, admin: AdminClient) -> None:
        self.admin = admin
        self.last = "not described yet"

    def members(self) -> list[tuple[str, dict[str, set[int]]]]:
        """The group's members now: (host, topic -> partitions); [] while rebalancing."""
        [future] = self.admin.describe_consumer_groups([GROUP]).values()
        description = future.result(timeout=30)
        state = str(description.state).rsplit(".", 1)[-1].upper()
        out, seen = [], []
        for m in description.members:
            owned: dict[str, set[int]] = defaultdict(set)
            for tp in m.assignment.topic_partitions:
                owned[tp.topic].add(tp.partition)
            host = m.host.lstrip("/")
            out.append((host, dict(owned)))
            partitions = sorted((t, sorted(p)) for t, p in owned.items())
            seen.append(f"{host} ({m.client_id}) {partitions}")
        self.last = f"{state}: " + "; ".join(seen)
        return out if state == "STABLE" else []


def owners_when_covered(group: Group, count: int, partitions: int) -> dict[str, set[int]]:
    """Host -> its market.ticks partitions once `count` members own every partition, partition
    i of both topics by the same member (the range assignor's pairing); {} before."""
    now = group.members()
    if len(now) != count:
        return {}
    if any(owned.get(TOPICS[0], set()) != owned.get(TOPICS[1], set()) for _h, owned in now):
        return {}
    ticks = {host: owned.get(TOPICS[0], set()) for host, owned in now}
    return ticks if set().union(*ticks.values()) == set(range(partitions)) else {}


def container_ips(compose: ComposePlatform, service: str) -> dict[str, str]:
    """The service's running containers: IP on the compose network -> container id."""
    ids = compose.compose("ps", "--quiet", service, timeout_s=60).stdout.split()
    out = {}
    for cid in ids:
        ip = subprocess.run(
            [
                compose.docker,
                "inspect",
                "--format",
                "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                cid,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.strip()
        out[ip] = cid
    return out


def ticks_partitions(bootstrap: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "e2e-meta"})
    try:
        topic = consumer.list_topics(contracts.KAFKA_TICKS, timeout=30)
        return len(topic.topics[contracts.KAFKA_TICKS].partitions)
    finally:
        consumer.close()


def kill_minute_after(now_s: float) -> int:
    """The first minute (start, ms) the load can begin LEAD_S before, a producer's start
    (SPAWN_S) from `now_s`."""
    return math.ceil((now_s + SPAWN_S + LEAD_S) * 1000 / MINUTE_MS) * MINUTE_MS


def stored_load_minute(reader: IcebergReader, start_ms: int) -> dict[str, list[SentCandle]]:
    """Each synthetic ticker's 1-minute ``ohlc`` rows of the minute at `start_ms`, as
    SentCandles (order keys unused)."""
    table = reader.catalog().load_table(contracts.ICEBERG_OHLC)
    rows: pa.Table = table.scan(
        row_filter=f"{Ohlc.EXCHANGE} = '{EXCHANGE}' AND {Ohlc.PERIOD_SECONDS} = 60",
        selected_fields=(
            *(Ohlc.TICKER, Ohlc.OPEN_TIME, Ohlc.OPEN, Ohlc.HIGH, Ohlc.LOW, Ohlc.CLOSE),
            *(Ohlc.VOLUME, Ohlc.TRADE_COUNT),
        ),
    ).to_arrow()
    opened = pc.equal(rows[Ohlc.OPEN_TIME].cast(pa.int64()), start_ms * 1000)  # microseconds
    out: dict[str, list[SentCandle]] = defaultdict(list)
    for r in rows.filter(opened).to_pylist():
        values = (r[Ohlc.OPEN], r[Ohlc.HIGH], r[Ohlc.LOW], r[Ohlc.CLOSE], r[Ohlc.VOLUME])
        out[r[Ohlc.TICKER]].append(SentCandle(*values, r[Ohlc.TRADE_COUNT], (0, 0), (0, 0)))
    return dict(out)


def same(stored: SentCandle, sent: SentCandle) -> bool:
    """Count and OHLC exactly, volume up to float summation order."""
    exact = ("count", "open", "high", "low", "close")
    return all(getattr(stored, f) == getattr(sent, f) for f in exact) and math.isclose(
        stored.volume, sent.volume, rel_tol=1e-9
    )


def candle_faults(
    stored: dict[str, list[SentCandle]], sent: dict[str, SentCandle]
) -> dict[str, str]:
    """Ticker -> what is wrong with its stored candle ({}: each one stored once, right)."""
    faults = {}
    for ticker in sorted(set(stored) | set(sent)):
        rows, want = stored.get(ticker, []), sent.get(ticker)
        if want is None:
            faults[ticker] = f"stored {rows}, nothing sent"
        elif len(rows) != 1:
            faults[ticker] = f"{len(rows)} rows {rows}, sent {want}"
        elif not same(rows[0], want):
            faults[ticker] = f"stored {rows[0]}, sent {want}"
    return faults


@pytest.fixture
def three_engines(compose: ComposePlatform) -> Iterator[ComposePlatform]:
    """Two live-engine replicas beside the pipeline's engine; back to the default after."""
    compose.compose(
        "up", "--detach", "--no-deps", "--wait", "--scale", f"{SERVICE}=2", SERVICE, timeout_s=400
    )
    yield compose
    compose.compose(
        "up", "--detach", "--no-deps", "--wait", "--scale", f"{SERVICE}=1", SERVICE, timeout_s=400
    )


def test_a_killed_engine_s_partitions_move_with_no_candle_lost_or_doubled(
    three_engines: ComposePlatform, client_settings: ClientSettings, sim: SimulatorControl
) -> None:
    compose = three_engines
    began = time.time()
    bootstrap = compose.endpoints.kafka_bootstrap
    group = Group(AdminClient({"bootstrap.servers": bootstrap}))
    partitions = ticks_partitions(bootstrap)
    owners = poll_until(
        "three engines owning every partition",
        lambda: owners_when_covered(group, 3, partitions),
        WAIT_S,
        0.5,
        detail=lambda: f"the group last: {group.last}",
    )
    replicas = container_ips(compose, SERVICE)
    # The victim: a replica owning a subscribed market (its subscriber must resync).
    victims = [
        ip
        for ip in replicas
        if any(partition_of(t, partitions) in owners.get(ip, set()) for t in TICKERS)
    ]
    assert victims, (owners, replicas)
    victim_ip = victims[0]
    moved = [t for t in TICKERS if partition_of(t, partitions) in owners[victim_ip]]
    # The trigger's ticker: the hottest synthetic one the victim owns (200 cover all 6).
    jumping = next(
        t for t in load_tickers(LOAD_TICKERS) if partition_of(t, partitions) in owners[victim_ip]
    )
    watch = Watch()
    with Client(settings=client_settings) as client:
        streams = [
            client.live(
                t, ticks=True, ohlc=["1m"], callback=watch.message, on_sequence=watch.sequence
            )
            for t in TICKERS
        ]
        trigger = client.register_trigger(jumping, [f"above:{THRESHOLD}"], repeating=True)
        try:
            armed = trigger.wait_for(CEPTriggerEvent.ARMED, WAIT_S)
            assert armed is not None, "the trigger's owner never armed it"
            for symbol in SYMBOLS:
                sim.wait_for_subscribers(symbol, count=1, timeout_s=WAIT_S)
            poll_until(
                "a message of every moving market",
                lambda: all(watch.last_epoch(t) is not None for t in moved),
                WAIT_S,
                0.5,
            )
            kill_minute = kill_minute_after(time.time())
            spec = LoadSpec(
                bootstrap=bootstrap,
                topic=contracts.KAFKA_TICKS,
                tickers=LOAD_TICKERS,
                rate=LOAD_RATE,
                start_at=kill_minute / 1000 - LEAD_S,
                stop_at=(kill_minute + MINUTE_MS) / 1000 + TAIL_S,
                jump_ticker=jumping,
            )
            assert spec.minutes_inside() == [kill_minute]
            with TickLoad(spec) as load:
                poll_until(
                    "the kill's moment, the load flowing",
                    lambda: time.time() >= kill_minute / 1000 + KILL_AT_S and load.sent > 0,
                    WAIT_S,
                    0.2,
                )
                before = {t: watch.last_epoch(t) for t in moved}
                killed_at = time.monotonic()
                subprocess.run(
                    [compose.docker, "kill", "--signal", "KILL", replicas[victim_ip]],
                    capture_output=True,
                    text=True,
                    timeout=60,
                    check=True,
                )
                poll_until(
                    "the dead engine's partitions owned again",
                    lambda: owners_when_covered(group, 2, partitions),
                    WAIT_S,
                    0.2,
                    detail=lambda: f"the group last: {group.last}",
                )
                reowned_s = time.monotonic() - killed_at
                # CEP goes on: the moved ticker's trigger fires on its new owner.
                load.jump()
                fired = trigger.wait_for(CEPTriggerEvent.FIRED, WAIT_S)
                assert fired is not None, f"no FIRED for {jumping} after the kill"
                assert fired.values["price"] == JUMP_PRICE, fired
                # A moved market's subscriber sees another epoch and is told (restart).
                poll_until(
                    "a moved market's new epoch and restart",
                    lambda: any(
                        watch.last_epoch(t) != before[t] and watch.restarted(t) for t in moved
                    ),
                    WAIT_S,
                    0.5,
                )
                report = load.report(WAIT_S)

            sent = report.sent_candles.minute(kill_minute)
            offered = sum(c.count for c in sent.values()) / 60
            summary = (
                f"{offered:,.0f} trades/s offered in the kill's minute ({report.rate:,.0f}/s"
                f" over {report.ended - report.started:.0f} s, producer CPU"
                f" {report.cpu_s:.0f} s, from {report.started - began:.0f} s into the test),"
                f" owned again after {reowned_s:.1f} s"
            )
            print(summary)
            assert report.started <= kill_minute / 1000, f"the load started late: {summary}"
            assert offered >= MIN_OFFERED * LOAD_RATE, f"the load fell short: {summary}"
            assert report.failed == 0, f"{report.failed} trades not delivered to Kafka"

            reader = client.reader()
            end = kill_minute + MINUTE_MS

            def settled() -> bool:
                stored = stored_load_minute(reader, kill_minute)
                return all(
                    len(stored.get(t, [])) == 1 and stored[t][0].count == c.count
                    for t, c in sent.items()
                )

            with contextlib.suppress(AssertionError):  # the comparison below says what differs
                poll_until("the kill minute's candles in ohlc", settled, STORED_WAIT_S, 2.0)
            faults = candle_faults(stored_load_minute(reader, kill_minute), sent)
            assert faults == {}, f"{len(faults)} of {len(sent)} candles wrong: {faults}"
            print(f"{len(sent)} candles right {time.time() - end / 1000:.0f} s after the minute")

            want = {
                t: len(sim.trades(s, kill_minute, end - 1))
                for t, s in zip(TICKERS, SYMBOLS, strict=True)
            }

            def model_counts() -> dict[str, list[int]]:
                counts = {
                    t: reader.read_ohlc(contracts.ICEBERG_OHLC, t, 60, kill_minute, end)
                    .column("trade_count")
                    .to_pylist()
                    for t in TICKERS
                }
                return counts if all(counts.values()) else {}

            counts = poll_until(
                "the kill minute's market candles", model_counts, STORED_WAIT_S, 2.0
            )
            assert counts == {t: [want[t]] for t in TICKERS}, (counts, want, moved)
            # Once: a second FIRED would be here by now (every trade of the minute is stored).
            again = [e for e in iter(lambda: trigger.get(0), None) if e.kind == fired.kind]
            assert again == [], again
        finally:
            with contextlib.suppress(Exception):  # cleanup: the assertions matter more
                client.cancel_trigger(trigger.trigger_id)
            trigger.close()
            for stream in streams:
                stream.close()
    assert reowned_s <= REOWNED_WITHIN_S, f"owned again after {reowned_s:.1f} s"
