"""The whole platform, started once per test session on free loopback ports.

Local processes by default; the Docker Compose platform with MDP_E2E_STACK=compose
(`make e2e`). Tests ask for `endpoints`/`client_settings` to talk to it and for
`faults` to break a service; neither cares which stack runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.compose_platform import STACK_ENV, STACK_NAME, ComposePlatform
from infra.compose_platform import compose_stack as compose_stack  # the fixture
from infra.exchange_sim.control import SimulatorControl
from infra.localstack import Ports, StackConfig
from infra.platform import Platform, PlatformConfig, ServicePorts
from infra.platform.faults import Faults, LocalFaults
from infra.platform.supervisor import PlatformEndpoints
from mdclient import ClientSettings


def on_compose() -> bool:
    return os.environ.get(STACK_ENV) == STACK_NAME


@pytest.fixture(scope="session")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    """The local platform's processes (not under MDP_E2E_STACK=compose: use `faults`)."""
    if on_compose():
        pytest.skip("needs the local platform's processes (not the compose stack)")
    data_dir: Path = tmp_path_factory.mktemp("platform")
    config = PlatformConfig(
        data_dir=data_dir,
        ports=ServicePorts.free(),
        service_env={
            # Short grace periods and watermark keep live tests quick.
            "RELAY_REALTIME_GRACE_S": "5",
            "PIPELINE_LIVE__WATERMARK_S": "2",
        },
    )
    stack_config = StackConfig(data_dir=data_dir, ports=Ports.free())
    with Platform(config, stack_config=stack_config, use_simulator=True) as running:
        yield running


@pytest.fixture(scope="session")
def endpoints(request: pytest.FixtureRequest) -> PlatformEndpoints:
    """The local platform, or the Docker Compose one with MDP_E2E_STACK=compose (`make e2e`)."""
    if on_compose():
        stack: ComposePlatform = request.getfixturevalue("compose_stack")
        return stack.endpoints.platform_endpoints()
    platform: Platform = request.getfixturevalue("platform")
    return platform.endpoints


@pytest.fixture(scope="session")
def faults(request: pytest.FixtureRequest) -> Faults:
    """Kill/restart/crash a service of whichever stack runs (infra.platform.faults)."""
    if on_compose():
        stack: ComposePlatform = request.getfixturevalue("compose_stack")
        return stack
    return LocalFaults(request.getfixturevalue("platform"))


@pytest.fixture(scope="session")
def compose(request: pytest.FixtureRequest) -> ComposePlatform:
    """The compose platform itself (tests of containers); skips on the local stack."""
    if not on_compose():
        pytest.skip("runs containers: only on the compose stack (MDP_E2E_STACK=compose)")
    stack: ComposePlatform = request.getfixturevalue("compose_stack")
    return stack


@pytest.fixture(scope="session")
def client_settings(endpoints: PlatformEndpoints) -> ClientSettings:
    env = endpoints.client_env()
    fields = {key.removeprefix("MDCLIENT_").lower(): value for key, value in env.items()}
    return ClientSettings.model_validate({**fields, "history_timeout_s": 90.0, "attempts": 1})


@pytest.fixture(scope="session")
def sim(endpoints: PlatformEndpoints) -> SimulatorControl:
    assert endpoints.exchange_url is not None
    return SimulatorControl(endpoints.exchange_url)


@pytest.fixture(scope="session")
def gateway(endpoints: PlatformEndpoints) -> str:
    """The WebSocket/HTTP gateway's base URL: the local platform's gateway process, or
    the compose platform's `gateway` container (published on a free host port)."""
    assert endpoints.gateway, "this platform runs no gateway"
    return endpoints.gateway
