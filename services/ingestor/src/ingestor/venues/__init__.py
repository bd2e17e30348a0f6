"""What the ingestor knows about each exchange, one small module per exchange.

Every exchange-specific fact the paging and parsing path depends on lives in
its venue module (the style of nautilus_trader's per-venue adapter folders):
how a candle page is cut from a window (`Paging`), the most candles one call
returns, how far back the exchange serves candles, and its candle and trade
endpoints, written and parsed by the venue itself (ADR 0018). The rest of the
ingestor asks `venue_for(ccxt_id)` and never tests an exchange's name.

An exchange without a module gets `GENERIC`: bounded windows, which are right
whatever the exchange's window semantics (a window holding at most `limit`
periods comes back whole whether the exchange returns its oldest or its
newest candles), at the cost of one call per window.
"""

from __future__ import annotations

from ingestor.venues import binance, bybit, coinbaseexchange, kraken, okx
from ingestor.venues.base import HistoryUnavailableError, Paging, Venue

GENERIC = Venue(exchange_id="", paging=Paging.NEWEST_IN_WINDOW, page_cap=None)

VENUES: dict[str, Venue] = {
    v.exchange_id: v
    for v in (binance.VENUE, okx.VENUE, bybit.VENUE, kraken.VENUE, coinbaseexchange.VENUE)
}


def venue_for(exchange_id: str) -> Venue:
    """The venue description for a ccxt id; `GENERIC` (bounded paging) when unknown."""
    return VENUES.get(exchange_id, GENERIC)


__all__ = ["GENERIC", "VENUES", "HistoryUnavailableError", "Paging", "Venue", "venue_for"]
