"""Bybit spot: GET /v5/market/kline?category=spot.

`start`/`end` are inclusive and Bybit returns the newest `limit` (max 1000)
klines between them, newest first: bounded windows. A row is [start, open,
high, low, close, volume (base), turnover (quote)]; no trade count.

Order books (public spot websocket `/v5/public/spot`, topic `orderbook.{depth}.{symbol}`,
spot depths 1, 50, 200, 1000): a snapshot, then deltas; each carries `u`, the topic's
update id (+1 a message; a snapshot with `u` 1 after Bybit restarts its service) and
`seq`, the cross sequence (the book's version, comparable across depths).
`BybitBookGuard` checks `u` and reports `seq` as the book's exchange sequence. No
checksum. Bybit expects `{"op": "ping"}` every 20 s.

    {"topic": "orderbook.50.BTCUSDT", "type": "delta", "ts": 1671179923046,
     "data": {"s": "BTCUSDT", "b": [], "a": [["17440.50", "78.857"]],
              "u": 13079593, "seq": 22520573378}, "cts": 1671179923037}
"""

from collections.abc import Mapping, Sequence
from typing import Any

from ingestor.model import BookIntegrity, Candle, RawFields, Trade
from ingestor.venues import base
from ingestor.venues.base import BookContext, BookVerdict, Paging, TradePaging, Venue


def candle_request(q: base.CandleQuery) -> base.RestRequest:
    """`start` goes out on a period boundary (the first at or after `since`)."""
    start = -(-q.since_ms // q.period_ms) * q.period_ms
    params: dict[str, str | int] = {
        "symbol": q.market_id,
        "start": start,
        "limit": q.limit,
        "end": q.until_ms,
        "interval": q.interval,
        "category": "spot",
    }
    return base.RestRequest("public", "v5/market/kline", params)


def _extras(r: Sequence[Any]) -> RawFields:
    return RawFields(quote_volume=float(r[6])) if len(r) > 6 else RawFields()


def parse_candles(body: Any, market_id: str) -> list[Candle]:
    """GET /v5/market/kline, newest first:

    {"retCode": "0", "retMsg": "OK", "result": {"symbol": "BTCUSDT", "category": "linear",
     "list": [["1706637600000", "43376.1", "43474.1", "43264.8", "43352.8", "1575.305",
     "68345898.1407"], ...]}, "retExtInfo": {}, "time": "1706803708087"}
    """
    return base.read_candles("bybit", list(body["result"]["list"]), _extras)


def trade_request(q: base.TradeQuery) -> base.RestRequest:
    """The latest trades only: spot has no cursor and no time parameter."""
    params: dict[str, str | int] = {"symbol": q.market_id, "limit": q.limit, "category": "spot"}
    return base.RestRequest("public", "v5/market/recent-trade", params)


def _trade(row: Mapping[str, Any]) -> Trade:
    price, size = base.number(row["price"]), base.number(row["size"])
    return Trade(str(row["execId"]), price, size, int(row["time"]), str(row["side"]).lower())


def parse_trades(body: Any, market_id: str) -> list[Trade]:
    """GET /v5/market/recent-trade, newest first; `side` (Buy/Sell) is the taker's:

    {"retCode": "0", "retMsg": "OK", "result": {"category": "linear", "list": [
     {"execId": "9afd1288-b444-53f8-8e40-c2f99368ad22", "symbol": "BTCUSDT",
      "price": "51444.40", "size": "0.972", "side": "Buy", "time": "1707905515968",
      "isBlockTrade": false}]}, "retExtInfo": {}, "time": "1707905516443"}
    """
    return [_trade(row) for row in body["result"]["list"]]


BOOK_TOPIC = "orderbook."


class BybitBookGuard:
    """Each market's last `u`: an update must carry the next one."""

    def __init__(self, context: BookContext) -> None:
        self._context = context
        self._last: dict[str, int] = {}  # unified symbol -> `u` of the book's last message

    def check(self, message: Mapping[str, Any]) -> BookVerdict | None:
        if not str(message.get("topic", "")).startswith(BOOK_TOPIC):
            return None
        data = message.get("data") or {}
        symbol = str(self._context.market(str(data.get("s")))["symbol"])
        update_id, seq = int(data["u"]), int(data["seq"])
        if message.get("type") == "snapshot":
            self._last[symbol] = update_id
            return BookVerdict(symbol, sequence=seq)
        last = self._last.get(symbol)
        if last is None:
            return BookVerdict(symbol, stale=True)
        if update_id != last + 1:
            del self._last[symbol]
            return BookVerdict(
                symbol,
                BookIntegrity.SEQUENCE_GAP,
                f"update id {update_id} after {last} ({update_id - last - 1} skipped)",
            )
        self._last[symbol] = update_id
        return BookVerdict(symbol, sequence=seq)


def book_url(api: Mapping[str, Any]) -> str:
    return str(api["ws"]["public"]["spot"])


def book_request(op: str, topic: base.BookTopic) -> dict[str, Any]:
    """`op`: subscribe, unsubscribe."""
    return {"op": op, "args": [f"{BOOK_TOPIC}{topic.depth}.{topic.market_id}"]}


def parse_book(message: Mapping[str, Any]) -> base.BookMessage | None:
    """An `orderbook` push (size "0" removes a level):

    {"topic": "orderbook.50.BTCUSDT", "type": "delta", "ts": 1672304484998,
     "data": {"s": "BTCUSDT", "b": [["16493.50", "0"]],
              "a": [["16611.00", "0.040"], ["16611.50", "1.510"]],
              "u": 18521289, "seq": 7961638748}, "cts": 1672304484994}
    """
    if not str(message.get("topic", "")).startswith(BOOK_TOPIC):
        return None
    data = message["data"]
    bids, asks = base.book_levels(data.get("b") or ()), base.book_levels(data.get("a") or ())
    snapshot, ts = message.get("type") == "snapshot", int(message.get("ts") or 0)
    return base.BookMessage(str(data["s"]), snapshot, bids, asks, ts)


def book_refusal(message: Mapping[str, Any]) -> str | None:
    """`{"success": false, "ret_msg": "handler not found:...", "op": "subscribe"}`."""
    if message.get("success") is not False:
        return None
    return str(message.get("ret_msg") or "refused")


BOOKS = base.BookWire(
    book_url, book_request, parse_book, book_refusal, BybitBookGuard, '{"op": "ping"}', 18.0
)


VENUE = Venue(
    exchange_id="bybit",
    paging=Paging.NEWEST_IN_WINDOW,
    page_cap=1000,
    candle_request=candle_request,
    parse_candles=parse_candles,
    trade_request=trade_request,
    parse_trades=parse_trades,
    books=BOOKS,
    book_depths=(1, 50, 200, 1000),
    prefix="BYBIT",
    status_url="https://api.bybit.com/v5/market/time",
    # GET /v5/market/recent-trade: spot serves its latest 60 trades, no cursor.
    trade_paging=TradePaging.LATEST_ONLY,
    trade_page_cap=60,
    # GET /v5/market/tickers (ccxt's unified fetch_tickers): ccxt asks for
    # category=linear unless told spot.
    ticker_params={"type": "spot"},
)
