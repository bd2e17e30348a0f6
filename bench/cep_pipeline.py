"""CEP through the whole platform: latency and the cost of 10,000 triggers on one ticker.

Starts the platform locally (like `make run`: simulator, relay, ingestor,
pipeline on free ports), then:

latency     a repeating `above:10` trigger on XYZ/USDT; each round injects a trade
            at 5 then one at 11 into the exchange simulator and times the 11's
            injection -> FIRED event at the client (simulator websocket ->
            ingestor -> Kafka -> live engine (CEP) -> PUB -> relay -> client).
throughput  ticks produced straight into Kafka `market.ticks` for BINANCE:BENCH/USDT
            (bypassing the ingestor, which would be the bottleneck), followed by a
            tick on another ticker that fires a sentinel trigger; ticks/s = ticks /
            (first produce -> sentinel event). Run with 0 triggers on BENCH, then
            with N (default 10,000) registered on it through the relay, side by
            side; also the CEP runner's own time per 1,000 ticks, from the
            pipeline's log (the rest is Spark's micro-batch overhead).

    .venv/bin/python bench/cep_pipeline.py [--rounds 30] [--ticks 20000] [--triggers 10000]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Producer

from infra.exchange_sim.control import SimulatorControl
from infra.localstack import Ports, StackConfig
from infra.platform import Platform, PlatformConfig, ServicePorts
from mdclient import Client, ClientSettings
from mdclient.triggers import TriggerEvents
from mdproto import contracts, envelope
from mdproto.messages import CEPCondition, CEPTriggerEvent, Tick

SYMBOL = "XYZ/USDT"
BENCH = "BINANCE:BENCH/USDT"
SENTRY = "BINANCE:SENTRY/USDT"
TOTALS = re.compile(r"cep totals: \d+ batches, (\d+) ticks, \d+ events, runner (\d+) ms")
WAIT_S = 120.0


def latency(client: Client, sim: SimulatorControl, rounds: int) -> list[float]:
    ticker = f"BINANCE:{SYMBOL}"
    out: list[float] = []
    with client.live(ticker, ticks=True):
        sim.wait_for_subscribers(SYMBOL, count=1, timeout_s=WAIT_S)
        with client.register_trigger(ticker, ["above:10"], repeating=True) as events:
            assert events.wait_for(CEPTriggerEvent.ARMED, WAIT_S) is not None
            for _ in range(rounds):
                sim.inject_trades(SYMBOL, [{"price": "5", "qty": "1"}])
                started = time.perf_counter()
                sim.inject_trades(SYMBOL, [{"price": "11", "qty": "1"}])
                fire = events.wait_for(CEPTriggerEvent.FIRED, WAIT_S)
                assert fire is not None, "no FIRED event"
                out.append((time.perf_counter() - started) * 1000)
            client.cancel_trigger(events.trigger_id)
    return out


def register_many(client: Client, count: int) -> TriggerEvents:
    """`count` triggers on BENCH, mostly far from firing; returns their event stream."""
    rng = random.Random(5)
    kinds = [
        lambda: f"above:{100 * (1 + rng.uniform(0.05, 0.2)):.4f}",
        lambda: f"below:{100 * (1 - rng.uniform(0.05, 0.2)):.4f}",
        lambda: f"pct:{rng.uniform(10, 50):.2f}@{rng.choice(['60s', '300s'])}",
        lambda: f"volume:{rng.uniform(1e6, 1e7):.0f}@{rng.choice(['60s', '300s'])}",
    ]
    ids = [f"bench-{i}" for i in range(count)]
    events = client.trigger_events()  # RESPONSE:{client_id}: every trigger of this client
    for trigger_id in ids:
        client.add_trigger(
            BENCH, [rng.choice(kinds)()], trigger_id=trigger_id, repeating=rng.random() < 0.5
        )
    wanted = set(ids)
    armed = 0
    deadline = time.monotonic() + 600
    while armed < count and time.monotonic() < deadline:
        event = events.get(timeout_s=5)
        if event is not None and event.kind == CEPTriggerEvent.ARMED and event.trigger_id in wanted:
            armed += 1
    assert armed == count, f"only {armed} of {count} triggers armed"
    return events


def _totals(log_file: Path) -> tuple[int, float]:
    """(ticks, runner ms) of the pipeline's last `cep totals` line (every 10 s)."""
    found = TOTALS.findall(log_file.read_text(errors="replace"))
    return (int(found[-1][0]), float(found[-1][1])) if found else (0, 0.0)


def _totals_after(
    log_file: Path, ticks: int, nudge: Callable[[], None], timeout_s: float = 60.0
) -> tuple[int, float]:
    """The first `cep totals` line counting `ticks`. The live engine writes one with
    a poll that brings ticks, at most every 10 s: `nudge` sends one tick a second."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        totals = _totals(log_file)
        if totals[0] >= ticks:
            return totals
        nudge()
        time.sleep(1.0)
    raise RuntimeError(f"the pipeline never logged {ticks} CEP ticks")


def throughput(client: Client, bootstrap: str, ticks: int, log_file: Path) -> tuple[float, float]:
    """(ticks/s end to end, runner ms per 1,000 ticks) for `ticks` BENCH ticks.

    The sentinel trigger watches another ticker, whose tick is produced after every
    BENCH tick is in Kafka, so the BENCH triggers never see it.
    """
    sentinel_id = f"sentinel-{time.time_ns()}"
    condition = CEPCondition(kind=CEPCondition.PRICE_ABOVE, threshold=1000.0)
    with client.register_trigger(SENTRY, [condition], trigger_id=sentinel_id) as sentinel:
        assert sentinel.wait_for(CEPTriggerEvent.ARMED, WAIT_S) is not None
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
        rng = random.Random(9)
        now = int(time.time() * 1000)
        before = _totals(log_file)  # the query idles between runs: still current
        started = time.perf_counter()
        price = 100.0

        def send(ticker: str, trade_id: str, price: float, t: int) -> None:
            tick = Tick(
                ticker=ticker,
                trade_id=trade_id,
                price=price,
                amount=rng.expovariate(1.0),
                timestamp_ms=t,
            )
            while True:
                try:
                    producer.produce(
                        contracts.KAFKA_TICKS,
                        key=ticker.encode(),
                        value=envelope.encode_record(tick),
                    )
                    producer.poll(0)
                    return
                except BufferError:
                    producer.poll(0.05)

        for i in range(ticks):
            price *= 1 + rng.gauss(0, 0.0002)
            send(BENCH, f"{now}-{i}", price, now + i)
        producer.flush(60)  # every BENCH tick is in Kafka before the sentinel's
        send(SENTRY, f"{now}-s0", 100.0, now + ticks)
        send(SENTRY, f"{now}-s1", 2000.0, now + ticks + 1)
        producer.flush(60)
        fire = sentinel.wait_for(CEPTriggerEvent.FIRED, 600)
        assert fire is not None, "the sentinel never fired"
        elapsed = time.perf_counter() - started

        def nudge() -> None:  # below the sentinel's threshold: fires nothing
            send(SENTRY, f"{now}-n{time.time_ns()}", 100.0, int(time.time() * 1000))
            producer.flush(5)

        after = _totals_after(log_file, before[0] + ticks + 2, nudge)
    seen, ms = after[0] - before[0], after[1] - before[1]
    return ticks / elapsed, ms / seen * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--ticks", type=int, default=20_000)
    parser.add_argument("--triggers", type=int, default=10_000)
    args = parser.parse_args()
    data_dir = Path(tempfile.mkdtemp(prefix="bench-cep-"))
    config = PlatformConfig(
        data_dir=data_dir,
        ports=ServicePorts.free(),
        service_env={
            "RELAY_CLIENT_RATE_LIMIT": "0",
            # BENCH/USDT and SENTRY/USDT exist only in Kafka (no exchange lists them):
            # the relay must not refuse them as bad_symbol.
            "RELAY_KAFKA__TOPIC_MARKETS": "",
            "PIPELINE_LIVE__WATERMARK_S": "2",
        },
    )
    stack_config = StackConfig(data_dir=data_dir, ports=Ports.free())
    with Platform(config, stack_config=stack_config, use_simulator=True) as platform:
        endpoints = platform.endpoints
        env = endpoints.client_env()
        settings = ClientSettings.model_validate(
            {k.removeprefix("MDCLIENT_").lower(): v for k, v in env.items()}
        )
        assert endpoints.exchange_url is not None
        sim = SimulatorControl(endpoints.exchange_url)
        bootstrap = endpoints.stack.kafka_bootstrap
        with Client(settings=settings, client_id="bench-cep") as client:
            samples = latency(client, sim, args.rounds)
            samples.sort()
            p95 = samples[max(0, round(0.95 * len(samples)) - 1)]
            print(
                f"latency over {len(samples)} rounds: p50 {statistics.median(samples):.0f} ms, "
                f"p95 {p95:.0f} ms, min {samples[0]:.0f} ms, max {samples[-1]:.0f} ms",
                flush=True,
            )
            log_file = data_dir / "logs" / "spark-pipeline.log"
            throughput(client, bootstrap, 2_000, log_file)  # warm-up: JIT, Python workers
            base, base_ms = throughput(client, bootstrap, args.ticks, log_file)
            print(
                f"throughput, 0 triggers on the ticker: {base:,.0f} ticks/s "
                f"(runner {base_ms:.1f} ms per 1,000 ticks)",
                flush=True,
            )
            started = time.perf_counter()
            events = register_many(client, args.triggers)
            print(
                f"registered and armed {args.triggers:,} triggers in "
                f"{time.perf_counter() - started:.1f} s",
                flush=True,
            )
            loaded, loaded_ms = throughput(client, bootstrap, args.ticks, log_file)
            events.close()
            print(
                f"throughput, {args.triggers:,} triggers on the ticker: {loaded:,.0f} ticks/s "
                f"(ratio {loaded / base:.2f}; runner {loaded_ms:.1f} ms per 1,000 ticks)",
                flush=True,
            )
            print(f"load average at the end: {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main()
