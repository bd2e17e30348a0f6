"""The live engine's work per trade, without Kafka or sockets (issue 44 item 4).

What one engine process can sustain is bounded by the CPU its consume loop spends per
trade. This runs that loop's per-batch steps on Kafka messages built in memory
(confluent-kafka ``Message`` objects holding mdproto Tick records, ``--tickers``
tickers over 3 partitions, trade times spread over 10 minutes so candles close):

- **bare**: decode every record (`envelope.decode_record`), nothing else: the floor;
- **engine**: `live_engine._Run`'s steps for one consume() batch of 10,000: the
  position check, decoding and validating (`_decode`), dedupe, candles of 60 s
  (previews and closes), and encoding every tick, preview and closed candle as the
  PUB server does (`envelope.encode_pub`, stamped with sequence numbers; no socket).

Both alternate ``--reps`` times on the same messages, in one process; CPU seconds of
the process (`time.process_time`), so other load on the machine shifts the figures
less than wall time would. Trades per CPU-second is the engine's ceiling on one core.

    .venv/bin/python bench/live_engine_cpu.py [--trades 200000] [--tickers 1000] [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

import confluent_kafka
from google.protobuf.message import Message

from mdproto import envelope
from mdproto.messages import TakerSide, Tick
from mdproto.recent import RecentKeys
from pipeline import live_engine
from pipeline.config import CepConfig, LiveConfig, Settings

TOPIC = "market.ticks"
PARTITIONS = 3
BATCH = 10_000


def messages(trades: int, tickers: int, now_ms: int) -> list[Any]:
    rng = random.Random(1)
    step_ms = max(1, 600_000 // trades)
    out = []
    for i in range(trades):
        k = rng.randrange(tickers)
        tick = Tick(
            ticker=f"BINANCE:T{k}/USDT", trade_id=str(i), price=100 + rng.random(),
            amount=rng.random(), timestamp_ms=now_ms - 600_000 + i * step_ms,
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


def bare(msgs: list[Any], _now_ms: int) -> int:
    for m in msgs:
        envelope.decode_record(m.value(), Tick)
    return len(msgs)


def engine(msgs: list[Any], now_ms: int) -> int:
    sink = Sink()
    settings = Settings(live=LiveConfig(periods=[60]), cep=CepConfig(enabled=False))
    nothing: Any = None  # consumer, state store, snapshot file: not reached by these steps
    run = live_engine._Run(
        settings, nothing, Producer(), nothing, nothing, live_engine.Snapshot(), None,
        sink.send_many,
    )  # fmt: skip
    for p in range(PARTITIONS):
        key = (TOPIC, p)
        run.positions[key], run.live_from[key], run.tickers[key] = 0, 0, set()
        run.recent[p] = RecentKeys(100_000)
    assert run.candles is not None
    for start in range(0, len(msgs), BATCH):
        batch = [m for m in msgs[start : start + BATCH] if run._ok(m)]
        run._candles(run.candles, live_engine.live_only(run._decode(batch)), now_ms)
    return len(msgs)


def cpu_seconds(call: Callable[[], int]) -> float:
    t0 = time.process_time()
    call()
    return time.process_time() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trades", type=int, default=200_000)
    parser.add_argument("--tickers", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    now_ms = int(time.time() * 1000)
    msgs = messages(args.trades, args.tickers, now_ms)
    paths = {"bare": bare, "engine": engine}
    took: dict[str, list[float]] = {k: [] for k in paths}
    for rep in range(args.reps + 1):  # the first round warms up
        order = list(paths) if rep % 2 == 0 else list(reversed(paths))
        for label in order:
            seconds = cpu_seconds(lambda f=paths[label]: f(msgs, now_ms))  # type: ignore[misc]
            if rep:
                took[label].append(seconds)
    base = statistics.median(took["bare"])
    print(f"{args.trades:,} trades over {args.tickers:,} tickers, {args.reps} reps, "
          f"load {os.getloadavg()[0]:.1f}")  # fmt: skip
    print("| path | CPU s (median) | trades per CPU-s | x bare |")
    print("|---|---:|---:|---:|")
    for label, values in took.items():
        median = statistics.median(values)
        print(f"| {label} | {median:.2f} | {args.trades / median:,.0f} | {base / median:.2f} |")


if __name__ == "__main__":
    main()
