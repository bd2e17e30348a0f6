"""Kraken spot: GET /0/public/OHLC.

Kraken takes only `since` (ccxt sends since - one period, in seconds) and
returns every entry after it among its latest 720, oldest first, the last one
still open; `limit` is applied by ccxt. Anything older than the latest 720
entries is not served at all, so such requests are refused with the earliest
time Kraken can serve. ccxt has no end parameter for Kraken (it would send
`until` on as an unknown query parameter), so none is sent.
"""

from ingestor.venues.base import Paging, Venue

VENUE = Venue(
    exchange_id="kraken",
    paging=Paging.OLDEST_FROM_SINCE,
    page_cap=720,
    history_entries=720,
    sends_until=False,
)
