"""OKX spot: GET /api/v5/market/candles and /history-candles.

ccxt sends `before = since - 1` and `after = until` (both exclusive) and OKX
returns the newest `limit` (max 300) candles between them, newest first. A
window wider than the page therefore loses its oldest candles: bounded windows.
`after` excludes its own instant, so the inclusive end goes out one ms later.
A row is [ts, o, h, l, c, vol (base), volCcy, volCcyQuote (quote), confirm];
confirm "0" marks the candle still forming.

Order books (channel `books`): a snapshot, then updates; each carries `checksum`,
OKX's CRC32 (signed 32-bit) of the best 25 levels interleaved
`bid px:bid sz:ask px:ask sz:...` in the exchange's own strings. ccxt 4.5.90
checks `prevSeqId` but not the checksum: `OkxBookChecksum` does.
"""

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from ingestor.model import RawFields
from ingestor.venues.base import Paging, TradePaging, Venue


def raw_fields(body: Any, market_id: str) -> dict[int, RawFields]:
    rows = (body.get("data") or []) if isinstance(body, dict) else []
    return {
        int(r[0]): RawFields(quote_volume=float(r[7]), final=str(r[8]) == "1")
        for r in rows
        if len(r) > 8
    }


CHECKSUM_DEPTH = 25


def book_checksum(bids: Sequence[Sequence[str]], asks: Sequence[Sequence[str]]) -> int:
    """OKX's checksum of a book given best first as (price, size) strings."""
    fields: list[str] = []
    for level in range(CHECKSUM_DEPTH):
        for side in (bids, asks):  # a side that ran out is skipped
            if level < len(side):
                fields += side[level][:2]
    value = zlib.crc32(":".join(fields).encode())
    return value if value < 0x80000000 else value - 0x100000000


class OkxBookChecksum:
    """One market's book as OKX's strings, to recompute each message's checksum."""

    def __init__(self) -> None:
        self._sides: tuple[dict[float, list[str]], dict[float, list[str]]] = ({}, {})

    def apply(self, message: Mapping[str, Any], snapshot: bool) -> bool:
        bids, asks = self._sides
        if snapshot:
            bids.clear()
            asks.clear()
        for side, key in ((bids, "bids"), (asks, "asks")):
            for level in message.get(key) or ():
                price, size = str(level[0]), str(level[1])
                if float(size) == 0:
                    side.pop(float(price), None)
                else:
                    side[float(price)] = [price, size]
        expected = message.get("checksum")
        if expected is None:
            return True
        best_bids = [bids[p] for p in sorted(bids, reverse=True)[:CHECKSUM_DEPTH]]
        best_asks = [asks[p] for p in sorted(asks)[:CHECKSUM_DEPTH]]
        return book_checksum(best_bids, best_asks) == int(expected)


VENUE = Venue(
    exchange_id="okx",
    paging=Paging.NEWEST_IN_WINDOW,
    page_cap=300,
    until_exclusive=True,
    raw_fields=raw_fields,
    book_checksum=OkxBookChecksum,
    prefix="OKX",
    status_url="https://www.okx.com/api/v5/public/time",
    # GET /api/v5/market/history-trades, type=1: `after` = the trades older than that
    # tradeId, the newest 100 of them.
    trade_paging=TradePaging.BY_ID_BACKWARD,
    trade_page_cap=100,
    trade_params={"method": "publicGetMarketHistoryTrades", "type": "1"},
    trade_id_param="after",
)
