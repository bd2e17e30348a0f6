"""Binance spot: GET /api/v3/klines.

`startTime`/`endTime` are inclusive and the first `limit` (max 1000) klines
opening at or after `startTime` come back, oldest first, so one call skips any
empty stretch. The whole history is served.
"""

from ingestor.venues.base import Paging, Venue

VENUE = Venue(exchange_id="binance", paging=Paging.OLDEST_FROM_SINCE, page_cap=1000)
