"""Every error code the platform sends: what it means and where it first appears.

Codes are stable strings that travel unchanged to clients, logs and metric
labels; reasons are for humans. Every service, the SDK and the gateway name a
code by its constant here, so one code has one spelling and one meaning.
`VOCABULARY` lists them with their meaning and the channels (`Carrier`) that
originate them; docs/protocol.md "Reply and error codes (every channel)" holds
the same table and proto/tests/test_error_codes.py keeps the two, and every
code the source sends, in agreement.

A code is listed under the channels that first send it: the SDK raises every
code it receives (reply, history, feed) unchanged as its `error_code`, and the
gateway passes the SDK's codes on, so those channels are not repeated.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final


class Carrier(enum.Enum):
    """A channel that originates error codes; the value is its label in docs/protocol.md."""

    REPLY = "reply"  # relay reply on :5559: status REJECTED, ERROR or TIMEOUT
    FRAME = "frame"  # ProtocolError: an undecodable or unexpected frame or record
    HISTORY = "history"  # HistoryReadyNotification ERROR: the ingestor's ERROR marker, the
    # pipeline's own; a legacy ERROR Response's reason starts "<code>: " with these too
    LEGACY = "legacy"  # only a legacy ERROR Response's reason, "<code>: <reason>"
    HEALTH = "health"  # IngestorStatus ExchangeHealth.error_code: the last transient fault
    FEED = "feed"  # FeedStatus LOST, FAILED or REFUSED on {ticker}|status
    WS = "ws"  # the gateway's WebSocket error frame
    HTTP = "http"  # the gateway's HTTP error body
    SDK = "sdk"  # an mdclient error's error_code that the SDK itself decides
    LOG = "log"  # the pipeline's log line for a dropped Kafka record (nothing is sent)


@dataclass(frozen=True, slots=True)
class Code:
    """One code: its wire value, what it means and the channels that originate it."""

    value: str
    meaning: str
    carriers: frozenset[Carrier]


_codes: dict[str, Code] = {}


def _code(value: str, carriers: str, meaning: str) -> str:
    """Register a code; `carriers` are `Carrier` labels separated by spaces."""
    if value in _codes:
        raise ValueError(f"error code {value!r} is defined twice")
    _codes[value] = Code(value, meaning, frozenset(Carrier(c) for c in carriers.split()))
    return value


# --- request rules (mdproto.rules): the relay rejects, the SDK checks before sending ---
MISSING_ID: Final = _code(
    "missing_id", "reply sdk", "no request_id or client_id (submit), no trigger_id (trigger)"
)
BAD_ID: Final = _code("bad_id", "reply sdk http", "an id is not 1-128 characters of [A-Za-z0-9_.-]")
BAD_TICKER: Final = _code(
    "bad_ticker",
    "reply sdk frame",
    "a ticker is not EXCHANGE:BASE/QUOTE (a Market record's key too)",
)
UNKNOWN_EXCHANGE: Final = _code(
    "unknown_exchange", "reply", "the exchange is not in the relay's known_exchanges list"
)
BAD_SYMBOL: Final = _code(
    "bad_symbol", "reply history feed", "the exchange lists no such (active) market"
)
BAD_PERIOD: Final = _code("bad_period", "reply sdk", "period_seconds is not > 0")
BAD_BARS: Final = _code(
    "bad_bars",
    "reply sdk",
    "a history request's bars is not <N>ticks or <V>vol, or comes with a period_seconds",
)
BAD_TIME_RANGE: Final = _code(
    "bad_time_range", "reply sdk", "not 0 <= start < end, or the end too far in the future"
)
RANGE_TOO_LARGE: Final = _code(
    "range_too_large",
    "reply sdk",
    "the range holds more candles than the relay's limit, or more book samples than the SDK's",
)
BAD_NOTIFY: Final = _code(
    "bad_notify", "reply sdk", "unknown notify pattern, or PER_CLIENT without client_id"
)
BAD_ACTION: Final = _code("bad_action", "reply", "a trigger request's action is unknown")
BAD_CONDITION: Final = _code(
    "bad_condition", "reply sdk", "a trigger's conditions, thresholds, windows or bound are invalid"
)
EXPIRED: Final = _code("expired", "reply sdk", "a trigger's expires_at_ms is negative or past")

# --- the relay's refusals and failures -------------------------------------------------
RATE_LIMITED: Final = _code(
    "rate_limited",
    "reply history health feed",
    "too many requests: the client's connection at the relay, or the exchange's limit",
)
NO_INGESTOR: Final = _code(
    "no_ingestor",
    "reply sdk",
    "no live ingestor serves the exchange (none runs, or all hung; the SDK: also for a "
    "request in flight, from the relay's ExchangeServing report)",
)
KAFKA_UNAVAILABLE: Final = _code(
    "kafka_unavailable", "reply", "every live ingestor of the exchange cannot write to Kafka"
)
EXCHANGE_UNAVAILABLE: Final = _code(
    "exchange_unavailable",
    "reply history health feed",
    "the exchange is down (503, refused, maintenance), or its breaker is open at the relay",
)
PIPELINE_UNAVAILABLE: Final = _code(
    "pipeline_unavailable",
    "reply sdk",
    "no pipeline heartbeat, or the part the request needs does not run (the SDK: also "
    "for a request in flight, from the relay's down report on PIPELINE:status)",
)
PENDING_FULL: Final = _code("pending_full", "reply", "too many legacy requests are waiting")
DUPLICATE_REQUEST: Final = _code(
    "duplicate_request", "reply", "a legacy request with this request_id is already waiting"
)
NO_TRIGGER_STORE: Final = _code(
    "no_trigger_store", "reply", "the relay has no trigger store (no Kafka configured)"
)
SINK_ERROR: Final = _code("sink_error", "reply", "the trigger store did not take the record")
TIMEOUT: Final = _code(
    "timeout",
    "reply history health feed",
    "no answer in time: no ingestor answered a legacy request, or an exchange call timed out",
)
INTERNAL: Final = _code(
    "internal",
    "reply history ws",
    "a bug (logged with its traceback) in the relay, the ingestor or the gateway",
)

# --- frames and records that do not decode (ProtocolError) ------------------------------
FRAME_COUNT: Final = _code("frame_count", "frame", "a message has the wrong number of frames")
EMPTY_FRAME: Final = _code("empty_frame", "frame", "a frame or record is empty or too short")
BAD_VERSION: Final = _code("bad_version", "frame", "the version frame is not this protocol's")
UNKNOWN_TYPE: Final = _code("unknown_type", "frame", "the message type byte is unknown")
UNEXPECTED_TYPE: Final = _code(
    "unexpected_type", "frame sdk", "a valid message of a type this socket or reply does not take"
)
BAD_PAYLOAD: Final = _code("bad_payload", "frame", "the protobuf payload does not parse")
TOO_LARGE: Final = _code("too_large", "frame", "the payload exceeds the socket's maximum")
BAD_TOPIC: Final = _code("bad_topic", "frame ws", "a topic is not UTF-8 or not one exact topic")
BAD_STATUS: Final = _code(
    "bad_status", "frame", "an IngestorStatus the relay cannot use (relay_bad_frames_total)"
)

# --- history: the ingestor's ERROR marker, the pipeline's notification ------------------
INVALID_REQUEST: Final = _code(
    "invalid_request", "history", "the ingestor found the request invalid"
)
UNSUPPORTED_PERIOD: Final = _code(
    "unsupported_period", "history feed", "the exchange or the platform has no such candle period"
)
HISTORY_UNAVAILABLE: Final = _code(
    "history_unavailable", "history", "the range is older than the exchange's history"
)
BAD_REQUEST: Final = _code(
    "bad_request",
    "history feed ws http",
    "the exchange rejected the parameters; at the gateway, a malformed frame or body",
)
NOT_SUPPORTED: Final = _code("not_supported", "history feed", "the exchange lacks the feature")
EXCHANGE_ERROR: Final = _code(
    "exchange_error", "history feed", "any other error the exchange reported"
)
NETWORK_ERROR: Final = _code(
    "network_error", "history health feed", "a transient transport failure reaching the exchange"
)
KAFKA_DELIVERY: Final = _code(
    "kafka_delivery", "history", "the ingestor's records did not reach Kafka"
)
ABANDONED: Final = _code(
    "abandoned", "history", "every ingestor that held the request stopped without finishing it"
)
INCOMPLETE: Final = _code(
    "incomplete", "history", "the pipeline saw the final marker but not every record before it"
)
INGESTOR_ERROR: Final = _code(
    "ingestor_error", "history", "an ERROR marker without a code (the pipeline's default)"
)
TOO_MANY_CANDLES: Final = _code(
    "too_many_candles", "legacy", "a legacy range holds more candles than one Response carries"
)

# --- the gateway ------------------------------------------------------------------------
BAD_FORMAT: Final = _code("bad_format", "http", "format is not json, arrow or parquet")
UNAUTHORIZED: Final = _code("unauthorized", "http", "the gateway's token is missing or wrong")
UNAVAILABLE: Final = _code(
    "unavailable", "ws", "the gateway could not subscribe upstream (an SDK error without a code)"
)
FEED_UNAVAILABLE: Final = _code(
    "feed_unavailable", "ws", "the live feed ended (a FeedStatus without a code)"
)

# --- the SDK (mdclient) -----------------------------------------------------------------
BAD_TIME: Final = _code("bad_time", "sdk", "a time or period the SDK cannot parse")
UNEXPECTED_STATUS: Final = _code(
    "unexpected_status", "sdk", "a SubmitResponse status that is neither OK nor REJECTED"
)
REQUEST_ID_MISMATCH: Final = _code(
    "request_id_mismatch", "sdk", "the relay's reply names another request_id"
)
TOPIC_MISMATCH: Final = _code(
    "topic_mismatch",
    "sdk",
    "the relay announces another notification topic than the one subscribed",
)
WRONG_ID: Final = _code("wrong_id", "sdk", "a trigger ack names another trigger_id")
SUBMIT_TIMEOUT: Final = _code("submit_timeout", "sdk", "no relay acknowledged the submit in time")
HISTORY_TIMEOUT: Final = _code(
    "history_timeout", "sdk", "no HistoryReadyNotification arrived for any attempt"
)
REQUEST_TIMEOUT: Final = _code(
    "request_timeout", "sdk", "the relay did not answer a request in time"
)
SEAM_TIMEOUT: Final = _code(
    "seam_timeout",
    "sdk",
    "replay into live: the store did not hold a topic's first live message in time",
)
SEND_TIMEOUT: Final = _code(
    "send_timeout", "sdk", "a request could not be sent to the relay in time"
)
RELAY_UNREACHABLE: Final = _code(
    "relay_unreachable", "sdk", "the connection to a relay was lost or refused"
)
RELAY_UNAVAILABLE: Final = _code(
    "relay_unavailable", "sdk", "no connection to the relay's sockets in time"
)
SOCKET_ERROR: Final = _code("socket_error", "sdk", "the market-data socket cannot be opened")
CLOSED: Final = _code("closed", "sdk", "the SDK's subscriber thread is not running")
SUBSCRIBER_STUCK: Final = _code(
    "subscriber_stuck", "sdk", "the subscriber thread did not apply a (un)subscribe in time"
)
CATALOG_UNAVAILABLE: Final = _code(
    "catalog_unavailable", "sdk", "the Iceberg REST catalog cannot be reached"
)
NO_TABLE: Final = _code("no_table", "sdk", "the Iceberg table does not exist")
LOAD_FAILED: Final = _code("load_failed", "sdk", "the Iceberg table cannot be loaded")
SCAN_FAILED: Final = _code("scan_failed", "sdk", "reading the Iceberg rows failed")
SNAPSHOT_GONE: Final = _code(
    "snapshot_gone", "sdk", "table upkeep expired the snapshot a notification names"
)
NO_BOOK: Final = _code("no_book", "sdk", "no order book is stored at or before the time asked")
NOT_RECORDED: Final = _code(
    "not_recorded",
    "history sdk",
    "no trade of the ticker is stored in or around the range asked (history: no bar "
    "from trades can be built)",
)
UNKNOWN_TICKER: Final = _code(
    "unknown_ticker", "sdk", "a replay names a ticker with nothing stored for the channels asked"
)
BAD_CHANNEL: Final = _code(
    "bad_channel", "sdk", "a replay channel is not trades, book or ohlc:PERIOD (or none is named)"
)
BAD_SPEED: Final = _code("bad_speed", "sdk", "a replay speed is not a factor > 0 nor max")
BAD_CURSOR: Final = _code(
    "bad_cursor", "sdk", "a replay cursor is not one a replay of the same tickers and range gave"
)

# --- the pipeline's dropped Kafka records (logged, never sent) ---------------------------
BAD_REQUEST_ID: Final = _code(
    "bad_request_id", "log", "an OHLCBatch record's request_id is invalid"
)
BAD_ROW: Final = _code(
    "bad_row", "log", "candle rows without a valid ticker, period, time or value"
)
BAD_TICK: Final = _code("bad_tick", "log", "a tick record that cannot be stored")
BAD_CANDLE: Final = _code("bad_candle", "log", "a live candle record that cannot be stored")
BAD_BOOK: Final = _code("bad_book", "log", "an order-book record that cannot be used")
BAD_TRIGGER: Final = _code("bad_trigger", "log", "a trigger record that breaks the request rules")


#: Every code, by its wire value.
VOCABULARY: Final[Mapping[str, Code]] = MappingProxyType(_codes)


def carried_by(carrier: Carrier) -> frozenset[str]:
    """The codes a channel originates (e.g. `ProtocolError.CODES` is FRAME's)."""
    return frozenset(c.value for c in _codes.values() if carrier in c.carriers)
