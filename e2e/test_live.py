"""Live data end to end: a client's subscription alone starts the exchange feed."""

from __future__ import annotations

import time

import pytest

from infra.exchange_sim.control import SimulatorControl
from mdclient import Client, ClientSettings
from mdproto.messages import OHLC, Tick

pytestmark = [pytest.mark.e2e, pytest.mark.stack, pytest.mark.spark]


def test_live_ticks_and_candles_reach_a_subscriber_and_stop_after_it_leaves(
    client_settings: ClientSettings, sim: SimulatorControl
) -> None:
    tick: Tick | None = None
    candle: OHLC | None = None
    with (
        Client(settings=client_settings) as client,
        client.live("BINANCE:SOL/USDT", ticks=True, ohlc=["1m"]) as stream,
    ):
        # No other step: the relay sees the subscription and asks an ingestor for trades.
        sim.wait_for_subscribers("SOL/USDT", count=1, timeout_s=90)
        [trade] = sim.inject_trades("SOL/USDT", [{"price": "151.23", "qty": "4.5"}])
        deadline = time.monotonic() + 90
        while (tick is None or candle is None) and time.monotonic() < deadline:
            message = stream.get(timeout_s=max(0.0, deadline - time.monotonic()))
            if isinstance(message, Tick) and message.trade_id == str(trade["id"]):
                tick = message
            elif isinstance(message, OHLC) and message.period_seconds == 60:
                candle = message
    assert tick is not None, "the injected trade never reached the subscriber"
    assert (tick.ticker, tick.price, tick.amount) == ("BINANCE:SOL/USDT", 151.23, 4.5)
    assert tick.timestamp_ms == trade["time_ms"]
    assert tick.sequence >= 1 and tick.publisher_epoch > 0  # numbered by the pipeline
    assert stream.gaps == 0
    assert candle is not None, "no 1-minute candle reached the subscriber"
    assert candle.ticker == "BINANCE:SOL/USDT"
    assert candle.low <= candle.open <= candle.high and candle.low <= candle.close <= candle.high
    # The last subscriber left: after the relay's grace period the feed is cancelled.
    sim.wait_for_subscribers("SOL/USDT", count=0, timeout_s=90)

    # Nothing is published any more; a new subscriber still gets the latest tick and
    # candle at once: the relay passes its subscription up, the pipeline's XPUB
    # answers with the last values (docs/protocol.md "Sequence numbers and recovery").
    late: dict[type, Tick | OHLC] = {}
    with (
        Client(settings=client_settings) as client,
        client.live("BINANCE:SOL/USDT", ticks=True, ohlc=["1m"]) as stream,
    ):
        deadline = time.monotonic() + 10
        while len(late) < 2 and time.monotonic() < deadline:
            message = stream.get(timeout_s=max(0.0, deadline - time.monotonic()))
            if message is not None:
                late.setdefault(type(message), message)
    late_tick = late.get(Tick)  # the feed is cancelled: only the last value can arrive
    assert isinstance(late_tick, Tick), "a late subscriber did not get the last tick"
    assert late_tick.ticker == "BINANCE:SOL/USDT" and late_tick.sequence >= tick.sequence
    assert late_tick.publisher_epoch == tick.publisher_epoch
    last_candle = late.get(OHLC)
    assert isinstance(last_candle, OHLC) and last_candle.sequence >= candle.sequence
