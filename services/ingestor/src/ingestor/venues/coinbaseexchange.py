"""Coinbase Exchange spot: GET /products/{id}/candles.

`start`/`end` (ISO 8601, inclusive) must both be given and span at most 300
candles, or the request is rejected; every candle of the window comes back,
newest first, as [time s, low, high, open, close, volume]: bounded windows.
"""

from ingestor.venues.base import Paging, Venue

VENUE = Venue(
    exchange_id="coinbaseexchange",
    paging=Paging.NEWEST_IN_WINDOW,
    page_cap=300,
    prefix="COINBASE",
    status_url="https://api.exchange.coinbase.com/time",
)
