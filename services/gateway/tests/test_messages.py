"""The gateway's JSON messages and topic rules (pure: no sockets)."""

from __future__ import annotations

import json

import pytest

from gateway.messages import (
    GatewayError,
    book_event_frame,
    book_frame,
    choose_format,
    integrity,
    message_frame,
    parse_history,
    parse_op,
    parse_topic,
    to_dict,
)
from mdproto.markets import Precision
from mdproto.messages import (
    OHLC,
    CEPTriggerEvent,
    HistoryReadyNotification,
    HistorySource,
    TakerSide,
    Tick,
)

T = "BINANCE:BTC/USDT"


@pytest.mark.parametrize(
    ("text", "kind", "period"),
    [
        (f"{T}|tick", "tick", 0),
        (f"{T}|ohlc:60", "ohlc", 60),
        (f"{T}|ohlc:86400", "ohlc", 86400),
        (f"{T}|book", "book", 0),
        (f"{T}|status", "status", 0),
        ("RESPONSE:desk-7", "response", 0),
        ("HISTORY_READY:abc123", "history_ready", 0),
        ("CEP:t.1", "cep", 0),
    ],
)
def test_exact_topics_are_accepted(text: str, kind: str, period: int) -> None:
    topic = parse_topic(text)
    assert (topic.name, topic.kind, topic.period_seconds) == (text, kind, period)
    assert topic.live == (kind in ("tick", "ohlc"))


@pytest.mark.parametrize(
    "text",
    [
        f"{T}|ohlc:",
        f"{T}|ohlc:0",
        f"{T}|ohlc:x",
        "BINANCE:",
        f"{T}|",
        T,
        "btc|tick",
        "RESPONSE:",
        "CEP:a b",
        "",
        None,
        5,
        f"{T}|statusx",
        f"{T}|book:20",
        f"{T}|bookx",
    ],
)
def test_prefixes_and_junk_are_refused_as_bad_topic(text: object) -> None:
    with pytest.raises(GatewayError) as info:
        parse_topic(text)
    assert info.value.error_code == "bad_topic" and info.value.reason


def test_ops_parse_or_say_why() -> None:
    op = parse_op('{"op": "subscribe", "topic": "CEP:t1"}')
    assert (op.op, op.topic.name) == ("subscribe", "CEP:t1")
    for bad, code, topic in [
        ("nope", "bad_request", None),
        ("[1]", "bad_request", None),
        ('{"op": "publish", "topic": "CEP:t1"}', "bad_request", "CEP:t1"),
        ('{"op": "subscribe"}', "bad_request", None),  # no topic: a malformed frame
        ('{"op": "subscribe", "topic": null}', "bad_topic", None),
        ('{"op": "unsubscribe", "topic": "CEP:"}', "bad_topic", "CEP:"),
    ]:
        with pytest.raises(GatewayError) as info:
            parse_op(bad)
        assert (info.value.error_code, info.value.topic) == (code, topic)


def test_messages_become_plain_json_with_64_bit_strings_enums_and_nulls() -> None:
    candle = OHLC(
        ticker=T,
        period_seconds=60,
        open_time_ms=1_795_132_800_000,
        open=1.5,
        closed=True,
        sequence=7,
        publisher_epoch=1_795_132_800_000_123,
    )
    data = json.loads(message_frame(f"{T}|ohlc:60", candle))
    assert data["type"] == "message" and data["message_type"] == "OHLC"
    # int64/uint64 as decimal strings (exact in JavaScript), 32-bit ints as numbers
    assert data["data"]["open_time_ms"] == "1795132800000"
    assert data["data"]["publisher_epoch"] == "1795132800000123"
    assert data["data"]["sequence"] == "7" and data["data"]["period_seconds"] == 60
    assert data["data"]["trade_count"] is None  # proto3 optional, not reported
    assert data["data"]["closed"] is True and data["data"]["volume"] == 0.0
    tick = to_dict(Tick(ticker=T, side=TakerSide.SELL, trade_id="9"))
    assert tick["side"] == "SELL"
    event = to_dict(CEPTriggerEvent(trigger_id="t", values={"price": 3.0}))
    assert event["values"] == {"price": 3.0} and event["kind"] == "FIRED"


def test_history_body_and_format_negotiation() -> None:
    params = parse_history({"ticker": T, "period": "1m", "start": "-2h", "refetch": True})
    assert (params.period, params.start, params.end, params.refetch) == ("1m", "-2h", "now", True)
    bad: object
    for bad in (
        {"ticker": T, "period": 60},
        {"ticker": T, "period": 60, "start": 0, "x": 1},
        {"ticker": 1, "period": 60, "start": 0},
        [],
        {"ticker": T, "period": True, "start": 0},
    ):
        with pytest.raises(GatewayError):
            parse_history(bad)
    assert choose_format(None, None) == "json"
    assert choose_format(None, "text/html, application/vnd.apache.parquet;q=0.9") == "parquet"
    assert choose_format("arrow", "application/json") == "arrow"  # format= wins
    with pytest.raises(GatewayError) as info:
        choose_format("csv", None)
    assert info.value.error_code == "bad_format"


def test_integrity_report_comes_from_the_notification() -> None:
    note = HistoryReadyNotification(
        expected_candles=10,
        missing_candles=1,
        exchange_gaps=2,
        row_count=7,
        source=HistorySource.SOURCE_STORAGE,
    )
    assert integrity(note) == {
        "expected_candles": "10",
        "missing_candles": "1",
        "exchange_gaps": "2",
        "source": "SOURCE_STORAGE",
        "row_count": "7",
    }
    assert integrity(None) == {}


def test_a_book_ladder_spells_out_the_best_levels_and_the_spread() -> None:
    frame = json.loads(
        book_frame(
            f"{T}|book",
            [(99.5, 2.0), (99.0, 1.0)],
            [(100.25, 0.5)],
            in_sync=True,
            exchange_sequence=2**60,
            exchange_time_ms=1_795_764_453_815,
            precision=Precision.of(0.25, 0.5),
        )
    )
    assert (frame["price_decimals"], frame["amount_decimals"]) == (2, 1)
    assert frame["best_bid"] == [99.5, 2.0] and frame["best_ask"] == [100.25, 0.5]
    assert frame["spread"] == 0.75
    assert frame["bids"] == [[99.5, 2.0], [99.0, 1.0]] and frame["asks"] == [[100.25, 0.5]]
    assert frame["exchange_sequence"] == str(2**60)  # exact in JavaScript
    empty = json.loads(
        book_frame(f"{T}|book", [], [(1.0, 1.0)], in_sync=False, exchange_sequence=0,
                   exchange_time_ms=0, precision=Precision())
    )  # fmt: skip
    assert (empty["best_bid"], empty["spread"], empty["in_sync"]) == (None, None, False)
    assert (empty["price_decimals"], empty["amount_decimals"]) == (None, None)  # unknown
    tight = json.loads(
        book_frame(f"{T}|book", [(51788.55, 1.0)], [(51788.56, 1.0)], in_sync=True,
                   exchange_sequence=0, exchange_time_ms=0, precision=Precision())
    )  # fmt: skip
    assert tight["spread"] == 0.01  # in the prices' decimals, not 0.00999999999476131


def test_book_events_carry_the_reset_name_or_null() -> None:
    reset = json.loads(
        book_event_frame(f"{T}|book", "reset", reset="BOOK_RESET_CHECKSUM", reason="crc")
    )
    gap = json.loads(book_event_frame(f"{T}|book", "gap", reason="sequence gap", missed=3))
    assert (reset["kind"], reset["reset"], reset["reason"]) == (
        "reset",
        "BOOK_RESET_CHECKSUM",
        "crc",
    )
    assert (gap["reset"], gap["missed"], gap["waited_ms"]) == (None, "3", 0)
