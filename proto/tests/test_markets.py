"""`market.markets` records: the one decoder the relay and the pipeline share."""

from __future__ import annotations

import pytest

from mdproto import ProtocolError, envelope
from mdproto.markets import decode_market_record
from mdproto.messages import Market


def test_the_records_ticker_wins_and_a_tombstone_is_none() -> None:
    value = envelope.encode_record(Market(ticker="BINANCE:BTC/USDT", active=True))
    ticker, market = decode_market_record(b"stale-key", value)
    assert ticker == "BINANCE:BTC/USDT" and market is not None and market.active
    assert decode_market_record(b"BINANCE:ETH/USDT", None) == ("BINANCE:ETH/USDT", None)


@pytest.mark.parametrize(
    ("key", "value", "code"),
    [
        (b"BINANCE:BTC/USDT", b"\x01\x7fjunk", "unknown_type"),
        (b"binance:btc/usdt", None, "bad_ticker"),
        (None, None, "bad_ticker"),
    ],
)
def test_bad_records_are_protocol_errors(key: bytes | None, value: bytes | None, code: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_market_record(key, value)
    assert info.value.code == code
