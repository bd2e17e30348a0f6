"""A platform that serves OKX alone (no Binance anywhere) answers a history request.

Its own platform, as `make run EXCHANGES=okx` starts it (PlatformConfig with
`exchanges=["okx"]`): the relay knows only `OKX`, the ingestor opens only OKX
(pointed at the simulator's OKX front-end, which pages newest-first like the
real OKX) and the answer comes back from Iceberg through the client.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.localstack import Ports, StackConfig
from infra.platform import Platform, PlatformConfig, ServicePorts
from infra.testing import exchange_rows, result_rows
from mdclient import Client, ClientSettings, SubmitRejected

pytestmark = [pytest.mark.e2e, pytest.mark.stack, pytest.mark.spark]

HOUR_MS = 3_600_000


@pytest.fixture(scope="module")
def okx_platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    data_dir: Path = tmp_path_factory.mktemp("platform-okx")
    config = PlatformConfig(data_dir=data_dir, ports=ServicePorts.free(), exchanges=["okx"])
    stack_config = StackConfig(data_dir=data_dir, ports=Ports.free())
    with Platform(config, stack_config=stack_config, use_simulator=True) as running:
        yield running


@pytest.fixture(scope="module")
def okx_client(okx_platform: Platform) -> ClientSettings:
    env = okx_platform.endpoints.client_env()
    fields = {key.removeprefix("MDCLIENT_").lower(): value for key, value in env.items()}
    return ClientSettings.model_validate({**fields, "history_timeout_s": 120.0, "attempts": 1})


def test_okx_alone_answers_a_multi_page_history_request(okx_client: ClientSettings) -> None:
    start = (int(time.time() * 1000) - 2 * 24 * HOUR_MS) // HOUR_MS * HOUR_MS
    end = start + 12 * HOUR_MS  # 720 one-minute candles: three OKX pages of 300
    with Client(settings=okx_client, client_id="e2e-okx") as client:
        result = client.history("OKX:BTC/USDT", "1m", start, end)
        assert result.status == "OK"
        assert result_rows(result) == exchange_rows("BTC/USDT", start, end)
        assert len(result) == result.reported_rows == 720
        assert all(n is None for n in result.table.column("trade_count").to_pylist())
        with pytest.raises(SubmitRejected) as refused:  # the relay knows no Binance here
            client.history("BINANCE:BTC/USDT", "1m", start, end)
    assert "BINANCE" in str(refused.value)
