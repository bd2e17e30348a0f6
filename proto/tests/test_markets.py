"""`market.markets` records: the one decoder the relay and the pipeline share."""

from __future__ import annotations

import pytest

from mdproto import ProtocolError, envelope
from mdproto.markets import Precision, decode_market_record, step_decimals
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


@pytest.mark.parametrize(
    ("step", "decimals"),
    [
        *[(0.01, 2), (0.5, 1), (1.0, 0), (10.0, 0), (1e-8, 8), (0.1, 1), (0.00025, 5)],
        *[(0.0, None), (-0.01, None), (float("nan"), None), (float("inf"), None)],
    ],
)
def test_step_decimals(step: float, decimals: int | None) -> None:
    assert step_decimals(step) == decimals


def test_prices_are_shown_at_the_tick_size_one_width_per_column() -> None:
    """Issue 47: a ladder printed 54008, 54007.7 and 54008.13 in one column, and `:g`
    turned 54035.73 into 54035.7."""
    at_tick = Precision.of(0.01, 0.00001)
    assert [at_tick.price(p) for p in (54008.0, 54007.7, 54008.13, 54035.73)] == [
        "54008.00",
        "54007.70",
        "54008.13",
        "54035.73",
    ]
    assert at_tick.amount(0.5) == "0.50000"
    unknown = Precision.of(0.0, 0.0)
    assert (unknown.price(54008.0), unknown.price(54035.73), unknown.amount(1e-8)) == (
        "54008",
        "54035.73",
        "0.00000001",
    )
