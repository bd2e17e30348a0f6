"""Live feeds against a fake trade source: dedupe across reconnects, leases, cancel."""

from __future__ import annotations

import asyncio
from typing import Any

from ingestor.live import FeedStats, LiveFeeds, run_feed
from ingestor.model import ExchangeCallError, FaultKind, Trade
from ingestor.retry import RetryPolicy
from mdproto.messages import FeedStatus, Tick
from mdproto.recent import RecentKeys


def live_feeds(fakes: Any, source: Any, **options: Any) -> LiveFeeds:
    """LiveFeeds over one fake source (a lease of 10 s unless `options` say otherwise)."""
    values: dict[str, Any] = {"lease_s": 10, "dedupe_capacity": 100, "reconnect": RetryPolicy()}
    return LiveFeeds({"BINANCE:": source}, fakes.FakeSink(), **{**values, **options})


def trades(*ids: int) -> list[Trade]:
    return [Trade(str(i), 100.0 + i, 1.0, 1_700_000_000_000 + i, "buy") for i in ids]


def test_feed_dedupes_across_a_reconnect_and_backs_off(fakes: Any) -> None:
    drop = ExchangeCallError(FaultKind.NETWORK, "connection closed")
    source = fakes.FakeExchange(
        trade_batches=[trades(1, 2, 3), drop, trades(2, 3, 4, 5), trades(5, 6)]
    )
    sink = fakes.FakeSink()
    stats = FeedStats()
    sleeps: list[float] = []

    async def sleep(delay: float) -> None:
        sleeps.append(delay)

    async def scenario() -> None:
        task = asyncio.create_task(
            run_feed(
                "BINANCE:BTC/USDT",
                source,
                sink,
                stats,
                dedupe=RecentKeys(100),
                reconnect=RetryPolicy(base_delay_s=0.25, jitter=0),
                now_ms=lambda: 42,
                sleep=sleep,
            )
        )
        await asyncio.wait_for(source.trades_exhausted.wait(), 5)
        task.cancel()

    asyncio.run(scenario())
    ids = [t.trade_id for _, t in sink.ticks]
    assert ids == ["1", "2", "3", "4", "5", "6"]
    # Only the first trade follows a gap: the reconnect lost no trade id.
    assert [t.gap_before for _, t in sink.ticks] == [True] + [False] * 5
    assert (stats.ticks, stats.duplicates, stats.reconnects, stats.id_gaps) == (6, 3, 1, 0)
    assert sleeps == [0.25]
    key, tick = sink.ticks[0]
    assert key == "BINANCE:BTC/USDT" and isinstance(tick, Tick) and tick.ingested_at_ms == 42


def test_skipped_trade_ids_are_counted_and_the_next_tick_marked(fakes: Any) -> None:
    source = fakes.FakeExchange(trade_batches=[trades(1, 2), trades(5, 3, 6), trades(10)])
    stats = FeedStats()
    sink = fakes.FakeSink()

    async def scenario() -> None:
        task = asyncio.create_task(
            run_feed(
                "BINANCE:BTC/USDT",
                source,
                sink,
                stats,
                dedupe=RecentKeys(100),
                reconnect=RetryPolicy(),
            )
        )
        await asyncio.wait_for(source.trades_exhausted.wait(), 5)
        task.cancel()

    asyncio.run(scenario())
    assert stats.ticks == 6 and stats.id_gaps == 2 + 3  # 3..4 (3 came late), then 7..9
    # The Kafka records say where trades are missing: the pipeline marks those candles.
    marked = [(t.trade_id, t.gap_before) for _, t in sink.ticks]
    assert marked == [
        ("1", True),  # the feed's first trade
        ("2", False),
        ("5", True),
        ("3", False),
        ("6", False),
        ("10", True),
    ]
    assert stats.gaps_marked == 3


def test_feed_stops_on_a_permanent_error(fakes: Any) -> None:
    source = fakes.FakeExchange(
        trade_batches=[ExchangeCallError(FaultKind.BAD_SYMBOL, "no such market")]
    )
    stats = FeedStats()
    asyncio.run(
        run_feed(
            "BINANCE:NOPE/USDT",
            source,
            fakes.FakeSink(),
            stats,
            dedupe=RecentKeys(10),
            reconnect=RetryPolicy(),
        )
    )
    assert "no such market" in stats.failed


def test_feeds_start_once_refresh_and_expire(fakes: Any) -> None:
    async def scenario() -> None:
        now = [0.0]
        source = fakes.FakeExchange(trade_batches=[trades(1)])
        feeds = live_feeds(fakes, source, monotonic=lambda: now[0])
        assert feeds.request("BINANCE:BTC/USDT")
        now[0] = 8.0
        assert not feeds.request("BINANCE:BTC/USDT")  # re-announcement: lease refresh only
        assert feeds.active() == ["BINANCE:BTC/USDT"]
        now[0] = 15.0
        assert await feeds.sweep() == []  # refreshed at 8, so alive until 18
        now[0] = 18.5
        assert await feeds.sweep() == ["BINANCE:BTC/USDT"]
        assert feeds.active() == [] and source.unwatched == ["BTC/USDT"]

    asyncio.run(scenario())


def test_cancel_stops_the_feed_and_unknown_tickers_are_ignored(fakes: Any) -> None:
    async def scenario() -> None:
        source = fakes.FakeExchange()
        feeds = live_feeds(fakes, source)
        assert feeds.request("BINANCE:ETH/USDT")
        assert not feeds.request("KRAKEN:ETH/USD")  # not served here
        assert not feeds.request("not a ticker")
        assert await feeds.cancel("BINANCE:ETH/USDT")
        assert not await feeds.cancel("BINANCE:ETH/USDT")
        assert feeds.active() == [] and "BINANCE:ETH/USDT" not in feeds.leases
        assert feeds.request("BINANCE:ETH/USDT")  # can start again later
        await feeds.stop_all()

    asyncio.run(scenario())


def test_feeds_report_their_status_and_restart_after_the_exchange_was_down(fakes: Any) -> None:
    down = ExchangeCallError(FaultKind.UNAVAILABLE, "503 maintenance")
    sent: list[FeedStatus] = []

    async def scenario() -> None:
        arrived = asyncio.Event()
        source = fakes.FakeExchange(trade_batches=[down, down, trades(1)])
        feeds = live_feeds(
            fakes,
            source,
            reconnect=RetryPolicy(base_delay_s=0, jitter=0),
            start_attempts=2,
            on_status=lambda status: (sent.append(status), arrived.set()),
            ingestor_id="ing-1",
            now_ms=lambda: 7,
        )
        assert feeds.request("BINANCE:BTC/USDT")
        await asyncio.wait_for(arrived.wait(), 5)
        assert not feeds.active()  # FAILED ended the feed
        assert feeds.request("BINANCE:BTC/USDT")  # transient: the next announcement restarts it
        await asyncio.wait_for(source.trades_exhausted.wait(), 5)
        await feeds.stop_all()

    asyncio.run(scenario())
    failed, retrying, started = sent
    assert (failed.ticker, failed.state, failed.error_code, failed.ingestor_id, failed.at_ms) == (
        "BINANCE:BTC/USDT",
        FeedStatus.FAILED,
        "exchange_unavailable",
        "ing-1",
        7,
    )
    assert "503 maintenance" in failed.reason
    assert (retrying.state, retrying.error_code) == (FeedStatus.LOST, "exchange_unavailable")
    assert started.state == FeedStatus.STARTED and not started.error_code


def test_a_failed_feed_repeats_its_status_per_announcement_not_per_retry(fakes: Any) -> None:
    sent: list[FeedStatus] = []

    async def scenario() -> None:
        arrived = asyncio.Event()
        source = fakes.FakeExchange(
            trade_batches=[ExchangeCallError(FaultKind.BAD_SYMBOL, "no NOPE/USDT")]
        )
        feeds = live_feeds(
            fakes, source, on_status=lambda status: (sent.append(status), arrived.set())
        )
        assert feeds.request("BINANCE:NOPE/USDT")
        await asyncio.wait_for(arrived.wait(), 5)
        assert not feeds.request("BINANCE:NOPE/USDT")  # permanent: not restarted...
        assert [s.state for s in sent] == [FeedStatus.FAILED] * 2  # ...but told again
        await feeds.cancel("BINANCE:NOPE/USDT")
        assert not feeds.request("KRAKEN:NOPE/USD") and len(sent) == 2

    asyncio.run(scenario())
    assert sent[0] == sent[1] and sent[0].error_code == "bad_symbol"


def test_a_feed_restarted_while_its_old_one_unsubscribes_keeps_streaming(fakes: Any) -> None:
    """Real ccxt.pro on the simulator: a relay cancels a ticker and announces it again
    33 ms later (a subscriber left, another came). The new feed must not subscribe
    before the old feed's unsubscribe went out: that unsubscribe would end the new
    subscription (ccxt rejects its pending watch), and the feed would be FAILED for good."""
    from infra.exchange_sim import run_in_thread
    from ingestor.config import ExchangeSettings
    from ingestor.exchanges import ExchangeAdapter

    ticker, symbol = "BINANCE:BTC/USDT", "BTC/USDT"

    async def next_injected(sim: Any, sink: Any) -> None:
        for _ in range(40):
            [trade] = await asyncio.to_thread(
                sim.inject_trades, symbol, [{"price": "100", "qty": "1"}]
            )
            for _ in range(25):
                if any(t.trade_id == str(trade.id) for _, t in sink.ticks):
                    return
                await asyncio.sleep(0.02)
        raise AssertionError("no injected trade reached the sink")

    async def scenario(sim: Any) -> FeedStats:
        adapter = ExchangeAdapter("binance", ExchangeSettings(api_base_url=sim.base_url))
        await adapter.load_markets()
        sink = fakes.FakeSink()
        feeds = LiveFeeds(
            {"BINANCE:": adapter}, sink, lease_s=60, dedupe_capacity=1000, reconnect=RetryPolicy()
        )
        try:
            assert feeds.request(ticker)
            await next_injected(sim, sink)
            cancelling = asyncio.create_task(feeds.cancel(ticker))
            await asyncio.sleep(0)  # the cancel has begun, its unsubscribe not yet sent
            assert feeds.request(ticker)
            assert await cancelling
            await next_injected(sim, sink)
            stats = feeds.stats(ticker)
            assert stats is not None
            return stats
        finally:
            await feeds.cancel(ticker)
            await adapter.close()

    with run_in_thread() as sim:
        stats = asyncio.run(scenario(sim))
    assert (stats.failed, stats.reconnects) == ("", 0)
