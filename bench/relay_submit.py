"""SubmitHistoricalRequest -> SubmitResponse round trips: the relay vs a bare Python ROUTER echo.

    client processes (1, 10 or 100 REQ sockets, each: send, wait, send again)
        -> server process: the Relay (validate, publish DataRequest, answer)
                           or a ROUTER that sends every message straight back (baseline)
                           or that echo, also publishing each request to the ingestor
                           ("forward": the flow's transport, no Python work: the floor)

Each run lasts `--seconds` after a short warm-up; round trips per second and
p50/p99 latency are taken over that window. Modes alternate, `--reps` times,
and compared: each repetition's relay/echo ratio, reported as the median and
its spread (min-max), with p50/p99 latency. The relay runs with its
production logging (INFO, one "Forwarded request" line per request, written to
a file) and with logging at WARNING; its rate limit is set high enough never to
refuse (the token bucket is still consulted). As in production, every request
passes the pipeline and ingestor liveness checks: a thread of the server
process publishes `PipelineStatus` heartbeats where the relay's upstream is,
and an ingestor process subscribes to the work socket (receiving every
DataRequest, which really travels over TCP, in a blocking loop as the ingestor
service does; its CPU is the machine's too) and sends `IngestorStatus`
heartbeats. A reply other
than OK is counted and reported: the figures are for accepted requests only.
The server process's CPU time (all its threads, from /proc) over the window,
per round trip, is reported too: the machine's load moves it less than rates.

`--curve` compares the relay (WARNING logs) with CURVE off and on instead: the
client sockets then hold an allow-listed key pair.

Run: .venv/bin/python bench/relay_submit.py [--reps 3] [--seconds 2] [--curve]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import multiprocessing as mp
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any, Protocol

import zmq
import zmq.auth

from mdproto import envelope, topics
from mdproto.messages import (
    ExchangeHealth,
    IngestorStatus,
    PipelineStatus,
    Status,
    SubmitHistoricalRequest,
    SubmitResponse,
)

WARMUP = 0.3
HEARTBEAT_S = 0.25  # pipeline and ingestor heartbeats, sent this often...
HEARTBEAT_INTERVAL_MS = 60_000  # ...but announced as this: valgrind's slowed server never expires


Announce = Callable[[dict[str, str]], None]


class Stop(Protocol):
    def is_set(self) -> bool: ...
    def wait(self, timeout: float | None = None) -> bool: ...


def echo_server(announce: Announce, stop: Stop) -> None:
    """The baseline: a ROUTER in a Python loop that returns every message unchanged."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    announce({"client_request": f"tcp://127.0.0.1:{port}", "ingestor_work": ""})
    _echo(router, stop)
    ctx.destroy(linger=0)


def forward_server(announce: Announce, stop: Stop) -> None:
    """The transport floor of the spec's flow: the echo, plus each request's envelope
    published to the ingestors under the exchange prefix (a second message, as the
    relay sends), nothing decoded or checked. The ingestor's heartbeats are ignored."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    work = ctx.socket(zmq.XPUB)
    heartbeats = ctx.socket(zmq.ROUTER)
    for sock in (router, work, heartbeats):
        sock.linger = 0
    work.sndhwm = 0
    endpoints = {
        name: f"tcp://127.0.0.1:{sock.bind_to_random_port('tcp://127.0.0.1')}"
        for name, sock in (
            ("client_request", router), ("ingestor_work", work), ("ingestor_response", heartbeats)
        )
    }  # fmt: skip
    announce(endpoints)
    _echo(router, stop, forward_to=work)
    ctx.destroy(linger=0)


def _echo(
    router: zmq.Socket[bytes], stop: Stop, forward_to: zmq.Socket[bytes] | None = None
) -> None:
    """Every message straight back; with `forward_to` (an XPUB), its envelope published
    there too (and the subscriptions arriving on it taken off)."""
    while not stop.is_set():
        if forward_to is not None and forward_to.poll(0):
            forward_to.recv()
        if router.poll(100):
            for _ in range(256):
                try:
                    frames = router.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                router.send_multipart(frames)
                if forward_to is not None:
                    forward_to.send_multipart([b"BINANCE:", *frames[-2:]])


def relay_server(announce: Announce, stop: Stop, log_level: int, curve: bool = False) -> None:
    from relay import Relay, RelaySettings
    from relay.cli import configure_logging
    from relay.metrics import PIPELINE_SERVING

    with (
        tempfile.NamedTemporaryFile("w", suffix=".log") as log_file,
        tempfile.TemporaryDirectory() as keys,
    ):
        log_lines = configure_logging(log_level, stream=log_file)  # as `relay` does, to a file
        overrides = _curve_keys(Path(keys)) if curve else {}
        pipeline = zmq.Context().socket(zmq.PUB)  # heartbeats only: no market data measured
        pipeline.linger = 0
        upstream = f"tcp://127.0.0.1:{pipeline.bind_to_random_port('tcp://127.0.0.1')}"
        settings = RelaySettings.loopback(
            upstream,
            client_rate_limit=1e9,
            pipeline_heartbeat_timeout_s=5,  # the production default (loopback turns it off)
            curve_secret_key_file=overrides.get("server_secret", ""),
            curve_client_keys_dir=overrides.get("clients", ""),
        )
        relay = Relay(settings)
        ep = relay.start()

        def heartbeats() -> None:
            """Every HEARTBEAT_S; the endpoints are announced once the relay has one."""
            status = PipelineStatus(interval_ms=HEARTBEAT_INTERVAL_MS, history=True, triggers=True)
            serving = {"work": "history"}
            while True:
                pipeline.send_multipart(envelope.encode_pub(topics.PIPELINE_STATUS, status))
                if serving and relay.metrics.sample(PIPELINE_SERVING, serving):
                    serving = {}
                    announce(
                        {
                            "client_request": ep.client_request,
                            "ingestor_work": ep.ingestor_work,
                            "ingestor_response": ep.ingestor_response,
                            **overrides,
                        }
                    )
                if stop.wait(HEARTBEAT_S):
                    return

        def stopper() -> None:
            stop.wait()
            relay.stop()

        threading.Thread(target=heartbeats, daemon=True).start()
        threading.Thread(target=stopper, daemon=True).start()
        relay.run()
        relay.close()
        log_lines.close()


def _curve_keys(keys: Path) -> dict[str, str]:
    """A relay key pair and one allowed client pair; the paths go to the clients."""
    from relay import curve

    curve.generate(keys / "server", "relay")
    curve.generate(keys / "clients", "bench")
    return {
        "server_secret": str(keys / "server" / "relay.key_secret"),
        "server_public": str(keys / "server" / "relay.key"),
        "clients": str(keys / "clients"),
        "client_secret": str(keys / "clients" / "bench.key_secret"),
    }


def _apply_client_keys(sock: zmq.Socket[bytes], ep: dict[str, str]) -> None:
    if "client_secret" in ep:
        sock.curve_publickey, sock.curve_secretkey = zmq.auth.load_certificate(ep["client_secret"])
        sock.curve_serverkey = zmq.auth.load_certificate(ep["server_public"])[0]


def serve(mode: str, announce: Announce, stop: Stop) -> None:
    if mode == "echo":
        echo_server(announce, stop)
    elif mode == "forward":
        forward_server(announce, stop)
    else:
        level = logging.INFO if mode == "relay" else logging.WARNING
        relay_server(announce, stop, level, curve=mode == "relay-curve")


def serve_in_process(mode: str, endpoints: Queue[Any], stop: Event) -> None:
    """multiprocessing target."""
    serve(mode, endpoints.put, stop)


def _ingestor(
    ctx: zmq.Context[zmq.Socket[bytes]], poller: zmq.Poller, ep: dict[str, str]
) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes]]:
    """The ingestor's side: a SUB on the work socket (on `poller`; whatever it gets is
    to be drained) and the DEALER its `IngestorStatus` heartbeats go out on."""
    work = ctx.socket(zmq.SUB)
    work.rcvhwm = 0
    work.connect(ep["ingestor_work"])
    work.subscribe(b"BINANCE:")
    poller.register(work, zmq.POLLIN)
    status = ctx.socket(zmq.DEALER)
    status.linger = 0
    status.connect(ep["ingestor_response"])
    return work, status


INGESTOR_STATUS = IngestorStatus(
    ingestor_id="bench",
    interval_ms=HEARTBEAT_INTERVAL_MS,
    exchanges=[ExchangeHealth(exchange="BINANCE", healthy=True)],
)
REQUEST = SubmitHistoricalRequest(
    client_id="bench", ticker="BINANCE:BTC/USDT", period_seconds=60, end_time_ms=3_600_000
)


def _wait_accepted(sock: zmq.Socket[bytes], status: zmq.Socket[bytes] | None) -> None:
    """Submit on `sock` until the relay accepts (it has seen the ingestor subscribe and,
    with `status`, its heartbeat); the echo returns the request at once."""
    request = SubmitHistoricalRequest()
    request.CopyFrom(REQUEST)
    request.request_id = "warm-up"
    while True:
        if status is not None:
            status.send_multipart(envelope.encode(INGESTOR_STATUS))
        sock.send_multipart(envelope.encode(request))
        answer = envelope.decode(sock.recv_multipart())
        if not isinstance(answer, SubmitResponse) or answer.status == Status.OK:
            return
        time.sleep(HEARTBEAT_S)


def ingestor(ep: dict[str, str], stop: Stop) -> None:
    """The ingestor's side in its own process, as in production: every DataRequest
    received (a blocking receive, no poller), a heartbeat every HEARTBEAT_S."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    work, status = _ingestor(ctx, zmq.Poller(), ep)
    work.rcvtimeo = int(HEARTBEAT_S * 1000)  # wakes for the heartbeat when idle
    heartbeat = envelope.encode(INGESTOR_STATUS)
    next_status = 0.0
    while True:
        now = time.monotonic()
        if now >= next_status:
            if stop.is_set():
                break
            status.send_multipart(heartbeat)
            next_status = now + HEARTBEAT_S
        with contextlib.suppress(zmq.Again):  # idle: time for a heartbeat
            work.recv_multipart()
    ctx.destroy(linger=0)


def clients(
    ep: dict[str, str],
    n: int,
    ready: Queue[Any],
    start: Queue[Any],
    seconds: float,
    results: Queue[Any],
) -> None:
    """`n` REQ sockets in one process, each in a closed loop; counts the measured window.

    Reports `ready` once connected (and the relay accepts: the ingestor process has
    been seen), then starts at the time `start` gives."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    poller = zmq.Poller()
    socks = []
    for _ in range(n):
        sock = ctx.socket(zmq.REQ)
        _apply_client_keys(sock, ep)
        sock.connect(ep["client_request"])
        poller.register(sock, zmq.POLLIN)
        socks.append(sock)
    _wait_accepted(socks[0], None)
    request = REQUEST
    sent_at: dict[zmq.Socket[bytes], float] = {}
    counter = 0

    def send(sock: zmq.Socket[bytes]) -> None:
        nonlocal counter
        counter += 1
        request.request_id = f"b{id(sock)}-{counter}"
        sent_at[sock] = time.monotonic()
        sock.send_multipart(envelope.encode(request))

    ready.put(True)
    start_at = start.get()
    time.sleep(max(0.0, start_at - time.monotonic()))
    for sock in socks:
        send(sock)
    begin, end = start_at + WARMUP, start_at + WARMUP + seconds
    latencies: list[float] = []
    done = refused = 0
    while True:
        now = time.monotonic()
        if now >= end:
            break
        for sock, _ in poller.poll(100):
            reply = sock.recv_multipart()
            now = time.monotonic()
            # Parse it as a client would (the echo returns the request).
            answer = envelope.decode(reply)
            if now >= begin and now < end:
                done += 1
                latencies.append(now - sent_at[sock])
                if isinstance(answer, SubmitResponse) and answer.status != Status.OK:
                    refused += 1
            send(sock)
    results.put((done, latencies, refused))
    ctx.destroy(linger=0)


@dataclass
class Result:
    rate: float
    p50_ms: float
    p99_ms: float
    refused: int = 0  # replies other than OK (the run measured the wrong thing)
    cpu_us: float = 0.0  # server process CPU (all threads) per round trip in the window


def _cpu_s(pid: int) -> float:
    """utime + stime of a process, all threads (Linux /proc; load moves it less than rates)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


_CLK_TCK = float(os.sysconf("SC_CLK_TCK"))


def one_run(mode: str, n_clients: int, seconds: float) -> Result:
    spawn = mp.get_context("spawn")
    endpoints: Queue[Any] = spawn.Queue()
    results: Queue[Any] = spawn.Queue()
    stop = spawn.Event()
    server = spawn.Process(target=serve_in_process, args=(mode, endpoints, stop))
    server.start()
    ep = endpoints.get(timeout=30)
    feeder = None
    if ep["ingestor_work"]:
        feeder = spawn.Process(target=ingestor, args=(ep, stop))
        feeder.start()
    procs = min(2, n_clients)
    ready: Queue[Any] = spawn.Queue()
    start: Queue[Any] = spawn.Queue()
    workers = [
        spawn.Process(
            target=clients,
            args=(
                ep,
                n_clients // procs,
                ready,
                start,
                seconds,
                results,
            ),
        )
        for i in range(procs)
    ]
    for w in workers:
        w.start()
    for _ in workers:
        ready.get(timeout=120)
    start_at = time.monotonic() + 0.1  # every client connected: they start together
    for _ in workers:
        start.put(start_at)
    assert server.pid is not None
    time.sleep(max(0.0, start_at + WARMUP - time.monotonic()))
    cpu_begin = _cpu_s(server.pid)
    time.sleep(max(0.0, start_at + WARMUP + seconds - time.monotonic()))
    cpu = _cpu_s(server.pid) - cpu_begin
    parts = [results.get(timeout=60) for _ in workers]
    for w in workers:
        w.join(10)
    stop.set()
    server.join(10)
    if feeder is not None:
        feeder.join(10)
    done = sum(p[0] for p in parts)
    lat = sorted(x for p in parts for x in p[1])
    return Result(
        done / seconds,
        lat[len(lat) // 2] * 1000,
        lat[int(len(lat) * 0.99)] * 1000,
        sum(p[2] for p in parts),
        cpu / max(done, 1) * 1e6,
    )


def serve_cli(mode: str, endpoint_file: str) -> None:
    """`--serve MODE FILE`: serve until SIGTERM, endpoints in FILE (for --instructions)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())

    def announce(endpoints: dict[str, str]) -> None:
        Path(endpoint_file).write_text(json.dumps(endpoints))

    serve(mode, announce, stop)


def drive(ep: dict[str, str], sockets: int, total: int) -> None:
    """Exactly `total` round trips over `sockets` REQ sockets (plus the ingestor), all OK."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    poller = zmq.Poller()
    request = REQUEST
    socks = []
    for _ in range(sockets):
        sock = ctx.socket(zmq.REQ)
        sock.connect(ep["client_request"])
        poller.register(sock, zmq.POLLIN)
        socks.append(sock)
    status_sock = _ingestor(ctx, poller, ep)[1] if ep["ingestor_work"] else None
    _wait_accepted(socks[0], status_sock)
    next_status = 0.0
    sent = done = 0
    for sock in socks[:total]:
        sent += 1
        request.request_id = f"r{sent}"
        sock.send_multipart(envelope.encode(request))
    while done < total:
        if status_sock is not None and time.monotonic() >= next_status:
            status_sock.send_multipart(envelope.encode(INGESTOR_STATUS))
            next_status = time.monotonic() + HEARTBEAT_S
        for sock, _ in poller.poll(int(HEARTBEAT_S * 1000)):
            if sock not in socks:
                sock.recv_multipart()
                continue
            answer = envelope.decode(sock.recv_multipart())
            if isinstance(answer, SubmitResponse) and answer.status != Status.OK:
                raise RuntimeError(f"the relay refused a request: {answer.reason}")
            done += 1
            if sent < total:
                sent += 1
                request.request_id = f"r{sent}"
                sock.send_multipart(envelope.encode(request))
    ctx.destroy(linger=0)


def server_instructions(mode: str, total: int) -> int:
    """Instructions the server process (all threads) executed, counted by callgrind."""
    with tempfile.TemporaryDirectory() as tmp:
        ep_file = Path(tmp) / "endpoints.json"
        proc = subprocess.Popen(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={tmp}/callgrind.out",
                sys.executable,
                __file__,
                "--serve",
                mode,
                str(ep_file),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 300
            while not ep_file.exists() or not ep_file.read_text():
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"{mode} server did not start under valgrind")
                time.sleep(0.1)
            ep = json.loads(ep_file.read_text())
            drive(ep, 10, total)
            proc.send_signal(signal.SIGTERM)
            proc.wait(300)
        finally:
            if proc.poll() is None:
                proc.kill()
        text = (Path(tmp) / "callgrind.out").read_text(errors="replace")
        match = re.search(r"^(?:summary|totals): (\d+)", text, re.MULTILINE)
        assert match is not None
        return int(match.group(1))


def instructions_table(small: int, large: int) -> None:
    """Server instructions per round trip (differences cancel start-up and shut-down)."""
    print("Server instructions per round trip (callgrind, 10 REQ clients, ingestor connected):\n")
    modes = ("echo", "forward", "relay", "relay-quiet")
    per = {}
    for mode in modes:
        low = server_instructions(mode, small)
        high = server_instructions(mode, large)
        per[mode] = (high - low) / (large - small)
    print(
        "| echo | forward | relay (INFO logs) | relay (WARNING) | echo/relay (INFO) "
        "| forward/relay (INFO) |"
    )
    print("|---|---|---|---|---|---|")
    print(
        f"| {' | '.join(f'{per[m]:,.0f}' for m in modes)} "
        f"| {per['echo'] / per['relay']:.2f} | {per['forward'] / per['relay']:.2f} |\n",
        flush=True,
    )


def curve_table(reps: int, seconds: float) -> None:
    """The relay (WARNING logs) with CURVE off and on, alternated, medians compared."""
    print("| clients | plain rt/s | CURVE rt/s | ratio | p50/p99 ms plain | CURVE |")
    print("|---|---|---|---|---|---|")
    modes = ("relay-quiet", "relay-curve")
    for n in (1, 10, 100):
        runs: dict[str, list[Result]] = {m: [] for m in modes}
        for _ in range(reps):
            for mode in modes:
                runs[mode].append(one_run(mode, n, seconds))
        med = {m: _median(runs[m]) for m in modes}
        plain, curve = med["relay-quiet"], med["relay-curve"]
        print(
            f"| {n} | {plain.rate:,.0f} | {curve.rate:,.0f} | {curve.rate / plain.rate:.2f} "
            f"| {plain.p50_ms:.2f}/{plain.p99_ms:.2f} | {curve.p50_ms:.2f}/{curve.p99_ms:.2f} |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--serve", nargs=2, metavar=("MODE", "ENDPOINT_FILE"))
    parser.add_argument(
        "--instructions", action="store_true", help="also count instructions with valgrind"
    )
    parser.add_argument("--curve", action="store_true", help="relay with CURVE off vs on")
    args = parser.parse_args()
    if args.serve:
        serve_cli(*args.serve)
        return
    if args.curve:
        curve_table(args.reps, args.seconds)
        return
    if args.instructions:
        instructions_table(500, 2500)
    submit_table(args.reps, args.seconds)


def _median(runs: list[Result]) -> Result:
    return Result(*(statistics.median(getattr(r, f) for r in runs) for f in Result.__annotations__))


def _ratio(runs: list[Result], baseline: list[Result]) -> str:
    """Median of the per-repetition ratios, with their spread."""
    ratios = [r.rate / b.rate for r, b in zip(runs, baseline, strict=True)]
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"


def _latency(result: Result) -> str:
    return f"{result.p50_ms:.2f}/{result.p99_ms:.2f}"


def submit_table(reps: int, seconds: float) -> None:
    """Echo, forward, relay (INFO) and relay (WARNING) alternated `reps` times per client
    count.

    A ratio is one mode's round trips/s over another's in the same repetition (the
    machine's load moves both); the median is reported with the spread (min-max)."""
    modes = ("echo", "forward", "relay", "relay-quiet")
    print(
        "| clients | echo rt/s | forward / echo | relay / echo (INFO) | relay / echo (WARNING) "
        "| relay / forward (INFO) | p50/p99 ms echo | forward | relay | relay-quiet "
        "| server CPU us/rt echo | forward | relay | relay-quiet |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in (1, 10, 100):
        runs: dict[str, list[Result]] = {m: [] for m in modes}
        for _ in range(reps):
            for mode in modes:
                runs[mode].append(one_run(mode, n, seconds))
        med = {m: _median(runs[m]) for m in modes}
        print(
            f"| {n} | {med['echo'].rate:,.0f} | {_ratio(runs['forward'], runs['echo'])} "
            f"| {_ratio(runs['relay'], runs['echo'])} "
            f"| {_ratio(runs['relay-quiet'], runs['echo'])} "
            f"| {_ratio(runs['relay'], runs['forward'])} "
            f"| {' | '.join(_latency(med[m]) for m in modes)} "
            f"| {' | '.join(f'{med[m].cpu_us:.0f}' for m in modes)} |",
            flush=True,
        )
        refused = sum(r.refused for m in modes for r in runs[m])
        if refused:
            print(f"  ({refused} replies were not OK: this row measured refusals too)")


if __name__ == "__main__":
    main()
