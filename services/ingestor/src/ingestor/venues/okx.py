"""OKX spot: GET /api/v5/market/candles and /history-candles.

`before = since - 1` and `after = until + 1` go out (both exclusive) and OKX
returns the newest `limit` (max 300) candles between them, newest first. A
window wider than the page therefore loses its oldest candles: bounded windows.
Candles older than the latest 1,440 of a period come from /history-candles.
A row is [ts, o, h, l, c, vol (base), volCcy, volCcyQuote (quote), confirm];
confirm "0" marks the candle still forming.

Order books (public websocket `/ws/v5/public`, channel `books`, 400 levels): a
snapshot, then updates; each carries `seqId` and `prevSeqId` (the `seqId` of the
message before it: -1 on a snapshot) and `checksum`, OKX's CRC32 (signed 32-bit) of
the best 25 levels interleaved `bid px:bid sz:ask px:ask sz:...` in the exchange's own
strings. `OkxBookGuard` checks both; OKX expects the text `ping` at least every 30 s.
"""

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from ingestor.model import BookIntegrity, Candle, RawFields, Trade
from ingestor.venues import base
from ingestor.venues.base import BookContext, BookVerdict, Paging, TradePaging, Venue

#: /market/candles serves the latest 1,440 candles of a period; older ones come from
#: /market/history-candles.
RECENT_CANDLES = 1439
UTC_BARS_MS = 21_600_000  # from 6 h on, `bar` names the UTC-aligned candles (`6Hutc`, `1Dutc`)
TRADE_ID_PARAM = "after"  # history-trades: the trades older than this tradeId
TRADE_PARAMS = {"type": "1"}  # history-trades paged by trade id (2: by time)


def candle_request(q: base.CandleQuery) -> base.RestRequest:
    """`before`/`after` exclusive: `after` is the inclusive end one ms later."""
    history = q.since_ms < q.now_ms - RECENT_CANDLES * q.period_ms
    bar = q.interval + ("utc" if q.period_ms >= UTC_BARS_MS else "")
    params: dict[str, str | int] = {
        "instId": q.market_id,
        "bar": bar,
        "limit": min(q.limit, 300),
        "before": q.since_ms - 1 if q.since_ms > 1 else 0,
        "after": q.until_ms + 1,
    }
    return base.RestRequest(
        "public", "market/history-candles" if history else "market/candles", params
    )


def _extras(r: Sequence[Any]) -> RawFields:
    if len(r) <= 8:
        return RawFields()
    return RawFields(quote_volume=float(r[7]), final=str(r[8]) == "1")


def parse_candles(body: Any, market_id: str) -> list[Candle]:
    """GET /api/v5/market/(history-)candles, newest first (`confirm` "0": still forming):

    {"code": "0", "msg": "", "data": [["1706637600000", "43398.6", "43493.9", "43279.9",
     "43373.9", "5070.79611732", "220057933.233687634", "220057933.233687634", "1"], ...]}
    """
    return base.read_candles("okx", list(body["data"]), _extras)


def trade_request(q: base.TradeQuery) -> base.RestRequest:
    """history-trades older than the cursor; else the latest trades (`since` is not
    an OKX parameter: the trades before it are dropped once read)."""
    params: dict[str, str | int] = {"instId": q.market_id, "limit": q.limit}
    if q.cursor is None:
        return base.RestRequest("public", "market/trades", params)
    params |= {**TRADE_PARAMS, TRADE_ID_PARAM: q.cursor}
    return base.RestRequest("public", "market/history-trades", params)


def _trade(row: Mapping[str, Any]) -> Trade:
    price, size = base.number(row["px"]), base.number(row["sz"])
    return Trade(str(row["tradeId"]), price, size, int(row["ts"]), str(row["side"]))


def parse_trades(body: Any, market_id: str) -> list[Trade]:
    """GET /api/v5/market/trades and /history-trades, newest first; `side` is the taker's:

    {"code": "0", "msg": "", "data": [{"instId": "ETH-BTC", "side": "sell",
     "sz": "0.119501", "px": "0.07065", "tradeId": "15826757", "ts": "1621446178316"}]}
    """
    return [_trade(row) for row in body["data"]]


CHECKSUM_DEPTH = 25


def book_checksum(bids: Sequence[Sequence[str]], asks: Sequence[Sequence[str]]) -> int:
    """OKX's checksum of a book given best first as (price, size) strings."""
    fields: list[str] = []
    for level in range(CHECKSUM_DEPTH):
        for side in (bids, asks):  # a side that ran out is skipped
            if level < len(side):
                fields += side[level][:2]
    value = zlib.crc32(":".join(fields).encode())
    return value if value < 0x80000000 else value - 0x100000000


class OkxBookChecksum:
    """One market's book as OKX's strings, to recompute each message's checksum."""

    def __init__(self) -> None:
        self._sides: tuple[dict[float, list[str]], dict[float, list[str]]] = ({}, {})

    def apply(self, message: Mapping[str, Any], snapshot: bool) -> bool:
        bids, asks = self._sides
        if snapshot:
            bids.clear()
            asks.clear()
        for side, key in ((bids, "bids"), (asks, "asks")):
            for level in message.get(key) or ():
                price, size = str(level[0]), str(level[1])
                if float(size) == 0:
                    side.pop(float(price), None)
                else:
                    side[float(price)] = [price, size]
        expected = message.get("checksum")
        if expected is None:
            return True
        best_bids = [bids[p] for p in sorted(bids, reverse=True)[:CHECKSUM_DEPTH]]
        best_asks = [asks[p] for p in sorted(asks)[:CHECKSUM_DEPTH]]
        return book_checksum(best_bids, best_asks) == int(expected)


class OkxBookGuard:
    """Each market's `seqId` chain (an update's `prevSeqId` must be the book's `seqId`)
    and its checksum (`OkxBookChecksum`)."""

    def __init__(self, context: BookContext) -> None:
        self._context = context
        self._books: dict[str, tuple[int, OkxBookChecksum]] = {}  # symbol -> (seqId, book)

    def check(self, message: Mapping[str, Any]) -> BookVerdict | None:
        arg = message.get("arg") or {}
        if arg.get("channel") != BOOK_CHANNEL or "action" not in message:
            return None
        data = message["data"][0]
        symbol = str(self._context.market(str(arg.get("instId")))["symbol"])
        seq, previous = int(data["seqId"]), int(data.get("prevSeqId", -1))
        snapshot = message["action"] == "snapshot"
        known = self._books.pop(symbol, None)
        if snapshot:
            checker = OkxBookChecksum()
        elif known is None:
            return BookVerdict(symbol, stale=True)
        elif previous != known[0]:
            reason = f"prevSeqId {previous}, the book is at seqId {known[0]}"
            return BookVerdict(symbol, BookIntegrity.SEQUENCE_GAP, reason)
        else:
            checker = known[1]
        if not checker.apply(data, snapshot):
            reason = f"checksum {data.get('checksum')} disagrees with the book at seqId {seq}"
            return BookVerdict(symbol, BookIntegrity.CHECKSUM, reason)
        self._books[symbol] = (seq, checker)
        return BookVerdict(symbol, sequence=seq)


BOOK_CHANNEL = "books"


def book_url(api: Mapping[str, Any]) -> str:
    return f"{api['ws']}/public"


def book_request(op: str, topic: base.BookTopic) -> dict[str, Any]:
    """`op`: subscribe, unsubscribe."""
    return {"op": op, "args": [{"channel": BOOK_CHANNEL, "instId": topic.market_id}]}


def parse_book(message: Mapping[str, Any]) -> base.BookMessage | None:
    """A `books` push (levels `[px, sz, "0", orders]`; size "0" removes):

    {"arg": {"channel": "books", "instId": "BTC-USDT"}, "action": "update", "data": [
     {"asks": [["31657.7", "0", "0", "0"], ["31659.7", "0.01", "0", "1"]],
      "bids": [["31642.9", "0.50296385", "0", "4"]], "ts": "1626535709008",
      "checksum": 830931827, "prevSeqId": 123456, "seqId": 123457}]}
    """
    arg = message.get("arg") or {}
    if arg.get("channel") != BOOK_CHANNEL or "action" not in message:
        return None
    data = message["data"][0]
    bids, asks = base.book_levels(data.get("bids") or ()), base.book_levels(data.get("asks") or ())
    snapshot = message["action"] == "snapshot"
    return base.BookMessage(str(arg["instId"]), snapshot, bids, asks, int(data.get("ts") or 0))


def book_refusal(message: Mapping[str, Any]) -> str | None:
    """`{"event": "error", "code": "60018", "msg": "Wrong URL or channel..."}`."""
    if message.get("event") != "error":
        return None
    return f"{message.get('code')} {message.get('msg')}"


#: OKX answers the text `ping` with `pong`.
BOOKS = base.BookWire(book_url, book_request, parse_book, book_refusal, OkxBookGuard, "ping", 18.0)


VENUE = Venue(
    exchange_id="okx",
    paging=Paging.NEWEST_IN_WINDOW,
    page_cap=300,
    candle_request=candle_request,
    parse_candles=parse_candles,
    trade_request=trade_request,
    parse_trades=parse_trades,
    books=BOOKS,
    prefix="OKX",
    status_url="https://www.okx.com/api/v5/public/time",
    # GET /api/v5/market/history-trades, type=1: `after` = the trades older than that
    # tradeId, the newest 100 of them.
    trade_paging=TradePaging.BY_ID_BACKWARD,
    trade_page_cap=100,
)
