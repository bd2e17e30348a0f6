"""Bybit spot: GET /v5/market/kline?category=spot.

`start`/`end` are inclusive and Bybit returns the newest `limit` (max 1000)
klines between them, newest first: bounded windows.
"""

from ingestor.venues.base import Paging, Venue

VENUE = Venue(exchange_id="bybit", paging=Paging.NEWEST_IN_WINDOW, page_cap=1000)
