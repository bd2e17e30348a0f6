"""The chaos soak on compose, for 5 minutes (issue 45 item 4: its version in `make e2e`).

The soak of bench/chaos_soak.py (infra/chaos_soak.py), with the compose injector
(infra/chaos_platforms.py, `ComposeBreaker`) and the plan that fits 5 minutes
(`infra.chaos.compose_faults`): the ingestor hung (left to the health check's
watchdog), the pipeline frozen 8 s, the exchange cut 20 s, the catalog paused 20 s,
the relay killed -9, the gateway stopped (SIGTERM), one at a time, each recovered
before the next, while clients ask for history, follow the recorded markets live
(ticks, 1-minute candles, a book) and register one-shot triggers. Then the same
checks as the 30-minute soak against the simulator's own trades: no recorded trade
missing or twice in ``market.ticks``, no closed candle missing or twice in
``market.ohlc``, every history request answered with rows or refused with a code
within 10 s of its fault, every trigger whose threshold was crossed fired once.

It runs on the e2e stack's recorded markets (`infra.testing.E2E_RECORDED`), which
no other test injects into, and leaves every component ready for the next test.
``make e2e`` runs it with the other compose tests (so CI does); ``make e2e-soak
IMAGES=offline`` runs it alone (docs/soak.md).
"""

from __future__ import annotations

import time

import pytest

from infra.chaos import compose_faults
from infra.chaos_platforms import ComposeBreaker
from infra.chaos_soak import SoakOptions, run_soak
from infra.compose_platform import ComposePlatform
from infra.platform.supervisor import PlatformEndpoints
from infra.testing import E2E_RECORDED, RecordedLake, poll_until
from mdclient import ClientSettings

pytestmark = [pytest.mark.e2e, pytest.mark.compose, pytest.mark.soak, pytest.mark.timeout(900)]

TICKERS = [f"BINANCE:{s}" for s in E2E_RECORDED]
FREEZE_S = 8.0
CUT_S = 20.0
#: 30 s of clients, then the faults (about 3 minutes with their recoveries; 4.5 at
#: most), then at most 2.5 minutes for gap repair and the candles' rebuilds.
OPTIONS = SoakOptions(
    minutes=4.5,
    warmup_s=30.0,
    gap_s=10.0,
    freeze_s=FREEZE_S,
    cut_s=CUT_S,
    recover_s=180.0,
    settle_s=150.0,
    close_wait_s=10.0,
    settle_every_s=10.0,
    history_timeout_s=90.0,  # the e2e suite's (client_settings): unanswered by then is lost
)


def test_five_minutes_of_faults_lose_nothing_and_store_nothing_twice(
    compose: ComposePlatform,
    endpoints: PlatformEndpoints,
    client_settings: ClientSettings,
    capsys: pytest.CaptureFixture[str],
) -> None:
    stack = endpoints.stack
    lake = RecordedLake(stack.catalog_name, stack.pyiceberg_catalog_properties(), TICKERS)

    def recording() -> bool:  # checked from the soak's first minute on: all recorded
        return len(lake.newest_ms()) == len(TICKERS)

    poll_until("every recorded market in market.ticks", recording, 300, interval_s=2.0)
    began = time.monotonic()
    result = run_soak(
        ComposeBreaker(compose),
        client_settings,
        lake,
        TICKERS,
        compose_faults(freeze_s=FREEZE_S, cut_s=CUT_S),
        OPTIONS,
    )
    report = [*result.report(), f"chaos soak on compose: {time.monotonic() - began:.0f} s"]
    with capsys.disabled():  # the table in CI's log, passed or not
        print("\n".join(report))
    assert not result.not_ready, "\n".join(report)  # the next tests need every part
    assert result.ok, "\n".join(report)
