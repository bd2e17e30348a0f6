"""Live candles equal the exchange's own candles, per period, through the whole platform.

Simulator exchange (Binance front-end) -> ingestor (ccxt.pro trade stream) ->
Kafka -> pipeline live aggregation -> relay -> client: each closed live candle
of a window the subscription saw whole must equal the candle the exchange's
REST API serves for that window (`GET /api/v3/klines`, built from the same
model trades) in open, high, low, close, volume and trade count.

Fields that legitimately differ (docs/protocol.md "Live candles and the
exchange's candles"): quote and taker volumes are not built live (unset on the
live candle), and volume is a float sum of the trades' amounts, equal to the
exchange's decimal total within float rounding.

Its own platform: the simulator's clock runs 200 times faster than the wall so
a whole hour closes in well under a minute, which would disturb the shared one.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from infra.exchange_sim.control import SimulatorControl
from infra.platform import Platform
from infra.testing import (
    LiveRun,
    assert_live_equals_exchange,
    closed_live_candles,
    own_platform,
    platform_client,
)
from mdproto import contracts

# Own platform (Spark start: minutes on loaded cores) plus the run: more than the default.
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.stack,
    pytest.mark.spark,
    pytest.mark.local,  # local processes of its own: not a test of the compose stack
    pytest.mark.timeout(1500),
    pytest.mark.heavy(seconds=250),
]

SYMBOL = "ETH/USDT"  # trades every minute, so every window has a candle


@pytest.fixture(scope="module")
def fast_platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    with own_platform(tmp_path_factory.mktemp("platform-live-candles"), ["binance"]) as running:
        yield running


@pytest.fixture(scope="module")
def live_run(fast_platform: Platform) -> LiveRun:
    url = fast_platform.endpoints.exchange_url
    assert url is not None
    client = platform_client(fast_platform)
    sim = SimulatorControl(url)
    return closed_live_candles(client, sim, f"BINANCE:{SYMBOL}", contracts.LIVE_PERIODS)


@pytest.mark.parametrize("period", contracts.LIVE_PERIODS)
def test_closed_live_candles_equal_the_exchange_candles(live_run: LiveRun, period: int) -> None:
    assert_live_equals_exchange(live_run, "binance", SYMBOL, period)


def test_the_feeds_first_window_is_marked_incomplete(live_run: LiveRun) -> None:
    """The feed started inside its first window of each period: that window's earlier
    trades never reached the platform, and its candle says so (`incomplete`,
    docs/protocol.md "Live candles across a feed gap"); the later ones do not."""
    for period in contracts.LIVE_PERIODS:
        first = min(t for p, t in live_run.closed if p == period)
        assert live_run.closed[(period, first)].incomplete, period
