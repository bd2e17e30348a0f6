"""The whole platform, started once per test session on free loopback ports."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.exchange_sim.control import SimulatorControl
from infra.localstack import Ports, StackConfig
from infra.platform import Platform, PlatformConfig, ServicePorts
from infra.platform.supervisor import PlatformEndpoints
from mdclient import ClientSettings


@pytest.fixture(scope="session")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    data_dir: Path = tmp_path_factory.mktemp("platform")
    config = PlatformConfig(
        data_dir=data_dir,
        ports=ServicePorts.free(),
        service_env={
            # Short grace periods and watermark keep live tests quick.
            "RELAY_REALTIME_GRACE_SECS": "5",
            "PIPELINE_LIVE__WATERMARK_S": "2",
        },
    )
    stack_config = StackConfig(data_dir=data_dir, ports=Ports.free())
    with Platform(config, stack_config=stack_config, use_simulator=True) as running:
        yield running


@pytest.fixture(scope="session")
def endpoints(platform: Platform) -> PlatformEndpoints:
    return platform.endpoints


@pytest.fixture(scope="session")
def client_settings(endpoints: PlatformEndpoints) -> ClientSettings:
    env = endpoints.client_env()
    fields = {key.removeprefix("MDCLIENT_").lower(): value for key, value in env.items()}
    return ClientSettings.model_validate({**fields, "history_timeout_s": 90.0, "attempts": 1})


@pytest.fixture(scope="session")
def sim(endpoints: PlatformEndpoints) -> SimulatorControl:
    assert endpoints.exchange_url is not None
    return SimulatorControl(endpoints.exchange_url)
