"""Live candles (pipeline.candle_close, pipeline.live_candles): when a candle closes, what it
holds, corrections, incomplete windows, previews, and the snapshot a restart resumes from."""

from __future__ import annotations

import json
import random
from typing import Any

from candle_oracle import aggregate
from hypothesis import given, settings
from hypothesis import strategies as st

from mdproto import contracts
from mdproto.messages import OHLC, Tick
from pipeline.candle_close import Closing, TickerCandles
from pipeline.live_candles import LiveCandles

T = "BINANCE:ETH/USDT"
B = 1_704_067_200_000  # 2024-01-01T00:00:00Z, aligned to 1, 5 and 60 minutes
CFG = Closing(periods=(60, 300), lateness_s=10.0, idle_s=1.0)


def tick(
    trade_id: int, price: float, at_ms: int, amount: float = 1.0, *, gap: bool = False
) -> Tick:
    fields: dict[str, Any] = {"price": price, "amount": amount, "timestamp_ms": at_ms}
    return Tick(ticker=T, trade_id=str(trade_id), gap_before=gap, **fields)


def as_row(c: OHLC) -> dict[str, Any]:
    return {
        "period_seconds": c.period_seconds,
        "open_time_ms": c.open_time_ms,
        **{f: getattr(c, f) for f in ("open", "high", "low", "close", "volume", "trade_count")},
        "closed": c.closed,
        "correction": c.correction,
        "incomplete": c.incomplete,
    }


class Run:
    """Feeds batches through `LiveCandles` like the live engine, restoring it from its
    (JSON) snapshot after every batch, as a restart would."""

    def __init__(self, cfg: Closing = CFG) -> None:
        self.live = LiveCandles(cfg)
        self.emitted: list[dict[str, Any]] = []
        self.previews: list[dict[str, Any]] = []

    @property
    def candles(self) -> TickerCandles:
        return self.live.tickers[T]

    def batch(self, now_ms: int, *ticks: Tick) -> list[dict[str, Any]]:
        self.previews += [as_row(c) for c in self.live.add(ticks, now_ms)]
        rows = [as_row(c) for c in self.live.close_due(now_ms)]
        snapshot = json.loads(json.dumps(self.live.snapshot()))
        self.live = LiveCandles.restore(self.live.cfg, snapshot)
        self.emitted += rows
        return rows


def key(row: dict[str, Any]) -> tuple[int, int]:
    return (row["period_seconds"], row["open_time_ms"])


def values(row: dict[str, Any]) -> tuple[float, ...]:
    return (row["open"], row["high"], row["low"], row["close"], row["volume"], row["trade_count"])


def test_a_trade_of_the_next_window_closes_the_candle_with_trade_time_open_and_close() -> None:
    run = Run()
    minute0 = [
        tick(2, 101.0, B + 10_000, 0.5),
        tick(1, 100.0, B + 7_000),
        tick(3, 104.0, B + 30_000, 2.0),
        tick(3, 104.0, B + 30_000, 2.0),  # re-delivered: counts once
        tick(5, 103.0, B + 56_000, 0.25),
    ]
    assert run.batch(B + 57_000, *minute0) == []
    assert run.batch(B + 57_500, tick(4, 98.0, B + 50_000)) == []  # late, same window
    # Minute 1's first trade closes minute 0 at once: no watermark wait.
    [closed] = run.batch(B + 60_100, tick(6, 102.0, B + 60_000))
    assert key(closed) == (60, B)
    assert values(closed) == (100.0, 104.0, 98.0, 103.0, 4.75, 5)
    assert closed["correction"] is False and closed["closed"] is True
    assert (run.candles.exchange, run.candles.symbol) == ("BINANCE", "ETH/USDT")


def test_a_quiet_ticker_closes_by_processing_time_after_the_idle_timeout() -> None:
    run = Run()
    run.batch(B + 50_200, tick(1, 100.0, B + 50_000))
    # Due when the frontier (50 s) plus the quiet time beyond 1 s reaches 60 s.
    assert run.live.next_due_ms(B + 50_200) == 10_000 + 1_000
    assert run.batch(B + 61_100) == []
    [closed] = run.batch(B + 61_200)
    assert key(closed) == (60, B) and not closed["correction"]
    assert run.live.next_due_ms(B + 61_200) == 240_000  # the 5-minute candle next
    assert run.batch(B + 70_000) == []  # nothing twice


def test_a_late_trade_amends_closed_candles_and_publishes_corrections() -> None:
    run = Run()
    run.batch(B + 1_000, tick(1, 100.0, B + 1_000), tick(2, 101.0, B + 59_000))
    [closed] = run.batch(B + 61_000, tick(3, 102.0, B + 61_000))
    assert values(closed) == (100.0, 101.0, 100.0, 101.0, 2.0, 2)
    # Trade 4 (minute 0, 55 s) arrives after minute 0 was published: within the lateness.
    [correction] = run.batch(B + 62_000, tick(4, 90.0, B + 55_000))
    assert key(correction) == (60, B) and correction["correction"] is True
    assert values(correction) == (100.0, 101.0, 90.0, 101.0, 3.0, 3)
    # Re-delivered late trade: no change, nothing published.
    assert run.batch(B + 63_000, tick(4, 90.0, B + 55_000)) == []


def test_a_trade_later_than_the_lateness_misses_its_candle() -> None:
    run = Run()
    run.batch(B + 1_000, tick(1, 100.0, B + 1_000))
    run.batch(B + 75_000, tick(2, 100.0, B + 75_000))  # frontier 75 s
    assert run.batch(B + 76_000, tick(3, 500.0, B + 50_000)) == []  # 25 s behind: too late
    assert run.candles.too_late == 1
    # Closed minute 0 was evicted from the state, the open 5-minute candle kept its values.
    [five] = [r for r in run.batch(B + 300_500, tick(5, 100.0, B + 300_000)) if key(r)[0] == 300]
    assert values(five) == (100.0, 100.0, 100.0, 100.0, 2.0, 2)


def test_a_trade_after_a_feed_gap_marks_the_windows_the_gap_spans_incomplete() -> None:
    """The feed lost trades between 50 s and 130 s: minute 0 (already published closed
    on the idle timeout) is published again as an incomplete correction; minute 2 and
    the 5-minute window are incomplete from their previews on; minute 3 is whole."""
    run = Run()
    run.batch(B + 50_000, tick(1, 100.0, B + 10_000), tick(2, 101.0, B + 50_000))
    [minute0] = run.batch(B + 61_200)
    assert key(minute0) == (60, B) and not minute0["incomplete"]

    run.previews.clear()
    [again] = run.batch(B + 130_000, tick(9, 99.0, B + 130_000, gap=True))
    assert key(again) == (60, B) and again["correction"] and again["incomplete"]
    assert values(again) == values(minute0)  # the same trades, now with the note
    assert [(key(p), p["incomplete"]) for p in run.previews] == [
        ((60, B + 120_000), True),
        ((300, B), True),
    ]

    [minute2] = run.batch(B + 185_000, tick(10, 98.0, B + 185_000))
    assert key(minute2) == (60, B + 120_000) and minute2["incomplete"]
    assert not minute2["correction"]
    closed = run.batch(B + 301_000, tick(11, 97.0, B + 301_000))
    assert [(key(r), r["incomplete"]) for r in closed] == [
        ((60, B + 180_000), False),  # after the gap: every trade seen
        ((300, B), True),
    ]
    run.previews.clear()
    assert run.batch(B + 302_000, tick(11, 97.0, B + 301_000, gap=True)) == []  # re-delivered
    assert run.previews == [] and not run.candles.windows[(60, (B + 300_000) * 1000)].incomplete


def test_the_first_trade_of_a_feed_marks_only_its_own_windows() -> None:
    """The feed's first trade (`gap_before`: its windows began before the feed did)."""
    run = Run()
    run.batch(B + 70_000, tick(1, 100.0, B + 70_000, gap=True))
    [minute1] = run.batch(B + 121_000, tick(2, 100.0, B + 121_000))
    assert key(minute1) == (60, B + 60_000) and minute1["incomplete"]
    closed = run.batch(B + 301_000, tick(3, 100.0, B + 301_000))
    assert [(key(r), r["incomplete"]) for r in closed] == [
        ((60, B + 120_000), False),
        ((300, B), True),
    ]


def test_a_snapshot_from_before_the_incomplete_flag_restores_whole_windows() -> None:
    run = Run()
    run.batch(B + 1_000, tick(1, 100.0, B + 1_000, gap=True))
    snapshot = json.loads(json.dumps(run.live.snapshot()))
    for window in snapshot[T]["w"]:
        assert window.pop() is True  # the flag is the last item of a window
    restored = LiveCandles.restore(CFG, snapshot)
    assert not any(w.incomplete for w in restored.tickers[T].windows.values())
    previews = restored.add([tick(2, 101.0, B + 2_000)], B + 2_000)
    assert [(c.trade_count, c.incomplete) for c in previews] == [(2, False), (2, False)]


def test_snapshot_round_trip_keeps_dedup_ids_and_emitted_flags() -> None:
    run = Run()
    run.batch(B + 1_000, tick(1, 100.0, B + 1_000))
    snapshot = run.live.snapshot()
    restored = LiveCandles.restore(CFG, json.loads(json.dumps(snapshot)))
    assert restored.snapshot() == json.loads(json.dumps(snapshot))
    assert restored.tickers[T].ids == {(B + 1_000) * 1000: {"1"}}  # its second's bucket


def test_ids_are_kept_for_the_lateness_only_and_an_old_snapshots_still_dedupe() -> None:
    """A minute of trades leaves the ids of the last lateness (10 s) plus a bucket, not
    the whole minute's; a snapshot from before the buckets (ids by window start, no
    ``iw``) still drops a re-delivered trade, then moves to the buckets."""
    run = Run()
    run.batch(B + 60_000, *(tick(i, 100.0, B + i * 1_000) for i in range(60)))
    assert sorted(int(i) for ids in run.candles.ids.values() for i in ids) == list(range(49, 60))

    old = run.live.snapshot()
    old[T] |= {"i": {str(B * 1000): ["1", "2"]}}
    del old[T]["iw"]
    legacy = LiveCandles.restore(CFG, json.loads(json.dumps(old)))
    legacy.tickers[T].frontier_us = (B + 2_000) * 1000
    assert legacy.add([tick(2, 101.0, B + 2_000)], B + 61_000) == []  # a re-delivery
    assert legacy.add([tick(3, 101.0, B + 3_000)], B + 61_000) != []
    legacy.tickers[T].frontier_us = (B + 200_000) * 1000
    legacy.close_due(B + 200_000)
    assert legacy.tickers[T].id_width_us == 1_000_000


def test_previews_show_each_changed_open_window_once_per_batch_never_a_trade_twice() -> None:
    run = Run()
    run.batch(B + 2_000, tick(1, 100.0, B + 1_000), tick(2, 102.0, B + 2_000))
    assert [(key(p), p["close"], p["trade_count"], p["closed"]) for p in run.previews] == [
        ((60, B), 102.0, 2, False),
        ((300, B), 102.0, 2, False),
    ]
    run.previews.clear()
    run.batch(B + 3_000, tick(2, 102.0, B + 2_000))  # re-delivered: nothing changed
    assert run.previews == []
    run.batch(B + 61_000, tick(3, 99.0, B + 61_000))
    # The new minute's window and the 5-minute one; the closed minute is no preview.
    assert [(key(p), p["trade_count"]) for p in run.previews] == [
        ((60, B + 60_000), 1),
        ((300, B), 3),
    ]


def test_a_backlog_closes_on_event_time_only_never_on_idle_time() -> None:
    live = LiveCandles(CFG)
    live.add([tick(1, 100.0, B + 1_000)], now_ms=B + 500_000)
    # Long after the trade by the clock, but the engine is still catching up.
    assert live.close_due(B + 900_000, idle=False) == []
    assert [c.period_seconds for c in live.close_due(B + 900_000)] == [60, 300]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32))
def test_random_streams_publish_each_window_once_and_end_equal_to_the_oracle(seed: int) -> None:
    """Random trades, re-deliveries, arrival jitter < lateness, random batches and gaps.

    Every window is published closed exactly once; its last publication (closed
    or correction) equals the oracle over all trades, as no trade is too late.
    """
    rnd = random.Random(seed)
    trades = [
        tick(i, float(rnd.randint(90, 110)), B + rnd.randint(0, 600_000), rnd.choice([0.5, 1.0]))
        for i in range(rnd.randint(1, 80))
    ]
    trades.sort(key=lambda t: t.timestamp_ms)
    # Arrival: trade time plus up to 5 s of jitter; some trades delivered twice.
    arrivals = sorted(
        [(t.timestamp_ms + rnd.randint(0, 5_000), t) for t in trades]
        + [
            (t.timestamp_ms + rnd.randint(0, 8_000), t)
            for t in rnd.sample(trades, len(trades) // 5)
        ],
        key=lambda a: a[0],
    )
    run = Run()
    now = B
    i = 0
    while i < len(arrivals):
        now += rnd.choice([100, 500, 2_000])
        batch = []
        while i < len(arrivals) and arrivals[i][0] <= now:
            batch.append(arrivals[i][1])
            i += 1
        run.batch(now, *batch)
    run.batch(now + 3_600_000)  # long quiet: every window closes by the idle timeout
    assert run.candles.too_late == 0
    closed = [key(r) for r in run.emitted if not r["correction"]]
    assert len(closed) == len(set(closed))
    final = {key(r): values(r) for r in run.emitted}
    expected = {
        (c.period_seconds, c.open_time_ms): (
            c.open,
            c.high,
            c.low,
            c.close,
            c.volume,
            c.trade_count,
        )
        for c in aggregate(trades, [60, 300])
    }
    assert final == expected


def test_candles_of_the_exchanges_trades_equal_the_exchanges_candles() -> None:
    """The simulator's model trades, streamed in batches as the exchange sends them, close
    into exactly the candles its REST API serves (Binance klines: counts included) for
    each live period; volume within float rounding (decimal total vs float sum)."""
    from infra.exchange_sim import DEFAULT_MODEL, expected_klines

    cfg = Closing(periods=contracts.LIVE_PERIODS, lateness_s=10.0, idle_s=1.0)
    run = Run(cfg)
    end = B + 2 * 3_600_000
    trades = list(DEFAULT_MODEL.iter_trades("ETH/USDT", B, end + 60_000))
    for i in range(0, len(trades), 97):  # uneven batches, arrival in trade order
        batch = [tick(t.id, float(t.price), t.time_ms, float(t.qty)) for t in trades[i : i + 97]]
        run.batch(batch[-1].timestamp_ms, *batch)
    closed = {key(r): r for r in run.emitted if not r["correction"]}
    for period in contracts.LIVE_PERIODS:
        interval = {60: "1m", 300: "5m", 3600: "1h"}[period]
        klines = expected_klines("ETH/USDT", interval, B, end - 1)
        assert len(klines) == 2 * 3600 // period
        for k in klines:
            row = closed[(period, k.open_time)]
            exchange = (float(k.open), float(k.high), float(k.low), float(k.close))
            assert (row["open"], row["high"], row["low"], row["close"]) == exchange
            assert row["trade_count"] == k.trades
            assert abs(row["volume"] - float(k.volume)) <= 1e-9 * float(k.volume)
    assert not [r for r in run.emitted if r["correction"]]


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from([(60, 300, 3600), (60, 90), (30,)]))
def test_a_batch_counts_exactly_as_its_trades_one_at_a_time(
    seed: int, periods: tuple[int, ...]
) -> None:
    """Per-slice aggregation of a batch (periods sharing a slice or not) leaves the same
    windows, ids, frontier and too-late count as the trades one batch each: re-deliveries,
    trades beyond the lateness and gaps in the middle of a batch included."""
    rnd = random.Random(seed)
    cfg = Closing(periods=periods, lateness_s=10.0, idle_s=1.0)
    trades = [
        tick(
            rnd.randint(0, 40),
            float(rnd.randint(90, 110)),
            B + rnd.randint(0, 200_000),
            rnd.choice([0.5, 1.0, 2.0]),
            gap=rnd.random() < 0.05,
        )
        for _ in range(rnd.randint(1, 120))
    ]
    batched, single = TickerCandles(), TickerCandles()
    i = 0
    while i < len(trades):
        n = rnd.randint(1, 30)
        batched.add(cfg, trades[i : i + n])
        i += n
    for t in trades:
        single.add(cfg, [t])
    assert batched.to_dict() == single.to_dict()


def test_previews_come_at_most_once_per_interval_with_the_latest_values() -> None:
    """With ``preview_every_ms``, windows changed between rounds wait for the next call
    after the interval and come once, as they are then; a window that closed meanwhile
    gets no preview after its close."""
    live = LiveCandles(CFG, preview_every_ms=250)
    first = live.add([tick(1, 100.0, B + 1_000)], B + 1_000)
    assert [(c.period_seconds, c.trade_count) for c in first] == [(60, 1), (300, 1)]
    assert live.add([tick(2, 101.0, B + 1_100)], B + 1_100) == []
    assert live.add([tick(3, 102.0, B + 1_200)], B + 1_200) == []
    assert live.add([], B + 1_249) == []
    later = live.add([], B + 1_250)  # no trade in this call: the waiting round goes
    assert [(c.period_seconds, c.trade_count, c.close) for c in later] == [
        (60, 3, 102.0),
        (300, 3, 102.0),
    ]
    # The first change after a quiet interval goes at once; the next ones wait.
    assert len(live.add([tick(4, 99.0, B + 61_000)], B + 61_000)) == 2
    assert live.add([tick(5, 98.0, B + 61_050)], B + 61_050) == []
    assert live.add([tick(6, 97.0, B + 121_000)], B + 61_100) == []
    assert [c.open_time_ms for c in live.close_due(B + 61_100)] == [B, B + 60_000]
    assert [(c.period_seconds, c.open_time_ms) for c in live.add([], B + 61_350)] == [
        (300, B),
        (60, B + 120_000),
    ]  # minute 1 waited for this round, but closed meanwhile: no preview after its close


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32))
def test_every_ticker_closes_on_time_though_only_touched_and_due_ones_are_looked_at(
    seed: int,
) -> None:
    """Several tickers, one `LiveCandles` kept across batches (no restore), random
    batches and quiet spells: after each `close_due` no window that its ticker's
    frontier and quiet time allow to close is still open (what looking at every ticker
    every time gave), and each window is published closed once, equal to the oracle."""
    rnd = random.Random(seed)
    names = [f"BINANCE:T{i}/USDT" for i in range(4)]
    trades = sorted(
        (
            Tick(
                ticker=rnd.choice(names), trade_id=str(i), price=float(rnd.randint(90, 110)),
                amount=1.0, timestamp_ms=B + rnd.randint(0, 400_000),
            )
            for i in range(rnd.randint(1, 60))
        ),
        key=lambda t: t.timestamp_ms,
    )  # fmt: skip
    live = LiveCandles(CFG)
    closed: list[OHLC] = []
    now, i = B, 0
    while i < len(trades) or now < B + 2_000_000:
        now += rnd.choice([50, 700, 3_000, 40_000])
        batch = []
        while i < len(trades) and trades[i].timestamp_ms <= now:
            batch.append(trades[i])
            i += 1
        live.add(batch, now)
        closed += live.close_due(now)
        for candles in live.tickers.values():
            assert candles.frontier_us is not None
            quiet_us = max(0, now - candles.last_arrival_ms - 1_000) * 1000
            bound = max(candles.closed_until_us, candles.frontier_us + quiet_us)
            late = [
                k
                for k, w in candles.windows.items()
                if not w.emitted and k[1] + k[0] * 1_000_000 <= bound
            ]
            assert late == [], (now, late)
    firsts = [(c.ticker, c.period_seconds, c.open_time_ms) for c in closed if not c.correction]
    assert len(firsts) == len(set(firsts))
    expected = {
        (c.ticker, c.period_seconds, c.open_time_ms): c for c in aggregate(trades, [60, 300])
    }
    assert set(firsts) == set(expected)
    final = {(c.ticker, c.period_seconds, c.open_time_ms): c for c in closed}
    assert all(
        final[k].trade_count == e.trade_count and final[k].close == e.close
        for k, e in expected.items()
    )


def test_a_ticker_dropped_while_its_previews_wait_gets_none() -> None:
    """Its partition moved to another engine between two rounds (the engine pops it)."""
    live = LiveCandles(CFG, preview_every_ms=250)
    live.add([tick(1, 100.0, B + 1_000)], B + 1_000)
    assert live.add([tick(2, 101.0, B + 1_100)], B + 1_100) == []
    live.tickers.pop(T)
    assert live.add([], B + 1_300) == []
    assert live.close_due(B + 1_300) == []


def test_a_trading_ticker_keeps_one_idle_entry_and_its_quiet_close_still_comes() -> None:
    """A ticker trading at every batch pushes its idle close back each time: that must
    not cost a heap entry per batch (the engine's loop runs this for every ticker of
    every batch), and the entry left, taken early, must still close the window once
    the ticker goes quiet."""
    live = LiveCandles(CFG)
    now, frontier = B + 1_000, 0
    for i in range(200):  # 200 batches 50 ms apart, a trade 0-80 ms old in each
        at = now - (i * 7 % 5) * 20
        frontier = max(frontier, at)
        live.add([tick(i, 100.0 + i % 3, at)], now)
        assert live.close_due(now) == []
        now += 50
    assert len(live.heap) <= 2
    # Idle 1 s after the last batch, and event time on from the newest trade.
    quiet_close_ms = (now - 50) + 1_000 + (B + 60_000 - frontier)
    assert live.close_due(quiet_close_ms - 1) == []
    closed = live.close_due(quiet_close_ms)
    assert [(c.period_seconds, c.open_time_ms, c.trade_count) for c in closed] == [(60, B, 200)]


def test_an_amended_window_restored_from_a_snapshot_is_emitted_again() -> None:
    """`next_us` is derived, never saved: a restored ticker with a window amended after
    its close (dirty) must still emit the correction at its next `advance`."""
    candles = TickerCandles(last_arrival_ms=B + 61_000)  # not quiet
    candles.add(CFG, [tick(1, 100.0, B + 1_000), tick(2, 101.0, B + 61_000)])
    assert [p for p, *_ in candles.advance(CFG, B + 61_000)] == [60]
    candles.add(CFG, [tick(3, 99.0, B + 59_000)])  # late, within the lateness: amends
    restored = TickerCandles.from_dict(json.loads(json.dumps(candles.to_dict())), CFG)
    [(period, start, window, correction)] = restored.advance(CFG, B + 61_000)
    assert (period, start, window.count, correction) == (60, B * 1000, 2, True)
