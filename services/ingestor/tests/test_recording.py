"""Recording without Kafka: gaps a recorded feed reports, the repair plan's paging and
verdicts, the repairer's writes, and how recorded feeds ignore leases and cancels."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from ingestor.config import RecordedMarkets
from ingestor.exchange_calls import FetchEnv
from ingestor.live import FeedStats, GapFound, LiveFeeds, Recording, TradePoint, run_feed
from ingestor.model import ExchangeCallError, FaultKind, MarketInfo, Trade
from ingestor.recording import RepairPlan, recorded_tickers
from ingestor.repair import repair_gap
from ingestor.retry import RetryPolicy
from ingestor.venues import venue_for
from ingestor.venues.base import TradePaging
from mdproto.messages import Tick, TradeGap
from mdproto.recent import RecentKeys

T0 = 1_700_000_000_000
TICKER = "BINANCE:BTC/USDT"


def trades(*ids: int) -> list[Trade]:
    return [Trade(str(i), 100.0 + i, 1.0, T0 + i, "buy") for i in ids]


def point(i: int) -> TradePoint:
    return TradePoint(str(i), T0 + i)


def record_feed(
    fakes: Any, batches: list[Any], resume: TradePoint | None, *, consecutive: bool = True
) -> tuple[list[GapFound], list[TradePoint], Any]:
    source = fakes.FakeExchange(trade_batches=batches)
    source.consecutive_trade_ids = consecutive
    sink = fakes.FakeSink()
    gaps: list[GapFound] = []
    sent: list[TradePoint] = []

    async def no_sleep(_delay: float) -> None:
        return None

    async def scenario() -> None:
        recording = Recording(
            resume_from=lambda: resume,
            on_gap=gaps.append,
            on_sent=lambda p, _delivery, _count: sent.append(p),
        )
        task = asyncio.create_task(
            run_feed(
                TICKER,
                source,
                sink,
                FeedStats(),
                dedupe=RecentKeys(100),
                reconnect=RetryPolicy(base_delay_s=0, jitter=0),
                sleep=no_sleep,
                recording=recording,
            )
        )
        await asyncio.wait_for(source.trades_exhausted.wait(), 5)
        task.cancel()

    asyncio.run(scenario())
    return gaps, sent, sink


DROP = ExchangeCallError(FaultKind.NETWORK, "connection closed")


def test_a_recorded_feed_reports_skipped_ids_and_reconnect_losses_with_both_ends(
    fakes: Any,
) -> None:
    gaps, sent, sink = record_feed(
        fakes, [trades(1, 2, 3), trades(6, 7), DROP, trades(8, 9), DROP, trades(12)], point(0)
    )
    assert gaps == [
        GapFound(TICKER, point(3), point(6), TradeGap.SKIPPED_IDS, 2),
        GapFound(TICKER, point(9), point(12), TradeGap.RECONNECT, 2),
    ]
    # The reconnect that lost nothing (7 -> 8) is no gap; every batch's newest trade is
    # handed over with its delivery (the checkpoint's candidate).
    assert sent == [point(3), point(7), point(9), point(12)]
    assert [t.trade_id for _, t in sink.ticks] == [str(i) for i in (1, 2, 3, 6, 7, 8, 9, 12)]


def test_a_restarted_recording_reports_the_trades_since_its_checkpoint(fakes: Any) -> None:
    gaps, _, sink = record_feed(fakes, [trades(9, 10)], point(5))
    assert gaps == [GapFound(TICKER, point(5), point(9), TradeGap.RESTART, 3)]
    assert [t.gap_before for _, t in sink.ticks] == [True, False]


def test_a_recording_that_resumes_where_it_stopped_has_no_gap(fakes: Any) -> None:
    gaps, _, sink = record_feed(fakes, [trades(4, 5, 6)], point(3))
    assert gaps == []
    assert not any(t.gap_before for _, t in sink.ticks)


def test_without_consecutive_ids_every_restart_and_reconnect_is_a_gap(fakes: Any) -> None:
    gaps, _, _ = record_feed(
        fakes, [trades(100, 200), DROP, trades(300)], point(7), consecutive=False
    )
    assert gaps == [
        GapFound(TICKER, point(7), point(100), TradeGap.RESTART, 0),
        GapFound(TICKER, point(200), point(300), TradeGap.RECONNECT, 0),
    ]


def test_a_first_recording_has_no_gap_row_but_marks_its_first_trade(fakes: Any) -> None:
    gaps, _, sink = record_feed(fakes, [trades(40, 41)], None)
    assert gaps == []
    assert [t.gap_before for _, t in sink.ticks] == [True, False]


# --- the repair plan -----------------------------------------------------------


class History:
    """A trade history paged like an exchange: by id, by time, or the latest only."""

    def __init__(self, ids: Sequence[int], paging: TradePaging, cap: int) -> None:
        self.trades = trades(*ids)
        self.paging = paging
        self.cap = cap
        self.requests: list[tuple[str | None, int | None]] = []

    def page(self, cursor: str | None, since_ms: int | None, limit: int) -> list[Trade]:
        self.requests.append((cursor, since_ms))
        limit = min(limit, self.cap)
        if cursor is not None and self.paging is TradePaging.BY_ID_BACKWARD:
            return [t for t in self.trades if int(t.trade_id) < int(cursor)][-limit:]
        if cursor is not None:
            return [t for t in self.trades if int(t.trade_id) >= int(cursor)][:limit]
        if since_ms is not None:
            return [t for t in self.trades if t.timestamp_ms >= since_ms][:limit]
        return self.trades[-limit:]


def run_plan(plan: RepairPlan, history: History) -> None:
    for _ in range(100):
        if plan.finished:
            return
        cursor, since_ms = plan.request()
        plan.take(history.page(cursor, since_ms, plan.page_limit))
    raise AssertionError("the plan never finished")


def gap(first: int, last: int, cause: int = TradeGap.SKIPPED_IDS) -> GapFound:
    return GapFound(TICKER, point(first), point(last), cause, last - first - 1)


def test_by_id_paging_asks_for_the_missing_ids_page_by_page() -> None:
    history = History(range(1, 400), TradePaging.BY_ID, 1000)
    plan = RepairPlan(gap(100, 205), TradePaging.BY_ID, consecutive=True, page_limit=50)
    run_plan(plan, history)
    assert [r[0] for r in history.requests] == ["101", "151", "201"]
    assert sorted(int(i) for i in plan.recovered) == list(range(101, 205))
    assert plan.verdict("binance") == (TradeGap.REPAIRED, "104 trades recovered")


def test_backward_id_paging_walks_down_from_the_gaps_end() -> None:
    history = History(range(1, 400), TradePaging.BY_ID_BACKWARD, 100)
    plan = RepairPlan(gap(100, 305), TradePaging.BY_ID_BACKWARD, consecutive=True, page_limit=100)
    run_plan(plan, history)
    assert [r[0] for r in history.requests] == ["305", "205", "105"]
    assert sorted(int(i) for i in plan.recovered) == list(range(101, 305))
    assert plan.verdict("okx") == (TradeGap.REPAIRED, "204 trades recovered")


def test_trades_the_exchange_no_longer_has_make_the_gap_unrepairable() -> None:
    history = History(range(150, 400), TradePaging.BY_ID, 1000)  # history starts at 150
    plan = RepairPlan(gap(100, 205), TradePaging.BY_ID, consecutive=True, page_limit=1000)
    run_plan(plan, history)
    state, reason = plan.verdict("binance")
    assert state == TradeGap.UNREPAIRABLE
    assert reason == "binance returned 55 of the 104 missing trades"


def test_latest_only_repairs_a_recent_gap_and_refuses_an_older_one() -> None:
    recent = RepairPlan(gap(340, 350), TradePaging.LATEST_ONLY, consecutive=True, page_limit=60)
    run_plan(recent, History(range(1, 400), TradePaging.LATEST_ONLY, 60))
    assert recent.verdict("bybit") == (TradeGap.REPAIRED, "9 trades recovered")

    old = RepairPlan(gap(100, 350), TradePaging.LATEST_ONLY, consecutive=True, page_limit=60)
    run_plan(old, History(range(1, 400), TradePaging.LATEST_ONLY, 60))
    state, reason = old.verdict("bybit")
    assert state == TradeGap.UNREPAIRABLE
    assert "latest 60 trades" in reason


def test_by_time_paging_without_consecutive_ids_takes_everything_between_the_ends() -> None:
    history = History(range(0, 1000, 10), TradePaging.BY_TIME, 1000)
    plan = RepairPlan(gap(100, 300), TradePaging.BY_TIME, consecutive=False, page_limit=5)
    run_plan(plan, history)
    assert sorted(int(i) for i in plan.recovered) == list(range(110, 300, 10))
    assert plan.verdict("kraken")[0] == TradeGap.REPAIRED
    assert history.requests[0] == (None, T0 + 100)


def test_a_history_that_does_not_reach_the_gaps_start_is_no_repair() -> None:
    """An exchange that ignores `since` (serves its latest trades): no count can tell
    what is missing without consecutive ids, so the gap is not called repaired."""
    history = History(range(0, 1000, 10), TradePaging.BY_TIME, 1000)
    plan = RepairPlan(gap(100, 300), TradePaging.BY_TIME, consecutive=False, page_limit=5)

    def latest(cursor: str | None, since_ms: int | None, limit: int) -> list[Trade]:
        return history.trades[-limit:]

    history.page = latest  # type: ignore[method-assign]
    run_plan(plan, history)
    state, reason = plan.verdict("okx")
    assert state == TradeGap.UNREPAIRABLE
    assert reason.startswith("okx did not return trades from the gap's start on")


def test_adjacent_ends_need_no_repair() -> None:
    plan = RepairPlan(gap(7, 8), TradePaging.BY_ID, consecutive=True, page_limit=10)
    assert plan.finished and plan.verdict("binance") == (TradeGap.REPAIRED, "0 trades recovered")


# --- the repairer -----------------------------------------------------------------


class FakeHistory:
    consecutive_trade_ids = True

    def __init__(self, history: History, exchange_id: str, faults: Sequence[Exception] = ()):
        self.history = history
        self.venue = venue_for(exchange_id)
        self.faults = list(faults)

    async def fetch_trades(
        self, symbol: str, limit: int, *, since_ms: int | None = None, cursor: str | None = None
    ) -> list[Trade]:
        assert symbol == "BTC/USDT"
        if self.faults:
            raise self.faults.pop(0)
        return self.history.page(cursor, since_ms, limit)


def repair(fakes: Any, exchange: FakeHistory, the_gap: GapFound) -> tuple[Any, list[Any], Any]:
    sink = fakes.FakeSink()
    states: list[tuple[int, str]] = []

    async def progress(state: int, reason: str) -> None:
        states.append((state, reason))

    async def no_sleep(_delay: float) -> None:
        return None

    env = FetchEnv(policy=RetryPolicy(max_attempts=2, base_delay_s=0, jitter=0), sleep=no_sleep)
    outcome = asyncio.run(
        repair_gap(
            the_gap,
            exchange,
            sink,
            env,
            page_limit=1000,
            max_pages=100,
            progress=progress,
            now_ms=lambda: 99,
        )
    )
    return outcome, states, sink


def test_the_repairer_writes_the_missing_trades_marked_repaired(fakes: Any) -> None:
    exchange = FakeHistory(History(range(1, 3000), TradePaging.BY_ID, 1000), "binance")
    outcome, states, sink = repair(fakes, exchange, gap(10, 1500))
    assert (outcome.state, outcome.recovered) == (TradeGap.REPAIRED, 1489)
    assert states == [(TradeGap.REPAIRING, "paging binance by_id")]
    ticks: list[Tick] = [t for _, t in sink.ticks]
    assert [int(t.trade_id) for t in ticks] == list(range(11, 1500))
    assert all(t.repaired and not t.gap_before and t.ingested_at_ms == 99 for t in ticks)


def test_an_exchange_down_leaves_the_gap_open_and_a_refusal_makes_it_unrepairable(
    fakes: Any,
) -> None:
    history = History(range(1, 100), TradePaging.BY_ID, 1000)
    down = ExchangeCallError(FaultKind.UNAVAILABLE, "503")
    outcome, _, sink = repair(fakes, FakeHistory(history, "binance", [down, down]), gap(10, 20))
    assert outcome.state == TradeGap.OPEN and "retrying later" in outcome.reason
    assert sink.ticks == []

    refused = ExchangeCallError(FaultKind.BAD_REQUEST, "historicalTrades needs a key")
    outcome, _, _ = repair(fakes, FakeHistory(history, "binance", [refused]), gap(10, 20))
    assert outcome.state == TradeGap.UNREPAIRABLE
    assert outcome.reason == "binance refused its trade history: historicalTrades needs a key"


# --- recorded feeds among live ones ------------------------------------------------


def test_a_recorded_feed_has_no_lease_ignores_cancels_and_serves_every_request(
    fakes: Any,
) -> None:
    source = fakes.FakeExchange(trade_batches=[trades(1)])

    async def scenario() -> None:
        feeds = LiveFeeds(
            {"BINANCE:": source},
            fakes.FakeSink(),
            lease_s=0.001,
            dedupe_capacity=10,
            reconnect=RetryPolicy(),
            monotonic=lambda: 0.0,
        )
        feeds.recorded_anywhere = lambda t: t in (TICKER, "BINANCE:ETH/USDT")
        assert await feeds.record(TICKER)
        assert feeds.request(TICKER) is False  # shares the recorded feed
        assert feeds.request("BINANCE:ETH/USDT") is False  # recorded by another ingestor
        assert feeds.leases.tickers() == []
        assert await feeds.cancel(TICKER) is False
        assert feeds.active() == [TICKER]
        assert await feeds.unrecord(TICKER, "slot moved")
        assert feeds.active() == []
        assert feeds.request("BINANCE:SOL/USDT") is True  # not recorded: a live feed

    asyncio.run(scenario())


def market(symbol: str, quote: str = "USDT", active: bool = True) -> MarketInfo:
    base = symbol.split("/")[0]
    return MarketInfo(
        symbol, symbol.replace("/", ""), base, quote, active, 0.01, 0.001, 0, 0, 0, 0, 0
    )


@pytest.mark.parametrize(
    ("wanted", "tickers", "unknown"),
    [
        (
            RecordedMarkets(markets=["ETH/USDT", "BTC/USDT", "DOGE/USDT", "OLD/USDT"]),
            ["BINANCE:BTC/USDT", "BINANCE:ETH/USDT"],
            ["BINANCE:DOGE/USDT", "BINANCE:OLD/USDT"],
        ),
        (
            RecordedMarkets(markets="all", quote="BTC"),
            ["BINANCE:ETH/BTC"],
            [],
        ),
    ],
)
def test_the_universe_names_what_the_exchange_does_not_list(
    wanted: RecordedMarkets, tickers: list[str], unknown: list[str]
) -> None:
    markets = [
        market("BTC/USDT"),
        market("ETH/USDT"),
        market("ETH/BTC", "BTC"),
        market("OLD/USDT", active=False),
    ]
    universe = recorded_tickers("BINANCE", wanted, markets)
    assert list(universe.tickers) == tickers
    assert list(universe.unknown) == unknown


def test_top_keeps_the_largest_quote_volumes_and_ranks_unknown_volumes_last() -> None:
    markets = [market(s) for s in ("BTC/USDT", "ETH/USDT", "SOL/USDT", "XRP/USDT")]
    markets.append(market("DOGE/USDT", active=False))
    volumes = {"BTC/USDT": 9e9, "ETH/USDT": 5e9, "XRP/USDT": 5e9, "DOGE/USDT": 1e12}
    wanted = RecordedMarkets(markets="all", quote="USDT", top=3)
    universe = recorded_tickers("BINANCE", wanted, markets, volumes)
    # Ties by symbol; an inactive market never, however busy; no volume ranks last.
    assert list(universe.tickers) == ["BINANCE:BTC/USDT", "BINANCE:ETH/USDT", "BINANCE:XRP/USDT"]
    wanted = RecordedMarkets(markets="all", top=4)
    universe = recorded_tickers("BINANCE", wanted, markets, volumes)
    assert "BINANCE:SOL/USDT" in universe.tickers


@pytest.mark.parametrize("filters", [{"quote": "USDT"}, {"top": 5}])
def test_quote_and_top_are_refused_on_a_list_of_markets(filters: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="filter `markets: all`"):
        RecordedMarkets(markets=["BTC/USDT"], **filters)


# --- the recorder's own bookkeeping (no Kafka group: slot events fed by hand) ----


class FakeFeeds:
    def __init__(self) -> None:
        self.recorded: dict[str, Any] = {}

    async def record(self, ticker: str, recording: Any = None) -> bool:
        self.recorded[ticker] = recording
        return True

    async def unrecord(self, ticker: str, why: str) -> bool:
        return self.recorded.pop(ticker, None) is not None

    def revive_recorded(self) -> list[str]:
        return []


class RecordingSink:
    def __init__(self) -> None:
        self.records: list[tuple[str, Any, int]] = []

    async def send_recording(self, key: str, record: Any, partition: int) -> asyncio.Future[int]:
        self.records.append((key, record, partition))
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        future.set_result(len(self.records))
        return future


def recorder_with(feeds: FakeFeeds, books: FakeFeeds, sink: RecordingSink) -> Any:
    from ingestor.config import RecordingSettings
    from ingestor.recorder import Recorder

    class Adapter:
        prefix = "BINANCE"
        exchange_id = "binance"

    recorder = Recorder(
        Adapter(),  # type: ignore[arg-type]
        RecordedMarkets(markets=["BTC/USDT", "ETH/USDT"], channels=["trades", "book"]),
        RecordingSettings(),
        feeds=feeds,  # type: ignore[arg-type]
        books=books,  # type: ignore[arg-type]
        sink=sink,  # type: ignore[arg-type]
        env=lambda _adapter: FetchEnv(),
        ingestor_id="ing-1",
        bootstrap="unused",
        topic="unused",
        now_ms=lambda: 1_000,
    )
    wanted = RecordedMarkets(markets=["BTC/USDT", "ETH/USDT"])
    recorder.use_universe(
        recorded_tickers("BINANCE", wanted, [market("BTC/USDT"), market("ETH/USDT")])
    )
    return recorder


def test_a_slot_records_its_markets_resumes_at_their_checkpoints_and_stops_when_revoked() -> None:
    from mdproto import contracts, envelope
    from mdproto.messages import RecordingCheckpoint
    from mdproto.topics import recording_slot

    feeds, books, sink = FakeFeeds(), FakeFeeds(), RecordingSink()
    slot = recording_slot(TICKER, contracts.RECORDING_SLOTS)

    async def scenario() -> None:
        recorder = recorder_with(feeds, books, sink)
        # The slot's partition, read from its start: a checkpoint of an earlier run.
        checkpoint = RecordingCheckpoint(ticker=TICKER, last_trade_id="41", last_trade_time_ms=T0)
        from ingestor.kafka_sink import SlotRecord

        recorder.slot_records(
            [SlotRecord(slot, TICKER.encode(), envelope.encode_record(checkpoint))]
        )
        await recorder._take_slot(slot)
        assert set(feeds.recorded) >= {TICKER} and set(books.recorded) >= {TICKER}
        assert feeds.recorded[TICKER].resume_from() == TradePoint("41", T0)
        assert TICKER in recorder.recorded_here()
        await recorder._drop_slot(slot)
        assert TICKER not in feeds.recorded and TICKER not in books.recorded

    asyncio.run(scenario())


def test_trades_kafka_refused_become_a_gap_once_kafka_takes_them_again() -> None:
    feeds, books, sink = FakeFeeds(), FakeFeeds(), RecordingSink()

    async def scenario() -> list[Any]:
        recorder = recorder_with(feeds, books, sink)
        loop = asyncio.get_running_loop()

        def delivery(error: Exception | None) -> asyncio.Future[int]:
            future: asyncio.Future[int] = loop.create_future()
            if error is None:
                future.set_result(1)
            else:
                future.set_exception(error)
            return future

        recorder._on_sent(TICKER, point(10), delivery(None), 10)
        await recorder._checkpoint()  # checkpoint at 10
        recorder._on_sent(TICKER, point(20), delivery(RuntimeError("broker down")), 10)
        await asyncio.sleep(0)  # the delivery callback runs
        await recorder._checkpoint()  # no checkpoint past 10
        recorder._on_sent(TICKER, point(30), delivery(None), 10)
        await recorder._checkpoint()
        await asyncio.sleep(0)  # the queued records are sent
        assert recorder.stats.trades == 30
        return [r for _, r, _ in sink.records]

    records = asyncio.run(scenario())
    checkpoints = [r.last_trade_id for r in records if r.DESCRIPTOR.name == "RecordingCheckpoint"]
    gaps = [r for r in records if r.DESCRIPTOR.name == "TradeGap"]
    assert checkpoints == ["10", "30"]
    assert [(g.from_trade_id, g.to_trade_id, g.cause, g.state) for g in gaps] == [
        ("10", "30", TradeGap.DELIVERY_FAILED, TradeGap.OPEN)
    ]


def test_top_against_the_simulators_universe_keeps_its_three_busiest_markets() -> None:
    """`top: 3` over the simulator's markets and its own 24 h volumes (what its ticker
    endpoints serve): the three largest, all universe markets, ahead of the 13 defaults."""
    from infra.exchange_sim import Universe

    now_ms = 1_772_454_896_000  # 2026-03-02T12:34:56Z
    model = Universe(20, rate=200).model()
    markets = [market(s.symbol, s.quote, s.trading_at(now_ms)) for s in model.specs.values()]
    volumes: dict[str, float] = {}
    for m in markets:
        day = model.rolling_day(m.symbol, now_ms) if m.active else None
        if day is not None:
            volumes[m.symbol] = float(day.quote_volume)
    # The 24 h figure is the sum of the 1,440 one-minute candles before now's minute.
    end = now_ms - now_ms % 60_000
    minutes = model.klines("U001/USDT", "1m", end - 86_400_000, end - 1)
    assert volumes["U001/USDT"] == float(sum(k.quote_volume for k in minutes))
    wanted = RecordedMarkets(markets="all", quote="USDT", top=3)
    universe = recorded_tickers("BINANCE", wanted, markets, volumes)
    busiest = sorted(volumes, key=lambda s: -volumes[s])[:3]
    assert list(universe.tickers) == sorted(f"BINANCE:{s}" for s in busiest)
    assert all(s.startswith("U") for s in busiest)
    assert min(volumes[s] for s in busiest) > max(
        v for s, v in volumes.items() if not s.startswith("U")
    )
