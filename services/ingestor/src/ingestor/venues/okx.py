"""OKX spot: GET /api/v5/market/candles and /history-candles.

ccxt sends `before = since - 1` and `after = until` (both exclusive) and OKX
returns the newest `limit` (max 300) candles between them, newest first. A
window wider than the page therefore loses its oldest candles: bounded windows.
`after` excludes its own instant, so the inclusive end goes out one ms later.
"""

from ingestor.venues.base import Paging, Venue

VENUE = Venue(exchange_id="okx", paging=Paging.NEWEST_IN_WINDOW, page_cap=300, until_exclusive=True)
