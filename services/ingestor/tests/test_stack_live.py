"""Live trades over the simulator's websocket into real Kafka: dedupe, reconnect, leases."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from ingestor.app import Ingestor
from mdproto import envelope
from mdproto.messages import DataRequest, IngestorControl, Status, TakerSide, Tick

pytestmark = pytest.mark.stack

MIN = 60_000


@pytest.fixture
def quiet_sim() -> Iterator[Any]:
    """A simulator whose streams carry only the trades a test injects."""
    from infra.exchange_sim import run_in_thread

    with run_in_thread(stream_model_trades=False) as sim:
        yield sim


def realtime(ticker: str) -> DataRequest:
    return DataRequest(request_id=f"rt-{ticker}", kind=DataRequest.REALTIME, ticker=ticker)


def inject(sim: Any, ids: range, base_ms: int) -> None:
    sim.inject_trades(
        "BTC/USDT",
        [
            {
                "id": i,
                "price": f"{60000 + i}.5",
                "qty": "0.01",
                "time_ms": base_ms + i,
                "m": i % 2 == 0,
            }
            for i in ids
        ],
    )


def test_ticks_reach_kafka_once_across_a_websocket_drop(
    harness: Any, run_ingestor: Any, quiet_sim: Any
) -> None:
    sim = quiet_sim
    harness.sim = sim
    base_ms = sim.now_ms()

    async def scenario() -> tuple[list[Tick], Any, Any]:
        relay = harness.FakeRelay()
        settings = harness.settings(relay)
        ingestor = Ingestor(settings)
        task = await run_ingestor(ingestor)
        try:
            await relay.wait_subscribed()
            await relay.publish(realtime("BINANCE:BTC/USDT"))
            await asyncio.to_thread(sim.wait_for_subscribers, "BTC/USDT", 1)
            await relay.publish(realtime("BINANCE:BTC/USDT"))  # re-announcement: no 2nd feed
            await asyncio.to_thread(inject, sim, range(1, 6), base_ms)

            def ids_seen(records: list[Any], want: str) -> bool:
                return any(envelope.decode_record(v, Tick).trade_id == want for _, v in records)

            topic = settings.kafka.topic_ticks
            read = harness.read_topic
            await asyncio.to_thread(read, harness.bootstrap, topic, lambda r: ids_seen(r, "5"))

            # Historical work goes on while the feed streams.
            start = (sim.now_ms() // MIN - 300) * MIN
            history = DataRequest(
                request_id="hist-during-live",
                kind=DataRequest.HISTORICAL,
                ticker="BINANCE:ETH/USDT",
                period_seconds=60,
                start_time_ms=start,
                end_time_ms=start + 200 * MIN,
            )
            await relay.publish(history)

            assert await asyncio.to_thread(sim.drop_websockets, "BTC/USDT") == 1
            await asyncio.to_thread(sim.wait_for_subscribers, "BTC/USDT", 1, 20.0)
            await asyncio.to_thread(inject, sim, range(4, 9), base_ms)  # 4 and 5 replayed
            await asyncio.to_thread(inject, sim, range(9, 10), base_ms)  # sentinel
            records = await asyncio.to_thread(
                read, harness.bootstrap, topic, lambda r: ids_seen(r, "9")
            )
            batches = await asyncio.to_thread(
                harness.batches_until_final, settings, "hist-during-live"
            )

            await relay.send_control(
                IngestorControl(action=IngestorControl.CANCEL_REALTIME, ticker="BINANCE:BTC/USDT"),
                "BINANCE:",
            )
            await asyncio.to_thread(sim.wait_for_subscribers, "BTC/USDT", 0, 10.0)
            assert ingestor.feeds is not None and ingestor.feeds.active() == []
            ticks = [envelope.decode_record(v, Tick) for _, v in records]
            assert {k for k, _ in records} == {b"BINANCE:BTC/USDT"}
            return ticks, batches[-1], ingestor
        finally:
            await ingestor.stop()
            await task
            relay.close()

    ticks, final, _ = asyncio.run(scenario())
    assert [t.trade_id for t in ticks] == [str(i) for i in range(1, 10)]
    first = ticks[0]
    assert (first.ticker, first.price, first.amount, first.timestamp_ms) == (
        "BINANCE:BTC/USDT",
        60001.5,
        0.01,
        base_ms + 1,
    )
    assert first.side == TakerSide.BUY and ticks[1].side == TakerSide.SELL  # m=True: seller took
    assert first.ingested_at_ms >= first.timestamp_ms
    assert final.metadata.status == Status.OK and final.metadata.total_rows == 200


def test_feed_without_lease_refresh_stops(harness: Any, run_ingestor: Any, quiet_sim: Any) -> None:
    sim = quiet_sim
    harness.sim = sim

    async def scenario() -> None:
        relay = harness.FakeRelay()
        settings = harness.settings(relay, live={"realtime_lease_s": 1.5, "sweep_interval_s": 0.2})
        ingestor = Ingestor(settings)
        task = await run_ingestor(ingestor)
        try:
            await relay.wait_subscribed()
            for _ in range(8):  # the relay re-announces: the feed stays
                await relay.publish(realtime("BINANCE:BTC/USDT"))
                await asyncio.sleep(0.4)  # pacing the announcements, not synchronisation
            assert sim.subscribers("BTC/USDT") == 1
            assert ingestor.feeds is not None and ingestor.feeds.active() == ["BINANCE:BTC/USDT"]
            # announcements stop (the cancel was lost): the lease runs out
            await asyncio.to_thread(sim.wait_for_subscribers, "BTC/USDT", 0, 10.0)
            assert ingestor.feeds.active() == []
        finally:
            await ingestor.stop()
            await task
            relay.close()

    asyncio.run(scenario())
