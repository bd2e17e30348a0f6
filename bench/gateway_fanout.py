"""Gateway fan-out and added latency vs direct ZeroMQ subscribers of the relay.

    publisher process: XPUB bound, sequenced `Tick` envelopes (the pipeline's PUB role)
        -> relay process (the real Relay)
        -> direct: one process with N SUB sockets on the relay's :5558 (the baseline)
        -> gateway: the gateway process (one SDK live stream) -> N WebSocket clients
           in one asyncio process

Each message carries its send time (CLOCK_MONOTONIC, shared by the processes) in
`trade_id`. Two phases per mode and client count:

- throughput: `--messages` published as fast as the publisher can; messages/s =
  messages delivered to all N clients / time from the first send to the last
  receipt; losses (gateway queue drops, none at the relay: HWMs unlimited) counted;
- latency: `--paced` messages at `--rate`/s, one-way publisher -> client, p50/p99;
  the ratio is gateway / direct at the same N.

Clients are Python in both modes, and on a 2-core machine every process shares the
cores, so absolute figures are lower bounds; the ratio is the result.

Run: .venv/bin/python bench/gateway_fanout.py [--clients 1,10,100] [--messages 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import statistics
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event

import zmq

from infra.testing import free_port
from mdproto import envelope, topics
from mdproto.messages import Tick

TICKER = "BINANCE:BTC/USDT"
TOPIC = topics.tick_topic(TICKER)


def publisher(port: int, subscribed: Event, go: Event, todo: Connection) -> None:
    """Per job (count, rate): send `count` Ticks after `go`; numbered across jobs."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.sndhwm = 0
    pub.setsockopt(zmq.XPUB_VERBOSE, 1)
    pub.bind(f"tcp://127.0.0.1:{port}")
    sequence = 0
    epoch = time.time_ns() // 1000
    poller = zmq.Poller()
    poller.register(pub, zmq.POLLIN)
    while True:
        while not todo.poll(0.05):  # answer subscriptions meanwhile
            while poller.poll(0):
                if pub.recv()[1:] == TOPIC.encode():
                    subscribed.set()
        job = todo.recv()
        if job is None:
            return
        count, rate = job
        go.wait()
        interval = 1.0 / rate if rate > 0 else 0.0
        next_t = time.perf_counter()
        for _ in range(count):
            sequence += 1
            tick = Tick(
                ticker=TICKER,
                trade_id=str(time.monotonic_ns()),
                price=1.0,
                sequence=sequence,
                publisher_epoch=epoch,
            )
            pub.send_multipart(envelope.encode_pub(TOPIC, tick))
            if interval:
                next_t += interval
                while time.perf_counter() < next_t:
                    pass
        todo.send(count)


def relay_process(upstream: str, ready: Connection, stop: Event) -> None:
    from relay import Relay, RelaySettings

    relay = Relay(RelaySettings.loopback(upstream, high_water_mark=0))
    endpoints = relay.start()
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    ready.send((endpoints.client_request, endpoints.market_data))
    stop.wait()
    relay.stop()
    thread.join(5)
    relay.close()


def gateway_process(port: int, request: str, market: str, stop: Event) -> None:
    from gateway.config import GatewaySettings
    from gateway.server import GatewayThread
    from mdclient import ClientSettings

    client = ClientSettings(request_endpoint=request, market_data_endpoint=market)
    settings = GatewaySettings(port=port, client_queue_size=1_000_000)
    with GatewayThread(settings, client):
        stop.wait()


@dataclass
class Received:
    count: int
    first_ns: int
    last_ns: int
    latencies_us: list[float]


def direct_clients(market: str, n: int, expect: int, ready: Event, out: Connection) -> None:
    """N SUB sockets on the relay; decode each message as the SDK would."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    socks = []
    for _ in range(n):
        sub = ctx.socket(zmq.SUB)
        sub.rcvhwm = 0
        sub.connect(market)
        sub.subscribe(TOPIC)
        socks.append(sub)
    poller = zmq.Poller()
    for sub in socks:
        poller.register(sub, zmq.POLLIN)
    time.sleep(0.5)  # the slow joiner: subscriptions travel relay -> publisher (bench only)
    ready.set()
    got, lat, first, last = 0, [], 0, 0
    deadline = time.monotonic() + 120
    while got < expect * n and time.monotonic() < deadline:
        for sock, _ in poller.poll(1000):
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                now = time.monotonic_ns()
                _topic, tick = envelope.decode_sub(frames)
                assert isinstance(tick, Tick)
                lat.append((now - int(tick.trade_id)) / 1000)
                first = first or now
                last = now
                got += 1
    out.send(Received(got, first, last, lat))
    ctx.destroy(linger=0)


def ws_clients(url: str, n: int, expect: int, ready: Event, out: Connection) -> None:
    """N WebSocket clients of the gateway, each subscribed to the tick topic."""
    import aiohttp

    async def run() -> Received:
        lat: list[float] = []
        stamps = [0, 0]
        counts = [0]
        async with aiohttp.ClientSession() as http:
            sockets = [await http.ws_connect(f"{url}/ws", max_msg_size=0) for _ in range(n)]
            for ws in sockets:
                await ws.send_json({"op": "subscribe", "topic": TOPIC})
            for ws in sockets:
                while json.loads(await ws.receive_str())["type"] != "subscribed":
                    pass
            ready.set()

            async def read(ws: aiohttp.ClientWebSocketResponse) -> None:
                mine = 0
                while mine < expect:
                    frame = json.loads(await ws.receive_str())
                    if frame["type"] != "message":
                        continue
                    now = time.monotonic_ns()
                    lat.append((now - int(frame["data"]["trade_id"])) / 1000)
                    stamps[0] = stamps[0] or now
                    stamps[1] = now
                    mine += 1
                    counts[0] += 1

            await asyncio.wait([asyncio.create_task(read(ws)) for ws in sockets], timeout=120)
            for ws in sockets:
                await ws.close()
        return Received(counts[0], stamps[0], stamps[1], lat)

    out.send(asyncio.run(run()))


@dataclass
class Result:
    mode: str
    clients: int
    delivered: int
    expected: int
    msgs_per_s: float
    p50_us: float
    p99_us: float


def measure(mode: str, n: int, args: argparse.Namespace, env: dict[str, object]) -> Result:
    jobs: Connection = env["jobs"]  # type: ignore[assignment]
    out: dict[str, Received] = {}
    for phase, count, rate in (
        ("throughput", args.messages, 0.0),
        ("latency", args.paced, args.rate),
    ):
        ready = mp.Event()
        recv, send = mp.Pipe(duplex=False)
        target = direct_clients if mode == "direct" else ws_clients
        where = env["market"] if mode == "direct" else env["gateway"]
        proc = mp.Process(target=target, args=(where, n, count, ready, send))
        proc.start()
        if not ready.wait(60):
            raise RuntimeError(f"{mode} clients not ready")
        go: Event = env["go"]  # type: ignore[assignment]
        go.clear()
        t0 = time.monotonic_ns()
        jobs.send((count, rate))
        go.set()
        out[phase] = recv.recv()
        jobs.recv()
        proc.join(30)
        out[phase].first_ns = t0
    thr, lat = out["throughput"], out["latency"]
    seconds = (thr.last_ns - thr.first_ns) / 1e9 or float("nan")
    latencies = sorted(lat.latencies_us)
    p99 = latencies[int(len(latencies) * 0.99) - 1] if latencies else float("nan")
    return Result(
        mode,
        n,
        thr.count,
        args.messages * n,
        thr.count / seconds,
        statistics.median(latencies) if latencies else float("nan"),
        p99,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,10,100")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--paced", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=200.0)
    args = parser.parse_args()
    pub_port, gw_port = free_port(), free_port()
    subscribed, go, stop = mp.Event(), mp.Event(), mp.Event()
    jobs, pub_end = mp.Pipe()
    pub = mp.Process(target=publisher, args=(pub_port, subscribed, go, pub_end), daemon=True)
    pub.start()
    relay_recv, relay_send = mp.Pipe(duplex=False)
    relay = mp.Process(
        target=relay_process, args=(f"tcp://127.0.0.1:{pub_port}", relay_send, stop), daemon=True
    )
    relay.start()
    request, market = relay_recv.recv()
    gateway = mp.Process(target=gateway_process, args=(gw_port, request, market, stop), daemon=True)
    gateway.start()
    env: dict[str, object] = {
        "jobs": jobs,
        "go": go,
        "market": market,
        "gateway": f"http://127.0.0.1:{gw_port}",
    }
    import urllib.request

    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{gw_port}/healthz", timeout=2).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    results = []
    for n in (int(x) for x in args.clients.split(",")):
        for mode in ("direct", "gateway"):
            results.append(measure(mode, n, args, env))
            r = results[-1]
            print(
                f"{r.mode:8} clients {r.clients:4}: {r.delivered}/{r.expected} delivered, "
                f"{r.msgs_per_s:,.0f} msg/s, p50 {r.p50_us:,.0f} us, p99 {r.p99_us:,.0f} us",
                flush=True,
            )
    print(
        "\n| clients | direct msg/s | gateway msg/s | ratio | direct p50 / p99 ms | "
        "gateway p50 / p99 ms | latency ratio (p50) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for direct, gw in zip(results[::2], results[1::2], strict=True):
        print(
            f"| {direct.clients} | {direct.msgs_per_s:,.0f} | {gw.msgs_per_s:,.0f} | "
            f"{gw.msgs_per_s / direct.msgs_per_s:.2f}x | {direct.p50_us / 1000:.2f} / "
            f"{direct.p99_us / 1000:.2f} | {gw.p50_us / 1000:.2f} / {gw.p99_us / 1000:.2f} | "
            f"{gw.p50_us / direct.p50_us:.1f}x |"
        )
    jobs.send(None)
    stop.set()
    gateway.join(10)
    relay.join(10)


if __name__ == "__main__":
    main()
