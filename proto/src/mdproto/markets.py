"""Records of the compacted Kafka topic `market.markets`: one decoder for every reader
(the relay's symbol checks, the pipeline's Iceberg table)."""

from __future__ import annotations

from mdproto import envelope, topics
from mdproto.error_codes import BAD_TICKER
from mdproto.errors import ProtocolError
from mdproto.messages import Market


def decode_market_record(key: bytes | None, value: bytes | None) -> tuple[str, Market | None]:
    """(ticker, Market), or (ticker, None) for a tombstone: the market was removed.

    The record's own `ticker` wins over the key (they agree when an ingestor wrote
    it). Raises `ProtocolError` for a value that does not decode or a ticker that is
    not `EXCHANGE:BASE/QUOTE`.
    """
    ticker = key.decode("utf-8", "replace") if key else ""
    market = envelope.decode_record(value, Market) if value is not None else None
    if market is not None and market.ticker:
        ticker = market.ticker
    try:
        topics.parse_ticker(ticker)
    except ProtocolError as exc:
        raise ProtocolError(BAD_TICKER, exc.reason) from None
    return ticker, market
