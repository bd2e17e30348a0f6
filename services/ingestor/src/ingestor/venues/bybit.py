"""Bybit spot: GET /v5/market/kline?category=spot.

`start`/`end` are inclusive and Bybit returns the newest `limit` (max 1000)
klines between them, newest first: bounded windows. A row is [start, open,
high, low, close, volume (base), turnover (quote)]; no trade count.
"""

from typing import Any

from ingestor.model import RawFields
from ingestor.venues.base import Paging, Venue


def raw_fields(body: Any, market_id: str) -> dict[int, RawFields]:
    result = (body.get("result") or {}) if isinstance(body, dict) else {}
    rows = result.get("list") or []
    return {int(r[0]): RawFields(quote_volume=float(r[6])) for r in rows if len(r) > 6}


VENUE = Venue(
    exchange_id="bybit",
    paging=Paging.NEWEST_IN_WINDOW,
    page_cap=1000,
    raw_fields=raw_fields,
    prefix="BYBIT",
    status_url="https://api.bybit.com/v5/market/time",
)
