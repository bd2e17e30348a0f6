"""Type IDs of the protocol (spec table "Message Type IDs") and their classes."""

from __future__ import annotations

from enum import IntEnum

from google.protobuf.message import Message

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
    INGEST_CLAIM = 0x20  # Kafka ingest.claims only (ingestor to ingestor)


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
    MessageType.INGEST_CLAIM: pb.IngestClaim,
}

TYPE_BY_NAME: dict[str, MessageType] = {
    cls.DESCRIPTOR.full_name: type_id for type_id, cls in CLASS_BY_TYPE.items()
}


def type_of(message: Message) -> MessageType:
    """The type ID a message is sent with; KeyError for non-protocol messages."""
    return TYPE_BY_NAME[message.DESCRIPTOR.full_name]
