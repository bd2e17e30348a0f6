from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mdproto import topics
from mdproto.errors import ProtocolError
from mdproto.messages import NotifyPattern


def test_ticker_parts_and_prefix() -> None:
    ticker = topics.parse_ticker("BINANCE:BTC/USDT")
    assert (ticker.exchange, ticker.base, ticker.quote) == ("BINANCE", "BTC", "USDT")
    assert ticker.symbol == "BTC/USDT"
    assert str(ticker) == "BINANCE:BTC/USDT"
    assert topics.exchange_prefix("BINANCE:BTC/USDT") == "BINANCE:"


@pytest.mark.parametrize(
    "bad", ["", "BTC/USDT", "BINANCE:BTCUSDT", "binance:BTC/USDT", "BINANCE:BTC/", ":BTC/USDT"]
)
def test_bad_tickers_are_protocol_errors(bad: str) -> None:
    with pytest.raises(ProtocolError):
        topics.parse_ticker(bad)


def test_market_data_topics() -> None:
    assert topics.tick_topic("BINANCE:BTC/USDT") == "BINANCE:BTC/USDT|tick"
    assert topics.ohlc_topic("BINANCE:BTC/USDT", 60) == "BINANCE:BTC/USDT|ohlc:60"
    parsed = topics.parse_market_topic("BINANCE:BTC/USDT|ohlc:300")
    assert parsed == topics.MarketTopic("BINANCE:BTC/USDT", "ohlc", 300)
    assert topics.parse_market_topic("BINANCE:BTC/USDT|tick") == topics.MarketTopic(
        "BINANCE:BTC/USDT", "tick"
    )
    assert topics.parse_market_topic("BINANCE:BTC/USDT|ohlc:") == topics.MarketTopic(
        "BINANCE:BTC/USDT", "ohlc", None
    )
    for other in ["RESPONSE:c1", "BINANCE:BTC/USDT|ohlc:0", "BINANCE:BTC/USDT|books", "", "|tick"]:
        assert topics.parse_market_topic(other) is None


def test_notification_topics_follow_the_pattern() -> None:
    auto = NotifyPattern.NOTIFY_AUTO
    assert topics.notification_topic(auto, "r1", "c1") == "RESPONSE:c1"
    assert topics.notification_topic(auto, "r1", "") == "HISTORY_READY:r1"
    per_request = NotifyPattern.NOTIFY_PER_REQUEST
    assert topics.notification_topic(per_request, "r1", "c1") == "HISTORY_READY:r1"
    with pytest.raises(ProtocolError):
        topics.notification_topic(NotifyPattern.NOTIFY_PER_CLIENT, "r1", "")
    with pytest.raises(ProtocolError):
        topics.notification_topic(auto, "", "")


@given(st.text(max_size=40))
def test_parse_market_topic_never_raises(text: str) -> None:
    topics.parse_market_topic(text)


def test_ids_must_be_plain() -> None:
    assert topics.is_valid_id("req-1.a_B")
    assert not topics.is_valid_id("")
    assert not topics.is_valid_id("a b")
    assert not topics.is_valid_id("x" * 129)


def test_cep_event_topic_follows_notify() -> None:
    auto, client, request = (
        NotifyPattern.NOTIFY_AUTO,
        NotifyPattern.NOTIFY_PER_CLIENT,
        NotifyPattern.NOTIFY_PER_REQUEST,
    )
    assert topics.cep_event_topic(auto, "t1", "alice") == "RESPONSE:alice"
    assert topics.cep_event_topic(auto, "t1", "") == "CEP:t1"
    assert topics.cep_event_topic(client, "t1", "alice") == "RESPONSE:alice"
    assert topics.cep_event_topic(request, "t1", "alice") == "CEP:t1"
    with pytest.raises(ProtocolError):
        topics.cep_event_topic(client, "t1", "")
    with pytest.raises(ProtocolError):
        topics.cep_event_topic(request, "", "alice")


def test_exchange_names_are_what_tickers_allow() -> None:
    assert topics.is_valid_exchange("BINANCE") and topics.is_valid_exchange("GATE_IO2")
    assert not any(map(topics.is_valid_exchange, ["", "binance", "BIN:ANCE", "2X", "A/B"]))


def test_a_recording_slot_is_the_same_everywhere_and_spreads_markets() -> None:
    from mdproto.topics import gap_id, recording_slot

    # Fixed values: every ingestor and version must compute the same slot.
    assert recording_slot("BINANCE:BTC/USDT", 12) == recording_slot("BINANCE:BTC/USDT", 12)
    slots = {recording_slot(f"BINANCE:C{i}/USDT", 12) for i in range(200)}
    assert slots == set(range(12))
    assert gap_id("BINANCE:BTC/USDT", "10", "20") == "BINANCE:BTC/USDT|10|20"
