"""Live-data bookkeeping from subscription edges, with an injected clock."""

from __future__ import annotations

import itertools

from relay.subscriptions import Announce, Cancel, LiveSubscriptions

TICK = "BINANCE:BTC/USDT|tick"
OHLC_60 = "BINANCE:BTC/USDT|ohlc:60"


def tracker(grace: float = 30.0, refresh: float = 10.0) -> LiveSubscriptions:
    ids = (f"rt{i}" for i in itertools.count(1))
    return LiveSubscriptions(
        grace=grace, refresh=refresh, known_exchanges=["BINANCE"], new_id=lambda: next(ids), now=0.0
    )


def test_first_subscriber_starts_live_data_once_per_ticker() -> None:
    live = tracker()
    assert live.subscribed(TICK, 1.0) == [Announce("BINANCE:BTC/USDT", "rt1", "start")]
    assert live.subscribed(OHLC_60, 1.0) == []  # same ticker, already live
    assert live.subscribed("BINANCE:BTC/USDT|ohlc:", 1.0) == []
    assert live.subscribed("BINANCE:ETH/USDT|ohlc:", 1.0) == [
        Announce("BINANCE:ETH/USDT", "rt2", "start")
    ]
    assert live.live_tickers == ["BINANCE:BTC/USDT", "BINANCE:ETH/USDT"]
    assert live.topic_count == 4


def test_non_market_topics_and_unknown_exchanges_do_not_start_anything() -> None:
    live = tracker()
    for topic in (
        "RESPONSE:c1",
        "HISTORY_READY:r1",
        "",
        "BINANCE:",
        "BINANCE:BTC/USDT|",
        "KRAKEN:BTC/USD|tick",
        "BINANCE:BTC/USDT|ohlc:0",
    ):
        assert live.subscribed(topic, 0.0) == []
    assert live.live_tickers == []
    assert live.topic_count == 7


def test_last_unsubscribe_cancels_after_the_grace_period() -> None:
    live = tracker(grace=30.0)
    live.subscribed(TICK, 0.0)
    live.subscribed(OHLC_60, 0.0)
    assert live.unsubscribed(TICK, 5.0) == []
    assert live.unsubscribed(OHLC_60, 6.0) == []
    assert live.next_deadline() == 10.0  # refresh comes first
    assert [a for a in live.due(35.9) if isinstance(a, Cancel)] == []
    assert live.next_deadline() == 36.0
    assert live.due(36.0) == [Cancel("BINANCE:BTC/USDT", "rt1")]
    assert live.live_tickers == []
    # A later subscriber starts a new stream with a new id.
    assert live.subscribed(TICK, 40.0) == [Announce("BINANCE:BTC/USDT", "rt2", "start")]


def test_resubscribing_within_the_grace_period_keeps_the_stream() -> None:
    live = tracker(grace=30.0, refresh=1000.0)
    live.subscribed(TICK, 0.0)
    live.unsubscribed(TICK, 1.0)
    assert live.subscribed(OHLC_60, 20.0) == []  # no second start either
    assert live.due(100.0) == []
    assert live.live_tickers == ["BINANCE:BTC/USDT"]


def test_unknown_unsubscribe_is_ignored() -> None:
    live = tracker(grace=0.0)
    live.subscribed(TICK, 0.0)
    assert live.unsubscribed(OHLC_60, 1.0) == []  # never subscribed: the tick topic still counts
    assert live.due(2.0) == []
    assert live.live_tickers == ["BINANCE:BTC/USDT"]


def test_live_tickers_are_reannounced_every_refresh_interval() -> None:
    live = tracker(refresh=10.0)
    live.subscribed(TICK, 1.0)
    assert live.due(9.9) == []
    assert live.due(10.0) == [Announce("BINANCE:BTC/USDT", "rt1", "refresh")]
    assert live.due(15.0) == []
    assert live.next_deadline() == 20.0
    assert live.due(55.0) == [Announce("BINANCE:BTC/USDT", "rt1", "refresh")]  # no backlog
    assert live.next_deadline() == 65.0


def test_ingestor_joining_gets_the_live_tickers_of_its_prefix() -> None:
    live = LiveSubscriptions(
        grace=1, refresh=1, known_exchanges=["BINANCE", "COINBASE"], new_id=lambda: "x", now=0
    )
    live.subscribed(TICK, 0.0)
    live.subscribed("COINBASE:ETH/USD|tick", 0.0)
    assert [a.ticker for a in live.ingestor_joined("BINANCE:")] == ["BINANCE:BTC/USDT"]
    assert len(live.ingestor_joined("")) == 2  # an empty subscription receives everything
    assert live.ingestor_joined("KRAKEN:") == []
    assert all(a.why == "ingestor joined" for a in live.ingestor_joined(""))


def test_a_period_outside_live_periods_does_not_make_a_ticker_live() -> None:
    live = LiveSubscriptions(
        grace=0,
        refresh=10,
        known_exchanges=["BINANCE"],
        new_id=lambda: "x",
        now=0,
        live_periods=[60],
    )
    assert live.subscribed("BINANCE:BTC/USDT|ohlc:900", 0.0) == []
    assert live.subscribed("BINANCE:BTC/USDT|ohlc:6", 0.0) == []  # prefix of ohlc:60, not 60
    assert not live.is_live("BINANCE:BTC/USDT")
    assert live.subscribed("BINANCE:BTC/USDT|ohlc:", 0.0) == [
        Announce("BINANCE:BTC/USDT", "x", "start")  # every period: the served ones
    ]
    assert live.unsubscribed("BINANCE:BTC/USDT|ohlc:900", 0.0) == []
    assert live.is_live("BINANCE:BTC/USDT")
