"""Envelope codec: round trips for every type, and only ProtocolError on junk."""

from __future__ import annotations

import pytest
from google.protobuf.message import Message
from hypothesis import given, settings
from hypothesis import strategies as st

from mdproto import envelope
from mdproto import messages as m
from mdproto.envelope import CLASS_BY_TYPE, MessageType, type_of
from mdproto.errors import ProtocolError

CANDLE = m.OHLC(
    ticker="BINANCE:BTC/USDT",
    period_seconds=60,
    open_time_ms=1_700_000_000_000,
    open=1.5,
    high=2.0,
    low=1.0,
    close=1.75,
    volume=10.0,
    trade_count=7,
    closed=True,
)

SAMPLES: dict[MessageType, Message] = {
    MessageType.DATA_REQUEST: m.DataRequest(
        request_id="r1",
        client_id="c1",
        kind=m.DataRequest.HISTORICAL,
        ticker="BINANCE:BTC/USDT",
        period_seconds=60,
        start_time_ms=1,
        end_time_ms=2,
        notification_topic="RESPONSE:c1",
    ),
    MessageType.DATA_RESPONSE: m.DataResponse(
        request_id="r1", status=m.Status.OK, candles=[CANDLE]
    ),
    MessageType.INGESTOR_CONTROL: m.IngestorControl(
        action=m.IngestorControl.CANCEL_REALTIME, ticker="BINANCE:BTC/USDT", config={"a": "b"}
    ),
    MessageType.TICK: m.Tick(
        ticker="BINANCE:BTC/USDT", trade_id="42", price=1.0, amount=2.0, side=m.TakerSide.BUY
    ),
    MessageType.OHLC: CANDLE,
    MessageType.MARKET: m.Market(ticker="BINANCE:BTC/USDT", base="BTC", quote="USDT", active=True),
    MessageType.OHLC_REQUEST: m.OHLCRequest(request_id="r1", ticker="BINANCE:BTC/USDT"),
    MessageType.RESPONSE: m.Response(request_id="r1", status=m.Status.TIMEOUT, reason="late"),
    MessageType.CEP_TRIGGER_REQUEST: m.CEPTriggerRequest(
        trigger_id="t1",
        action=m.CEPTriggerRequest.REGISTER,
        conditions=[m.CEPCondition(kind=m.CEPCondition.PRICE_ABOVE, threshold=100.0)],
    ),
    MessageType.CEP_TRIGGER_ACK: m.CEPTriggerAck(
        trigger_id="t1", status=m.Status.OK, event_topic="CEP:t1"
    ),
    MessageType.CEP_TRIGGER_EVENT: m.CEPTriggerEvent(trigger_id="t1", values={"price": 101.0}),
    MessageType.OHLC_BATCH: m.OHLCBatch(
        request_id="r1",
        sequence=0,
        metadata=m.BatchMetadata(request_id="r1", ticker="BINANCE:BTC/USDT"),
        rows=[CANDLE, CANDLE],
    ),
    MessageType.SUBMIT_HISTORICAL_REQUEST: m.SubmitHistoricalRequest(
        request_id="r1", client_id="c1", ticker="BINANCE:BTC/USDT", period_seconds=60
    ),
    MessageType.SUBMIT_RESPONSE: m.SubmitResponse(
        request_id="r1", status=m.Status.OK, notification_topic="RESPONSE:c1"
    ),
    MessageType.HISTORY_READY_NOTIFICATION: m.HistoryReadyNotification(
        request_id="r1", status=m.Status.OK, row_count=2, iceberg_table="market.ohlc"
    ),
    MessageType.INGESTOR_STATUS: m.IngestorStatus(
        ingestor_id="i1",
        exchanges=[m.ExchangeHealth(exchange="BINANCE", healthy=True)],
        interval_ms=2000,
    ),
    MessageType.FEED_STATUS: m.FeedStatus(
        ticker="BINANCE:BTC/USDT", state=m.FeedStatus.FAILED, error_code="bad_symbol"
    ),
    MessageType.PIPELINE_STATUS: m.PipelineStatus(
        sent_at_ms=1_700_000_000_000, interval_ms=1000, history=True, reason="CEP is disabled"
    ),
    MessageType.BOOK_SNAPSHOT: m.BookSnapshot(
        ticker="OKX:BTC/USDT",
        bids=[m.BookLevel(price=100.5, amount=2.0)],
        asks=[m.BookLevel(price=100.6, amount=1.5)],
        depth=400,
        exchange_sequence=123_456_789_012,
        reset=m.BookReset.BOOK_RESET_CHECKSUM,
        reason="checksum 123 != 456",
        sequence=3,
        publisher_epoch=1_700_000_000_000_000,
    ),
    MessageType.BOOK_DELTA: m.BookDelta(
        ticker="OKX:BTC/USDT",
        bids=[m.BookLevel(price=100.5, amount=0.0)],
        exchange_sequence=123_456_789_013,
        exchange_prev_sequence=123_456_789_012,
        sequence=4,
    ),
    MessageType.REQUEST_STATUS_QUERY: m.RequestStatusQuery(request_id="r1"),
    MessageType.REQUEST_STATUS_REPLY: m.RequestStatusReply(
        request_id="r1",
        status=m.Status.OK,
        accepted_at_ms=1_700_000_000_000,
        notification_topic="HISTORY_READY:r1",
        remembered_s=86_400,
    ),
    MessageType.INGEST_CLAIM: m.IngestClaim(
        kind=m.IngestClaim.CLAIM,
        ingestor_id="i1",
        request_id="r1",
        attempt=1,
        request=m.DataRequest(request_id="r1", ticker="BINANCE:BTC/USDT", period_seconds=60),
    ),
    MessageType.TRADE_GAP: m.TradeGap(
        gap_id="BINANCE:BTC/USDT|10|20",
        ticker="BINANCE:BTC/USDT",
        from_trade_id="10",
        to_trade_id="20",
        cause=m.TradeGap.SKIPPED_IDS,
        state=m.TradeGap.REPAIRED,
        trades_recovered=9,
        missing_ids=9,
    ),
    MessageType.RECORDING_CHECKPOINT: m.RecordingCheckpoint(
        ticker="BINANCE:BTC/USDT", last_trade_id="20", last_trade_time_ms=1_700_000_000_000
    ),
    MessageType.EXCHANGE_SERVING: m.ExchangeServing(
        exchange="BINANCE", served=False, error_code="no_ingestor", interval_ms=1000
    ),
}


def test_every_type_id_matches_the_spec_table() -> None:
    assert {t.value for t in MessageType} == {
        0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C, 0x10, 0x11, 0x12,
        0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x20, 0x21, 0x22,
        0x23,
    }  # fmt: skip
    assert set(SAMPLES) == set(MessageType) == set(CLASS_BY_TYPE)


@pytest.mark.parametrize("type_id", list(MessageType), ids=lambda t: t.name)
def test_round_trip_every_message_type(type_id: MessageType) -> None:
    message = SAMPLES[type_id]
    frames = envelope.encode(message)
    assert frames[0] == b"\x01"
    assert frames[1][0] == type_id
    assert type_of(message) == type_id
    assert envelope.decode(frames) == message
    assert envelope.decode(frames, type(message)) == message
    assert envelope.decode_record(envelope.encode_record(message)) == message
    topic, decoded = envelope.decode_sub(envelope.encode_pub("BINANCE:BTC/USDT|tick", message))
    assert (topic, decoded) == ("BINANCE:BTC/USDT|tick", message)


def test_unexpected_type_is_a_protocol_error() -> None:
    frames = envelope.encode(SAMPLES[MessageType.TICK])
    with pytest.raises(ProtocolError) as info:
        envelope.decode(frames, m.OHLC)
    assert info.value.code == "unexpected_type"


@pytest.mark.parametrize(
    ("frames", "code"),
    [
        ([b"\x01"], "frame_count"),
        ([b"\x01", b"\x04", b"x"], "frame_count"),
        ([b"\x02", b"\x04"], "bad_version"),
        ([b"", b"\x04"], "bad_version"),
        ([b"\x01", b""], "empty_frame"),
        ([b"\x01", b"\x7f"], "unknown_type"),
        ([b"\x01", b"\x04\xff\xff\xff"], "bad_payload"),
    ],
)
def test_malformed_frames_name_their_reason(frames: list[bytes], code: str) -> None:
    with pytest.raises(ProtocolError) as info:
        envelope.decode(frames)
    assert info.value.code == code
    assert "\n" not in info.value.reason


def test_oversized_payload_is_refused_before_parsing() -> None:
    frames = envelope.encode(m.Tick(ticker="X" * 100))
    with pytest.raises(ProtocolError) as info:
        envelope.decode(frames, max_payload=50)
    assert info.value.code == "too_large"
    assert envelope.decode(frames, max_payload=200) == m.Tick(ticker="X" * 100)


def test_router_route_is_split_for_req_and_dealer_peers() -> None:
    body = envelope.encode(SAMPLES[MessageType.SUBMIT_RESPONSE])
    req_route, req_env = envelope.split_routed([b"id", b"", *body])
    assert (req_route, req_env) == ([b"id", b""], body)
    dealer_route, dealer_env = envelope.split_routed([b"id", *body])
    assert (dealer_route, dealer_env) == ([b"id"], body)
    reply = envelope.encode_routed(req_route, SAMPLES[MessageType.SUBMIT_RESPONSE])
    assert reply[:2] == [b"id", b""]


@settings(max_examples=500)
@given(st.lists(st.binary(max_size=64), max_size=5))
def test_random_frames_raise_only_protocol_error(frames: list[bytes]) -> None:
    try:
        message = envelope.decode(frames, max_payload=32)
    except ProtocolError as exc:
        assert exc.code in ProtocolError.CODES
        assert exc.reason
    else:
        assert len(frames) == 2
        assert envelope.decode(envelope.encode(message)) == message


@settings(max_examples=300)
@given(st.lists(st.binary(max_size=32), max_size=5))
def test_random_sub_frames_raise_only_protocol_error(frames: list[bytes]) -> None:
    try:
        envelope.decode_sub(frames)
    except ProtocolError as exc:
        assert exc.code in ProtocolError.CODES


@settings(max_examples=300)
@given(st.binary(max_size=64))
def test_random_records_raise_only_protocol_error(value: bytes) -> None:
    try:
        envelope.decode_record(value)
    except ProtocolError as exc:
        assert exc.code in ProtocolError.CODES


@settings(max_examples=200)
@given(st.sampled_from(list(MessageType)), st.binary(max_size=64))
def test_valid_header_with_random_payload_raises_only_protocol_error(
    type_id: MessageType, payload: bytes
) -> None:
    try:
        message = envelope.decode([b"\x01", bytes([type_id]) + payload])
    except ProtocolError as exc:
        assert exc.code == "bad_payload"
    else:
        assert type_of(message) == type_id


def test_decode_records_gives_each_value_what_decode_record_gives() -> None:
    tick = m.Tick(ticker="BINANCE:BTC/USDT", trade_id="1", price=1.0, amount=2.0)
    good = envelope.encode_record(tick)
    values: list[bytes | None] = [
        good,
        envelope.encode_record(m.OHLC(ticker="BINANCE:BTC/USDT")),  # another type
        good[:1],  # too short
        bytes([9]) + good[1:],  # another version
        good[:2] + b"\xff\xff",  # the type byte right, the payload not protobuf
        None,
        good,
    ]
    out = envelope.decode_records(values, m.Tick, max_payload=64)
    assert out[0] == tick and out[-1] == tick
    for value, got in zip(values[1:-1], out[1:-1], strict=True):
        with pytest.raises(ProtocolError) as expected:
            envelope.decode_record(value or b"", m.Tick, max_payload=64)
        assert isinstance(got, ProtocolError)
        assert (got.code, got.reason) == (expected.value.code, expected.value.reason)
    too_large = envelope.encode_record(m.Tick(ticker="X" * 100))
    [refused] = envelope.decode_records([too_large], m.Tick, max_payload=64)
    assert isinstance(refused, ProtocolError) and "exceeds" in refused.reason
