"""The chaos soak's injectors (infra/chaos_platforms.py): one component name per platform,
and what the compose one asks of Docker, against a fake `docker` that records its
commands and answers `ps`/`inspect` from a file (no engine needed)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.chaos import COMPONENTS, EXCHANGE, Fault
from infra.chaos_platforms import SERVICES, ComposeBreaker
from infra.chaos_soak import Injector
from infra.compose_platform import REPO_ROOT, ComposePlatform, endpoints_for, port_variables
from infra.localstack.components import IcebergRest
from infra.localstack.config import free_ports
from infra.platform.services import Gateway, Ingestor, Pipeline, Relay

FAKE_DOCKER = """\
import json, sys
from pathlib import Path
here = Path(sys.argv[0]).parent
args = sys.argv[1:]
with (here / "calls.jsonl").open("a") as log:
    log.write(json.dumps(args) + "\\n")
containers = json.loads((here / "containers.json").read_text())
if args[0] == "ps":
    print("\\n".join(containers))
elif args[0] == "inspect":
    for cid in args[3:]:
        service, state = containers[cid]
        print(service, json.dumps(state))
"""


def test_every_soak_component_has_its_name_on_both_platforms() -> None:
    make_run = {Relay.name, Ingestor.name, Gateway.name, IcebergRest.name, Pipeline.name}
    compose = set(yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())["services"])
    assert set(SERVICES) == {"make run", "compose"}
    for label, known in (("make run", make_run), ("compose", compose)):
        assert set(SERVICES[label]) == set(COMPONENTS), label
        assert set(SERVICES[label].values()) <= known, label


class FakeDocker:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / "docker"
        self.path.write_text(f"#!{sys.executable}\n{FAKE_DOCKER}")
        self.path.chmod(0o755)
        self.containers: dict[str, tuple[str, dict[str, Any]]] = {}
        self.save()

    def save(self) -> None:
        (self.folder / "containers.json").write_text(json.dumps(self.containers))

    def run(self, service: str, started: str, checks: list[tuple[str, int]]) -> None:
        """`service`'s container runs since `started`, with these (start, exit) checks."""
        log = [{"Start": at, "ExitCode": code} for at, code in checks]
        state = {"Status": "running", "Pid": 7, "StartedAt": started, "Health": {"Log": log}}
        self.containers[f"id-{service}"] = (service, state)
        self.save()

    def calls(self) -> list[list[str]]:
        lines = (self.folder / "calls.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]


@pytest.fixture
def docker(tmp_path: Path) -> FakeDocker:
    return FakeDocker(tmp_path)


@pytest.fixture
def breaker(docker: FakeDocker) -> ComposeBreaker:
    files = ["docker-compose.yml"]
    variables = port_variables(files)
    ports = dict(zip(variables, free_ports(len(variables)), strict=True))
    endpoints = endpoints_for("mdp-e2e-1-abc", ports, offline=True)
    compose = ComposePlatform(endpoints, files, {}, ("offline",), docker=str(docker.path))
    return ComposeBreaker(compose)


def test_faults_are_signals_inside_the_container_or_the_freezer(
    breaker: ComposeBreaker, docker: FakeDocker
) -> None:
    """Not `docker kill` (an operator's stop: the restart policy would leave it down)."""
    breaker.kill("relay")
    breaker.terminate("gateway")
    breaker.hang("ingestor")
    breaker.wake("ingestor")
    breaker.freeze("iceberg-rest")
    breaker.thaw("iceberg-rest")
    calls = docker.calls()
    assert all(c[:3] == ["compose", "--project-name", "mdp-e2e-1-abc"] for c in calls)
    tails = [c[c.index("--profile") + 2 :] for c in calls]
    execs = [t for t in tails if t[0] == "exec"]
    assert [t[:6] for t in execs] == [["exec", "-T", "--user", "0", s, "sh"] for s in
        ("relay", "gateway", "ingestor", "ingestor")]  # fmt: skip
    scripts = [t[-1] for t in execs]
    assert scripts[0].endswith("kill -s KILL $pids") and "/proc/1/task/1/children" in scripts[0]
    assert scripts[1].endswith("kill -s TERM $pids")
    assert scripts[2:] == ["kill -s STOP -- -1", "kill -s CONT -- -1"]  # all but init
    assert [t for t in tails if t[0] != "exec"] == [["pause", "iceberg-rest"],
        ["unpause", "iceberg-rest"]]  # fmt: skip


def test_ready_means_a_health_check_passed_since_the_latest_start(
    breaker: ComposeBreaker, docker: FakeDocker
) -> None:
    t0, t1, t2 = "2026-11-30T12:00:00Z", "2026-11-30T12:00:05.5Z", "2026-11-30T12:01:00Z"
    docker.run("gateway", t0, [(t1, 0)])
    docker.run("ingestor", t0, [(t1, 1)])  # running, its check fails
    first = breaker.run_id("gateway")
    assert breaker.not_ready(["gateway", "ingestor", "iceberg-rest"]) == [
        "ingestor",
        "iceberg-rest",  # no container at all
    ]
    docker.run("gateway", t2, [(t1, 0)])  # restarted: its last pass is from before
    assert breaker.run_id("gateway") != first
    assert breaker.not_ready(["gateway"]) == ["gateway"]
    docker.containers["id-gateway"][1]["Status"] = "exited"
    docker.save()
    assert breaker.run_id("gateway") is None
    # The relay healthy, but no relay reports the pipeline's heartbeat (none answers).
    docker.run("relay", t0, [(t1, 0)])
    assert breaker.not_ready(["relay"]) == ["relay"]
    listed = [c for c in docker.calls() if c[0] == "ps"]  # this project's containers only
    assert listed and all("label=com.docker.compose.project=mdp-e2e-1-abc" in c for c in listed)


class ScriptedBreaker:
    """A platform that restarts what is killed, stopped or hung at once."""

    label = "scripted"
    exchange_url = "http://sim"
    crash_limit = 3
    crash_window_s = 300.0

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.runs = dict.fromkeys(COMPONENTS, 1)

    def run_id(self, component: str) -> str | None:
        return str(self.runs[component])

    def not_ready(self, components: Iterable[str]) -> list[str]:
        return []

    def alive(self) -> bool:
        return True

    def _do(self, what: str, component: str, restarts: bool = False) -> None:
        self.calls.append((what, component))
        self.runs[component] += restarts

    def kill(self, component: str) -> None:
        self._do("kill", component, restarts=True)

    def terminate(self, component: str) -> None:
        self._do("terminate", component, restarts=True)

    def freeze(self, component: str) -> None:
        self._do("freeze", component)

    def thaw(self, component: str) -> None:
        self._do("thaw", component)

    def hang(self, component: str) -> None:
        self._do("hang", component, restarts=True)

    def wake(self, component: str) -> None:
        self._do("wake", component)


class ScriptedSimulator:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def add_fault(self, kind: str, **options: object) -> None:
        self.calls.append(f"add {kind}")

    def ws_outage(self, seconds: float = 120.0) -> int:
        self.calls.append("ws_outage")
        return 1

    def clear_faults(self, kind: str | None = None) -> None:
        self.calls.append(f"clear {kind}")


def test_the_injector_breaks_through_the_breaker_and_waits_for_the_restart() -> None:
    breaker, sim = ScriptedBreaker(), ScriptedSimulator()
    injector = Injector(breaker, sim, recover_s=5)  # type: ignore[arg-type]
    records = [
        injector.apply(fault)
        for fault in (
            Fault("ingestor", "hang"),
            Fault("spark-pipeline", "freeze", 0.01),
            Fault(EXCHANGE, "cut", 0.01),
            Fault("relay", "kill"),
            Fault("iceberg-rest", "cut", 0.01),
            Fault("gateway", "restart"),
        )
    ]
    assert breaker.calls == [
        ("hang", "ingestor"),  # restarted by the platform: never woken
        ("freeze", "spark-pipeline"),
        ("thaw", "spark-pipeline"),
        ("kill", "relay"),
        ("freeze", "iceberg-rest"),
        ("thaw", "iceberg-rest"),
        ("terminate", "gateway"),
    ]
    assert sim.calls == ["add unavailable", "ws_outage", "clear unavailable", "clear ws_outage"]
    assert all(r.recovered_ms >= r.ended_ms >= r.started_ms > 0 for r in records)
    assert [r.note for r in records] == [""] * 6
