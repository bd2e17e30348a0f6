"""Market-data fan-out (XSUB <- pipeline, XPUB -> clients) on real sockets."""

from __future__ import annotations

from typing import TYPE_CHECKING

import zmq

from mdproto import envelope
from mdproto.messages import OHLC, HistoryReadyNotification, Status, Tick

if TYPE_CHECKING:
    from conftest import FakePipeline, RelayFactory, RunningRelay

TICK = "BINANCE:BTC/USDT|tick"
CANDLES = "BINANCE:BTC/USDT|ohlc:60"


def test_data_and_notifications_fan_out_to_subscribers(
    relay: RunningRelay, pipeline: FakePipeline
) -> None:
    ticks = [relay.subscriber(TICK) for _ in range(3)]
    notified = relay.subscriber("RESPONSE:c1")
    other = relay.subscriber(CANDLES)
    pipeline.wait_subscribed(TICK, "RESPONSE:c1", CANDLES)

    tick = Tick(ticker="BINANCE:BTC/USDT", trade_id="1", price=50_000.0, amount=0.1)
    note = HistoryReadyNotification(request_id="r1", client_id="c1", status=Status.OK)
    pipeline.publish(TICK, tick)
    pipeline.publish("RESPONSE:c1", note)
    for sub in ticks:
        assert envelope.decode_sub(relay.recv(sub)) == (TICK, tick)
    assert envelope.decode_sub(relay.recv(notified)) == ("RESPONSE:c1", note)
    candle = OHLC(ticker="BINANCE:BTC/USDT", period_seconds=60, close=1.0)
    pipeline.publish(CANDLES, candle)
    assert envelope.decode_sub(relay.recv(other)) == (CANDLES, candle)  # not the tick first
    # The capture reaches the relay's loop independently of the forwarded subscription.
    relay.wait_until(lambda: relay.sample("relay_subscribed_topics") == 3)


def test_proxy_statistics_become_metrics(make_relay: RelayFactory, pipeline: FakePipeline) -> None:
    relay = make_relay(stats_interval_s=0.05)
    sub = relay.subscriber(TICK)
    pipeline.wait_subscribed(TICK)
    tick = Tick(ticker="BINANCE:BTC/USDT", trade_id="1")
    for _ in range(10):
        pipeline.publish(TICK, tick)
    for _ in range(10):
        relay.recv(sub)
    relay.wait_until(
        lambda: relay.sample("relay_proxy_frames_total", direction="downstream") == 30,
        what="10 three-frame messages counted",
    )
    assert relay.sample("relay_proxy_bytes_total", direction="downstream") >= 10 * len(TICK)
    assert relay.sample("relay_proxy_frames_total", direction="upstream") >= 1  # the subscription
    # Monitor events and the capture reach the loop apart from the statistics: waited for.
    relay.wait_until(lambda: relay.sample("relay_upstream_connected") == 1)
    relay.wait_until(
        lambda: relay.sample("relay_subscription_events_total", event="subscribe") == 1
    )
    # Data never reaches the relay's loop as subscription events (the tap sees no data).
    assert relay.sample("relay_subscription_events_total", event="unsubscribe") == 0


def test_upstream_restart_keeps_subscriptions(relay: RunningRelay, pipeline: FakePipeline) -> None:
    sub = relay.subscriber(TICK, "RESPONSE:c1")
    pipeline.wait_subscribed(TICK, "RESPONSE:c1")
    relay.wait_until(lambda: relay.sample("relay_upstream_connected") == 1)
    restarted = pipeline.restart()
    try:
        restarted.wait_subscribed(TICK, "RESPONSE:c1")  # resent by the relay's XSUB
        tick = Tick(ticker="BINANCE:BTC/USDT", trade_id="after-restart")
        restarted.publish(TICK, tick)
        assert envelope.decode_sub(relay.recv(sub)) == (TICK, tick)
        # The monitor's event of the lost link reaches the loop apart from the data.
        relay.wait_until(lambda: relay.sample("relay_upstream_disconnects_total") >= 1)
    finally:
        restarted.close()


def _subscribe_many(relay: RunningRelay, count: int) -> tuple[zmq.Socket[bytes], list[str]]:
    topics = [f"RESPONSE:client-{i:05d}" for i in range(count)]
    sub = relay.socket(zmq.SUB, relay.endpoints.market_data)
    sub.sndhwm = 0  # the client's own SUB would drop subscriptions beyond its SNDHWM too
    for topic in topics:
        sub.subscribe(topic.encode())
    return sub, topics


def test_5000_subscriptions_survive_an_upstream_restart(
    relay: RunningRelay, pipeline: FakePipeline
) -> None:
    sub, topics = _subscribe_many(relay, 5000)
    pipeline.wait_subscribed(*topics, timeout=20)
    relay.wait_until(lambda: relay.sample("relay_subscribed_topics") == 5000)
    restarted = pipeline.restart()
    try:
        restarted.wait_subscribed(*topics, timeout=20)
        note = HistoryReadyNotification(request_id="r", client_id="client-04999")
        restarted.publish(topics[-1], note)
        assert envelope.decode_sub(relay.recv(sub)) == (topics[-1], note)
    finally:
        restarted.close()


def test_default_sndhwm_would_lose_resent_subscriptions(
    make_relay: RelayFactory, pipeline: FakePipeline
) -> None:
    """Why upstream_subscription_hwm exists: libzmq resends at most SNDHWM (#2258)."""
    relay = make_relay(upstream_subscription_hwm=1000)
    # Subscribed in chunks, each one upstream before the next: in one burst the
    # XSUB would already drop beyond SNDHWM while the pipeline reads slowly.
    _sub, topics = _subscribe_many(relay, 0)
    for first in range(0, 5000, 500):
        chunk = [f"RESPONSE:client-{i:05d}" for i in range(first, first + 500)]
        for topic in chunk:
            _sub.subscribe(topic.encode())
        pipeline.wait_subscribed(*chunk, timeout=20)
        topics += chunk
    assert len(pipeline.subscriptions) == 5000
    relay.wait_until(lambda: relay.sample("relay_subscribed_topics") == 5000, timeout=20)
    disconnects = relay.sample("relay_upstream_disconnects_total")
    restarted = pipeline.restart()
    try:
        relay.wait_until(
            lambda: (
                relay.sample("relay_upstream_disconnects_total") > disconnects
                and relay.sample("relay_upstream_connected") == 1
            ),
            what="the relay to reconnect",
        )
        # Resent subscriptions were queued before the reconnect; read until quiet.
        restarted.poll_subscriptions(timeout=5.0, quiet=0.5)
        assert 0 < len(restarted.subscriptions) <= 1000 < len(topics)
    finally:
        restarted.close()


def test_engines_connect_to_the_bound_port_and_get_every_subscription(
    relay: RunningRelay, pipeline: FakePipeline
) -> None:
    """An extra live engine's XPUB connects to `engines_port` (ADR 0014): a subscription
    made before it came reaches it, and its messages reach the relay's clients beside
    the pipeline's; it leaves the upstream link count alone."""
    assert relay.endpoints.engines
    sub = relay.subscriber(TICK, CANDLES)
    pipeline.wait_subscribed(TICK, CANDLES)
    engine = relay.ctx.socket(zmq.XPUB)
    engine.linger = 0
    relay.sockets.append(engine)
    engine.connect(relay.endpoints.engines)
    seen: set[bytes] = set()
    while not {b"\x01" + TICK.encode(), b"\x01" + CANDLES.encode()} <= seen:
        assert engine.poll(5000), f"the engine got only {seen}"
        seen.add(engine.recv())
    candle = OHLC(ticker="BINANCE:BTC/USDT", period_seconds=60, close=2.0, closed=True)
    engine.send_multipart(envelope.encode_pub(CANDLES, candle))
    tick = Tick(ticker="BINANCE:BTC/USDT", trade_id="9")
    pipeline.publish(TICK, tick)
    got = {envelope.decode_sub(relay.recv(sub))[0] for _ in range(2)}
    assert got == {TICK, CANDLES}
    # Monitor events reach the relay's loop apart from the data: wait until it has seen
    # the engine, then the upstream count must still be the pipeline's one link.
    relay.wait_until(
        lambda: relay.sample("relay_live_engines_connected") == 1, what="the engine counted"
    )
    relay.wait_until(
        lambda: relay.sample("relay_upstream_connected") == 1, what="the pipeline link counted"
    )
