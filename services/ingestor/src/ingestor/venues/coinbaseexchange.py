"""Coinbase Exchange spot: GET /products/{id}/candles.

`start`/`end` (ISO 8601, inclusive) must both be given and span at most 300
candles, or the request is rejected; every candle of the window comes back,
newest first, as [time s, low, high, open, close, volume]: bounded windows.

Order books (websocket feed): channel `level2` is served only to signed subscriptions
since 2023; `level2_batch` carries the same messages (a snapshot, then `l2update`s,
batched every 50 ms) to anyone, so it is watched, unsigned. Neither carries a
sequence or a checksum: a lost message cannot be detected, only a reconnect. The
feed keeps a connection alive with websocket protocol pings.

    {"type": "l2update", "product_id": "BTC-USD", "time": "2019-08-14T20:42:27.265Z",
     "changes": [["buy", "10101.80000000", "0.162567"]]}
"""

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from ingestor.model import Candle, RawFields, Trade
from ingestor.venues import base
from ingestor.venues.base import Paging, TradePaging, Venue

TRADE_ID_PARAM = "after"  # products/{id}/trades: the trades older than this trade_id
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _iso(ms: int) -> str:
    """ISO 8601 in UTC with milliseconds, as Coinbase reads `start`/`end`."""
    moment = _EPOCH + timedelta(milliseconds=ms)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def candle_request(q: base.CandleQuery) -> base.RestRequest:
    params = {
        "id": q.market_id,
        "granularity": q.interval,
        "start": _iso(q.since_ms),
        "end": _iso(q.until_ms),
    }
    return base.RestRequest("public", "products/{id}/candles", params)


def _ohlcv(r: Sequence[Any]) -> base.Ohlcv:
    # [time s, low, high, open, close, volume]
    return base.ohlcv(r, (3, 2, 1, 4, 5), unit_ms=1000)


def _extras(r: Sequence[Any]) -> RawFields:
    return RawFields()  # nothing beyond OHLCV


def parse_candles(body: Any, market_id: str) -> list[Candle]:
    """GET /products/{id}/candles, newest first:

    [[1710327600, 73241.5, 73402.47, 73243.33, 73370.65, 1.56794406]]
    """
    return base.read_candles("coinbaseexchange", list(body), _extras, _ohlcv)


def trade_request(q: base.TradeQuery) -> base.RestRequest:
    """The trades older than the cursor, else the latest (`since` is not a Coinbase
    parameter: the trades before it are dropped once read)."""
    params: dict[str, str | int] = {"id": q.market_id, "limit": q.limit}
    if q.cursor is not None:
        params[TRADE_ID_PARAM] = q.cursor
    return base.RestRequest("public", "products/{id}/trades", params)


_TAKER = {"buy": "sell", "sell": "buy"}


def _trade(row: Mapping[str, Any]) -> Trade:
    price, size = base.number(row["price"]), base.number(row["size"])
    side = _TAKER.get(str(row["side"]), "")
    return Trade(str(row["trade_id"]), price, size, base.iso_ms(str(row["time"])), side)


def parse_trades(body: Any, market_id: str) -> list[Trade]:
    """GET /products/{id}/trades, newest first; `side` is the MAKER's (the taker did the
    opposite):

    [{"trade_id": "18502034", "side": "sell", "size": "0.00007448",
      "price": "73271.63000000", "time": "2024-03-13T11:00:17.710679Z"}]
    """
    return [_trade(row) for row in body]


BOOK_CHANNEL = "level2_batch"


def book_url(api: Mapping[str, Any]) -> str:
    return str(api["ws"])


def book_request(op: str, topic: base.BookTopic) -> dict[str, Any]:
    """`op`: subscribe, unsubscribe (unsigned: `level2_batch` is public)."""
    return {"type": op, "product_ids": [topic.market_id], "channels": [BOOK_CHANNEL]}


def parse_book(message: Mapping[str, Any]) -> base.BookMessage | None:
    """A `snapshot` (no time), then `l2update`s (`[side, price, size]`, size "0" removes):

    {"type": "snapshot", "product_id": "BTC-USD", "bids": [["10101.10", "0.45054140"]],
     "asks": [["10102.55", "0.57753524"]]}
    {"type": "l2update", "product_id": "BTC-USD", "time": "2019-08-14T20:42:27.265Z",
     "changes": [["buy", "10101.80000000", "0.162567"]]}
    """
    kind = message.get("type")
    if kind == "snapshot":
        bids = base.book_levels(message.get("bids") or ())
        asks = base.book_levels(message.get("asks") or ())
        return base.BookMessage(str(message["product_id"]), True, bids, asks)
    if kind != "l2update":
        return None
    changes = message.get("changes") or ()
    bids = base.book_levels(c[1:] for c in changes if c[0] == "buy")
    asks = base.book_levels(c[1:] for c in changes if c[0] == "sell")
    ts = base.iso_ms(str(message["time"]))
    return base.BookMessage(str(message["product_id"]), False, bids, asks, ts)


def book_refusal(message: Mapping[str, Any]) -> str | None:
    """`{"type": "error", "message": "Failed to subscribe", "reason": "..."}`."""
    if message.get("type") != "error":
        return None
    return f"{message.get('message')}: {message.get('reason')}"


#: No guard (neither ids nor checksums); websocket protocol pings keep it alive.
BOOKS = base.BookWire(book_url, book_request, parse_book, book_refusal, None, None, 30.0)


VENUE = Venue(
    exchange_id="coinbaseexchange",
    paging=Paging.NEWEST_IN_WINDOW,
    page_cap=300,
    candle_request=candle_request,
    parse_candles=parse_candles,
    trade_request=trade_request,
    parse_trades=parse_trades,
    books=BOOKS,
    prefix="COINBASE",
    status_url="https://api.exchange.coinbase.com/time",
    # GET /products/{id}/trades: `after` = the trades older than that trade_id.
    trade_paging=TradePaging.BY_ID_BACKWARD,
    # ccxt 4.5.90 `fetch_tickers` reads GET /products/spark-lines: OHLC, no volume.
    tickers_unsupported="ccxt's fetchTickers reads /products/spark-lines, which has no volume",
)
