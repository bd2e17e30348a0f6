"""Compose's liveness: the container health check that kills a hung service so that its
`restart:` policy brings it back (infra/compose/healthcheck.py, docs/adr/0013), without
Docker: a fake container start, a fake kill, real sockets."""

from __future__ import annotations

import importlib.util
import re
import socket
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from prometheus_client import CollectorRegistry

from infra.localstack.config import LOOPBACK, REPO_ROOT
from mdproto.runtime.metrics_http import Health, MetricsServer


@pytest.fixture(scope="module")
def healthcheck() -> ModuleType:
    """Loaded from its file, as the images run it (infra/compose is no package)."""
    name = "mdp_compose_healthcheck_liveness"
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "infra/compose/healthcheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_failures_count_only_after_an_answer_and_per_container_start(
    healthcheck: ModuleType,
) -> None:
    state = healthcheck.Liveness("")
    state = state.after("boot-1", answered=False)  # still starting: not counted
    state = state.after("boot-1", answered=False)
    assert state == healthcheck.Liveness("boot-1", answered=False, failures=0)
    state = state.after("boot-1", answered=True)
    for _ in range(2):
        state = state.after("boot-1", answered=False)
    assert not state.hung(3)
    state = state.after("boot-1", answered=False)
    assert state.hung(3)
    # Restarted: a new pid 1, counted afresh from its first answer.
    assert state.after("boot-2", answered=False) == healthcheck.Liveness("boot-2")
    assert not state.after("boot-1", answered=True).hung(1)  # one answer clears the count


def test_a_silent_service_is_killed_at_the_third_check_saying_why(
    healthcheck: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(healthcheck.LIVENESS_FAILURES_ENV, raising=False)
    killed: list[str] = []

    def watch(answered: bool, failure: str) -> None:
        healthcheck.watch_liveness(
            answered,
            failure,
            state_file=tmp_path / "liveness.json",
            boot=lambda: "boot-1",
            kill=killed.append,
        )

    server = MetricsServer(LOOPBACK, 0, CollectorRegistry(), lambda: Health(False, {}))
    server.start()
    try:  # a 503 is an answer: alive, whatever the health
        assert healthcheck.run([f"live:http://{LOOPBACK}:{server.port}/healthz"], watch) == 0
    finally:
        server.close()
    # A frozen process: the kernel accepts the connection, nothing ever answers.
    with socket.create_server((LOOPBACK, 0)) as frozen:
        url = f"http://{LOOPBACK}:{frozen.getsockname()[1]}/healthz"
        assert healthcheck.run([f"live:{url}"], watch) == 1
        assert healthcheck.run([f"live:{url}"], watch) == 1
        assert killed == []
        assert healthcheck.run([f"file:{tmp_path / 'missing'}", f"live:{url}"], watch) == 1
    assert len(killed) == 1
    assert killed[0].startswith(f"[healthcheck] live {url}: no answer: ")
    assert killed[0].endswith(
        "(3 checks in a row, MDP_LIVENESS_FAILURES=3): killing the service; the container restarts"
    )


def test_the_threshold_comes_from_the_environment(
    healthcheck: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(healthcheck.LIVENESS_FAILURES_ENV, "1")
    killed: list[str] = []
    state = tmp_path / "liveness.json"
    for answered in (True, False):
        healthcheck.watch_liveness(
            answered, "live x: no answer", state_file=state, boot=lambda: "b", kill=killed.append
        )
    assert len(killed) == 1 and "MDP_LIVENESS_FAILURES=1" in killed[0]


def test_every_live_check_can_kill_and_restart_its_service() -> None:
    """A `live:` check kills every process but the container's init: the service needs
    `init: true` (else it is pid 1, which its own namespace cannot SIGKILL) and a
    `restart:` policy, and the probed port must be the one compose configures."""
    compose = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())["services"]
    probed: dict[str, str] = {}
    for name, svc in compose.items():
        dockerfile = svc.get("build", {}).get("dockerfile")
        if dockerfile is None:
            continue
        text = (REPO_ROOT / dockerfile).read_text()
        health = text[text.index("HEALTHCHECK") :].split("\n", 2)[1]
        if match := re.search(r'"live:(http://127\.0\.0\.1:(\d+)/healthz)"', health):
            probed[name] = match.group(2)
            assert svc.get("init") is True, name
            assert svc.get("restart") == "unless-stopped", name
    assert probed == {
        "spark-pipeline": "9562",
        "relay": "9560",
        "ingestor": "9561",
        "gateway": "8090",
    }
    for name, config in (("spark-pipeline", "config.yaml"), ("ingestor", "config.yaml")):
        settings = yaml.safe_load((REPO_ROOT / "infra/compose" / name / config).read_text())
        assert str(settings["metrics_port"]) == probed[name], name
