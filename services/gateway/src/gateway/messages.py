"""The gateway's JSON messages (docs/gateway-messages.schema.json), pure: no I/O.

Client -> gateway: `{"op": "subscribe" | "unsubscribe", "topic": "..."}`. Gateway ->
client: `subscribed`, `unsubscribed`, `message` (a platform message as JSON),
`feed_status` and `sequence` (what the SDK learnt about a live topic), `book` (the
top of an order book the gateway keeps) and `book_event` (its resets, losses and
resyncs), `dropped` (this client fell behind), `error`. Topics are the platform's
exact topics; prefixes are refused, so a subscriber gets exactly the topic it named
(docs/protocol.md).
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from mdproto import ProtocolError, topics
from mdproto.book import Level
from mdproto.error_codes import BAD_FORMAT, BAD_REQUEST, BAD_TOPIC
from mdproto.markets import Precision, price_difference
from mdproto.messages import HistoryReadyNotification

if TYPE_CHECKING:
    import pyarrow as pa

TopicKind = Literal["tick", "ohlc", "book", "status", "response", "history_ready", "cep"]
#: Kinds whose latest message a late subscriber gets at once (state, not events),
#: like the pipeline's last-value cache (docs/protocol.md); a book's is its ladder.
LAST_VALUE_KINDS: frozenset[TopicKind] = frozenset({"tick", "ohlc", "book", "status"})
#: What mdproto.topics.is_valid_id accepts, for reasons sent to clients.
ID_RULE = "1-128 characters of [A-Za-z0-9_.-]"
_ID_PREFIXES: tuple[tuple[str, TopicKind], ...] = (
    (topics.RESPONSE_PREFIX, "response"),
    (topics.HISTORY_READY_PREFIX, "history_ready"),
    (topics.CEP_PREFIX, "cep"),
)


class GatewayError(Exception):
    """A refusal with a machine-readable code, sent to the client as `error`.

    `topic`: the topic the refused op named, as sent, so a client can tell which of
    its ops was refused (None when the frame named no topic string).
    """

    def __init__(self, error_code: str, reason: str, topic: str | None = None) -> None:
        super().__init__(reason)
        self.error_code = error_code
        self.reason = reason
        self.topic = topic


@dataclass(frozen=True, slots=True)
class Topic:
    """An exact platform topic a WebSocket client may subscribe to."""

    name: str
    kind: TopicKind
    ticker: str = ""
    period_seconds: int = 0

    @property
    def live(self) -> bool:
        """Ticks and candles: served by an SDK live stream (feed status, gap recovery)."""
        return self.kind in ("tick", "ohlc")


def parse_topic(text: object) -> Topic:
    """`text` as an exact topic, or GatewayError(`bad_topic`) saying what is accepted."""
    if not isinstance(text, str) or not text:
        raise GatewayError(BAD_TOPIC, "topic must be a non-empty string")
    for prefix, kind in _ID_PREFIXES:
        if text.startswith(prefix):
            if not topics.is_valid_id(text.removeprefix(prefix)):
                raise GatewayError(BAD_TOPIC, f"{text!r}: the id must be {ID_RULE}")
            return Topic(text, kind)
    ticker, _, rest = text.partition("|")
    market = topics.parse_market_topic(text)
    if market is not None and market.kind == "tick":
        return Topic(text, "tick", market.ticker)
    if market is not None and market.kind == "ohlc" and market.period_seconds:
        return Topic(text, "ohlc", market.ticker, market.period_seconds)
    if market is not None and market.kind == "book":
        return Topic(text, "book", market.ticker)
    if rest == topics.STATUS:
        try:
            topics.parse_ticker(ticker)
        except ProtocolError as exc:
            raise GatewayError(BAD_TOPIC, exc.reason) from None
        return Topic(text, "status", ticker)
    raise GatewayError(
        BAD_TOPIC,
        f"{text!r} is not an exact topic: use EXCHANGE:BASE/QUOTE|tick, |ohlc:SECONDS, "
        "|book, |status, RESPONSE:id, HISTORY_READY:id or CEP:id (prefixes are not accepted)",
    )


@dataclass(frozen=True, slots=True)
class Op:
    op: Literal["subscribe", "unsubscribe"]
    topic: Topic


def parse_op(text: str | bytes) -> Op:
    """A client frame as an operation, or GatewayError (`bad_request`, `bad_topic`)
    carrying the frame's topic when it named one (a string)."""
    try:
        data = json.loads(text)
    except ValueError:
        raise GatewayError(BAD_REQUEST, "a frame must be one JSON object") from None
    if not isinstance(data, dict):
        raise GatewayError(BAD_REQUEST, "a frame must be one JSON object")
    op, topic = data.get("op"), data.get("topic")
    sent = topic if isinstance(topic, str) else None
    if op not in ("subscribe", "unsubscribe"):
        raise GatewayError(BAD_REQUEST, f"op must be subscribe or unsubscribe, not {op!r}", sent)
    if "topic" not in data:  # a malformed frame; a topic that is no exact topic is bad_topic
        raise GatewayError(BAD_REQUEST, f"a {op} frame needs a topic")
    try:
        return Op(op, parse_topic(topic))
    except GatewayError as exc:
        exc.topic = sent
        raise


_INT64_TYPES = frozenset({FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64})


def int64(value: int | None) -> str | None:
    """A 64-bit integer as JSON sends it: a decimal string, exact in every language
    (a JSON number above 2**53 is rounded by JavaScript; Iceberg snapshot ids are)."""
    return None if value is None else str(value)


def to_dict(message: Message) -> dict[str, Any]:
    """A protobuf message as plain JSON values, field names as in the .proto.

    64-bit integers (int64, uint64) are decimal strings, as in protobuf's JSON
    mapping; unlike it, every field is present, an unset optional field (proto3
    `optional`: "not reported") is null, and enums are their names.
    """
    out: dict[str, Any] = {}
    field: Any
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            out[field.name] = {k: _plain(field, v, map_value=True) for k, v in value.items()}
        elif field.is_repeated:
            out[field.name] = [_plain(field, v) for v in value]
        elif field.has_presence and not message.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = _plain(field, value)
    return out


def _plain(field: Any, value: Any, *, map_value: bool = False) -> Any:
    if map_value:
        field = field.message_type.fields_by_name["value"]
    if field.message_type is not None:
        return to_dict(value)
    if field.enum_type is not None:
        names = field.enum_type.values_by_number
        return names[value].name if value in names else value
    if field.cpp_type in _INT64_TYPES:
        return str(value)
    return value


def notification_dict(note: HistoryReadyNotification) -> dict[str, Any]:
    """A HistoryReadyNotification as JSON; `sequence` and `publisher_epoch` null when
    unknown (epoch 0): read from `market.requests`, which does not record them, for a
    request whose publication this gateway did not receive (gateway.notices)."""
    data = to_dict(note)
    if not note.publisher_epoch:
        data["sequence"] = data["publisher_epoch"] = None
    return data


def dumps(data: dict[str, Any]) -> str:
    return json.dumps(data, separators=(",", ":"))


def message_frame(topic: str, message: Message) -> str:
    """What every subscriber of `topic` receives: encoded once, sent to all."""
    return dumps(
        {
            "type": "message",
            "topic": topic,
            "message_type": message.DESCRIPTOR.name,
            "data": to_dict(message),
        }
    )


def control_frame(frame_type: str, topic: str, /, **extra: Any) -> str:
    return dumps({"type": frame_type, "topic": topic, **extra})


def error_frame(error_code: str, reason: str, topic: str | None = None) -> str:
    return dumps({"type": "error", "topic": topic, "error_code": error_code, "reason": reason})


def book_frame(
    topic: str,
    bids: list[Level],
    asks: list[Level],
    *,
    in_sync: bool,
    exchange_sequence: int,
    exchange_time_ms: int,
    precision: Precision,
) -> str:
    """The top of a book as a ladder: what a page draws, without keeping a book itself.

    `bids`/`asks` best first (the gateway's depth limit); best levels and the spread
    are spelled out so a client need not know which end of a list is best. `in_sync`
    false: the book lost messages and waits for a snapshot (these levels are stale).
    `price_decimals`/`amount_decimals`: the market's tick and lot size as decimals to
    show (null: unknown), so a page prints a column of prices at one width.
    """
    best_bid = list(bids[0]) if bids else None
    best_ask = list(asks[0]) if asks else None
    return dumps(
        {
            "type": "book",
            "topic": topic,
            "in_sync": in_sync,
            "bids": [list(level) for level in bids],
            "asks": [list(level) for level in asks],
            "best_bid": best_bid,
            "best_ask": best_ask,
            "spread": price_difference(asks[0][0], bids[0][0]) if bids and asks else None,
            "exchange_sequence": int64(exchange_sequence),
            "exchange_time_ms": int64(exchange_time_ms),
            "price_decimals": precision.price_decimals,
            "amount_decimals": precision.amount_decimals,
        }
    )


BookEventKind = Literal["reset", "gap", "resynced"]


def book_event_frame(
    topic: str,
    kind: BookEventKind,
    *,
    reset: str | None = None,
    reason: str = "",
    missed: int = 0,
    waited_ms: int = 0,
) -> str:
    """What happened to a book (the SDK's BookEvent): `reset` by the feed (its BookReset
    name), a `gap` (`missed` messages lost: a decimal string, like `sequence`'s), or
    `resynced` from a snapshot `waited_ms` after the gap."""
    return dumps(
        {
            "type": "book_event",
            "topic": topic,
            "kind": kind,
            "reset": reset,
            "reason": reason,
            "missed": int64(missed),
            "waited_ms": waited_ms,
        }
    )


# --- HTTP history -----------------------------------------------------------------

HistoryFormat = Literal["json", "arrow", "parquet"]
MEDIA_TYPES: dict[HistoryFormat, str] = {
    "json": "application/json",
    "arrow": "application/vnd.apache.arrow.stream",
    "parquet": "application/vnd.apache.parquet",
}


def table_bytes(table: pa.Table, fmt: HistoryFormat) -> bytes:
    """A whole Arrow table as an Arrow IPC stream (`arrow`) or a Parquet file (`parquet`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    if fmt == "arrow":
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    elif fmt == "parquet":
        pq.write_table(table, sink)
    else:
        raise ValueError(f"{fmt!r} is not a binary format")
    return sink.getvalue()


def choose_format(query_format: str | None, accept: str | None) -> HistoryFormat:
    """`format=` wins, then the first Accept media type we serve; JSON by default."""
    if query_format:
        if query_format not in MEDIA_TYPES:
            raise GatewayError(
                BAD_FORMAT, f"format must be one of {sorted(MEDIA_TYPES)}, not {query_format!r}"
            )
        return query_format
    by_type = {media: name for name, media in MEDIA_TYPES.items()}
    for part in (accept or "").split(","):
        media = part.split(";")[0].strip().lower()
        if media in by_type:
            return by_type[media]
    return "json"


@dataclass(frozen=True, slots=True)
class HistoryParams:
    ticker: str
    period: int | str
    start: int | str
    end: int | str = "now"
    refetch: bool = False


def parse_history(body: object) -> HistoryParams:
    """The POST /history body; times and periods as the SDK takes them (ms, `-24h`, `1m`)."""
    if not isinstance(body, dict):
        raise GatewayError(BAD_REQUEST, "the body must be a JSON object")
    unknown = set(body) - {"ticker", "period", "start", "end", "refetch", "format"}
    if unknown:
        raise GatewayError(BAD_REQUEST, f"unknown field(s): {', '.join(sorted(unknown))}")
    for name in ("ticker", "period", "start"):
        if name not in body:
            raise GatewayError(BAD_REQUEST, f"missing field {name!r}")
    ticker = body["ticker"]
    if not isinstance(ticker, str):
        raise GatewayError(BAD_REQUEST, "ticker must be a string")
    for name in ("period", "start", "end"):
        value = body.get(name, "now")
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise GatewayError(BAD_REQUEST, f"{name} must be a number or a string")
    refetch = body.get("refetch", False)
    if not isinstance(refetch, bool):
        raise GatewayError(BAD_REQUEST, "refetch must be true or false")
    return HistoryParams(ticker, body["period"], body["start"], body.get("end", "now"), refetch)


def parse_recording_query(query: Mapping[str, str]) -> str | None:
    """`GET /recording`'s query: `exchange` (`BINANCE`, any case; absent: every exchange).
    `token` is the auth middleware's; anything else is refused, as in POST /history."""
    unknown = set(query) - {"exchange", "token"}
    if unknown:
        raise GatewayError(BAD_REQUEST, f"unknown parameter(s): {', '.join(sorted(unknown))}")
    text = query.get("exchange", "").strip()
    if not text:
        return None
    name = text.upper().rstrip(":")
    if not topics.is_valid_exchange(name):
        raise GatewayError(BAD_REQUEST, f"{text!r} is not an exchange name such as BINANCE")
    return name


def server_timing(notify_s: float, read_s: float, encode_s: float) -> str:
    """A `POST /history` answer's `Server-Timing` header (W3C; durations in ms): the
    gateway's own measure of a request, whatever the client's clock does."""
    parts = (
        ("notify", notify_s, "submit to notification"),
        ("read", read_s, "rows read"),
        ("encode", encode_s, "answer encoded"),
    )
    return ", ".join(f'{name};dur={max(s, 0) * 1000:.1f};desc="{what}"' for name, s, what in parts)


def integrity(note: Message | None) -> dict[str, Any]:
    """The integrity report of a HistoryReadyNotification (docs/protocol.md)."""
    if note is None:
        return {}
    data = to_dict(note)
    keys = ("expected_candles", "missing_candles", "exchange_gaps", "source", "row_count")
    return {key: data[key] for key in keys}
