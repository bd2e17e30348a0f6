"""Order books, Kafka-to-client half: CPU per delta where each side spends it.

`pub`: the PUB process's book path for one decoded record
(`pipeline.pub_server.Outlet.send_books`: apply to the ticker's `OrderBook`,
stamp, encode, send on an XPUB under its lock), plus decoding the Kafka value
(`live_engine.decode_book_records`). `client`: the SDK's
(`mdclient.book.BookStream.deliver`: sequence check, exchange-id check, apply,
queue). `snapshot`: one periodic or last-value BookSnapshot of the book
(`LiveBooks.snapshot` + encode). Books of `--depth` levels a side, deltas of
`--changed` levels (a quarter removals), prices on a 0.01 grid. A SUB on
loopback drains the XPUB. Min and median over `--reps` of the thread CPU time.

    .venv/bin/python bench/book_path.py [--deltas 50000] [--depth 100] [--changed 5] [--reps 5]
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time

import zmq

from mdclient.book import BookStream
from mdproto import envelope
from mdproto.book import levels_message
from mdproto.messages import BookDelta, BookReset, BookSnapshot
from pipeline.live_engine import decode_book_records
from pipeline.pub_server import Outlet, Sequencer

TICKER = "BINANCE:BTC/USDT"
MID = 42_000.0


def records(n: int, depth: int, changed: int, seed: int = 7) -> tuple[BookSnapshot, list[bytes]]:
    """A START snapshot and `n` delta records (Kafka values) that keep the book near `depth`."""
    rnd = random.Random(seed)
    start = BookSnapshot(
        ticker=TICKER,
        bids=levels_message([(round(MID - 0.01 * (i + 1), 2), 1.0) for i in range(depth)]),
        asks=levels_message([(round(MID + 0.01 * (i + 1), 2), 1.0) for i in range(depth)]),
        depth=depth,
        exchange_sequence=1,
        reset=BookReset.BOOK_RESET_START,
    )
    values = []
    for k in range(n):
        side: tuple[list[tuple[float, float]], list[tuple[float, float]]] = ([], [])
        for _ in range(changed):
            bid = rnd.random() < 0.5
            offset = 0.01 * rnd.randint(1, depth)
            price = round(MID - offset if bid else MID + offset, 2)
            amount = 0.0 if rnd.random() < 0.25 else round(rnd.uniform(0.001, 5.0), 4)
            side[0 if bid else 1].append((price, amount))
        delta = BookDelta(
            ticker=TICKER,
            bids=levels_message(side[0]),
            asks=levels_message(side[1]),
            exchange_sequence=k + 2,
            exchange_prev_sequence=k + 1,
            ingested_at_ms=1,
        )
        values.append(envelope.encode_record(delta))
    return start, values


def pub_run(start: BookSnapshot, values: list[bytes]) -> tuple[float, float, list[list[bytes]]]:
    """(µs per delta in the PUB thread, µs per snapshot, the frames a subscriber got)."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    xpub = ctx.socket(zmq.XPUB)
    xpub.setsockopt(zmq.SNDHWM, 0)
    xpub.bind("tcp://127.0.0.1:*")
    endpoint = xpub.getsockopt(zmq.LAST_ENDPOINT)
    assert isinstance(endpoint, bytes)
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint.decode())
    xpub.recv()  # the subscription arrived: nothing sent is lost
    outlet = Outlet(xpub, Sequencer())
    outlet.send_books([start])
    got: list[list[bytes]] = []

    def drain() -> None:
        while len(got) < len(values) + 1:
            got.append(sub.recv_multipart())

    reader = threading.Thread(target=drain)
    reader.start()
    began = time.thread_time()
    for i in range(0, len(values), 500):  # the engine's consume() batches
        outlet.send_books(decode_book_records(values[i : i + 500]))
    per_delta = (time.thread_time() - began) / len(values) * 1e6
    reader.join()
    began = time.thread_time()
    for _ in range(200):
        snapshot = outlet.books.snapshot(TICKER)
        assert snapshot is not None
        envelope.encode_pub(f"{TICKER}|book", snapshot)
    per_snapshot = (time.thread_time() - began) / 200 * 1e6
    sub.close(0)
    xpub.close(0)
    ctx.term()
    return per_delta, per_snapshot, got


def client_run(frames: list[list[bytes]]) -> float:
    """µs per delta in the SDK's subscriber thread (decode + BookStream.deliver)."""
    stream = BookStream(TICKER, lambda s: None, maxsize=1000, on_event=lambda e: None)
    began = time.thread_time()
    for f in frames:
        stream.deliver(envelope.decode_sub(f)[1])
    per = (time.thread_time() - began) / len(frames) * 1e6
    assert stream.in_sync and stream.stats["gaps"] == 0
    return per


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deltas", type=int, default=50_000)
    parser.add_argument("--depth", type=int, default=100)
    parser.add_argument("--changed", type=int, default=5)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    start, values = records(args.deltas, args.depth, args.changed)
    pub, snap, client = [], [], []
    for _ in range(args.reps):
        p, s, frames = pub_run(start, values)
        pub.append(p)
        snap.append(s)
        client.append(client_run(frames))
    for name, xs in (("pub per delta", pub), ("client per delta", client), ("snapshot", snap)):
        print(f"{name:>17}: min {min(xs):7.1f} µs, median {statistics.median(xs):7.1f} µs")
    print(
        f"depth {args.depth}, {args.changed} levels per delta: one core takes "
        f"{1e6 / statistics.median(pub):,.0f} deltas/s in the PUB, "
        f"{1e6 / statistics.median(client):,.0f} in a client"
    )


if __name__ == "__main__":
    main()
