"""Binance spot: GET /api/v3/klines; trades GET /api/v3/historicalTrades.

`startTime`/`endTime` are inclusive and the first `limit` (max 1000) klines
opening at or after `startTime` come back, oldest first, so one call skips any
empty stretch. The whole history is served. A row is [open time, open, high,
low, close, volume, close time, quote volume, trades, taker buy base volume,
taker buy quote volume, ignore]: every field but the last is kept.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from ingestor.model import Candle, RawFields, Trade
from ingestor.venues import base
from ingestor.venues.base import Paging, TradePaging, Venue

HOUR_MS = 3_600_000
TRADE_ID_PARAM = "fromId"  # historicalTrades: the trades from this id on, inclusive


def candle_request(q: base.CandleQuery) -> base.RestRequest:
    params: dict[str, str | int] = {
        "interval": q.interval,
        "limit": min(q.limit, 1000),
        "symbol": q.market_id,
        "startTime": q.since_ms,
        "endTime": q.until_ms,
    }
    return base.RestRequest("public", "klines", params)


def _extras(r: Sequence[Any]) -> RawFields:
    # Positional (trade count, quote volume, taker buy base, taker buy quote):
    # this runs for every candle of a 1000-candle page.
    if len(r) <= 10:
        return RawFields()
    return RawFields(int(r[8]), float(r[7]), float(r[9]), float(r[10]))


def parse_candles(body: Any, market_id: str) -> list[Candle]:
    """GET /api/v3/klines, oldest first:

    [[1706630400000, "43519.34000000", "43936.00000000", "43171.00000000",
      "43488.71000000", "20.55495000", 1706633999999, "891428.42858070", 3743,
      "10.91428000", "473782.95739920", "0"], ...]
    """
    return base.read_candles("binance", list(body), _extras)


def trade_request(q: base.TradeQuery) -> base.RestRequest:
    """historicalTrades from the id `fromId` on (MARKET_DATA: ccxt's `sign` adds the API
    key header); else aggTrades, from `since` for an hour, or the latest."""
    if q.cursor is not None:
        params: dict[str, str | int] = {
            "symbol": q.market_id,
            "limit": q.limit,
            TRADE_ID_PARAM: q.cursor,
        }
        return base.RestRequest("public", "historicalTrades", params)
    params = {"symbol": q.market_id}
    if q.since_ms is not None:
        params |= {"startTime": q.since_ms, "endTime": q.since_ms + HOUR_MS}
    return base.RestRequest("public", "aggTrades", {**params, "limit": q.limit})


def _trade(row: Mapping[str, Any]) -> Trade:
    # `isBuyerMaker` / `m` true: the buyer was the maker, the taker sold.
    if "a" in row:
        side = "sell" if row["m"] else "buy"
        return Trade(
            str(row["a"]), base.number(row["p"]), base.number(row["q"]), int(row["T"]), side
        )
    side = "sell" if row["isBuyerMaker"] else "buy"
    return Trade(
        str(row["id"]), base.number(row["price"]), base.number(row["qty"]), int(row["time"]), side
    )


def parse_trades(body: Any, market_id: str) -> list[Trade]:
    """GET /api/v3/historicalTrades:

    [{"id": 28457, "price": "4.00000100", "qty": "12.00000000", "quoteQty": "48.000012",
      "time": 1499865549590, "isBuyerMaker": true, "isBestMatch": true}]

    GET /api/v3/aggTrades (the aggregate id `a`):

    [{"a": "2913537567", "p": "73238.70000000", "q": "0.00109000", "f": "3479463557",
      "l": "3479463557", "T": "1710327661939", "m": false, "M": true}]
    """
    return [_trade(row) for row in body]


VENUE = Venue(
    exchange_id="binance",
    paging=Paging.OLDEST_FROM_SINCE,
    page_cap=1000,
    candle_request=candle_request,
    parse_candles=parse_candles,
    trade_request=trade_request,
    parse_trades=parse_trades,
    prefix="BINANCE",
    status_url="https://api.binance.com/api/v3/ping",
    # The trade stream's ids are trade ids (aggTrades has its own): historicalTrades
    # pages them by `fromId`, inclusive, 1000 a call.
    trade_paging=TradePaging.BY_ID,
    trade_history_key=True,
)
