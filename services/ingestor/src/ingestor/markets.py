"""Market metadata -> `Market` records for `market.markets` (pure)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from ingestor.model import MarketInfo
from mdproto import ProtocolError
from mdproto.messages import Market
from mdproto.topics import parse_ticker

log = logging.getLogger(__name__)


def market_records(
    exchange_prefix: str,
    infos: Iterable[MarketInfo],
    wanted: Iterable[str],
    updated_at_ms: int,
) -> list[Market]:
    """Records for the served markets; `wanted` (BASE/QUOTE) empty means all.

    Markets whose unified symbol does not make a platform ticker
    (`EXCHANGE:BASE/QUOTE`, upper case alphanumerics) are skipped.
    """
    only = {w.upper() for w in wanted}
    records = []
    for info in infos:
        if only and info.symbol.upper() not in only:
            continue
        try:
            ticker = str(parse_ticker(f"{exchange_prefix}:{info.symbol}"))
        except ProtocolError:
            log.debug("market %s has no platform ticker; skipped", info.symbol)
            continue
        records.append(
            Market(
                ticker=ticker,
                exchange=exchange_prefix,
                symbol=info.exchange_symbol,
                base=info.base,
                quote=info.quote,
                active=info.active,
                price_precision=info.price_precision,
                amount_precision=info.amount_precision,
                min_amount=info.min_amount,
                max_amount=info.max_amount,
                min_price=info.min_price,
                max_price=info.max_price,
                min_cost=info.min_cost,
                updated_at_ms=updated_at_ms,
            )
        )
    return records
