"""The whole platform, started once per test session on free loopback ports.

Local processes by default; the Docker Compose platform with MDP_E2E_STACK=compose
(`make e2e`). Tests ask for `endpoints`/`client_settings` to talk to it and for
`faults` to break a service; neither cares which stack runs.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from infra.compose_platform import STACK_ENV, STACK_NAME, ComposePlatform
from infra.compose_platform import compose_stack as compose_stack  # the fixture
from infra.exchange_sim.control import SimulatorControl
from infra.localstack import Ports, StackConfig
from infra.localstack.process import log_tail
from infra.platform import Platform, PlatformConfig, ServicePorts
from infra.platform.faults import Faults, LocalFaults
from infra.platform.supervisor import PlatformEndpoints
from infra.testing import E2E_REALTIME_GRACE_S, E2E_RECORDED
from mdclient import ClientSettings

#: The services whose logs a failed test's report carries (CI keeps nothing else).
LOGGED_SERVICES = ("relay", "ingestor", "spark-pipeline")
#: On compose, also the extra live engines (`live-engine` replicas, ADR 0014).
COMPOSE_LOGGED = (*LOGGED_SERVICES, "live-engine")
LOG_TAIL_LINES = 60
#: Besides the tails, the lines that tell what a recording did (its gaps and repairs)
#: and every warning, from the whole logs: a tail of 60 lines is often reconnects only.
KEY_LINES = re.compile(r"WARNING|ERROR|gap|repair", re.IGNORECASE)
NOISE = re.compile(r"reconnecting in")
KEY_LINES_KEPT = 120
#: The platform's logs of `LOGGED_SERVICES`: their tails (lines), or all (None).
_platform_logs: list[Callable[[int | None], str]] = []


def on_compose() -> bool:
    return os.environ.get(STACK_ENV) == STACK_NAME


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test's report ends with the platform's log tails: a CI run on a
    fresh machine leaves nothing else to read once it has failed."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when == "call" and report.failed and _platform_logs:
        logs = _platform_logs[-1]
        try:
            tails, whole = logs(LOG_TAIL_LINES), logs(None)
        except Exception as exc:  # the report matters more than its appendix
            tails = whole = f"(no logs: {exc!r})"
        report.sections.append(("platform logs (tail)", tails))
        report.sections.append(("platform logs (warnings, gaps, repairs)", key_lines(whole)))


def key_lines(text: str) -> str:
    kept = [line for line in text.splitlines() if KEY_LINES.search(line) and not NOISE.search(line)]
    return "\n".join(kept[-KEY_LINES_KEPT:])


def _local_logs(logs_dir: Path, tail: int | None) -> str:
    def text(name: str) -> str:
        path = logs_dir / f"{name}.log"
        if tail is not None:
            return log_tail(path, tail)
        return path.read_text(errors="replace") if path.exists() else "(no log file)"

    return "\n".join(f"----- {name} -----\n{text(name)}" for name in LOGGED_SERVICES)


@pytest.fixture(scope="session")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    """The local platform's processes (not under MDP_E2E_STACK=compose: use `faults`)."""
    if on_compose():
        pytest.skip("needs the local platform's processes (not the compose stack)")
    data_dir: Path = tmp_path_factory.mktemp("platform")
    config = PlatformConfig(
        data_dir=data_dir,
        ports=ServicePorts.free(),
        # Recorded markets no other test injects trades into or watches stop
        # (e2e/test_recording.py); compose records the same (infra/compose/e2e.yml).
        record=list(E2E_RECORDED),
        service_env={
            # Short grace periods and watermark keep live tests quick.
            "RELAY_REALTIME_GRACE_S": E2E_REALTIME_GRACE_S,
            "PIPELINE_LIVE__WATERMARK_S": "2",
        },
    )
    stack_config = StackConfig(data_dir=data_dir, ports=Ports.free())
    with Platform(config, stack_config=stack_config, use_simulator=True) as running:
        _platform_logs.append(functools.partial(_local_logs, data_dir / "logs"))
        yield running
        _platform_logs.clear()


@pytest.fixture(scope="session")
def endpoints(request: pytest.FixtureRequest) -> PlatformEndpoints:
    """The local platform, or the Docker Compose one with MDP_E2E_STACK=compose (`make e2e`)."""
    if on_compose():
        stack: ComposePlatform = request.getfixturevalue("compose_stack")
        _platform_logs.append(lambda tail: stack.logs(*COMPOSE_LOGGED, tail=tail))
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
