"""Binance spot: GET /api/v3/klines; trades GET /api/v3/historicalTrades.

`startTime`/`endTime` are inclusive and the first `limit` (max 1000) klines
opening at or after `startTime` come back, oldest first, so one call skips any
empty stretch. The whole history is served. A row is [open time, open, high,
low, close, volume, close time, quote volume, trades, taker buy base volume,
taker buy quote volume, ignore]; ccxt keeps the first six.
"""

from typing import Any

from ingestor.model import RawFields
from ingestor.venues.base import Paging, TradePaging, Venue


def raw_fields(body: Any, market_id: str) -> dict[int, RawFields]:
    # Positional (trade count, quote volume, taker buy base, taker buy quote):
    # this runs for every candle of a 1000-candle page.
    return {
        int(r[0]): RawFields(int(r[8]), float(r[7]), float(r[9]), float(r[10]))
        for r in body
        if len(r) > 10
    }


VENUE = Venue(
    exchange_id="binance",
    paging=Paging.OLDEST_FROM_SINCE,
    page_cap=1000,
    raw_fields=raw_fields,
    prefix="BINANCE",
    status_url="https://api.binance.com/api/v3/ping",
    # The trade stream's ids are trade ids (aggTrades has its own): historicalTrades
    # pages them by `fromId`, inclusive, 1000 a call.
    trade_paging=TradePaging.BY_ID,
    trade_params={"fetchTradesMethod": "publicGetHistoricalTrades"},
    trade_id_param="fromId",
    trade_history_key=True,
)
