"""Envelope codec: the only place that turns messages into frames and back.

It also holds the protocol's type IDs (spec table "Message Type IDs") and
the class each one decodes to: the type byte is part of the envelope.

Logical format (docs/protocol.md):

    frame 1: [1 byte protocol version]
    frame 2: [1 byte type ID][protobuf payload]

Transport adds frames around it: a topic frame in front on PUB/SUB, identity
(and, for REQ peers, an empty delimiter) frames in front on ROUTER. Kafka
records carry the same bytes concatenated into one value.

Every decode function raises only `ProtocolError`, whatever the input.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum
from typing import TypeVar, overload

from google.protobuf.message import DecodeError, Message

from mdproto.error_codes import (
    BAD_PAYLOAD,
    BAD_TOPIC,
    BAD_VERSION,
    EMPTY_FRAME,
    FRAME_COUNT,
    TOO_LARGE,
    UNEXPECTED_TYPE,
    UNKNOWN_TYPE,
)
from mdproto.errors import ProtocolError
from mdproto.gen import marketdata_pb2 as pb


class MessageType(IntEnum):
    DATA_REQUEST = 0x01
    DATA_RESPONSE = 0x02  # deprecated: legacy synchronous flow
    INGESTOR_CONTROL = 0x03
    TICK = 0x04
    OHLC = 0x05
    MARKET = 0x06
    OHLC_REQUEST = 0x07  # deprecated: legacy synchronous flow
    RESPONSE = 0x08  # deprecated: legacy synchronous flow
    CEP_TRIGGER_REQUEST = 0x09
    CEP_TRIGGER_ACK = 0x0A
    CEP_TRIGGER_EVENT = 0x0B
    OHLC_BATCH = 0x0C
    SUBMIT_HISTORICAL_REQUEST = 0x10
    SUBMIT_RESPONSE = 0x11
    HISTORY_READY_NOTIFICATION = 0x12
    INGESTOR_STATUS = 0x13
    FEED_STATUS = 0x14
    PIPELINE_STATUS = 0x15
    BOOK_SNAPSHOT = 0x16
    BOOK_DELTA = 0x17
    REQUEST_STATUS_QUERY = 0x18
    REQUEST_STATUS_REPLY = 0x19
    INGEST_CLAIM = 0x20  # Kafka ingest.claims only (ingestor to ingestor)
    TRADE_GAP = 0x21  # Kafka market.recording (ingestors, pipeline)
    RECORDING_CHECKPOINT = 0x22  # Kafka market.recording (ingestors)
    EXCHANGE_SERVING = 0x23  # relay XPUB :5558 INGESTORS:{exchange}|status


CLASS_BY_TYPE: dict[MessageType, type[Message]] = {
    MessageType.DATA_REQUEST: pb.DataRequest,
    MessageType.DATA_RESPONSE: pb.DataResponse,
    MessageType.INGESTOR_CONTROL: pb.IngestorControl,
    MessageType.TICK: pb.Tick,
    MessageType.OHLC: pb.OHLC,
    MessageType.MARKET: pb.Market,
    MessageType.OHLC_REQUEST: pb.OHLCRequest,
    MessageType.RESPONSE: pb.Response,
    MessageType.CEP_TRIGGER_REQUEST: pb.CEPTriggerRequest,
    MessageType.CEP_TRIGGER_ACK: pb.CEPTriggerAck,
    MessageType.CEP_TRIGGER_EVENT: pb.CEPTriggerEvent,
    MessageType.OHLC_BATCH: pb.OHLCBatch,
    MessageType.SUBMIT_HISTORICAL_REQUEST: pb.SubmitHistoricalRequest,
    MessageType.SUBMIT_RESPONSE: pb.SubmitResponse,
    MessageType.HISTORY_READY_NOTIFICATION: pb.HistoryReadyNotification,
    MessageType.INGESTOR_STATUS: pb.IngestorStatus,
    MessageType.FEED_STATUS: pb.FeedStatus,
    MessageType.PIPELINE_STATUS: pb.PipelineStatus,
    MessageType.BOOK_SNAPSHOT: pb.BookSnapshot,
    MessageType.BOOK_DELTA: pb.BookDelta,
    MessageType.REQUEST_STATUS_QUERY: pb.RequestStatusQuery,
    MessageType.REQUEST_STATUS_REPLY: pb.RequestStatusReply,
    MessageType.INGEST_CLAIM: pb.IngestClaim,
    MessageType.TRADE_GAP: pb.TradeGap,
    MessageType.RECORDING_CHECKPOINT: pb.RecordingCheckpoint,
    MessageType.EXCHANGE_SERVING: pb.ExchangeServing,
}

TYPE_BY_NAME: dict[str, MessageType] = {
    cls.DESCRIPTOR.full_name: type_id for type_id, cls in CLASS_BY_TYPE.items()
}

# The same tables keyed the way the codec meets them (a frame's first byte, a message's
# class or name): no IntEnum call per message, which costs more than the dict lookup.
_CLASS_BY_BYTE: dict[int, type[Message]] = {int(t): cls for t, cls in CLASS_BY_TYPE.items()}
_TYPE_BYTE_BY_NAME: dict[str, bytes] = {name: bytes([t]) for name, t in TYPE_BY_NAME.items()}
_TYPE_BYTE_BY_CLASS: dict[type[Message], bytes] = {
    cls: bytes([t]) for t, cls in CLASS_BY_TYPE.items()
}


def type_of(message: Message) -> MessageType:
    """The type ID a message is sent with; KeyError for non-protocol messages."""
    return TYPE_BY_NAME[message.DESCRIPTOR.full_name]


PROTOCOL_VERSION = 1
VERSION_FRAME = bytes([PROTOCOL_VERSION])

#: Default cap on a protobuf payload; receivers may pass their own.
DEFAULT_MAX_PAYLOAD = 16 * 1024 * 1024

M = TypeVar("M", bound=Message)
Frames = Sequence[bytes]


def encode(message: Message) -> list[bytes]:
    """The two-frame envelope for `message`."""
    return [VERSION_FRAME, _body(message)]


def encode_pub(topic: str, message: Message) -> list[bytes]:
    """Frames for a PUB socket: topic, then the envelope."""
    return [topic.encode(), VERSION_FRAME, _body(message)]


def encode_routed(route: Frames, message: Message) -> list[bytes]:
    """Frames for a ROUTER reply: the route from `split_routed`, then the envelope."""
    return [*route, VERSION_FRAME, _body(message)]


def encode_record(message: Message) -> bytes:
    """A Kafka record value: version byte, type byte, payload."""
    return VERSION_FRAME + _body(message)


@overload
def decode(frames: Frames, expected: None = None, *, max_payload: int = ...) -> Message: ...
@overload
def decode(frames: Frames, expected: type[M], *, max_payload: int = ...) -> M: ...
def decode(
    frames: Frames,
    expected: type[Message] | None = None,
    *,
    max_payload: int = DEFAULT_MAX_PAYLOAD,
) -> Message:
    """Parse exactly one two-frame envelope.

    With `expected`, a message of any other type is a ProtocolError, so callers
    can use the result without isinstance checks.
    """
    if len(frames) != 2:
        raise ProtocolError(FRAME_COUNT, f"expected 2 envelope frames, got {len(frames)}")
    version, body = frames
    _check_version(version)
    return _parse_body(body, expected, max_payload)


def decode_sub(frames: Frames, *, max_payload: int = DEFAULT_MAX_PAYLOAD) -> tuple[str, Message]:
    """Parse what a SUB socket receives: topic frame, then the envelope."""
    if len(frames) != 3:
        raise ProtocolError(FRAME_COUNT, f"expected topic + 2 envelope frames, got {len(frames)}")
    return decode_topic(frames[0]), decode(frames[1:], max_payload=max_payload)


@overload
def decode_record(value: bytes, expected: None = None, *, max_payload: int = ...) -> Message: ...
@overload
def decode_record(value: bytes, expected: type[M], *, max_payload: int = ...) -> M: ...
def decode_record(
    value: bytes,
    expected: type[Message] | None = None,
    *,
    max_payload: int = DEFAULT_MAX_PAYLOAD,
) -> Message:
    """Parse a Kafka record value written by `encode_record`."""
    if len(value) < 2:
        raise ProtocolError(EMPTY_FRAME, f"record of {len(value)} bytes is too short")
    _check_version(value[:1])
    return _parse_body(value[1:], expected, max_payload)


def decode_records(
    values: Sequence[bytes | None], expected: type[M], *, max_payload: int = DEFAULT_MAX_PAYLOAD
) -> list[M | ProtocolError]:
    """`decode_record` of many values of one type: each message, or the error it raised.

    A hot path (the live engine decodes every trade): a well-formed value is parsed
    without the per-value checks; any other goes through `decode_record` for its error.
    """
    prefix = VERSION_FRAME + _TYPE_BYTE_BY_CLASS[expected]
    parse, limit = expected.FromString, max_payload + 2
    out: list[M | ProtocolError] = []
    for value in values:
        if value is not None and value.startswith(prefix) and len(value) <= limit:
            try:
                out.append(parse(value[2:]))
                continue
            except DecodeError:  # decode_record below names it
                pass
        try:
            out.append(decode_record(value or b"", expected, max_payload=max_payload))
        except ProtocolError as exc:
            out.append(exc)
    return out


def split_routed(frames: Frames) -> tuple[list[bytes], list[bytes]]:
    """Split ROUTER input into (route, envelope).

    A REQ peer (or a DEALER imitating one) sends an empty delimiter, so the route
    is everything up to and including the first empty frame; a bare DEALER sends
    none, so the route is the identity frame alone. Replies must echo the route
    unchanged for the peer's socket to accept them.
    """
    if len(frames) < 2:
        raise ProtocolError(FRAME_COUNT, f"routed message has only {len(frames)} frame(s)")
    if not frames[1]:  # a REQ peer's: identity, delimiter (the relay's every submit)
        return list(frames[:2]), list(frames[2:])
    for i, frame in enumerate(frames[2:], start=2):
        if len(frame) == 0:
            return list(frames[: i + 1]), list(frames[i + 1 :])
    return list(frames[:1]), list(frames[1:])


def decode_topic(frame: bytes) -> str:
    try:
        return frame.decode()
    except UnicodeDecodeError as exc:
        raise ProtocolError(BAD_TOPIC, f"topic is not UTF-8: {exc.reason}") from None


def _body(message: Message) -> bytes:
    # By class first: DESCRIPTOR.full_name costs more than the rest of the encoding.
    type_byte = _TYPE_BYTE_BY_CLASS.get(type(message))
    if type_byte is None:
        type_byte = _TYPE_BYTE_BY_NAME.get(message.DESCRIPTOR.full_name)
    if type_byte is None:
        raise TypeError(f"{message.DESCRIPTOR.full_name} is not a protocol message")
    return type_byte + message.SerializeToString()


def _check_version(version: bytes) -> None:
    if len(version) != 1:
        raise ProtocolError(BAD_VERSION, f"version frame has {len(version)} bytes, expected 1")
    if version[0] != PROTOCOL_VERSION:
        raise ProtocolError(
            BAD_VERSION, f"unsupported protocol version {version[0]} (speaks {PROTOCOL_VERSION})"
        )


def _parse_body(body: bytes, expected: type[Message] | None, max_payload: int) -> Message:
    if len(body) == 0:
        raise ProtocolError(EMPTY_FRAME, "message frame is empty")
    payload_size = len(body) - 1
    if payload_size > max_payload:
        raise ProtocolError(
            TOO_LARGE, f"payload of {payload_size} bytes exceeds the maximum {max_payload}"
        )
    cls = _CLASS_BY_BYTE.get(body[0])
    if cls is None:
        raise ProtocolError(UNKNOWN_TYPE, f"unknown message type 0x{body[0]:02X}")
    if expected is not None and cls is not expected:
        raise ProtocolError(
            UNEXPECTED_TYPE,
            f"expected {expected.DESCRIPTOR.name}, got {cls.DESCRIPTOR.name} (0x{body[0]:02X})",
        )
    try:
        return cls.FromString(body[1:])
    except Exception as exc:  # protobuf backends raise DecodeError or others
        raise ProtocolError(
            BAD_PAYLOAD, f"{cls.DESCRIPTOR.name} payload does not parse: {exc}"
        ) from None
