"""Tickers and topic strings: the routing keys every service must agree on."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from mdproto.error_codes import BAD_TOPIC
from mdproto.errors import ProtocolError
from mdproto.gen.marketdata_pb2 import NotifyPattern

_TICKER = re.compile(r"^(?P<exchange>[A-Z][A-Z0-9_]*):(?P<base>[A-Z0-9]+)/(?P<quote>[A-Z0-9]+)$")
_ID = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")

TICK = "tick"
OHLC = "ohlc"
STATUS = "status"
BOOK = "book"
RESPONSE_PREFIX = "RESPONSE:"
HISTORY_READY_PREFIX = "HISTORY_READY:"
CEP_PREFIX = "CEP:"
#: The pipeline's heartbeat (PipelineStatus): what relays watch to refuse work it cannot do.
PIPELINE_STATUS = "PIPELINE:status"
#: A relay's per-exchange word on its ingestors (ExchangeServing): `INGESTORS:BINANCE|status`.
INGESTORS_PREFIX = "INGESTORS:"
# Plain ints: protobuf enum attribute lookups cost microseconds on the relay's hot path.
_AUTO = int(NotifyPattern.NOTIFY_AUTO)
_PER_CLIENT = int(NotifyPattern.NOTIFY_PER_CLIENT)


@dataclass(frozen=True, slots=True)
class Ticker:
    """`EXCHANGE:BASE/QUOTE`, e.g. BINANCE:BTC/USDT."""

    exchange: str
    base: str
    quote: str

    @property
    def symbol(self) -> str:
        """The unified (ccxt) symbol, e.g. BTC/USDT."""
        return f"{self.base}/{self.quote}"

    @property
    def prefix(self) -> str:
        """The ingestor work topic for this ticker's exchange, e.g. BINANCE:."""
        return f"{self.exchange}:"

    def __str__(self) -> str:
        return f"{self.exchange}:{self.base}/{self.quote}"


def parse_ticker(ticker: str) -> Ticker:
    match = _TICKER.match(ticker)
    if match is None:
        raise ProtocolError(BAD_TOPIC, f"ticker {ticker!r} is not EXCHANGE:BASE/QUOTE (upper case)")
    return Ticker(match["exchange"], match["base"], match["quote"])


def exchange_prefix(ticker: str) -> str:
    """`BINANCE:BTC/USDT` -> `BINANCE:` (the relay's ingestor work topic)."""
    return parse_ticker(ticker).prefix


def is_valid_exchange(name: str) -> bool:
    """An exchange as tickers name it: `BINANCE` (upper case, no colon)."""
    return _TICKER.match(f"{name}:A/B") is not None


def is_valid_id(value: str) -> bool:
    """Request, client and trigger ids become topic suffixes: keep them plain."""
    return _ID.match(value) is not None


def recording_slot(ticker: str, slots: int) -> int:
    """The recording slot (Kafka `market.recording` partition) of a ticker: a stable hash,
    the same in every process and version (not Python's salted `hash`)."""
    digest = hashlib.blake2b(ticker.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % slots


def gap_id(ticker: str, from_trade_id: str, to_trade_id: str) -> str:
    """A TradeGap's id: the same gap found twice (a takeover) gets the same id."""
    return f"{ticker}|{from_trade_id}|{to_trade_id}"


def tick_topic(ticker: str) -> str:
    return f"{ticker}|{TICK}"


def ohlc_topic(ticker: str, period_seconds: int) -> str:
    return f"{ticker}|{OHLC}:{period_seconds}"


def book_topic(ticker: str) -> str:
    """Where a ticker's L2 order book is published (BookSnapshot, BookDelta)."""
    return f"{ticker}|{BOOK}"


def status_topic(ticker: str) -> str:
    """Where the relay publishes a ticker's FeedStatus (live feed started, lost, failed...)."""
    return f"{ticker}|{STATUS}"


def ingestors_status_topic(exchange: str) -> str:
    """Where relays publish whether a live ingestor serves `exchange` (ExchangeServing);
    the `|` ends the name, so `BINANCE` never matches `BINANCEUS`."""
    return f"{INGESTORS_PREFIX}{exchange}|{STATUS}"


def response_topic(client_id: str) -> str:
    return f"{RESPONSE_PREFIX}{client_id}"


def history_ready_topic(request_id: str) -> str:
    return f"{HISTORY_READY_PREFIX}{request_id}"


def cep_topic(trigger_id: str) -> str:
    return f"{CEP_PREFIX}{trigger_id}"


def notification_topic(pattern: int, request_id: str, client_id: str) -> str:
    """The deterministic topic a client subscribes to before it submits a history request.

    NOTIFY_AUTO picks the per-client topic `RESPONSE:{client_id}` when there is a
    client_id, else the per-request topic `HISTORY_READY:{request_id}`.
    """
    return _route(pattern, client_id, request_id, history_ready_topic, "request_id")


def cep_event_topic(pattern: int, trigger_id: str, client_id: str) -> str:
    """Where a trigger's CEPTriggerEvents are published (the relay's ack says the same).

    Same rule as `notification_topic`, with `CEP:{trigger_id}` as the per-trigger topic.
    """
    return _route(pattern, client_id, trigger_id, cep_topic, "trigger_id")


def _route(
    pattern: int, client_id: str, own_id: str, own_topic: Callable[[str], str], own_name: str
) -> str:
    per_client = pattern == _PER_CLIENT or (pattern == _AUTO and bool(client_id))
    if per_client:
        if not client_id:
            raise ProtocolError(BAD_TOPIC, "per-client topics need a client_id")
        return response_topic(client_id)
    if not own_id:
        raise ProtocolError(
            BAD_TOPIC, f"per-{own_name.removesuffix('_id')} topics need a {own_name}"
        )
    return own_topic(own_id)


@dataclass(frozen=True, slots=True)
class MarketTopic:
    """A parsed market-data topic: `{ticker}|tick`, `{ticker}|ohlc:{period}` or `{ticker}|book`."""

    ticker: str
    kind: Literal["tick", "ohlc", "book"]
    period_seconds: int | None = None


def parse_market_topic(topic: str) -> MarketTopic | None:
    """The market-data topic in `topic`, or None for notifications and junk.

    Also accepts subscription prefixes such as `BINANCE:BTC/USDT|ohlc:` (all
    periods), reported with period_seconds None.
    """
    ticker, sep, data_type = topic.partition("|")
    if not sep or _TICKER.match(ticker) is None:
        return None
    if data_type == TICK:
        return MarketTopic(ticker, "tick")
    if data_type == BOOK:
        return MarketTopic(ticker, "book")
    kind, colon, period = data_type.partition(":")
    if kind != OHLC or not colon:
        return None
    if period == "":
        return MarketTopic(ticker, "ohlc", None)
    if not period.isdigit() or int(period) <= 0:
        return None
    return MarketTopic(ticker, "ohlc", int(period))
