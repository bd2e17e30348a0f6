"""Kraken spot: GET /0/public/OHLC.

Kraken takes only `since` (ccxt sends since - one period, in seconds) and
returns every entry after it among its latest 720, oldest first, the last one
still open; `limit` is applied by ccxt. Anything older than the latest 720
entries is not served at all, so such requests are refused with the earliest
time Kraken can serve. ccxt has no end parameter for Kraken (it would send
`until` on as an unknown query parameter), so none is sent.
A row is [time s, open, high, low, close, vwap, volume, count]; `last` is the
time of the last committed (final) entry.
"""

from typing import Any

from ingestor.model import RawFields
from ingestor.venues.base import Paging, Venue


def raw_fields(body: Any, market_id: str) -> dict[int, RawFields]:
    result = (body.get("result") or {}) if isinstance(body, dict) else {}
    rows = result.get(market_id) or []
    last = result.get("last")
    committed = int(last) if last is not None else None
    return {
        int(r[0]) * 1000: RawFields(
            trade_count=int(r[7]),
            final=None if committed is None else int(r[0]) <= committed,
        )
        for r in rows
        if len(r) > 7
    }


VENUE = Venue(
    exchange_id="kraken",
    paging=Paging.OLDEST_FROM_SINCE,
    page_cap=720,
    history_entries=720,
    sends_until=False,
    raw_fields=raw_fields,
    prefix="KRAKEN",
    status_url="https://api.kraken.com/0/public/Time",
)
