"""What the gateway encodes matches docs/gateway-messages.schema.json (no drift)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gateway.app import encode_history
from gateway.messages import control_frame, dumps, error_frame, message_frame
from mdclient import HistoryResult
from mdclient.frames import candles_from_ohlc
from mdproto.messages import OHLC, FeedStatus, HistoryReadyNotification, Tick

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
        message_frame("RESPONSE:c1", HistoryReadyNotification(request_id="r")),
        control_frame("subscribed", f"{T}|tick"),
        control_frame("sequence", f"{T}|tick", kind="gap", missed=3, candles=0, reason=""),
        control_frame("feed_status", f"{T}|tick", data={"state": "STARTED"}),
        error_frame("bad_request", "a frame must be one JSON object"),
        error_frame("unsupported_period", "served: 60, 300, 3600", f"{T}|ohlc:6"),
        dumps({"type": "dropped", "count": 2}),
    ]
    for frame in frames:
        check("server_frame", json.loads(frame))
    check("client_op", {"op": "subscribe", "topic": "HISTORY_READY:abc"})
    with pytest.raises(jsonschema.ValidationError):
        check("client_op", {"op": "subscribe", "topic": f"{T}|ohlc:"})


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
    result = HistoryResult(candles_from_ohlc(rows), "OK", "r", 1, 0.5, 7, 3, note)
    body = json.loads(encode_history(result, "json"))
    check("history_response", body)
    assert [c["open_time_ms"] for c in body["candles"]] == [0, 60_000, 120_000]
    assert body["candles"][0]["trade_count"] is None
