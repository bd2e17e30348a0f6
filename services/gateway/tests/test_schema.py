"""What the gateway encodes matches docs/gateway-messages.schema.json (no drift)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from gateway.app import encode_history
from gateway.messages import (
    book_event_frame,
    book_frame,
    control_frame,
    dumps,
    error_frame,
    message_frame,
    notification_dict,
    to_dict,
)
from mdclient import HistoryResult
from mdclient.frames import candles_from_ohlc
from mdproto.markets import Precision
from mdproto.messages import (
    OHLC,
    BookReset,
    CEPTriggerEvent,
    FeedStatus,
    HistoryReadyNotification,
    Tick,
)

BIG = 520810068597018615  # above 2**53, like real Iceberg snapshot ids
SCHEMA = json.loads(
    (Path(__file__).parents[3] / "docs" / "gateway-messages.schema.json").read_text()
)
T = "BINANCE:BTC/USDT"


def check(definition: str, data: Any) -> None:
    schema = {**SCHEMA, "$ref": f"#/$defs/{definition}"}
    jsonschema.Draft202012Validator(schema).validate(data)


def test_server_frames_match_the_schema() -> None:
    candle = OHLC(
        ticker=T,
        period_seconds=60,
        open_time_ms=60_000,
        open=1,
        high=2,
        low=0.5,
        close=1.5,
        volume=3,
        trade_count=4,
        closed=True,
    )
    frames = [
        message_frame(f"{T}|ohlc:60", candle),
        message_frame(f"{T}|tick", Tick(ticker=T, trade_id="1", price=2.0, timestamp_ms=5)),
        message_frame(f"{T}|status", FeedStatus(ticker=T, state=FeedStatus.LOST)),
        message_frame("RESPONSE:c1", HistoryReadyNotification(request_id="r", snapshot_id=BIG)),
        message_frame("CEP:t1", CEPTriggerEvent(trigger_id="t1", values={"price": 2.0})),
        control_frame("subscribed", f"{T}|tick"),
        control_frame("sequence", f"{T}|tick", kind="gap", missed="3", candles=0, reason=""),
        control_frame("feed_status", f"{T}|tick", data=to_dict(FeedStatus(state=FeedStatus.LOST))),
        error_frame("bad_request", "a frame must be one JSON object"),
        error_frame("bad_topic", "not an exact topic", "BINANCE:"),
        error_frame("unsupported_period", "served: 60, 300, 3600", f"{T}|ohlc:6"),
        dumps({"type": "dropped", "count": 2}),
        book_frame(
            f"{T}|book", [(2.0, 1.5)], [(2.5, 0.1)], in_sync=True, exchange_sequence=BIG,
            exchange_time_ms=5, precision=Precision.of(0.01, 0.001),
        ),
        book_frame(f"{T}|book", [], [], in_sync=False, exchange_sequence=0, exchange_time_ms=0,
                   precision=Precision()),
        book_event_frame(f"{T}|book", "reset", reset="BOOK_RESET_SEQUENCE_GAP", reason="u 7"),
        book_event_frame(f"{T}|book", "gap", reason="sequence gap", missed=2),
        book_event_frame(f"{T}|book", "resynced", waited_ms=350),
        control_frame("subscribed", f"{T}|book"),
    ]  # fmt: skip
    for frame in frames:
        check("server_frame", json.loads(frame))
    with pytest.raises(jsonschema.ValidationError):  # 64-bit integers are strings
        check("server_frame", {**json.loads(frames[0]), "data": {**to_dict(candle), "sequence": 1}})
    check("client_op", {"op": "subscribe", "topic": "HISTORY_READY:abc"})
    with pytest.raises(jsonschema.ValidationError):
        check("client_op", {"op": "subscribe", "topic": f"{T}|ohlc:"})
    with pytest.raises(jsonschema.ValidationError):  # a level removed is never sent
        check("book", {**json.loads(frames[12]), "bids": [[2.0, 0.0]]})


def test_the_book_reset_names_in_the_schema_are_the_protos() -> None:
    """Every BookReset a reset event can name (NONE is a periodic copy: no event)."""
    names = SCHEMA["$defs"]["book_event"]["properties"]["reset"]["anyOf"][0]["enum"]
    assert sorted(names) == sorted(set(BookReset.keys()) - {"BOOK_RESET_NONE"})


def test_history_answer_matches_the_schema() -> None:
    rows = [
        OHLC(
            ticker=T,
            period_seconds=60,
            open_time_ms=i * 60_000,
            open=1,
            high=2,
            low=0.5,
            close=1.5,
            volume=3,
            closed=True,
        )
        for i in range(3)
    ]
    note = HistoryReadyNotification(
        request_id="r", ticker=T, period_seconds=60, row_count=3, expected_candles=3
    )
    result = HistoryResult(candles_from_ohlc(rows), "OK", "r", 1, 0.5, BIG, 3, note)
    body = json.loads(encode_history(result, "json"))
    check("history_response", body)
    assert body["snapshot_id"] == str(BIG)
    assert [c["open_time_ms"] for c in body["candles"]] == ["0", "60000", "120000"]
    assert body["candles"][0]["trade_count"] is None


def test_a_tick_bar_answer_matches_the_schema_and_says_where_each_bar_ends() -> None:
    import pyarrow as pa

    from mdproto.tables import TradeBars, arrow_schema

    row = {name: None for name in TradeBars.SCHEMA.names}
    row.update(
        ticker=T, bars="100ticks", anchor_time=0, seq=7, open_time=1_000, close_time=61_000_000,
        open=1.0, high=2.0, low=0.5, close=1.5, volume=3.0, trade_count=100,
        first_trade_id="701", last_trade_id="800", incomplete=False,
    )  # fmt: skip
    table = pa.Table.from_pylist([row]).cast(arrow_schema(TradeBars.SCHEMA))
    note = HistoryReadyNotification(request_id="r", ticker=T, bars="100ticks", row_count=1)
    body = json.loads(encode_history(HistoryResult(table, "OK", "r", 1, 0.5, BIG, 1, note), "json"))
    check("history_response", body)
    assert body["bars"] == "100ticks"
    (bar,) = body["candles"]
    assert (bar["seq"], bar["close_time_ms"], bar["trade_count"]) == ("7", "61000", "100")
    assert (bar["first_trade_id"], bar["last_trade_id"], bar["incomplete"]) == ("701", "800", False)
    none = HistoryResult(table.slice(0, 0), "NOT_FOUND", "r", 1, 0.5, 0, 0, note)
    body = json.loads(encode_history(none, "json"))
    check("history_response", body)
    assert body["candles"] == [] and body["bars"] == "100ticks"


#: Schema definitions of the platform messages the gateway forwards.
MESSAGE_DEFS = {
    "ohlc": OHLC.DESCRIPTOR,
    "tick": Tick.DESCRIPTOR,
    "feed_status_data": FeedStatus.DESCRIPTOR,
    "history_ready_notification": HistoryReadyNotification.DESCRIPTOR,
    "cep_trigger_event": CEPTriggerEvent.DESCRIPTOR,
}
_INT64 = {FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64}


@pytest.mark.parametrize("definition", sorted(MESSAGE_DEFS))
def test_the_schema_lists_every_field_and_every_64_bit_integer_as_a_string(
    definition: str,
) -> None:
    descriptor: Descriptor = MESSAGE_DEFS[definition]
    schema = SCHEMA["$defs"][definition]
    names = [f.name for f in descriptor.fields]
    assert sorted(schema["properties"]) == sorted(names)
    assert sorted(schema["required"]) == sorted(names)  # every field is sent
    strings = {"#/$defs/int64", "#/$defs/nullable_int64"}
    as_strings = {name for name, p in schema["properties"].items() if p.get("$ref") in strings}
    assert as_strings == {f.name for f in descriptor.fields if f.cpp_type in _INT64}


def test_status_and_error_notifications_match_the_schema() -> None:
    published = HistoryReadyNotification(
        request_id="r", snapshot_id=BIG, sequence=1, publisher_epoch=2**63
    )
    recorded = HistoryReadyNotification(request_id="r", snapshot_id=BIG)  # market.requests
    check("http_error", {"error_code": "x", "reason": "y", "notification": to_dict(published)})
    for note in (published, recorded):
        body = {"request_id": "r", "state": "OK", "notification": notification_dict(note)}
        check("status_response", body)
    check("status_response", {"request_id": "r", "state": "PENDING", "notification": None})
    check("status_response", {"request_id": "r", "state": "UNKNOWN", "notification": None})
    assert notification_dict(published)["sequence"] == "1"
    assert notification_dict(recorded)["sequence"] is None
    check("http_error", {"error_code": "bad_id", "reason": "'bad id!': an id is ..."})
