"""The live engine's work per trade, without Kafka or sockets (issue 44 item 4).

What one engine process can sustain is bounded by the CPU its consume loop spends per
trade. This runs that loop (`live_engine._Run.loop`) on Kafka messages built in memory
(confluent-kafka ``Message`` objects holding mdproto Tick records, ``--tickers``
tickers over 3 partitions), handed out by a stand-in consumer whose clock is the
trades' own: by default a 10-minute backlog in batches of 10,000 (candles close
during it); with ``--rate R``, live at R trades/s: trade times 1/R s apart, in the
batches a gather window (``--window``, default `live.gather_s`) takes in at that rate.

- **bare**: decode every record (`envelope.decode_record`), nothing else: the floor;
- **engine**: the loop as it runs: the position check, decoding and validating,
  dedupe, candles of the default live periods (previews at most every
  `live.preview_interval_s`, closes), the collections at batch ends (`gc_pacing`; a
  full one every 0.5 s rather than 60 s, so the run shows its pause), and encoding
  every tick, preview and closed candle as the PUB server does
  (`envelope.encode_pub`, stamped with sequence numbers; no socket);
- **engine, default gc**: the same with the interpreter's own collections (before
  ADR 0020);
- **engine, previews every batch**: `preview_interval_s` 0 (before ADR 0020).

They alternate ``--reps`` times on the same messages, in one process; CPU seconds of
the process (`time.process_time`), so other load on the machine shifts the figures
less than wall time would. Trades per CPU-second is the engine's ceiling on one core.

    .venv/bin/python bench/live_engine_cpu.py [--trades 200000] [--tickers 1000] [--reps 5]
        [--rate 10000 [--window 0.01]]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import random
import statistics
import threading
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any
from unittest import mock

import confluent_kafka
from google.protobuf.message import Message

from mdproto import envelope
from mdproto.messages import TakerSide, Tick
from mdproto.recent import RecentKeys
from pipeline import live_engine, live_saves
from pipeline.config import CepConfig, LiveConfig, Settings

TOPIC = "market.ticks"
PARTITIONS = 3
BATCH = 10_000


def messages(trades: int, tickers: int, now_ms: int, span_ms: int) -> list[Any]:
    """`trades` ticks evenly over the `span_ms` before `now_ms`."""
    rng = random.Random(1)
    out = []
    for i in range(trades):
        k = rng.randrange(tickers)
        tick = Tick(
            ticker=f"BINANCE:T{k}/USDT", trade_id=str(i), price=100 + rng.random(),
            amount=rng.random(), timestamp_ms=now_ms - span_ms + i * span_ms // trades,
            side=TakerSide.BUY, ingested_at_ms=now_ms,
        )  # fmt: skip
        out.append(
            confluent_kafka.Message(
                topic=TOPIC,
                partition=k % PARTITIONS,
                offset=i,
                key=tick.ticker.encode(),
                value=envelope.encode_record(tick),
                timestamp=(confluent_kafka.TIMESTAMP_CREATE_TIME, now_ms),
            )
        )
    return out


class Sink:
    """The PUB server's `send_many` without its socket: stamp, encode, count."""

    def __init__(self) -> None:
        self.counters: dict[str, int] = {}
        self.sent = 0

    def send_many(self, items: Iterable[tuple[str, Message]]) -> int:
        counters, n = self.counters, 0
        for topic, message in items:
            counters[topic] = counters.get(topic, 0) + 1
            message.sequence = counters[topic]  # type: ignore[attr-defined]
            envelope.encode_pub(topic, message)
            n += 1
        self.sent += n
        return n


class Producer:
    """Closed candles to Kafka, dropped."""

    def produce(self, *args: Any, **kwargs: Any) -> None:
        pass

    def poll(self, _timeout: float) -> int:
        return 0


def bare(msgs: list[Any], _batch: int) -> int:
    for m in msgs:
        envelope.decode_record(m.value(), Tick)
    return len(msgs)


class Replay:
    """A consumer handing out `msgs` in consume() batches of `batch`; `stop` set at the
    end. `now_ms` is the last handed-out trade's time: live, the clock is the trades'."""

    def __init__(self, msgs: list[Any], stop: threading.Event, batch: int) -> None:
        self.msgs, self.stop, self.batch, self.at = msgs, stop, batch, 0
        self.now_ms = 0
        self.pending: list[Any] = []

    def poll(self, timeout: float) -> Any:
        """The next batch's first record (the engine polls, then consumes the rest)."""
        batch = self.msgs[self.at : self.at + self.batch]
        self.at += len(batch)
        if batch:
            self.now_ms = envelope.decode_record(batch[-1].value(), Tick).timestamp_ms
        if self.at >= len(self.msgs):
            self.stop.set()
        self.pending = batch[1:]
        return batch[0] if batch else None

    def consume(self, n: int, timeout: float) -> list[Any]:
        taken, self.pending = self.pending[:n], self.pending[n:]
        return taken


def engine(
    msgs: list[Any], batch: int, *, pacing: bool = True, preview_interval_s: float = 0.25
) -> int:
    """`live_engine._Run.loop` over the messages (the default live periods, CEP off), its
    clock the trades' (`Replay.now_ms`)."""
    sink = Sink()
    live = LiveConfig(snapshot_s=3600, gc_full_s=0.5, preview_interval_s=preview_interval_s)
    settings = Settings(cep=CepConfig(enabled=False), live=live)
    nothing: Any = None  # state store, snapshot file: not reached in these batches
    stop = threading.Event()
    replay = Replay(msgs, stop, batch)
    run = live_engine._Run(
        settings, replay, Producer(), nothing, nothing, live_saves.Snapshot(),
        None, sink.send_many,
    )  # fmt: skip
    for p in range(PARTITIONS):
        key = (TOPIC, p)
        run.positions[key], run.live_from[key], run.tickers[key] = 0, 0, set()
        run.recent[p] = RecentKeys(100_000)
    run.rebalancing = False
    with contextlib.ExitStack() as patches:
        patches.enter_context(mock.patch.object(live_engine, "_now_ms", lambda: replay.now_ms))
        if not pacing:
            patches.enter_context(mock.patch.object(live_engine, "GcPacing", NoPacing))
        run.loop(stop)
    return len(msgs)


class NoPacing:
    """The interpreter's own collections (before ADR 0020)."""

    def __init__(self, _full_every_s: float) -> None: ...

    def start(self) -> None: ...
    def batch_done(self) -> None: ...
    def stop(self) -> None: ...


class Pauses:
    """The longest collection (wall ms) while it is on: how long the engine stops."""

    def __init__(self) -> None:
        self.longest_ms, self._started = 0.0, 0.0

    def __enter__(self) -> Pauses:
        gc.callbacks.append(self._on_gc)
        return self

    def __exit__(self, *_exc: object) -> None:
        gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.longest_ms = max(self.longest_ms, (time.perf_counter() - self._started) * 1000)


def cpu_seconds(call: Callable[[], int]) -> tuple[float, float]:
    """CPU seconds of the call and its longest collection (ms)."""
    gc.collect()  # the last path's engine, not timed
    with Pauses() as pauses:
        t0 = time.process_time()
        call()
        return time.process_time() - t0, pauses.longest_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trades", type=int, default=200_000)
    parser.add_argument("--tickers", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument(
        "--rate", type=int, default=0,
        help="live at this many trades/s: trade times that far apart, batches of what one "
        "gather window takes in; default: a 10-minute backlog read in batches of 10,000",
    )  # fmt: skip
    parser.add_argument(
        "--window", type=float, default=LiveConfig().gather_s,
        help="with --rate: seconds a batch gathers (live.gather_s; 0.05 was the old poll)",
    )  # fmt: skip
    args = parser.parse_args()
    now_ms = int(time.time() * 1000)
    span_ms = args.trades * 1000 // args.rate if args.rate else 600_000
    batch = max(1, round(args.rate * args.window)) if args.rate else BATCH
    msgs = messages(args.trades, args.tickers, now_ms, span_ms)
    gc.freeze()  # the messages are the bench's, not the engine's heap
    paths: dict[str, Callable[[list[Any], int], int]] = {
        "bare": bare,
        "engine": engine,
        "engine, default gc": partial(engine, pacing=False),
        "engine, previews every batch": partial(engine, preview_interval_s=0.0),
    }
    took: dict[str, list[float]] = {k: [] for k in paths}
    paused: dict[str, list[float]] = {k: [] for k in paths}
    for rep in range(args.reps + 1):  # the first round warms up
        order = list(paths) if rep % 2 == 0 else list(reversed(paths))
        for label in order:
            seconds, pause_ms = cpu_seconds(lambda f=paths[label]: f(msgs, batch))  # type: ignore[misc]
            if rep:
                took[label].append(seconds)
                paused[label].append(pause_ms)
    base = statistics.median(took["bare"])
    mode = f"live at {args.rate:,}/s" if args.rate else "a backlog"
    print(f"{args.trades:,} trades over {args.tickers:,} tickers ({mode}, batches of "
          f"{batch:,}), {args.reps} reps, load {os.getloadavg()[0]:.1f}")  # fmt: skip
    print("| path | CPU s (median) | trades per CPU-s | x bare | longest collection ms (max) |")
    print("|---|---:|---:|---:|---:|")
    for label, values in took.items():
        median = statistics.median(values)
        print(
            f"| {label} | {median:.2f} | {args.trades / median:,.0f} | {base / median:.2f} "
            f"| {max(paused[label]):.0f} |"
        )


if __name__ == "__main__":
    main()
