"""Order books through the whole platform, side by side with a bare websocket -> ZeroMQ bridge.

Platform path: exchange simulator (Binance depth stream) -> ingestor (ccxt.pro
book, deltas) -> Kafka `market.book` -> pipeline live engine -> PUB -> relay ->
SDK `Client.book` (BookStream: sequence checks, applied to its OrderBook).
Baseline: a bare Python process reading the same simulator's depth websocket
and publishing each message on a ZeroMQ PUB, read by a plain SUB (JSON parsed
for the event time, nothing else). Both watch the same markets at the same time,
so they see the same exchange events, each under the other's load (the
platform's is most of it).

Per path: deltas/s delivered to the client (platform: BookDeltas applied to the
SDK's book; baseline: depth messages received), next to the events/s the
simulator sent (one per watched market per event; the ingestor may merge
several into one delta: ccxt hands it the book as it is when it asks), and the
client-side update latency: wall clock when the client's book was updated (the
SDK's callback, after applying) or the SUB received the message, minus the
exchange's event time (Binance `E`, the simulator's wall clock on this
machine). Lost messages: the SDK's book events (gaps, resets).

Two phases in one run:

- `natural`: the simulator's own pace, a book event per market every 100 ms
  (`--markets` markets: up to 120 events/s); latency and deltas/s.
- `burst`: the simulator's clock is pushed on 100 ms (one book step) per
  `POST /_sim/clock` as fast as it answers, for `--burst-seconds`: each push is
  an event per market, many times the natural rate; deltas/s only (event times
  then run ahead of the wall clock: no latency). Last, since the simulator's
  clock stays ahead afterwards.

The whole platform starts like `make run` on free ports (infra.platform, with
the simulator), never on the fixed ports. A quiet machine is needed for figures
(docs/pipeline-benchmarks.md, "Order books through the platform").

    .venv/bin/python bench/book_platform.py [--markets 12] [--seconds 60]
        [--burst-seconds 30] [--warmup 10] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.queues import Queue
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from pathlib import Path

import zmq
from pipeline_common import percentile, workdir

from infra.exchange_sim import DEFAULT_MODEL
from infra.exchange_sim.control import SimulatorControl
from infra.localstack import Ports, StackConfig
from infra.platform import Platform, PlatformConfig, ServicePorts
from infra.testing import free_port

#: What the readers record into (`phase.value`): 0 warm-up (nothing), then each phase.
WARMUP, NATURAL, BURST, DONE = 0, 1, 2, 3
PHASES = {NATURAL: "natural", BURST: "burst"}
STEP_MS = 100  # one book step of the simulator (infra/exchange_sim/books.py)


PLATFORM, BRIDGE = "platform -> SDK", "bridge -> SUB"


@dataclass
class Sample:
    """What one reader saw in one phase."""

    updates: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    events: Counter[str] = field(default_factory=Counter)


#: (path, its samples by phase, or why it could not measure)
Result = tuple[str, dict[int, Sample] | str]


def pick_symbols(count: int) -> list[str]:
    """The simulator's markets that are listed now, in its model's order (liquid first)."""
    now_ms = int(time.time() * 1000)
    listed = [s.symbol for s in DEFAULT_MODEL.specs.values() if s.trading_at(now_ms)]
    if count > len(listed):
        raise SystemExit(f"the simulator lists {len(listed)} markets; asked for {count}")
    return listed[:count]


# ------------------------------------------------------------------ platform path


def platform_reader(
    client_env: dict[str, str],
    tickers: list[str],
    phase: Synchronized[int],
    ready: Event,
    out: Queue[Result],
) -> None:
    """`Client.book` of every ticker; a sample per BookDelta the SDK applied."""
    from mdclient import Client, ClientSettings
    from mdclient.book import BookEvent, BookMessage
    from mdproto.messages import BookDelta

    settings = ClientSettings.model_validate(
        {k.removeprefix("MDCLIENT_").lower(): v for k, v in client_env.items()}
    )
    samples = {p: Sample() for p in PHASES}

    def on_book(message: BookMessage) -> None:
        sample = samples.get(phase.value)
        if sample is None or not isinstance(message, BookDelta):
            return
        sample.updates += 1
        if message.exchange_time_ms:
            sample.latencies_ms.append(time.time_ns() / 1e6 - message.exchange_time_ms)

    def on_event(event: BookEvent) -> None:
        sample = samples.get(phase.value)
        if sample is not None:
            sample.events[event.kind] += 1

    with Client(settings=settings, client_id="bench-books") as client:
        streams = [client.book(t, callback=on_book, on_event=on_event) for t in tickers]
        missing = [s.ticker for s in streams if not s.wait_synced(600)]
        if missing:
            out.put((PLATFORM, f"no book within 600 s for {missing}"))
            return
        ready.set()
        while phase.value != DONE:
            time.sleep(0.1)
        for stream in streams:
            stream.close()
    out.put((PLATFORM, samples))


# ------------------------------------------------------------------ baseline path


def bridge(ws_url: str, endpoint: str, ready: Event) -> None:
    """The bare baseline: each websocket text message published as is on a PUB."""
    import asyncio

    import aiohttp

    async def run() -> None:
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.SNDHWM, 0)
        pub.bind(endpoint)
        async with aiohttp.ClientSession() as session, session.ws_connect(ws_url) as ws:
            ready.set()
            async for message in ws:
                if message.type == aiohttp.WSMsgType.TEXT:
                    pub.send_multipart([b"book", message.data.encode()])

    asyncio.run(run())


def bridge_reader(
    endpoint: str, phase: Synchronized[int], ready: Event, out: Queue[Result]
) -> None:
    """A plain SUB: a sample per depth message (its event time read, nothing applied)."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    samples = {p: Sample() for p in PHASES}
    first = True
    while phase.value != DONE:
        if not sub.poll(100):
            continue
        _topic, payload = sub.recv_multipart()
        now_ms = time.time_ns() / 1e6
        if first:  # the bridge is connected and the simulator streams
            ready.set()
            first = False
        sample = samples.get(phase.value)
        if sample is None:
            continue
        event = json.loads(payload)
        event = event.get("data", event)  # combined stream: {"stream", "data"}
        if event.get("e") == "depthUpdate":
            sample.updates += 1
            sample.latencies_ms.append(now_ms - event["E"])
    out.put((BRIDGE, samples))
    ctx.destroy(linger=0)


# ------------------------------------------------------------------ the run


def burst(sim: SimulatorControl, seconds: float) -> int:
    """Push the simulator's clock a book step at a time for `seconds`; returns pushes."""
    pushes = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sim.advance_time(STEP_MS)
        pushes += 1
    return pushes


def row(path: str, phase: int, sample: Sample, seconds: float, offered: float) -> str:
    rate = sample.updates / seconds
    lat = sample.latencies_ms
    latency = (
        f"{percentile(lat, 50):.1f} | {percentile(lat, 99):.1f} | {max(lat):.1f}"
        if lat and phase == NATURAL
        else "- | - | -"
    )
    events = ", ".join(f"{k} {v}" for k, v in sorted(sample.events.items())) or "-"
    return (
        f"| {PHASES[phase]} | {path} | {offered:,.0f} | {rate:,.0f} | {rate / offered:.2f} "
        f"| {latency} | {events} |"
    )


def run(args: argparse.Namespace) -> None:
    symbols = pick_symbols(args.markets)
    tickers = [f"BINANCE:{s}" for s in symbols]
    with workdir(args.workdir) as tmp:
        measure(args, symbols, tickers, Path(tmp))


def measure(
    args: argparse.Namespace, symbols: list[str], tickers: list[str], data_dir: Path
) -> None:
    config = PlatformConfig(data_dir=data_dir, ports=ServicePorts.free())
    stack_config = StackConfig(data_dir=data_dir, ports=Ports.free())
    ctx = mp.get_context("spawn")
    phase: Synchronized[int] = ctx.Value("i", WARMUP, lock=False)
    results: Queue[Result] = ctx.Queue()
    started = time.monotonic()
    load = os.getloadavg()
    with Platform(config, stack_config=stack_config, use_simulator=True) as platform:
        print(f"platform up in {time.monotonic() - started:.0f} s ({data_dir})", flush=True)
        assert platform.endpoints.exchange_url is not None
        sim = SimulatorControl(platform.endpoints.exchange_url)
        streams = "/".join(
            f"{DEFAULT_MODEL.spec(s).binance_id.lower()}@depth@100ms" for s in symbols
        )
        ws_url = (
            platform.endpoints.exchange_url.replace("http", "ws", 1) + f"/stream?streams={streams}"
        )
        endpoint = f"tcp://127.0.0.1:{free_port()}"
        ready = [ctx.Event() for _ in range(3)]
        processes = [
            ctx.Process(target=bridge, args=(ws_url, endpoint, ready[0]), daemon=True),
            ctx.Process(target=bridge_reader, args=(endpoint, phase, ready[1], results)),
            ctx.Process(
                target=platform_reader,
                args=(platform.endpoints.client_env(), tickers, phase, ready[2], results),
            ),
        ]
        for process in processes:
            process.start()
        try:
            began = time.monotonic()
            for event, what in zip(ready, ("bridge", "bridge SUB", "platform books"), strict=True):
                if not event.wait(max(1.0, 900 - (time.monotonic() - began))):
                    raise SystemExit(f"{what} not ready within 900 s")
            print(f"{len(tickers)} books live in {time.monotonic() - began:.0f} s", flush=True)
            time.sleep(args.warmup)  # not measured: caches warm, periodic snapshots settle
            offered: dict[int, float] = {}
            durations: dict[int, float] = {}
            for current in (NATURAL, BURST):
                seconds = args.seconds if current == NATURAL else args.burst_seconds
                if seconds <= 0:
                    continue
                before = sim.stats()["ws"]["book_events"]
                t0 = time.monotonic()
                phase.value = current
                if current == BURST:
                    pushes = burst(sim, seconds)
                    print(
                        f"burst: {pushes / seconds:,.0f} clock pushes/s (each computes a book "
                        "step per market: the simulator's CPU bounds the rate)",
                        flush=True,
                    )
                else:
                    time.sleep(seconds)
                phase.value = WARMUP
                durations[current] = time.monotonic() - t0
                offered[current] = (sim.stats()["ws"]["book_events"] - before) / durations[current]
                time.sleep(2.0)  # what was sent in the phase but is still on its way is not counted
            phase.value = DONE
            got = dict(results.get(timeout=120) for _ in range(2))
        finally:
            phase.value = DONE
            for process in processes:
                process.join(10)
                if process.is_alive():
                    process.terminate()
    errors = [f"{path}: {g}" for path, g in got.items() if isinstance(g, str)]
    if errors:
        raise SystemExit("; ".join(errors))
    print()
    print(
        f"{len(tickers)} markets, natural {args.seconds:g} s, burst {args.burst_seconds:g} s, "
        f"{time.strftime('%Y-%m-%d')}, load average {load[0]:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end"
    )
    print(
        "| phase | path | events/s sent | deltas/s delivered | delivered/sent "
        "| p50 ms | p99 ms | max ms | book events |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for current in durations:
        for path in (PLATFORM, BRIDGE):
            samples = got[path]
            assert not isinstance(samples, str)
            print(row(path, current, samples[current], durations[current], offered[current]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--markets", type=int, default=12, help="Binance markets of the simulator")
    parser.add_argument("--seconds", type=float, default=60.0, help="the natural phase")
    parser.add_argument("--burst-seconds", type=float, default=30.0, help="0: no burst phase")
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--workdir", type=Path, help="keep the platform's data and logs here")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
