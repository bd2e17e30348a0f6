"""Fan-out through the relay vs a bare `zmq.proxy` between the same sockets.

    publisher process: XPUB bound (the pipeline's PUB role)
        -> host process: XSUB <== proxy ==> XPUB   (bare zmq.proxy, or the whole Relay)
        -> subscriber process: 1 or 10 SUB sockets

For each payload size (64 B, 1 KiB) and subscriber count (1, 10), bare and
relay runs alternate, `--reps` times each, and the medians are compared:

- throughput: messages published / time until every subscriber had them all
  (HWMs unlimited in both setups, so nothing is dropped; counts are checked);
- host CPU per message: process CPU of the host (proxy thread, libzmq I/O
  thread, and for the relay its Python loop) divided by messages published;
- latency: one-way publisher -> subscriber at a paced rate (CLOCK_MONOTONIC is
  shared by the processes), p50 and p99.

The endpoints are Python, so on a 2-core machine they, not the proxy, bound
the throughput; CPU per message isolates the cost of the forwarding itself.

`--curve` compares the relay with CURVE off and on instead (end to end only: the
subscribers hold allow-listed keys; every message is encrypted once per subscriber).

Run: .venv/bin/python bench/relay_fanout.py [--reps 3] [--messages 100000] [--curve]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import multiprocessing as mp
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any, Protocol

import zmq
import zmq.auth

from infra.testing import free_port

TOPIC = b"BINANCE:BTC/USDT|tick"
VERSION = b"\x01"
WARMUP = b"W"
END = b"E"
DATA = b"D"


# --- processes ---------------------------------------------------------------


def publisher(port: int, go: Event, count: int, size: int, rate: float) -> None:
    """Send `count` messages after `go` (as fast as possible, or paced at `rate`/s)."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.sndhwm = 0
    pub.bind(f"tcp://127.0.0.1:{port}")
    while pub.recv()[1:] != TOPIC:  # the subscription came through the proxy
        pass
    while not go.is_set():  # warm-up until every subscriber has seen a message
        pub.send_multipart([TOPIC, VERSION, WARMUP])
        time.sleep(0.005)
    pad = b"x" * max(0, size - 9)
    body = DATA + pad
    if rate <= 0:
        frames = [TOPIC, VERSION, body]
        for _ in range(count):
            pub.send_multipart(frames)
    else:
        interval = 1.0 / rate
        next_t = time.perf_counter()
        for _ in range(count):
            next_t += interval
            delay = next_t - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            stamp = struct.pack("=q", time.perf_counter_ns())
            pub.send_multipart([TOPIC, VERSION, DATA + stamp + pad])
    for _ in range(50):
        pub.send_multipart([TOPIC, VERSION, END])
        time.sleep(0.01)
    pub.close(linger=1000)
    ctx.term()


def subscriber(
    endpoint: str,
    n: int,
    ready: Event,
    results: Any,
    timed: bool,
    curve: tuple[bytes, bytes, bytes] | None = None,  # public, secret, server public
) -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    socks = []
    poller = zmq.Poller()
    for _ in range(n):
        s = ctx.socket(zmq.SUB)
        s.rcvhwm = 0
        if curve is not None:
            s.curve_publickey, s.curve_secretkey, s.curve_serverkey = curve
        s.connect(endpoint)
        s.subscribe(TOPIC)
        poller.register(s, zmq.POLLIN)
        socks.append(s)
    warm: set[int] = set()
    counts = [0] * n
    done: set[int] = set()
    latencies: list[int] = []
    first = last = 0.0
    while len(done) < n:
        for sock, _ in poller.poll(30_000):
            i = socks.index(sock)
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                kind = frames[2][:1]
                if kind == DATA:
                    last = time.perf_counter()
                    first = first or last
                    counts[i] += 1
                    if timed and i == 0:
                        sent = struct.unpack("=q", frames[2][1:9])[0]
                        latencies.append(time.perf_counter_ns() - sent)
                elif kind == WARMUP:
                    warm.add(i)
                    if len(warm) == n:
                        ready.set()
                elif kind == END:
                    done.add(i)
    results.put({"counts": counts, "seconds": last - first, "latencies": latencies})
    for s in socks:
        s.close(linger=0)
    ctx.term()


# --- hosts: the thing under test ---------------------------------------------


class BareProxy:
    """zmq.proxy between an XSUB and an XPUB, nothing else."""

    def __init__(self, upstream: str) -> None:
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.xsub = self.ctx.socket(zmq.XSUB)
        self.xsub.rcvhwm = 0
        self.xsub.connect(upstream)
        self.xpub = self.ctx.socket(zmq.XPUB)
        self.xpub.sndhwm = 0
        port = self.xpub.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        # The context is destroyed under it: that is how this host stops.
        with contextlib.suppress(zmq.ZMQError):
            zmq.proxy(self.xsub, self.xpub)

    def close(self) -> None:
        self.ctx.destroy(linger=0)
        self.thread.join(5)


class RelayHost:
    """The real Relay, configured like production except ports and HWMs."""

    client_keys: tuple[bytes, bytes, bytes] | None = None

    def __init__(self, upstream: str, **overrides: str) -> None:
        from relay import Relay, RelaySettings

        settings = RelaySettings.loopback(upstream, high_water_mark=0, **overrides)
        self.relay = Relay(settings)
        self.endpoint = self.relay.start().market_data
        self.thread = threading.Thread(target=self.relay.run, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.relay.stop()
        self.thread.join(5)
        self.relay.close()


class CurveRelayHost(RelayHost):
    """The relay with CURVE on its client sockets; one allow-listed client key pair."""

    def __init__(self, upstream: str) -> None:
        from relay import curve

        self._dir = tempfile.TemporaryDirectory()
        keys = Path(self._dir.name)
        server, _ = curve.generate(keys / "server", "relay")
        _, secret = curve.generate(keys / "clients", "bench")
        public_key, secret_key = zmq.auth.load_certificate(secret)
        self.client_keys = (public_key, secret_key or b"", zmq.auth.load_certificate(server)[0])
        super().__init__(
            upstream,
            curve_secret_key_file=str(keys / "server" / "relay.key_secret"),
            curve_client_keys_dir=str(keys / "clients"),
        )

    def close(self) -> None:
        super().close()
        self._dir.cleanup()


class Host(Protocol):
    """What one_run needs of the thing under test (bench/relay_chain.py adds hosts)."""

    endpoint: str  # where the subscribers connect

    def close(self) -> None: ...


HOSTS: dict[str, Callable[[str], Host]] = {
    "bare": BareProxy,
    "relay": RelayHost,
    "relay-curve": CurveRelayHost,
}


@dataclass
class Run:
    rate: float  # messages/s delivered to every subscriber
    cpu_us: float  # host process CPU per published message
    p50_us: float
    p99_us: float


def one_run(mode: str, subs: int, size: int, count: int, paced_rate: float) -> Run:
    spawn = mp.get_context("spawn")
    port = free_port()
    host = HOSTS[mode](f"tcp://127.0.0.1:{port}")
    go, ready = spawn.Event(), spawn.Event()
    results = spawn.Queue()
    timed = paced_rate > 0
    keys = getattr(host, "client_keys", None)
    sub = spawn.Process(target=subscriber, args=(host.endpoint, subs, ready, results, timed, keys))
    pub = spawn.Process(target=publisher, args=(port, go, count, size, paced_rate))
    sub.start()
    pub.start()
    try:
        if not ready.wait(60):
            raise RuntimeError("subscribers never got the warm-up")
        cpu0 = time.process_time()
        go.set()
        result = results.get(timeout=300)
        cpu = time.process_time() - cpu0
    finally:
        pub.join(30)
        sub.join(30)
        for proc in (pub, sub):  # a failed run must not leave a child waiting forever
            if proc.is_alive():
                proc.terminate()
        host.close()
    if any(c != count for c in result["counts"]):
        raise RuntimeError(f"{mode}: lost messages: {result['counts']} of {count}")
    lat = sorted(result["latencies"])
    p50 = lat[len(lat) // 2] / 1000 if lat else 0.0
    p99 = lat[int(len(lat) * 0.99)] / 1000 if lat else 0.0
    return Run(count / result["seconds"], cpu / count * 1e6, p50, p99)


def capacity_run(mode: str, subs: int, size: int, count: int) -> tuple[float, float]:
    """(messages/s per proxy-thread CPU second, wall messages/s) draining a backlog.

    In-process over inproc: `count` messages are queued in the XSUB before the
    proxy thread starts, which is then timed until STATISTICS shows every frame
    forwarded. Nobody reads the subscribers meanwhile (HWMs unlimited), so the
    proxy thread alone sets the pace. (The steerable proxy's PAUSE does not stop
    forwarding in libzmq 4.3.5, hence queueing before the start.)
    """
    from relay.sockets import MarketDataProxy, ProxyStats

    assert mode in ("bare", "relay", "capture")
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.sndhwm = 0
    pub.bind("inproc://up")
    xsub = ctx.socket(zmq.XSUB)
    xsub.rcvhwm = 0
    xsub.connect("inproc://up")
    xpub = ctx.socket(zmq.XPUB)
    xpub.sndhwm = 0
    xpub.setsockopt(zmq.XPUB_VERBOSE, 1)  # so we can see every sink's subscription arrive
    xpub.bind("inproc://down")
    sinks = []
    for _ in range(subs):
        sink = ctx.socket(zmq.SUB)
        sink.rcvhwm = 0
        sink.connect("inproc://down")
        sink.subscribe(TOPIC)
        sinks.append(sink)
    for _ in sinks:  # every sink is registered in the XPUB...
        xpub.recv()
    xsub.send(b"\x01" + TOPIC)  # ...and the subscription is upstream (the proxy's job later)
    pub.recv()
    frames = [TOPIC, VERSION, DATA + b"x" * (size - 1)]
    for _ in range(count):
        pub.send_multipart(frames)
    target = 3 * count
    wall0 = time.perf_counter()
    if mode == "relay":
        proxy = MarketDataProxy(ctx, xsub, xpub)  # the relay's own proxy and subscription tap
        control = proxy.control
        proxy.start()
        thread_id = proxy.thread_id
        stop: Callable[[], None] = proxy.stop
    else:
        control = ctx.socket(zmq.PAIR)
        steer = ctx.socket(zmq.PAIR)
        steer.bind("inproc://steer")
        control.connect("inproc://steer")
        capture = None
        if mode == "capture":  # the suggested design, for comparison
            capture = ctx.socket(zmq.PUB)
            capture.sndhwm = 0
            capture.bind("inproc://capture")
            events = ctx.socket(zmq.SUB)
            events.rcvhwm = 0
            events.connect("inproc://capture")
            events.subscribe(b"\x00")
            events.subscribe(b"\x01")
        thread = threading.Thread(
            target=zmq.proxy_steerable, args=(xsub, xpub, capture, steer), daemon=True
        )
        thread.start()
        thread_id = thread.ident

        def stop() -> None:
            control.send(b"TERMINATE")
            control.recv()  # libzmq 4.3.5 answers every steering command (b"" but STATISTICS)
            thread.join(10)

    assert thread_id is not None
    clock = time.pthread_getcpuclockid(thread_id)

    def forwarded() -> int:
        control.send(b"STATISTICS")
        stats = ProxyStats.parse(control.recv_multipart())
        assert stats is not None
        return stats.downstream_frames

    while forwarded() < target:
        time.sleep(0.001)
    cpu, wall = time.clock_gettime(clock), time.perf_counter() - wall0
    stop()
    ctx.destroy(linger=0)
    return count / cpu, count / wall


def proxy_instructions(mode: str, subs: int, size: int, count: int) -> int:
    """Instructions the proxy thread executed in one capacity run, counted by callgrind.

    Deterministic, unlike CPU time on a shared machine. The thread is found by
    the libzmq entry point it runs (zmq_proxy_steerable).
    """
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--separate-threads=yes",
                f"--callgrind-out-file={tmp}/cg.%p",
                sys.executable,
                __file__,
                "--one",
                mode,
                str(subs),
                str(size),
                str(count),
            ],
            check=True,
            capture_output=True,
        )
        for path in Path(tmp).glob("cg.*-*"):
            text = path.read_text(errors="replace")
            if "zmq_proxy_steerable" in text:
                match = re.search(r"^summary: (\d+)", text, re.MULTILINE)
                assert match is not None
                return int(match.group(1))
    raise RuntimeError("no proxy thread in the callgrind output")


def instructions_table(small: int, large: int) -> None:
    """Instructions per forwarded message: the difference between two run sizes
    cancels the thread's start-up and shut-down."""
    print("Proxy thread instructions per message (callgrind, deterministic):\n")
    print("| payload | subs | bare | relay (tap) | ratio | capture design | ratio |")
    print("|---|---|---|---|---|---|---|")
    for size in (64, 1024):
        for subs in (1, 10):
            per: dict[str, float] = {}
            for mode in ("bare", "relay", "capture"):
                low = proxy_instructions(mode, subs, size, small)
                high = proxy_instructions(mode, subs, size, large)
                per[mode] = (high - low) / (large - small)
            print(
                f"| {size} B | {subs} | {per['bare']:,.0f} | {per['relay']:,.0f} "
                f"| {per['relay'] / per['bare']:.3f} | {per['capture']:,.0f} "
                f"| {per['capture'] / per['bare']:.3f} |",
                flush=True,
            )
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--one", nargs=4, metavar=("MODE", "SUBS", "SIZE", "COUNT"))
    parser.add_argument(
        "--instructions", action="store_true", help="also count instructions with valgrind"
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--messages", type=int, default=100_000, help="per run, 1 subscriber")
    parser.add_argument("--latency-rate", type=float, default=2000.0)
    parser.add_argument("--latency-messages", type=int, default=2000)
    parser.add_argument("--capacity-reps", type=int, default=7)
    parser.add_argument("--capacity-messages", type=int, default=200_000)
    parser.add_argument("--capacity-only", action="store_true")
    parser.add_argument("--curve", action="store_true", help="relay with CURVE off vs on")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.curve:
        end_to_end(args, ("relay", "relay-curve"))
        return
    if args.one:  # one capacity run (used under valgrind by --instructions)
        mode, subs, size, count = args.one
        print(capacity_run(mode, int(subs), int(size), int(count)))
        return
    if args.instructions:
        instructions_table(2000, 10000)
    print("Proxy capacity (backlog drained by the proxy thread, in-process, inproc):\n")
    print(
        "| payload | subs | bare msg/CPU-s | relay (tap) | ratio | capture design | ratio "
        "| wall msg/s bare / relay / capture |"
    )
    print("|---|---|---|---|---|---|---|---|")
    modes = ("bare", "relay", "capture")
    for size in (64, 1024):
        for subs in (1, 10):
            cap: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
            for _ in range(args.capacity_reps):
                for mode in modes:
                    n = args.capacity_messages // (1 if subs == 1 else 2)  # bounded memory
                    cap[mode].append(capacity_run(mode, subs, size, n))
            cpu = {m: statistics.median(r[0] for r in cap[m]) for m in modes}
            wall = {m: statistics.median(r[1] for r in cap[m]) for m in modes}
            print(
                f"| {size} B | {subs} | {cpu['bare']:,.0f} | {cpu['relay']:,.0f} "
                f"| {cpu['relay'] / cpu['bare']:.2f} | {cpu['capture']:,.0f} "
                f"| {cpu['capture'] / cpu['bare']:.2f} "
                f"| {wall['bare']:,.0f} / {wall['relay']:,.0f} / {wall['capture']:,.0f} |",
                flush=True,
            )
    if args.capacity_only:
        return
    end_to_end(args, ("bare", "relay"))


def end_to_end(args: argparse.Namespace, modes: tuple[str, str]) -> None:
    """Throughput, host CPU and latency of two hosts, alternated, medians compared."""
    a, b = modes
    print("\nEnd to end (Python publisher and subscriber processes, TCP):\n")
    print(
        f"| payload | subs | {a} msg/s | {b} msg/s | ratio | {a} CPU us/msg | {b} CPU us/msg "
        f"| ratio | {a} p50/p99 us | {b} p50/p99 us |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for size in (64, 1024):
        for subs in (1, 10):
            count = args.messages if subs == 1 else args.messages // 5
            runs: dict[str, list[Run]] = {a: [], b: []}
            for _ in range(args.reps):
                for mode in modes:
                    thr = one_run(mode, subs, size, count, 0.0)
                    lat = one_run(mode, subs, size, args.latency_messages, args.latency_rate)
                    runs[mode].append(Run(thr.rate, thr.cpu_us, lat.p50_us, lat.p99_us))

            def med(mode: str, field: str, runs: dict[str, list[Run]] = runs) -> float:
                return float(statistics.median(getattr(r, field) for r in runs[mode]))

            print(
                f"| {size} B | {subs} | {med(a, 'rate'):,.0f} | {med(b, 'rate'):,.0f} "
                f"| {med(b, 'rate') / med(a, 'rate'):.2f} "
                f"| {med(a, 'cpu_us'):.2f} | {med(b, 'cpu_us'):.2f} "
                f"| {med(b, 'cpu_us') / med(a, 'cpu_us'):.2f} "
                f"| {med(a, 'p50_us'):.0f}/{med(a, 'p99_us'):.0f} "
                f"| {med(b, 'p50_us'):.0f}/{med(b, 'p99_us'):.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
