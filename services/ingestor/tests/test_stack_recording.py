"""Recording on real Kafka and the simulator: configured markets recorded with no
client, spread over two ingestors, taken over when one stops, gaps from dropped trade
ids and a websocket outage repaired, and every trade of the window in Kafka once."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from ingestor.app import Ingestor
from mdproto import envelope
from mdproto.messages import Tick, TradeGap

pytestmark = pytest.mark.stack

MARKETS = ["BTC/USDT", "ETH/USDT", "SOL/USDT", "BNB/USDT", "XRP/USDT"]
TICKERS = {f"BINANCE:{m}" for m in MARKETS}


@pytest.fixture(autouse=True)
def api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Binance's historicalTrades (the repairer's id cursor) needs a key; the simulator
    takes any."""
    monkeypatch.setenv("INGESTOR_BINANCE_API_KEY", "simulator")


def recording_settings(
    harness: Any, relay: Any, tag: str, markets: list[str] = MARKETS, **exchange: Any
) -> Any:
    return harness.settings(
        relay,
        suffix=tag,
        kafka={"topic_recording": f"t{tag}.recording"},
        exchange=exchange,
        recording={
            "exchanges": {"binance": {"markets": [*markets, "NOPE/USDT"]}},
            "group_prefix": f"t{tag}-recorders",
            "checkpoint_interval_s": 0.2,
            "repair": {"retry_s": 0.5},
        },
    )


async def until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Wait for `condition` (checked on every loop turn of 50 ms); fail naming `what`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what}")
        await asyncio.sleep(0.05)


def recorded(*ingestors: Ingestor) -> list[set[str]]:
    return [set(i.recorders["BINANCE:"].recorded_here()) for i in ingestors]


def records_in(bootstrap: str, topic: str) -> int:
    """How many records `topic` holds now (its partitions' end offsets: no transactions,
    no retention deletes here)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"size-{uuid.uuid4().hex}"})
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in partitions
        )
    finally:
        consumer.close()


def ticks_until(harness: Any, topic: str, last: dict[str, str]) -> dict[str, dict[str, Tick]]:
    """Every tick of `topic` by ticker and trade id, read until each ticker's `last`
    trade (its final checkpoint) and every record the topic held already were read (a
    repair's trades, delivered before this read, come after the live ones in the log)."""
    by_ticker: dict[str, dict[str, Tick]] = {t: {} for t in last}
    held = records_in(harness.bootstrap, topic)

    def done(records: list[tuple[bytes | None, bytes]]) -> bool:
        for _, value in records[done.seen :]:  # type: ignore[attr-defined]
            tick = envelope.decode_record(value, Tick)
            by_ticker[tick.ticker].setdefault(tick.trade_id, tick)
        done.seen = len(records)  # type: ignore[attr-defined]
        return len(records) >= held and all(
            trade_id in by_ticker[t] for t, trade_id in last.items()
        )

    done.seen = 0  # type: ignore[attr-defined]
    harness.read_topic(harness.bootstrap, topic, done, timeout_s=120)
    return by_ticker


async def past(recorder: Any, tickers: set[str], end_ms: int) -> dict[str, str]:
    """Wait until every ticker's checkpoint is past `end_ms`; their trade ids."""
    await until(
        lambda: all(recorder.checkpoint(t).time_ms > end_ms for t in tickers),
        90,
        "every market recorded past the window",
    )
    return {t: recorder.checkpoint(t).trade_id for t in tickers}


def test_markets_are_recorded_without_clients_spread_and_taken_over_with_no_trade_lost(
    harness: Any, run_ingestor: Any
) -> None:
    sim = harness.sim
    tag = uuid.uuid4().hex[:8]

    async def scenario() -> tuple[Any, int, int, list[TradeGap], dict[str, str]]:
        relay = harness.FakeRelay()
        first = Ingestor(recording_settings(harness, relay, tag))
        second = Ingestor(recording_settings(harness, relay, tag))
        task_first = await run_ingestor(first)
        await until(lambda: recorded(first)[0] == TICKERS, 60, "the first records every market")
        recorder = first.recorders["BINANCE:"]
        assert recorder.universe.unknown == ("BINANCE:NOPE/USDT",)
        # From the newest first checkpoint on, every market's trades are recorded (the
        # trades before a market's first one are before its recording began).
        await until(lambda: all(recorder.checkpoint(t) for t in TICKERS), 60, "every market trades")
        begin_ms = max(p.time_ms for t in TICKERS if (p := recorder.checkpoint(t)))
        task_second = await run_ingestor(second)
        try:
            await until(
                lambda: (a := recorded(first, second))[0] | a[1] == TICKERS and not a[0] & a[1],
                60,
                "the two record every market once between them",
            )
            await first.stop()  # leaves the group: the second takes its slots at once
            await task_first
            await until(lambda: recorded(second)[0] == TICKERS, 30, "the second takes over")
            await asyncio.sleep(0)
            end_ms = sim.now_ms()
            # A takeover's gap is found at the new feed's first trade: only once every
            # market was recorded past the window are all of its gaps known.
            last = await past(second.recorders["BINANCE:"], TICKERS, end_ms)
            settled = lambda: all(  # noqa: E731
                g.state in (TradeGap.REPAIRED, TradeGap.UNREPAIRABLE)
                for g in second.recorders["BINANCE:"].gaps()
            )
            await until(settled, 90, "gaps settled")
            gaps = second.recorders["BINANCE:"].gaps()
        finally:
            await second.stop()
            await task_second
            relay.close()
        return second.settings.kafka.topic_ticks, begin_ms, end_ms, gaps, last

    topic, begin_ms, end_ms, gaps, last = asyncio.run(scenario())
    # Every gap of the takeover was repaired, by id (historicalTrades fromId).
    assert {TradeGap.State.Name(g.state) for g in gaps} <= {"REPAIRED"}
    assert {TradeGap.Cause.Name(g.cause) for g in gaps} <= {"RESTART"}
    assert_every_trade_once(harness, sim, topic, begin_ms, end_ms, last)


def assert_every_trade_once(
    harness: Any, sim: Any, topic: str, begin_ms: int, end_ms: int, last: dict[str, str]
) -> None:
    """Kafka holds each model trade of [begin, end] of the tickers of `last` (once per
    id: the table's key; a repair may re-send a trade the feed also sent)."""
    stored = ticks_until(harness, topic, last)
    model = sim.model
    for ticker in sorted(last):
        symbol = ticker.split(":")[1]
        want = {str(t.id) for t in model.iter_trades(symbol, begin_ms, end_ms)}
        got = {i for i, t in stored[ticker].items() if begin_ms <= t.timestamp_ms <= end_ms}
        assert got == want, (
            f"{ticker}: missing {sorted(want - got)[:5]}, extra {sorted(got - want)[:5]}"
        )


def test_dropped_trade_ids_and_a_websocket_outage_are_found_and_repaired(
    harness: Any, run_ingestor: Any
) -> None:
    sim = harness.sim
    tag = uuid.uuid4().hex[:8]
    tickers = {"BINANCE:BTC/USDT", "BINANCE:ETH/USDT"}

    async def scenario() -> tuple[str, int, int, list[TradeGap], dict[str, str]]:
        relay = harness.FakeRelay()
        ingestor = Ingestor(recording_settings(harness, relay, tag, ["BTC/USDT", "ETH/USDT"]))
        task = await run_ingestor(ingestor)
        recorder = ingestor.recorders["BINANCE:"]
        try:
            await until(
                lambda: all(recorder.checkpoint(t) for t in tickers), 60, "both markets trade"
            )
            begin_ms = max(p.time_ms for t in tickers if (p := recorder.checkpoint(t)))
            sim.add_fault("trade_drop", symbol="BTC/USDT", count=4)
            # A reconnect that missed no trade is no gap (consecutive ids say so), and a
            # quiet minute of ETH can hold no trade for seconds: the outage ends once the
            # exchange traded ETH during it, so the feed surely misses one.
            sim.ws_outage(symbol="ETH/USDT", exchange="binance", seconds=120)
            closed_ms = sim.now_ms() + 1  # its connections are closed by now
            await until(
                lambda: any(sim.model.iter_trades("ETH/USDT", closed_ms, sim.now_ms())),
                60,
                "an ETH trade during the outage",
            )
            sim.clear_faults("ws_outage")

            def causes() -> set[str]:
                return {TradeGap.Cause.Name(g.cause) for g in recorder.gaps()}

            await until(lambda: {"SKIPPED_IDS", "RECONNECT"} <= causes(), 90, "both gaps found")
            await until(
                lambda: all(g.state == TradeGap.REPAIRED for g in recorder.gaps()),
                90,
                "both gaps repaired",
            )
            end_ms = max(g.to_time_ms for g in recorder.gaps())
            last = await past(recorder, tickers, end_ms)
            return ingestor.settings.kafka.topic_ticks, begin_ms, end_ms, recorder.gaps(), last
        finally:
            await ingestor.stop()
            await task
            relay.close()

    topic, begin_ms, end_ms, gaps, last = asyncio.run(scenario())
    skipped = next(g for g in gaps if g.cause == TradeGap.SKIPPED_IDS)
    assert (skipped.ticker, skipped.missing_ids, skipped.trades_recovered) == (
        "BINANCE:BTC/USDT",
        4,
        4,
    )
    outage = next(g for g in gaps if g.cause == TradeGap.RECONNECT)
    assert outage.ticker == "BINANCE:ETH/USDT"
    assert outage.trades_recovered == outage.missing_ids > 0
    assert_every_trade_once(harness, sim, topic, begin_ms, end_ms, last)
