"""Tick thread CPU per tick in the PUB server: the sequenced send against the plain one.

`sequenced`: `pipeline.pub_server.Outlet.send_many` (stamp sequence + epoch,
encode, send on the XPUB under its lock, keep the last value). `plain`: the path
before sequence numbers (encode, send on an inproc PUSH that a C `zmq.proxy`
forwards to a PUB; the proxy thread's time is not counted). A SUB on loopback
drains both. Cases alternate `--reps` times; min and median of the per-tick
thread CPU time are printed.

    .venv/bin/python bench/pipeline_pub_send.py [--ticks 100000] [--reps 8]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import threading
import time
from collections.abc import Callable, Iterable

import zmq
from google.protobuf.message import Message

from mdproto import envelope, topics
from mdproto.messages import Tick
from pipeline.pub_server import Outlet, Sequencer

TICKERS = ["BINANCE:BTC/USDT", "BINANCE:ETH/USDT", "BINANCE:SOL/USDT", "BINANCE:XRP/USDT"]
BATCH = 100
Ctx = zmq.Context[zmq.Socket[bytes]]
SendMany = Callable[[Iterable[tuple[str, Message]]], int]


def _bound(ctx: Ctx, kind: int) -> tuple[zmq.Socket[bytes], str]:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.bind("tcp://127.0.0.1:*")
    endpoint = sock.getsockopt(zmq.LAST_ENDPOINT)
    assert isinstance(endpoint, bytes)
    return sock, endpoint.decode()


def plain(ctx: Ctx) -> tuple[str, SendMany]:
    pub, endpoint = _bound(ctx, zmq.PUB)
    pull = ctx.socket(zmq.PULL)
    pull.bind("inproc://ticks")
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, 0)
    push.connect("inproc://ticks")

    def proxy() -> None:
        with contextlib.suppress(zmq.ZMQError):
            zmq.proxy(pull, pub)

    threading.Thread(target=proxy, daemon=True).start()

    def send_many(items: Iterable[tuple[str, Message]]) -> int:
        count = 0
        for topic, message in items:
            push.send_multipart(envelope.encode_pub(topic, message))
            count += 1
        return count

    return endpoint, send_many


def sequenced(ctx: Ctx) -> tuple[str, SendMany]:
    xpub, endpoint = _bound(ctx, zmq.XPUB)
    xpub.setsockopt(zmq.XPUB_VERBOSE, 1)
    return endpoint, Outlet(xpub, Sequencer()).send_many


def one_run(make: Callable[[Ctx], tuple[str, SendMany]], n: int) -> float:
    """Microseconds of the sending thread's CPU per tick."""
    ctx: Ctx = zmq.Context()
    endpoint, send_many = make(ctx)
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    time.sleep(0.3)  # the subscription reaches the publisher (nothing to probe with)
    ticks = [
        Tick(ticker=TICKERS[i % 4], trade_id=str(i), price=100.0, amount=0.5, ingested_at_ms=i)
        for i in range(n)
    ]
    done = threading.Event()

    def drain() -> None:
        for _ in range(n):
            sub.recv_multipart()
        done.set()

    threading.Thread(target=drain, daemon=True).start()
    started = time.thread_time()
    for i in range(0, n, BATCH):
        send_many((topics.tick_topic(t.ticker), t) for t in ticks[i : i + BATCH])
    cpu = time.thread_time() - started
    if not done.wait(120):
        raise RuntimeError("the SUB did not receive every tick")
    ctx.destroy(linger=0)
    return cpu / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ticks", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=8)
    args = parser.parse_args()
    cases = {"plain": plain, "sequenced": sequenced}
    results: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.reps):
        for name, make in cases.items():
            results[name].append(one_run(make, args.ticks))
    print(f"{'case':<10} {'min us/tick':>12} {'median us/tick':>15}")
    for name, values in results.items():
        print(f"{name:<10} {min(values):>12.2f} {statistics.median(values):>15.2f}")


if __name__ == "__main__":
    main()
