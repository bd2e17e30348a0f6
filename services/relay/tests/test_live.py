"""Live subscriptions start and stop live data (grace period made short in config)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from mdproto.messages import DataRequest, IngestorControl

if TYPE_CHECKING:
    from conftest import FakePipeline, RelayFactory

TICK = "BINANCE:BTC/USDT|tick"
CANDLES = "BINANCE:BTC/USDT|ohlc:60"
TICKER = "BINANCE:BTC/USDT"


def test_first_subscriber_starts_and_last_one_leaving_cancels_after_grace(
    make_relay: RelayFactory, pipeline: FakePipeline
) -> None:
    relay = make_relay(realtime_grace_s=0.3, realtime_refresh_s=600)
    ingestor = relay.ingestor()
    first = relay.subscriber(TICK)
    topic, start = ingestor.next_work(DataRequest.REALTIME)
    assert (topic, start.ticker, start.kind) == ("BINANCE:", TICKER, DataRequest.REALTIME)
    assert start.request_id
    second = relay.subscriber(TICK, CANDLES)  # more subscribers: no second start
    pipeline.wait_subscribed(TICK, CANDLES)
    relay.wait_until(lambda: relay.sample("relay_subscribed_topics") == 2)
    first.close()
    second.unsubscribe(TICK.encode())
    pipeline.wait_subscribed(CANDLES)  # still one market topic of the ticker left
    assert not ingestor.control.poll(500)  # > grace: nothing cancelled while CANDLES has a reader
    left_at = time.monotonic()
    second.close()
    topic, cancel = ingestor.recv_control()
    assert time.monotonic() - left_at >= 0.3 - 0.05
    assert (topic, cancel.action) == ("BINANCE:", IngestorControl.CANCEL_REALTIME)
    assert (cancel.ticker, cancel.request_id) == (TICKER, start.request_id)
    assert relay.sample("relay_published_total", kind="realtime_start") == 1
    relay.wait_until(lambda: relay.sample("relay_live_tickers") == 0)  # set after the send


def test_resubscribing_within_the_grace_period_keeps_live_data(
    make_relay: RelayFactory, pipeline: FakePipeline
) -> None:
    relay = make_relay(realtime_grace_s=0.5, realtime_refresh_s=0.1)
    ingestor = relay.ingestor()
    first = relay.subscriber(TICK)
    _, start = ingestor.next_work(DataRequest.REALTIME)
    left_at = time.monotonic()
    first.close()
    relay.subscriber(CANDLES)  # someone else wants the ticker again
    # Refreshes keep coming after the grace period would have ended: not cancelled.
    while True:
        _, refresh = ingestor.next_work(DataRequest.REALTIME)
        assert refresh.request_id == start.request_id
        if time.monotonic() - left_at > 1.0:
            break
    assert not ingestor.control.poll(0)
    assert relay.sample("relay_published_total", kind="realtime_start") == 1


def test_duplicate_subscriptions_from_one_client_do_not_leak(make_relay: RelayFactory) -> None:
    relay = make_relay(realtime_grace_s=0.0, realtime_refresh_s=600)
    ingestor = relay.ingestor()
    sub = relay.subscriber(TICK, TICK)  # a SUB sends both subscribes upstream
    ingestor.next_work(DataRequest.REALTIME)
    sub.unsubscribe(TICK.encode())
    sub.unsubscribe(TICK.encode())  # ...but only the last unsubscribe
    _, cancel = ingestor.recv_control()
    assert cancel.ticker == TICKER


def test_ingestor_joining_late_is_told_at_once(make_relay: RelayFactory) -> None:
    relay = make_relay(realtime_refresh_s=600)
    relay.subscriber(TICK)
    relay.wait_until(lambda: relay.sample("relay_live_tickers") == 1)
    ingestor = relay.ingestor()  # connects after the start was published
    _, announce = ingestor.next_work(DataRequest.REALTIME)
    assert announce.ticker == TICKER
    assert relay.sample("relay_published_total", kind="realtime_join") >= 1


def test_periodic_refresh_reaches_ingestors(make_relay: RelayFactory) -> None:
    relay = make_relay(realtime_refresh_s=0.1)
    ingestor = relay.ingestor()
    relay.subscriber(TICK, "BINANCE:ETH/USDT|ohlc:")
    seen: dict[str, int] = {}
    while min(seen.values(), default=0) < 3 or len(seen) < 2:
        _, announce = ingestor.next_work(DataRequest.REALTIME)
        seen[announce.ticker] = seen.get(announce.ticker, 0) + 1
    assert set(seen) == {TICKER, "BINANCE:ETH/USDT"}


def test_notification_and_unknown_exchange_topics_start_nothing(
    make_relay: RelayFactory, pipeline: FakePipeline
) -> None:
    relay = make_relay(known_exchanges=["BINANCE"])
    topics = ["RESPONSE:c1", "HISTORY_READY:r1", "KRAKEN:BTC/USD|tick", "BINANCE:"]
    relay.subscriber(*topics)
    pipeline.wait_subscribed(*topics)
    relay.wait_until(lambda: relay.sample("relay_subscribed_topics") == 4)
    assert relay.sample("relay_live_tickers") == 0
    assert relay.sample("relay_published_total", kind="realtime_start") == 0
