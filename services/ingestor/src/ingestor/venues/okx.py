"""OKX spot: GET /api/v5/market/candles and /history-candles.

ccxt sends `before = since - 1` and `after = until` (both exclusive) and OKX
returns the newest `limit` (max 300) candles between them, newest first. A
window wider than the page therefore loses its oldest candles: bounded windows.
`after` excludes its own instant, so the inclusive end goes out one ms later.
A row is [ts, o, h, l, c, vol (base), volCcy, volCcyQuote (quote), confirm];
confirm "0" marks the candle still forming.
"""

from typing import Any

from ingestor.model import RawFields
from ingestor.venues.base import Paging, Venue


def raw_fields(body: Any, market_id: str) -> dict[int, RawFields]:
    rows = (body.get("data") or []) if isinstance(body, dict) else []
    return {
        int(r[0]): RawFields(quote_volume=float(r[7]), final=str(r[8]) == "1")
        for r in rows
        if len(r) > 8
    }


VENUE = Venue(
    exchange_id="okx",
    paging=Paging.NEWEST_IN_WINDOW,
    page_cap=300,
    until_exclusive=True,
    raw_fields=raw_fields,
    prefix="OKX",
    status_url="https://www.okx.com/api/v5/public/time",
)
