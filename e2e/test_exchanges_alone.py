"""A platform that serves one exchange alone (no Binance anywhere), end to end.

Each its own platform, as `make run EXCHANGES=okx` (or `bybit`) starts it
(PlatformConfig with `exchanges=[...]`): the relay knows only that exchange's
prefix, the ingestor opens only that exchange, pointed at the simulator's
front-end for it, which speaks the exchange's wire format and pages
newest-first like the real one. History answers come back from Iceberg
through the client; Bybit's live candles, built by the pipeline from the
simulator's Bybit trade stream, equal Bybit's own candles.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from infra.exchange_sim.control import SimulatorControl
from infra.platform import Platform
from infra.testing import (
    assert_live_equals_exchange,
    closed_live_candles,
    exchange_rows,
    own_platform,
    platform_client,
    result_rows,
)
from mdclient import Client, SubmitRejected
from mdproto import contracts

# Own platform (Spark start: minutes on loaded cores) plus the run: more than the default.
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.stack,
    pytest.mark.spark,
    pytest.mark.local,  # local processes of its own: not a test of the compose stack
    pytest.mark.timeout(1500),
]

HOUR_MS = 3_600_000


@pytest.fixture(scope="module", params=["okx", "bybit"])
def alone(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Platform]:
    """The platform serving the exchange `request.param` alone."""
    exchange_id = str(request.param)
    with own_platform(tmp_path_factory.mktemp(f"platform-{exchange_id}"), [exchange_id]) as running:
        yield running


def test_one_exchange_alone_answers_a_multi_page_history_request(alone: Platform) -> None:
    [exchange_id] = alone.config.exchanges
    prefix = exchange_id.upper()
    # OKX pages hold 300 one-minute candles, Bybit's 1000: three pages each.
    hours = {"okx": 12, "bybit": 36}[exchange_id]
    start = (int(time.time() * 1000) - 3 * 24 * HOUR_MS) // HOUR_MS * HOUR_MS
    end = start + hours * HOUR_MS
    # Generous: the first micro-batches of a just-started pipeline took minutes on loaded cores.
    settings = platform_client(alone, history_timeout_s=480.0, attempts=1)
    with Client(settings=settings, client_id=f"e2e-{exchange_id}") as client:
        result = client.history(f"{prefix}:BTC/USDT", "1m", start, end)
        assert result.status == "OK"
        assert result_rows(result) == exchange_rows("BTC/USDT", start, end)
        assert len(result) == result.reported_rows == hours * 60
        # Neither exchange reports a trade count: unknown, not zero.
        assert all(n is None for n in result.table.column("trade_count").to_pylist())
        with pytest.raises(SubmitRejected) as refused:  # the relay knows no Binance here
            client.history("BINANCE:BTC/USDT", "1m", start, end)
    assert "BINANCE" in str(refused.value)


# The simulator streams trades in Binance's and Bybit's formats (not OKX's).
@pytest.mark.parametrize("alone", ["bybit"], indirect=True)
def test_bybit_alone_live_candles_equal_the_exchange_candles(alone: Platform) -> None:
    url = alone.endpoints.exchange_url
    assert url is not None
    run = closed_live_candles(
        platform_client(alone), SimulatorControl(url), "BYBIT:ETH/USDT", contracts.LIVE_PERIODS
    )
    for period in contracts.LIVE_PERIODS:
        assert_live_equals_exchange(run, "bybit", "ETH/USDT", period)
