"""Per-request cost of each stage of the relay's submit path, measured in-process.

    a Relay started on loopback ports, its pipeline heartbeat and an ingestor's
    subscription and heartbeat in place (every submit is accepted); a peer
    process holds a DEALER client (requests queued on the relay's ROUTER over
    TCP, replies drained) and the ingestor's SUB (drained); each stage is the
    relay's own code called `--n` times in a row:

    loop turn   zmq_poll over the sockets `Relay.run` polls, nothing ready
    recv        one 4-frame request off the ROUTER (zmq_frames.recv_frames)
    on_frames   the whole handler for one request alone: the stages below
    on_batch    the same per request, for batches of `BATCH` requests taken off the
                ROUTER together (what the loop hands over at 10 and 100 clients)
      split, decode, rate limit, validate (check_submit), liveness (pipeline and
      ingestor verdicts), reply (encode + 4 frames out), publish (encode + 3 frames
      to the ingestors' XPUB, counters), log line (the spec's INFO line, to a file: `HotLine`)

Default: microseconds per call, the relay process's CPU time (all threads:
libzmq's I/O thread and the log writer count), best of `--reps`. `--count`: instructions per
call under callgrind instead, one process per stage, the stage's count minus a
run that only sets up: load-independent, slow (a minute or two per stage).

Run: .venv/bin/python bench/relay_submit_stages.py [--n 20000] [--reps 5] [--count]
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import zmq

from mdproto import envelope, topics
from mdproto.messages import (
    ExchangeHealth,
    IngestorStatus,
    PipelineStatus,
    SubmitHistoricalRequest,
)

REQUEST = SubmitHistoricalRequest(
    request_id="stage-1",
    client_id="bench",
    ticker="BINANCE:BTC/USDT",
    period_seconds=60,
    end_time_ms=3_600_000,
)
STAGES = (
    "loop turn",
    "recv",
    "on_frames",
    "on_batch",
    "split",
    "decode",
    "rate limit",
    "validate",
    "liveness",
    "reply",
    "publish",
    "log line",
)


def peer(endpoints: tuple[str, str], body: list[bytes], commands: Connection) -> None:
    """The other process: queues requests on command, drains replies and DataRequests."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    client = ctx.socket(zmq.DEALER)
    client.sndhwm = client.rcvhwm = 0
    client.connect(endpoints[0])
    ingestor = ctx.socket(zmq.SUB)
    ingestor.rcvhwm = 0
    ingestor.connect(endpoints[1])
    ingestor.subscribe(b"BINANCE:")
    poller = zmq.Poller()
    poller.register(client, zmq.POLLIN)
    poller.register(ingestor, zmq.POLLIN)
    while True:
        if commands.poll(0):
            n = commands.recv()
            if n < 0:
                break
            for _ in range(n):
                client.send_multipart([b"", *body])
            commands.send(n)
        for sock, _ in poller.poll(10):
            while True:
                try:
                    sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
    ctx.destroy(linger=0)


QUEUED = ("recv", "on_frames", "on_batch")  # stages that take requests the peer queued first
BATCH = 50


class Bench:
    """The started relay, its peers and one prepared request."""

    def __init__(self, log_file: Any) -> None:
        from relay import Relay, RelaySettings
        from relay.cli import configure_logging

        self.log_lines = configure_logging(logging.INFO, stream=log_file)
        settings = RelaySettings.loopback(
            "tcp://127.0.0.1:1", client_rate_limit=1e9, pipeline_heartbeat_timeout_s=5
        )
        self.relay = relay = Relay(settings)
        ep = relay.start()
        now = time.monotonic()
        status = PipelineStatus(interval_ms=60_000, history=True, triggers=True)
        relay._pipeline.on_frames(envelope.encode_pub(topics.PIPELINE_STATUS, status), now)
        relay._client.rcvhwm = relay._client.sndhwm = 0
        self.body = envelope.encode(REQUEST)
        self.commands, theirs = mp.get_context("spawn").Pipe()
        self.peer = mp.get_context("spawn").Process(
            target=peer, args=((ep.client_request, ep.ingestor_work), self.body, theirs)
        )
        self.peer.start()
        assert relay._work.poll(60_000), "the ingestor's subscription did not arrive"
        relay._on_work_subscription(relay._work.recv_multipart(), now)
        health = ExchangeHealth(exchange="BINANCE", healthy=True)
        relay._ingestors.on_status(
            IngestorStatus(ingestor_id="bench", interval_ms=60_000, exchanges=[health]), now
        )
        self.queue(1)
        self.frames = _recv(self.relay._client)
        self.route, self.envelope = envelope.split_routed(self.frames)
        self.message = envelope.decode(self.envelope)
        requests = relay._requests
        outcome = requests_check(requests, self.message)
        assert outcome.work is not None, outcome.reply
        self.work = outcome.work
        self.reply = outcome.reply

    def queue(self, n: int) -> None:
        """`n` requests sent to the relay's ROUTER, the first arrived (TCP keeps order; the
        relay reads them faster than they come in, so the stage waits for the rest)."""
        self.commands.send(n)
        assert self.commands.recv() == n
        assert self.relay._client.poll(60_000), "requests did not arrive"

    def stage(self, name: str, n: int) -> Callable[[], None]:
        """A function doing stage `name` `n` times (requests it consumes queued first)."""
        from mdproto import envelope as env
        from relay.ingestors import _forwarded as forwarded  # the line publish_work writes
        from relay.ingestors import log as ingestors_log
        from relay.pipeline_status import Part

        relay, requests = self.relay, self.relay._requests
        frames, route, body, message = self.frames, self.route, self.envelope, self.message
        now = time.monotonic()
        if name in (*QUEUED, "queue"):
            self.queue(n)
        if name == "loop turn":  # the sockets `Relay.run` polls, as it polls them
            items: list[tuple[Any, int]] = [
                (sock, zmq.POLLIN)
                for sock in (relay._client, relay._responses, relay._proxy.events,
                             relay._proxy.control, relay._work, relay._control,
                             relay._upstream_monitor, relay._market_monitor, relay._heartbeat_sub)
            ]  # fmt: skip
            items.append((relay._wakeup.fileno(), zmq.POLLIN))
            return lambda: _times(n, lambda: zmq.zmq_poll(items, 0))
        client = relay._client
        if name == "recv":
            return lambda: _times(n, lambda: _recv(client))
        if name == "on_frames":
            on_frames = requests.on_frames
            return lambda: _times(n, lambda: on_frames(_recv(client), now))
        if name == "on_batch":
            on_batch = getattr(requests, "on_batch", None)
            if on_batch is None:  # a relay from before batches (comparing with a base)
                return lambda: _times(n, lambda: requests.on_frames(_recv(client), now))
            return lambda: _times(
                n // BATCH, lambda: on_batch([_recv(client) for _ in range(BATCH)], now)
            )
        if name == "split":
            return lambda: _times(n, lambda: env.split_routed(frames))
        if name == "decode":
            return lambda: _times(n, lambda: env.decode(body, max_payload=1 << 20))
        if name == "rate limit":
            return lambda: _times(n, lambda: requests._buckets.take(route[0], now))
        if name == "validate":
            return lambda: _times(n, lambda: requests_check(requests, message))
        if name == "liveness":
            ingestors, pipeline, topic = relay._ingestors, relay._pipeline, self.work.topic
            return lambda: _times(
                n,
                lambda: pipeline.refusal(Part.HISTORY, now) or ingestors.unserved(topic, now),
            )
        if name == "reply":
            reply = self.reply
            return lambda: _times(n, lambda: requests._reply(route, reply, now))
        if name == "publish":
            ingestors, work = relay._ingestors, self.work
            level = ingestors_log.level
            ingestors_log.setLevel(logging.WARNING)  # its log line is the next stage

            def publish() -> None:
                try:
                    _times(
                        n,
                        lambda: ingestors.publish_work(work.topic, work.request, "historical", now),
                    )
                finally:
                    ingestors_log.setLevel(level)

            return publish
        if name == "log line":
            rid = self.work.request.request_id
            return lambda: _times(n, lambda: forwarded("BINANCE:", rid, "historical"))
        if name in ("none", "queue"):  # baselines: set up only, or set up and queue too
            return lambda: None
        raise ValueError(name)

    def close(self) -> None:
        self.commands.send(-1)
        self.peer.join(10)
        self.relay.close()
        self.log_lines.close()


def requests_check(requests: Any, message: Any) -> Any:
    """check_submit as `ClientRequests._submit` calls it."""
    from relay.client_requests import check_submit

    return check_submit(
        message, requests._policy, requests._wall_ms(), requests._new_id, symbols=requests._symbols
    )


def _recv(sock: zmq.Socket[bytes]) -> list[bytes]:
    """The next request (it may still be on its way)."""
    from mdproto.runtime import zmq_frames

    while True:
        frames = zmq_frames.recv_frames(sock)
        if frames is not None:
            return frames
        sock.poll(1000)


def _times(n: int, call: Callable[[], object]) -> None:
    for _ in range(n):
        call()


def timed(n: int, reps: int) -> dict[str, float]:
    """Microseconds of process CPU per call, best of `reps`."""
    with tempfile.NamedTemporaryFile("w", suffix=".log") as log_file:
        bench = Bench(log_file)
        try:
            best: dict[str, float] = {}
            for _ in range(reps):
                for name in STAGES:
                    run = bench.stage(name, n)
                    start = time.process_time()
                    run()
                    if name == "log line":
                        bench.log_lines.flush()
                    spent = time.process_time() - start
                    best[name] = min(best.get(name, spent), spent)
            return {name: best[name] / n * 1e6 for name in STAGES}
        finally:
            bench.close()


def count_one(name: str, n: int) -> None:
    """`--count-stage`: set up, run one stage `n` times, exit (valgrind counts it)."""
    with tempfile.NamedTemporaryFile("w", suffix=".log") as log_file:
        bench = Bench(log_file)
        run = bench.stage(name, n)
        run()
        if name == "log line":
            bench.log_lines.flush()
        bench.close()


def instructions(name: str, n: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
             __file__, "--count-stage", name, "--n", str(n)],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=1800,
        )  # fmt: skip
        match = re.search(r"^(?:summary|totals): (\d+)", out.read_text(errors="replace"), re.M)
        assert match is not None
        return int(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--count", action="store_true", help="instructions (callgrind)")
    parser.add_argument("--count-stage", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.count_stage:
        count_one(args.count_stage, args.n)
        return
    if args.count:
        base = {"none": instructions("none", args.n), "queue": instructions("queue", args.n)}
        print("| stage | instructions per call |\n|---|---|")
        for name in STAGES:
            spent = instructions(name, args.n) - base["queue" if name in QUEUED else "none"]
            print(f"| {name} | {spent / args.n:,.0f} |", flush=True)
        return
    print(f"| stage | us per call (process CPU, best of {args.reps}) |\n|---|---|")
    for name, us in timed(args.n, args.reps).items():
        print(f"| {name} | {us:.2f} |")


if __name__ == "__main__":
    main()
