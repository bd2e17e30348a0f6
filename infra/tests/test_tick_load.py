"""infra/tick_load.py: the synthetic load of the kill-one-engine test and the candles it
counts, against the candle oracle and, on the local stack, against what Kafka received."""

from __future__ import annotations

import importlib
import math
import random
import time
import uuid
from collections import Counter
from typing import Any, NamedTuple

import pytest
from confluent_kafka import Consumer

from infra.localstack import LocalStack
from infra.testing import consume, poll_until
from infra.tick_load import (
    CYCLE,
    JUMP_PRICE,
    MINUTE_MS,
    LoadSpec,
    SentCandle,
    SentCandles,
    TickLoad,
    load_tickers,
    paced,
    price_of,
    ticker_cycle,
    zipf_shares,
)
from mdproto import envelope
from mdproto.messages import Tick


class Trade(NamedTuple):
    ticker: str
    trade_id: str
    price: float
    amount: float
    timestamp_ms: int
    gap_before: bool = False


def tally(trades: list[Trade]) -> dict[tuple[str, int], SentCandle]:
    sent = SentCandles()
    for t in trades:
        sent.add(t.ticker, t.timestamp_ms, int(t.trade_id.rsplit("-", 1)[1]), t.price, t.amount)
    return sent.candles


def differences(sent: dict[tuple[str, int], SentCandle], trades: list[Trade]) -> list[Any]:
    """Where the tally and the oracle's 1-minute candles of `trades` differ (volume up
    to float summation order)."""
    oracle = importlib.import_module("candle_oracle")  # tests/oracles, on pytest's path
    want = {(c.ticker, c.open_time_ms): c for c in oracle.aggregate(trades, [60])}
    if set(sent) != set(want):
        return [sorted(sent), sorted(want)]
    return [
        (key, got, c)
        for key, got in sent.items()
        if (c := want[key])
        and (
            (got.open, got.high, got.low, got.close, got.count)
            != (c.open, c.high, c.low, c.close, c.trade_count)
            or not math.isclose(got.volume, c.volume, rel_tol=1e-9)
        )
    ]


def test_the_tally_is_the_oracle_s_candle_with_equal_times_and_a_clock_step_back() -> None:
    rng = random.Random(7)
    start = 1_700_000_040_000 + 50_000  # 10 s before a minute's end
    trades, now = [], start
    for n in range(3_000):
        now += rng.choice((0, 0, 1, 5, 40, -30, 200))  # many trades a millisecond; NTP steps back
        ticker = rng.choice(("X:A/B", "X:C/D"))
        trades.append(Trade(ticker, f"r1-{n}", price_of(n % 3, n), (1 + n % 9) / 1000, now))
    sent = tally(trades)
    assert len(sent) >= 3  # two tickers, crossing a minute
    assert differences(sent, trades) == []


def test_the_mix_gives_every_ticker_its_zipf_share_hottest_first() -> None:
    shares = zipf_shares(200, 1.0)
    assert math.isclose(sum(shares), 1.0)
    cycle = ticker_cycle(200, shares)
    counts = Counter(cycle)
    assert set(counts) == set(range(200))
    assert abs(len(cycle) - CYCLE) <= 200
    assert counts[0] == max(counts.values()) and counts[0] > 10 * counts[199]
    assert cycle[:50] != sorted(cycle[:50])  # shuffled: hot tickers spread over time


def test_prices_stay_under_a_threshold_the_jump_crosses() -> None:
    prices = [price_of(i, n) for i in range(200) for n in range(100)]
    assert min(prices) >= 10 and max(prices) < 1_000 < JUMP_PRICE
    assert load_tickers(200)[0] == "LOADGEN:T001/USD"


def test_the_minutes_inside_a_run_are_the_whole_ones() -> None:
    def spec(start: float, stop: float) -> LoadSpec:
        return LoadSpec("kafka:9092", "t", 10, 100.0, start_at=start, stop_at=stop)

    assert spec(1_800.0 - 6, 1_860.0 + 2).minutes_inside() == [1_800_000]
    assert spec(1_800.0, 1_860.0).minutes_inside() == [1_800_000]
    assert spec(1_801.0, 1_900.0).minutes_inside() == []


@pytest.mark.stack
def test_the_producer_sends_what_it_counts_and_jumps(local_stack: LocalStack) -> None:
    bootstrap = local_stack.endpoints.kafka_bootstrap
    topic = f"tick-load-{uuid.uuid4().hex[:8]}"
    tickers = load_tickers(20)
    now = time.time()
    spec = LoadSpec(
        bootstrap, topic, 20, 2_000.0, start_at=now + 3, stop_at=now + 6, jump_ticker=tickers[0]
    )
    with TickLoad(spec) as load:
        poll_until("a third of the run sent", lambda: load.sent >= 2_000, 30, 0.05)
        load.jump()  # a ticker's trades before and after it
        report = load.report(60)
    assert report.failed == 0 and report.sent > 2_000
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": topic, "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    try:
        received = [
            envelope.decode_record(m.value() or b"", Tick) for m in consume(consumer, report.sent)
        ]
    finally:
        consumer.close()
    trades = [Trade(t.ticker, t.trade_id, t.price, t.amount, t.timestamp_ms) for t in received]
    assert len({t.trade_id for t in trades}) == report.sent
    assert differences(report.sent_candles.candles, trades) == []
    jumped = [t for t in trades if t.price == JUMP_PRICE]
    assert jumped and {t.ticker for t in jumped} == {tickers[0]}
    first_jump = min(int(t.trade_id.rsplit("-", 1)[1]) for t in jumped)
    assert all(
        t.price == JUMP_PRICE
        for t in trades
        if t.ticker == tickers[0] and int(t.trade_id.rsplit("-", 1)[1]) > first_jump
    )
    assert all(key[1] % MINUTE_MS == 0 for key in report.sent_candles.candles)


class FakeClock:
    """A monotonic clock that a sleep moves on by ``step`` (a slow sender: a larger step)."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 100.0, step

    def __call__(self) -> float:
        return self.now

    def sleep(self, _seconds: float) -> None:
        self.now += self.step


def test_paced_numbers_every_trade_once_in_order_at_the_rate() -> None:
    clock = FakeClock(step=1 / 256)  # exact in binary: no rounding in the test's sums
    slices = list(paced(1024.0, 1.0, clock=clock, sleep=clock.sleep))
    numbers = [n for s in slices for n in s]
    assert numbers == list(range(1021))  # the last slice, at 255/256 s: 1,020 due after the first
    assert all(len(s) == 4 for s in slices[1:])  # 1/256 s of 1,024/s


def test_paced_behind_schedule_sends_what_is_due_and_still_ends_on_time() -> None:
    clock = FakeClock(step=0.25)  # each slice took a quarter of a second
    slices = list(paced(1000.0, 1.0, clock=clock, sleep=clock.sleep))
    assert [len(s) for s in slices] == [1, 250, 250, 250]  # due at 0, 0.25, 0.5, 0.75 s
    assert clock.now - 100.0 == 1.0  # no longer run: a rate not offered shows as fewer trades
