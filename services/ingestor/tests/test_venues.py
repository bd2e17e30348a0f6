"""Venue descriptions: paging mode, page caps and history windows (pure)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from ingestor.config import ExchangeSettings
from ingestor.exchanges import ExchangeAdapter, paging_mode
from ingestor.venues import GENERIC, HistoryUnavailableError, Paging, venue_for
from ingestor.venues.base import CandleQuery

MIN = 60_000


@pytest.mark.parametrize(
    ("exchange_id", "paging", "cap"),
    [
        ("binance", Paging.OLDEST_FROM_SINCE, 1000),
        ("okx", Paging.NEWEST_IN_WINDOW, 300),
        ("bybit", Paging.NEWEST_IN_WINDOW, 1000),
        ("kraken", Paging.OLDEST_FROM_SINCE, 720),
        ("coinbaseexchange", Paging.NEWEST_IN_WINDOW, 300),
    ],
)
def test_each_exchange_pages_by_its_own_semantics(
    exchange_id: str, paging: Paging, cap: int
) -> None:
    venue = venue_for(exchange_id)
    assert (venue.paging, venue.page_cap) == (paging, cap)
    adapter = ExchangeAdapter(exchange_id, ExchangeSettings(prefix="X", page_limit=5000))
    assert adapter.page_limit == cap
    assert adapter.bounded_pages == (paging is Paging.NEWEST_IN_WINDOW)


def test_an_unknown_exchange_gets_bounded_windows_which_suit_any_semantics() -> None:
    assert venue_for("somethingelse") is GENERIC and GENERIC.bounded
    adapter = ExchangeAdapter("bitstamp", ExchangeSettings(prefix="X", page_limit=50))
    assert adapter.bounded_pages and adapter.page_limit == 50


def test_unbounded_pages_are_refused_where_they_would_lose_candles() -> None:
    assert paging_mode(venue_for("binance"), False) is False
    assert paging_mode(venue_for("binance"), True) is True
    with pytest.raises(ValueError, match="would lose the oldest"):
        paging_mode(venue_for("okx"), False)
    with pytest.raises(ValueError, match="would lose the oldest"):
        ExchangeAdapter("bybit", ExchangeSettings(prefix="X", bounded_pages=False))


def test_kraken_serves_its_latest_720_entries_counting_the_open_one() -> None:
    kraken = venue_for("kraken")
    now = 10_000 * MIN + 30_000  # mid-way through the minute opening at 10 000
    # Kraken holds 10 000 - 719 .. 10 000; the oldest slides out at the next minute.
    assert kraken.earliest_open_ms(now, MIN) == (10_000 - 718) * MIN
    kraken.check_history((10_000 - 718) * MIN, now, MIN)  # fine
    with pytest.raises(HistoryUnavailableError) as refused:
        kraken.check_history((10_000 - 719) * MIN, now, MIN)
    assert refused.value.earliest_ms == (10_000 - 718) * MIN
    assert "1970-01-07T10:42:00Z" in str(refused.value)
    assert venue_for("binance").earliest_open_ms(now, MIN) is None


def test_the_end_goes_out_as_each_exchange_reads_it() -> None:
    def params(exchange_id: str) -> Mapping[str, str | int]:
        build = venue_for(exchange_id).candle_request
        assert build is not None
        query = CandleQuery("M", "1m", MIN, since_ms=0, until_ms=99, limit=5, now_ms=MIN)
        return build(query).params

    assert params("binance")["endTime"] == 99
    assert params("okx")["after"] == 100  # OKX `after` is exclusive
    assert params("bybit")["end"] == 99
    assert params("coinbaseexchange")["end"] == "1970-01-01T00:00:00.099Z"
    assert set(params("kraken")) == {"pair", "interval", "since"}  # Kraken has no end
