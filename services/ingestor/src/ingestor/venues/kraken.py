"""Kraken spot: GET /0/public/OHLC.

Kraken takes only `since` (since - one period goes out, in seconds) and
returns every entry after it among its latest 720, oldest first, the last one
still open; `limit` is applied on our side. Anything older than the latest 720
entries is not served at all, so such requests are refused with the earliest
time Kraken can serve. Kraken has no end parameter, so none is sent.
A row is [time s, open, high, low, close, vwap, volume, count]; `last` is the
time of the last committed (final) entry.

Order books (websocket v2 `/v2`, channel `book`, depths 10, 25, 100, 500, 1000; the
pair by its unified name): a snapshot, then updates, each with `checksum`, CRC32 of the
best 10 asks then the best 10 bids, each price and qty in the pair's full precision
without "." and leading zeros. No sequence. Levels pushed out of the depth are not
removed on the wire (the client truncates). `KrakenBookGuard` checks.

    {"channel": "book", "type": "update", "data": [{"symbol": "MATIC/USD",
     "bids": [{"price": 0.5657, "qty": 1098.3947558}], "asks": [],
     "checksum": 2114181697, "timestamp": "2023-10-06T17:35:55.440295Z"}]}
"""

import zlib
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from ingestor.model import BookIntegrity, Candle, RawFields, Trade
from ingestor.venues import base
from ingestor.venues.base import BookContext, BookVerdict, Paging, Venue


def candle_request(q: base.CandleQuery) -> base.RestRequest:
    """`since` one period before the page's start, in seconds: Kraken returns the
    entries after it. No end, no limit (the adapter keeps the first `limit`)."""
    since = q.since_ms // 1000 - q.period_ms // 1000
    return base.RestRequest(
        "public", "OHLC", {"pair": q.market_id, "interval": q.interval, "since": since}
    )


def _ohlcv(r: Sequence[Any]) -> base.Ohlcv:
    # [time s, open, high, low, close, vwap, volume, count]
    return base.ohlcv(r, (1, 2, 3, 4, 6), unit_ms=1000)


def parse_candles(body: Any, market_id: str) -> list[Candle]:
    """GET /0/public/OHLC, oldest first; `last`: the last committed (final) entry's time:

    {"error": [], "result": {"XBTUSDT": [[1706626800, "43437.5", "43593.7", "43355.5",
     "43361.1", "43511.3", "18.75430110", 162], ...], "last": 1706641200}}
    """
    result = body["result"]
    last = result.get("last")
    committed = int(last) if last is not None else None

    def extras(r: Sequence[Any]) -> RawFields:
        if len(r) <= 7:
            return RawFields()
        final = None if committed is None else int(r[0]) <= committed
        return RawFields(trade_count=int(r[7]), final=final)

    return base.read_candles("kraken", list(result.get(market_id) or []), extras, _ohlcv)


def trade_request(q: base.TradeQuery) -> base.RestRequest:
    """The trades from `since` (whole seconds) on, else the latest; `count` of them."""
    params: dict[str, str | int] = {"pair": q.market_id}
    if q.since_ms is not None:
        params["since"] = q.since_ms // 1000
    return base.RestRequest("public", "Trades", {**params, "count": q.limit})


_SIDES = {"b": "buy", "s": "sell"}


def _trade(row: Sequence[Any]) -> Trade:
    # [price, volume, time (s, fractional), b/s (taker), m/l, misc, trade id]
    timestamp = int(float(row[2]) * 1000)
    return Trade(
        str(row[6]), base.number(row[0]), base.number(row[1]), timestamp, _SIDES.get(row[3], "")
    )


def parse_trades(body: Any, market_id: str) -> list[Trade]:
    """GET /0/public/Trades, oldest first:

    {"error": [], "result": {"XBTUSDT": [["73324.40000", "0.01030900", 1710327959.1733468,
     "b", "m", "", 6324366]], "last": "1710327959173746878"}}
    """
    return [_trade(row) for row in body["result"].get(market_id) or []]


CHECKSUM_DEPTH = 10


def _digits(value: str) -> str:
    return value.replace(".", "").lstrip("0")


def book_checksum(asks: Sequence[Sequence[str]], bids: Sequence[Sequence[str]]) -> int:
    """Kraken's checksum of a book given best first as (price, qty) strings written with
    the pair's precision: asks first, then bids, unsigned."""
    text = "".join(
        _digits(price) + _digits(qty)
        for side in (asks, bids)
        for price, qty in side[:CHECKSUM_DEPTH]
    )
    return zlib.crc32(text.encode())


def _text(value: Any, places: int | None) -> str:
    """A price or qty as Kraken writes it: every digit of the pair's precision."""
    number = Decimal(str(value))
    return f"{number:.{places}f}" if places is not None else f"{number:f}"


def _places(market: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """The pair's price and qty decimals (AssetPairs `pair_decimals`, `lot_decimals`)."""
    info = market.get("info") or {}
    price, qty = info.get("pair_decimals"), info.get("lot_decimals")
    return (None if price is None else int(price), None if qty is None else int(qty))


class KrakenBookGuard:
    """Each market's book as Kraken's strings, to recompute each message's checksum."""

    def __init__(self, context: BookContext) -> None:
        self._context = context
        self._books: dict[str, tuple[dict[Decimal, list[str]], dict[Decimal, list[str]]]] = {}

    def check(self, message: Mapping[str, Any]) -> BookVerdict | None:
        if message.get("channel") != "book":
            return None
        data = (message.get("data") or [{}])[0]
        symbol = str(data.get("symbol"))
        book = self._books.get(symbol)
        if message.get("type") == "snapshot":
            book = self._books[symbol] = ({}, {})
        elif book is None:
            return BookVerdict(symbol, stale=True)
        places = _places(self._context.market(symbol))
        depth = self._context.depth(symbol)
        bids, asks = book
        for side, key in ((bids, "bids"), (asks, "asks")):
            _apply(side, data.get(key) or (), places)
            _truncate(side, depth, descending=side is bids)
        expected = data.get("checksum")
        if expected is None:
            return BookVerdict(symbol)
        best_asks = [asks[p] for p in sorted(asks)[:CHECKSUM_DEPTH]]
        best_bids = [bids[p] for p in sorted(bids, reverse=True)[:CHECKSUM_DEPTH]]
        actual = book_checksum(best_asks, best_bids)
        if actual == int(expected):
            return BookVerdict(symbol)
        del self._books[symbol]
        return BookVerdict(
            symbol, BookIntegrity.CHECKSUM, f"checksum {expected}, the book's is {actual}"
        )


def _apply(
    side: dict[Decimal, list[str]],
    levels: Iterable[Mapping[str, Any]],
    places: tuple[int | None, int | None],
) -> None:
    for level in levels:
        price, qty = Decimal(str(level["price"])), Decimal(str(level["qty"]))
        if qty == 0:
            side.pop(price, None)
        else:
            side[price] = [_text(level["price"], places[0]), _text(level["qty"], places[1])]


def _truncate(side: dict[Decimal, list[str]], depth: int | None, *, descending: bool) -> None:
    """Kraken sends no removal for a level pushed out of the subscribed depth."""
    if depth is None or len(side) <= depth:
        return
    for price in sorted(side, reverse=descending)[depth:]:
        del side[price]


def book_url(api: Mapping[str, Any]) -> str:
    return str(api["ws"]["publicV2"])


def book_request(op: str, topic: base.BookTopic) -> dict[str, Any]:
    """`op`: subscribe, unsubscribe; the pair by its unified name."""
    return {
        "method": op,
        "params": {"channel": "book", "symbol": [topic.symbol], "depth": topic.depth},
    }


def _side(levels: Iterable[Mapping[str, Any]]) -> tuple[tuple[float, float], ...]:
    return tuple((base.number(level["price"]), base.number(level["qty"])) for level in levels)


def _time_ms(stamp: Any) -> int:
    """RFC 3339 with microseconds (`2023-10-06T17:35:55.440295Z`) in ms; 0 without one."""
    return base.iso_ms(str(stamp)) if stamp else 0


def parse_book(message: Mapping[str, Any]) -> base.BookMessage | None:
    """A `book` push (qty 0 removes a level; a snapshot has no `timestamp`):

    {"channel": "book", "type": "update", "data": [{"symbol": "MATIC/USD",
     "bids": [{"price": 0.5657, "qty": 1098.3947558}], "asks": [],
     "checksum": 2114181697, "timestamp": "2023-10-06T17:35:55.440295Z"}]}
    """
    if message.get("channel") != "book" or message.get("type") not in ("snapshot", "update"):
        return None
    data = message["data"][0]
    bids, asks = _side(data.get("bids") or ()), _side(data.get("asks") or ())
    snapshot, ts = message["type"] == "snapshot", _time_ms(data.get("timestamp"))
    return base.BookMessage(str(data["symbol"]), snapshot, bids, asks, ts)


def book_refusal(message: Mapping[str, Any]) -> str | None:
    """`{"method": "subscribe", "success": false, "error": "Currency pair not supported"}`."""
    if message.get("success") is not False:
        return None
    return f"{message.get('error')} {message.get('symbol') or ''}".strip()


#: Levels pushed out of the depth are not removed on the wire: the book cuts them.
BOOKS = base.BookWire(
    book_url,
    book_request,
    parse_book,
    book_refusal,
    KrakenBookGuard,
    '{"method": "ping"}',
    6.0,
    True,
)


VENUE = Venue(
    exchange_id="kraken",
    paging=Paging.OLDEST_FROM_SINCE,
    page_cap=720,
    history_entries=720,
    candle_request=candle_request,
    parse_candles=parse_candles,
    trade_request=trade_request,
    parse_trades=parse_trades,
    books=BOOKS,
    book_depths=(10, 25, 100, 500, 1000),
    prefix="KRAKEN",
    status_url="https://api.kraken.com/0/public/Time",
)
