"""Synthetic trades straight into ``market.ticks`` at a fixed rate, and the candles they make.

Why: the kill-one-engine test (e2e/test_live_engines.py, issue 44 item 7) needs
10,000 trades/s on the compose platform, far past what the exchange simulator's HTTP
injection carries on two shared cores, and it must know every trade it caused to
check the stored candles. So a producer *process* (its own interpreter: no GIL shared
with the test's clients) writes ``Tick`` records keyed by ticker with confluent-kafka,
as the ingestor does, and counts each ``(ticker, minute)`` it sent: the candle the
platform must store, by the oracle's rule (services/spark-pipeline/tests/oracles/
candle_oracle.py: open/close by trade time, then trade id).

- Tickers ``LOADGEN:T001/USD`` ... of an exchange no ingestor serves and no market
  metadata lists: the live engine and the candles-store take any
  ``EXCHANGE:BASE/QUOTE`` ticker, the relay judges no symbol of an exchange without
  metadata, and nothing else trades them.
- Rates follow the simulator universe's Zipf law (``infra.exchange_sim.universe``): a
  few hot tickers, a long tail; each ticker fills its share of a shuffled cycle.
- Trade time = wall clock at produce time; prices and amounts a pure function of the
  ticker and the trade's number, except that after ``jump()`` one ticker trades at
  ``JUMP_PRICE`` (a move a CEP trigger can wait for).

The pure parts (mix, prices, the tally) are unit-tested in infra/tests/test_tick_load.py.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import random
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from multiprocessing.sharedctypes import Synchronized
from typing import Any, Protocol

from mdproto import envelope
from mdproto.messages import TakerSide, Tick

EXCHANGE = "LOADGEN"
MINUTE_MS = 60_000
#: Slots of the ticker cycle: a ticker's share of them follows its weight (at least one).
CYCLE = 20_000
#: The price of the jumped ticker's trades after ``jump()``; others stay below 1,000.
JUMP_PRICE = 1_000_000.0
#: Sends are paced in slices this long (the producer sleeps between them).
SLICE_S = 0.005


class Flag(Protocol):
    def is_set(self) -> bool: ...


def paced(
    rate: float,
    seconds: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[range]:
    """The trade numbers to send now, slice after slice, so that ``rate`` a second go out
    for ``seconds`` from the first call; the generator sleeps ``SLICE_S`` between slices.
    Behind schedule a slice holds everything due, so a rate the sender cannot offer shows
    as fewer trades sent, not as a longer run. The one pacing of every synthetic tick
    producer (this module's and the benchmarks', bench/pipeline_common.py)."""
    origin, sent = clock(), 0
    while (elapsed := clock() - origin) < seconds:
        due = int(elapsed * rate) + 1
        if due > sent:
            yield range(sent, due)
            sent = due
        sleep(SLICE_S)


def send(
    producer: Any,
    topic: str,
    tick: Tick,
    on_delivery: Callable[[Any, Any], None] | None = None,
) -> None:
    """Produce ``tick`` keyed by its ticker, as the ingestor does; a full librdkafka queue
    is given time to send instead of failing the trade."""
    value, key = envelope.encode_record(tick), tick.ticker.encode()
    while True:
        try:
            if on_delivery is None:
                producer.produce(topic, key=key, value=value)
            else:
                producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
            return
        except BufferError:
            producer.poll(0.01)


def load_tickers(count: int) -> list[str]:
    """``LOADGEN:T001/USD``, ... (hottest first in a mix)."""
    width = max(3, len(str(count)))
    return [f"{EXCHANGE}:T{i:0{width}d}/USD" for i in range(1, count + 1)]


def zipf_shares(count: int, skew: float) -> list[float]:
    """Each ticker's share of the trades, hottest first: the simulator universe's law."""
    from infra.exchange_sim.universe import Universe

    return Universe(count, rate=1.0, skew=skew).rates()


def ticker_cycle(count: int, shares: Sequence[float], seed: int = 0) -> list[int]:
    """Ticker indexes, each about ``share * CYCLE`` times (at least once), shuffled: a
    producer that takes them in turn gives every ticker its share at any rate."""
    cycle = [i for i in range(count) for _ in range(max(1, round(shares[i] * CYCLE)))]
    random.Random(seed).shuffle(cycle)
    return cycle


def price_of(index: int, n: int) -> float:
    """Trade ``n``'s price on ticker ``index``: 10..999 plus up to 0.88, two decimals."""
    return round(10 + (index * 37) % 990 + (n % 89) / 100, 2)


def amount_of(n: int) -> float:
    return (1 + n % 9) / 1000


@dataclass(slots=True)
class SentCandle:
    """What one ticker traded in one minute, as the stored candle must show it. ``first``
    and ``last`` are the oracle's order keys (trade time, then trade number: ids share
    their prefix, so a longer id is a later number)."""

    open: float
    high: float
    low: float
    close: float
    volume: float
    count: int
    first: tuple[int, int]
    last: tuple[int, int]

    def add(self, price: float, amount: float, key: tuple[int, int]) -> None:
        self.count += 1
        self.volume += amount
        self.high = max(self.high, price)
        self.low = min(self.low, price)
        if key < self.first:
            self.open, self.first = price, key
        if key > self.last:
            self.close, self.last = price, key


@dataclass
class SentCandles:
    """Every (ticker, minute start in ms) sent, as ``SentCandle``."""

    candles: dict[tuple[str, int], SentCandle] = field(default_factory=dict)

    def add(self, ticker: str, time_ms: int, n: int, price: float, amount: float) -> None:
        key = (ticker, time_ms - time_ms % MINUTE_MS)
        candle = self.candles.get(key)
        if candle is None:
            order = (time_ms, n)
            self.candles[key] = SentCandle(price, price, price, price, amount, 1, order, order)
        else:
            candle.add(price, amount, (time_ms, n))

    def minute(self, start_ms: int) -> dict[str, SentCandle]:
        """Each ticker's candle of the minute starting at ``start_ms``."""
        return {t: c for (t, m), c in self.candles.items() if m == start_ms}


@dataclass(frozen=True)
class LoadSpec:
    """``rate`` trades/s over ``tickers`` tickers (Zipf ``skew``) into ``topic`` from
    ``start_at`` to ``stop_at`` (wall clock, s); ``jump_ticker`` moves on ``jump()``."""

    bootstrap: str
    topic: str
    tickers: int
    rate: float
    start_at: float
    stop_at: float
    skew: float = 1.0
    jump_ticker: str = ""
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:6])

    @property
    def names(self) -> list[str]:
        return load_tickers(self.tickers)

    def minutes_inside(self) -> list[int]:
        """Starts of the minutes that lie wholly between ``start_at`` and ``stop_at``."""
        first = math.ceil(self.start_at * 1000 / MINUTE_MS) * MINUTE_MS
        last = math.floor(self.stop_at * 1000 / MINUTE_MS) * MINUTE_MS
        return list(range(first, last, MINUTE_MS))


@dataclass
class LoadReport:
    """What the producer achieved: trades sent (and of those, deliveries Kafka refused),
    wall clock of the first and last send, its CPU seconds, the candles it made."""

    sent: int
    failed: int
    started: float
    ended: float
    cpu_s: float
    sent_candles: SentCandles

    @property
    def rate(self) -> float:
        """Trades/s offered between the first and the last send."""
        return self.sent / max(self.ended - self.started, 1e-9)


def produce(
    spec: LoadSpec, jump: Flag, progress: Synchronized[int], out: Queue[LoadReport]
) -> None:
    """The producer process: wait for ``start_at``, send at ``spec.rate`` until
    ``stop_at`` (``paced``), flush, put the report."""
    from confluent_kafka import KafkaError, Message, Producer

    producer = Producer(
        {
            "bootstrap.servers": spec.bootstrap,
            "linger.ms": 5,
            "enable.idempotence": True,  # no retry reorders or repeats a ticker's trades
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    failed = 0

    def delivered(error: KafkaError | None, _message: Message) -> None:
        nonlocal failed
        if error is not None:
            failed += 1

    names = spec.names
    cycle = ticker_cycle(len(names), zipf_shares(len(names), spec.skew))
    jump_index = names.index(spec.jump_ticker) if spec.jump_ticker else -1
    tally = SentCandles()
    time.sleep(max(0.0, spec.start_at - time.time()))  # a schedule, not a synchronisation
    started, cpu = time.time(), time.process_time()
    sent, jumped = 0, False
    for numbers in paced(spec.rate, spec.stop_at - started):
        jumped = jumped or jump.is_set()
        for n in numbers:
            now = time.time_ns() // 1_000_000
            index = cycle[n % len(cycle)]
            price = JUMP_PRICE if jumped and index == jump_index else price_of(index, n)
            amount = amount_of(n)
            tick = Tick(
                ticker=names[index],
                trade_id=f"{spec.run}-{n}",
                price=price,
                amount=amount,
                timestamp_ms=now,
                side=TakerSide.BUY if n % 2 else TakerSide.SELL,
                ingested_at_ms=now,
            )
            send(producer, spec.topic, tick, delivered)
            tally.add(tick.ticker, now, n, price, amount)
        sent = numbers.stop
        progress.value = sent
        producer.poll(0)
    ended = time.time()
    producer.flush(60)
    unsent = len(producer)  # not delivered within the flush: as good as refused
    cpu_s = time.process_time() - cpu
    out.put(LoadReport(sent, failed + unsent, started, ended, cpu_s, tally))


class TickLoad:
    """``produce`` in a spawned process (no fork of a threaded test process), with the
    flag that moves ``spec.jump_ticker`` and the count sent so far."""

    def __init__(self, spec: LoadSpec) -> None:
        self.spec = spec
        ctx = mp.get_context("spawn")
        self._jump = ctx.Event()
        self._progress: Synchronized[int] = ctx.Value("q", 0)
        self._out: Queue[LoadReport] = ctx.Queue()
        self._process: BaseProcess = ctx.Process(
            target=produce,
            args=(spec, self._jump, self._progress, self._out),
            name="tick-load",
            daemon=True,
        )

    @property
    def sent(self) -> int:
        return int(self._progress.value)

    def jump(self) -> None:
        """From now on ``spec.jump_ticker`` trades at ``JUMP_PRICE``."""
        self._jump.set()

    def report(self, timeout_s: float) -> LoadReport:
        """The producer's report once it has stopped and flushed (``stop_at`` passed)."""
        wait = max(0.0, self.spec.stop_at - time.time()) + timeout_s
        report = self._out.get(timeout=wait)
        self._process.join(timeout_s)
        return report

    def __enter__(self) -> TickLoad:
        self._process.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._process.is_alive():
            self._process.terminate()
        self._process.join(30)
