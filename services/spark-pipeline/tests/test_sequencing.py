"""Sequence assignment and last values of the PUB server (pure)."""

from __future__ import annotations

from mdproto.messages import OHLC, CEPTriggerEvent, HistoryReadyNotification, Market, Tick
from pipeline.pub_server import LastValues, Sequencer, is_snapshot_topic, new_epoch, sequenced

T = "BINANCE:BTC/USDT"


def test_numbers_run_per_topic_from_one_with_the_epoch() -> None:
    seq = Sequencer(epoch=42)
    stamped = []
    for topic in ("a|tick", "a|tick", "b|tick", "a|tick"):
        tick = Tick(ticker=topic)
        seq.stamp(topic, tick)
        stamped.append((topic, tick.sequence, tick.publisher_epoch))
    assert stamped == [("a|tick", 1, 42), ("a|tick", 2, 42), ("b|tick", 1, 42), ("a|tick", 3, 42)]
    assert (seq.last("a|tick"), seq.last("never")) == (3, 0)


def test_each_publisher_start_gets_another_epoch() -> None:
    assert Sequencer().epoch >= new_epoch() - 60_000_000  # its start time in microseconds
    assert Sequencer(epoch=7).epoch == 7


def test_published_types_carry_sequence_fields_others_do_not() -> None:
    for cls in (Tick, OHLC, HistoryReadyNotification, CEPTriggerEvent):
        assert sequenced(cls())
    assert not sequenced(Market())


def test_only_market_topics_keep_a_last_value() -> None:
    assert is_snapshot_topic(f"{T}|tick") and is_snapshot_topic(f"{T}|ohlc:60")
    assert not is_snapshot_topic("RESPONSE:alice") and not is_snapshot_topic("CEP:t1")
    assert not is_snapshot_topic(f"{T}|status")
    last = LastValues()
    last.put("RESPONSE:alice", [b"x"])
    assert len(last) == 0


def test_a_subscription_prefix_gets_the_last_value_of_each_matching_topic() -> None:
    last = LastValues()
    last.put(f"{T}|ohlc:60", [b"60-old"])
    last.put(f"{T}|ohlc:60", [b"60"])
    last.put(f"{T}|ohlc:600", [b"600"])
    last.put(f"{T}|tick", [b"tick"])
    assert list(last.matching(f"{T}|ohlc:60")) == [[b"60"], [b"600"]]  # a prefix match, as ZeroMQ
    assert list(last.matching(f"{T}|tick")) == [[b"tick"]]
    assert list(last.matching("BINANCE:ETH/USDT|tick")) == []
