"""The platform as Docker Compose containers, for the end-to-end tests (`make e2e`).

``compose_session()`` starts the compose files named by ``MDP_COMPOSE_FILES``
(colon-separated, relative to the repository; default ``docker-compose.yml``,
e.g. ``docker-compose.yml:infra/images/compose.yml`` for the offline image set)
with the ``offline`` profile (the exchange simulator stands in for Binance)
through testcontainers' ``DockerCompose``, waits until every container is
healthy, and yields a ``ComposePlatform``: its ``endpoints`` (where the host
reaches it) and the container faults of ``infra.platform.faults.Faults``
(kill, restart, crash, wait until ready) plus ``run()`` for one-shot services
such as the test-client. ``compose_platform()`` yields just the endpoints.
Host ports are free ports picked at start (``MDP_PORT_*``) and the compose
project has its own name, so it never collides with a ``make up`` stack, the
local stack, or another run. One stack per process: while one runs, another
``compose_platform()`` without an explicit project reuses it (two stacks at
once would starve a 2-core machine).

Without a Docker engine it skips the calling test with a one-line reason
(``docker_unavailable_reason()``); with ``CI=true`` it fails with that reason
instead: in CI a missing engine is a broken machine, not a reason to pass.

The e2e suite picks its stack with ``MDP_E2E_STACK`` (``compose`` here; see
``STACK_ENV``); ``compose_stack``, used by e2e/conftest.py, is a session fixture
around ``compose_session()``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from infra.image_prune import docker_time
from infra.localstack.config import free_ports
from infra.platform.metrics import PIPELINE_SERVES_HISTORY, metric_sample
from infra.testing import in_ci
from mdproto.runtime.processes import process_alive

if TYPE_CHECKING:
    from infra.localstack.endpoints import StackEndpoints
    from infra.platform.supervisor import PlatformEndpoints

REPO_ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = "docker-compose.yml"
#: Colon-separated compose files (relative to the repository), e.g.
#: ``docker-compose.yml:infra/images/compose.yml``; default ``COMPOSE_FILE``.
COMPOSE_FILES_ENV = "MDP_COMPOSE_FILES"
#: The e2e stack: the exchange simulator and Prometheus watching every service.
PROFILES_OFFLINE = ("offline", "monitoring")
STACK_ENV = "MDP_E2E_STACK"
#: The e2e suite's override: what its stack records (infra.testing.E2E_RECORDED).
E2E_OVERRIDES = "infra/compose/e2e.yml"
STACK_NAME = "compose"
DOCKER_TIMEOUT_S = 20.0
#: The labels compose puts on a project's containers.
PROJECT_LABEL = "com.docker.compose.project"
SERVICE_LABEL = "com.docker.compose.service"
#: Services whose (re)start is only over once the relays hear the pipeline's heartbeat.
_PIPELINE_SEEN_BY = frozenset({"spark-pipeline", "relay", "relay-2"})

# The compose file's credentials, bucket and warehouse (same as the local stack's).
S3_ACCESS_KEY = "localstack"
S3_SECRET_KEY = "localstack-secret"
S3_REGION = "us-east-1"
S3_BUCKET = "warehouse"
WAREHOUSE = "s3://warehouse/lake"

# ComposeEndpoints field -> the docker-compose.yml variable that publishes it.
PORT_VARIABLES: dict[str, str] = {
    "work_port": "MDP_PORT_RELAY_WORK",
    "response_port": "MDP_PORT_RELAY_RESPONSE",
    "market_data_port": "MDP_PORT_RELAY_MARKET_DATA",
    "request_port": "MDP_PORT_RELAY_REQUEST",
    "control_port": "MDP_PORT_RELAY_CONTROL",
    "relay_metrics_port": "MDP_PORT_RELAY_METRICS",
    "pipeline_pub_port": "MDP_PORT_PIPELINE_PUB",
    "kafka_port": "MDP_PORT_KAFKA",
    "s3_port": "MDP_PORT_S3",
    "s3_console_port": "MDP_PORT_S3_CONSOLE",
    "catalog_port": "MDP_PORT_CATALOG",
    "spark_ui_port": "MDP_PORT_SPARK_UI",
    "exchange_sim_port": "MDP_PORT_EXCHANGE_SIM",
    "prometheus_port": "MDP_PORT_PROMETHEUS",
    "gateway_port": "MDP_PORT_GATEWAY",
    # relay-2, the second relay (active/active): the same sockets on its own ports.
    "relay2_work_port": "MDP_PORT_RELAY2_WORK",
    "relay2_response_port": "MDP_PORT_RELAY2_RESPONSE",
    "relay2_market_data_port": "MDP_PORT_RELAY2_MARKET_DATA",
    "relay2_request_port": "MDP_PORT_RELAY2_REQUEST",
    "relay2_control_port": "MDP_PORT_RELAY2_CONTROL",
    "relay2_metrics_port": "MDP_PORT_RELAY2_METRICS",
}
#: The three-broker Kafka override: brokers 2 and 3 publish their own EXTERNAL
#: listeners (a host client is sent to each partition's leader).
KAFKA_CLUSTER_FILE = "infra/compose/kafka-cluster.yml"
KAFKA_PEER_PORT_VARIABLES: dict[str, str] = {
    "kafka_2_port": "MDP_PORT_KAFKA_2",
    "kafka_3_port": "MDP_PORT_KAFKA_3",
}
HOST = "127.0.0.1"


def port_variables(files: list[str]) -> dict[str, str]:
    """The published ports of a stack of these compose files (field -> variable)."""
    if KAFKA_CLUSTER_FILE in files:
        return {**PORT_VARIABLES, **KAFKA_PEER_PORT_VARIABLES}
    return dict(PORT_VARIABLES)


@dataclass(frozen=True)
class ComposeEndpoints:
    """Where the host reaches a running compose platform (all on 127.0.0.1)."""

    project: str
    relay_host: str
    request_port: int
    market_data_port: int
    work_port: int
    response_port: int
    control_port: int
    relay_metrics_port: int
    pipeline_pub_port: int
    kafka_port: int
    s3_port: int
    s3_console_port: int
    catalog_port: int
    spark_ui_port: int
    exchange_sim_port: int
    prometheus_port: int
    gateway_port: int
    offline: bool
    relay2_request_port: int
    relay2_market_data_port: int
    relay2_work_port: int
    relay2_response_port: int
    relay2_control_port: int
    relay2_metrics_port: int
    kafka_peer_ports: tuple[int, ...] = ()  # brokers 2 and 3 of the Kafka cluster override
    s3_access_key: str = S3_ACCESS_KEY
    s3_secret_key: str = S3_SECRET_KEY
    s3_region: str = S3_REGION
    warehouse: str = WAREHOUSE

    @property
    def kafka_bootstrap(self) -> str:
        """Every broker: a host client still finds the cluster while one is down."""
        ports = (self.kafka_port, *self.kafka_peer_ports)
        return ",".join(f"{self.relay_host}:{port}" for port in ports)

    @property
    def catalog_uri(self) -> str:
        return f"http://{self.relay_host}:{self.catalog_port}"

    @property
    def s3_endpoint(self) -> str:
        return f"http://{self.relay_host}:{self.s3_port}"

    @property
    def prometheus_url(self) -> str:
        """Prometheus of the `monitoring` profile (the e2e stack always runs it)."""
        return f"http://{self.relay_host}:{self.prometheus_port}"

    @property
    def gateway_url(self) -> str:
        """The gateway container's page, WebSocket and HTTP API."""
        return f"http://{self.relay_host}:{self.gateway_port}"

    @property
    def exchange_sim_url(self) -> str | None:
        """Base URL of the simulator's REST + control API (offline profile only)."""
        return f"http://{self.relay_host}:{self.exchange_sim_port}" if self.offline else None

    @property
    def relay_metrics_urls(self) -> dict[str, str]:
        """Each relay service's /metrics on the host (``relay``, ``relay-2``)."""
        return {
            "relay": f"http://{self.relay_host}:{self.relay_metrics_port}/metrics",
            "relay-2": f"http://{self.relay_host}:{self.relay2_metrics_port}/metrics",
        }

    def both_relays(self) -> dict[str, str]:
        """Client settings listing both relays (active/active), ``relay`` first."""
        host = self.relay_host
        return {
            "request_endpoint": f"tcp://{host}:{self.request_port},"
            f"tcp://{host}:{self.relay2_request_port}",
            "market_data_endpoint": f"tcp://{host}:{self.market_data_port},"
            f"tcp://{host}:{self.relay2_market_data_port}",
        }

    def client_settings(self) -> dict[str, Any]:
        """Keyword overrides for ``mdclient.config.load_settings`` (same keys as its YAML)."""
        return {
            "relay_host": self.relay_host,
            "request_port": self.request_port,
            "market_data_port": self.market_data_port,
            "catalog_uri": self.catalog_uri,
            "warehouse": self.warehouse,
            "s3_endpoint": self.s3_endpoint,
            "s3_access_key": self.s3_access_key,
            "s3_secret_key": self.s3_secret_key,
            "s3_region": self.s3_region,
        }

    def stack_endpoints(self) -> StackEndpoints:
        """The same addresses as the local stack's ``StackEndpoints`` (same consumers)."""
        from infra.localstack.endpoints import StackEndpoints

        return StackEndpoints(
            kafka_bootstrap=self.kafka_bootstrap,
            s3_endpoint=self.s3_endpoint,
            s3_access_key=self.s3_access_key,
            s3_secret_key=self.s3_secret_key,
            s3_region=self.s3_region,
            s3_bucket=S3_BUCKET,
            warehouse=self.warehouse,
            catalog_uri=self.catalog_uri,
            catalog_name="lake",
        )

    def platform_endpoints(self) -> PlatformEndpoints:
        """As ``infra.platform``'s ``PlatformEndpoints``: the e2e ``endpoints`` fixture's type."""
        from infra.platform.supervisor import PlatformEndpoints

        return PlatformEndpoints(
            request=f"tcp://{self.relay_host}:{self.request_port}",
            market_data=f"tcp://{self.relay_host}:{self.market_data_port}",
            relay_metrics=f"http://{self.relay_host}:{self.relay_metrics_port}",
            exchange_url=self.exchange_sim_url,
            gateway=self.gateway_url,
            stack=self.stack_endpoints(),
        )

    def endpoints_json(self) -> str:
        """This platform's endpoints.json: the layout `make run` writes (the stack's fields
        and the `clients` section), with both relays (docs/docker.md "Where clients find
        it"; ``infra/compose/endpoints.json`` is the one of the default ports)."""
        from infra.localstack.endpoints import client_addresses

        host = self.relay_host
        stack = self.stack_endpoints()
        clients = client_addresses(
            request=[f"tcp://{host}:{p}" for p in (self.request_port, self.relay2_request_port)],
            market_data=[
                f"tcp://{host}:{p}" for p in (self.market_data_port, self.relay2_market_data_port)
            ],
            gateway=self.gateway_url,
            catalog=self.catalog_uri,
            s3=stack.s3_endpoint,
            metrics={
                "relay": f"http://{host}:{self.relay_metrics_port}",
                "relay-2": f"http://{host}:{self.relay2_metrics_port}",
            },
        )
        return stack.to_json(clients)

    def pyiceberg_catalog_properties(self) -> dict[str, str]:
        """Properties for ``pyiceberg.catalog.load_catalog(name, **props)``."""
        return {
            "type": "rest",
            "uri": self.catalog_uri,
            "warehouse": self.warehouse,
            "s3.endpoint": self.s3_endpoint,
            "s3.access-key-id": self.s3_access_key,
            "s3.secret-access-key": self.s3_secret_key,
            "s3.region": self.s3_region,
            "s3.path-style-access": "true",
        }


def default_ports(compose_text: str) -> dict[str, int]:
    """``PORT_VARIABLES`` field -> the host port a compose file publishes by default
    (its ``${MDP_PORT_...:-N}``): where ``make up`` puts each service."""
    defaults = dict(re.findall(r"\$\{(MDP_PORT_[A-Z0-9_]+):-(\d+)\}", compose_text))
    return {field: int(defaults[variable]) for field, variable in PORT_VARIABLES.items()}


def endpoints_for(project: str, ports: Mapping[str, int], *, offline: bool) -> ComposeEndpoints:
    """Endpoints of a stack published on ``ports`` (``PORT_VARIABLES`` field -> host port)."""
    missing = set(PORT_VARIABLES) - set(ports)
    if missing:
        raise ValueError(f"no host port for {sorted(missing)}")
    return ComposeEndpoints(
        project=project,
        relay_host=HOST,
        offline=offline,
        request_port=ports["request_port"],
        market_data_port=ports["market_data_port"],
        work_port=ports["work_port"],
        response_port=ports["response_port"],
        control_port=ports["control_port"],
        relay_metrics_port=ports["relay_metrics_port"],
        pipeline_pub_port=ports["pipeline_pub_port"],
        kafka_port=ports["kafka_port"],
        s3_port=ports["s3_port"],
        s3_console_port=ports["s3_console_port"],
        catalog_port=ports["catalog_port"],
        spark_ui_port=ports["spark_ui_port"],
        exchange_sim_port=ports["exchange_sim_port"],
        prometheus_port=ports["prometheus_port"],
        gateway_port=ports["gateway_port"],
        relay2_request_port=ports["relay2_request_port"],
        relay2_market_data_port=ports["relay2_market_data_port"],
        relay2_work_port=ports["relay2_work_port"],
        relay2_response_port=ports["relay2_response_port"],
        relay2_control_port=ports["relay2_control_port"],
        relay2_metrics_port=ports["relay2_metrics_port"],
        kafka_peer_ports=tuple(ports[f] for f in KAFKA_PEER_PORT_VARIABLES if f in ports),
    )


def docker_unavailable_reason(docker: str | None = None) -> str | None:
    """One line saying why no Docker engine can run the stack, or None if one can."""
    cli = docker or shutil.which("docker")
    if cli is None:
        return "no Docker engine: the docker CLI is not installed"
    host = os.environ.get("DOCKER_HOST", "")
    if not host and not Path("/var/run/docker.sock").exists():
        return "no Docker engine: /var/run/docker.sock does not exist and DOCKER_HOST is unset"
    try:
        info = subprocess.run(
            [cli, "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=DOCKER_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"no Docker engine: `docker info` failed ({type(exc).__name__})"
    if info.returncode != 0 or not info.stdout.strip():
        lines = [ln.strip() for ln in info.stderr.splitlines() if ln.strip()]
        detail = lines[-1] if lines else f"exit code {info.returncode}"
        return f"no Docker engine: `docker info` failed ({detail})"
    try:
        plugin = subprocess.run(
            [cli, "compose", "version", "--short"],
            capture_output=True,
            text=True,
            timeout=DOCKER_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"no Docker Compose: `docker compose version` failed ({type(exc).__name__})"
    if plugin.returncode != 0:
        return "no Docker Compose: the `docker compose` plugin is not installed"
    return None


def compose_files(value: str | None = None) -> list[str]:
    """The compose files to use: ``value`` or ``$MDP_COMPOSE_FILES`` (colon-separated)."""
    raw = os.environ.get(COMPOSE_FILES_ENV, "") if value is None else value
    files = [part.strip() for part in raw.split(":") if part.strip()]
    files = files or [COMPOSE_FILE]
    missing = [f for f in files if not (REPO_ROOT / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{COMPOSE_FILES_ENV}: no such compose file {missing}")
    return files


def require_docker() -> None:
    """Skip the calling test without a Docker engine; fail instead when ``CI`` is true."""
    reason = docker_unavailable_reason()
    if reason is None:
        return
    if in_ci():
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


def compose_environment(
    ports: Mapping[str, int], project: str, image_tag: str | None = None
) -> dict[str, str]:
    """Variables docker-compose.yml reads: project name, bind address, published ports."""
    env = {
        "COMPOSE_PROJECT_NAME": project,
        "MDP_BIND": HOST,
        "MDP_KAFKA_HOST": HOST,
    }
    variables = {**PORT_VARIABLES, **KAFKA_PEER_PORT_VARIABLES}
    env.update({variables[field]: str(port) for field, port in ports.items()})
    if image_tag:
        env["MDP_IMAGE_TAG"] = image_tag
    return env


@contextlib.contextmanager
def _environ(values: Mapping[str, str]) -> Iterator[None]:
    """Set variables for the docker compose subprocesses, restore them afterwards."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


class ComposeError(RuntimeError):
    """A docker compose command failed (the message has the end of its output)."""


class ComposePlatform:
    """A running compose project: its endpoints and the faults tests inject into it.

    Every command uses the same files, profiles, project name and environment
    (published ports) as the ``up`` that started the project. Implements
    ``infra.platform.faults.Faults``.
    """

    stack = "compose"

    def __init__(
        self,
        endpoints: ComposeEndpoints,
        files: list[str],
        env: Mapping[str, str],
        profiles: tuple[str, ...],
        docker: str = "docker",
    ) -> None:
        self.endpoints = endpoints
        self.files = files
        self.env = dict(env)
        self.profiles = profiles
        self.docker = docker

    @property
    def project(self) -> str:
        return self.endpoints.project

    def command(self, *args: str, profiles: tuple[str, ...] = ()) -> list[str]:
        cmd = [self.docker, "compose", "--project-name", self.project]
        for file in self.files:
            cmd += ["--file", str(REPO_ROOT / file)]
        for profile in (*self.profiles, *profiles):
            cmd += ["--profile", profile]
        return [*cmd, *args]

    def compose(
        self,
        *args: str,
        profiles: tuple[str, ...] = (),
        timeout_s: float = 300.0,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``docker compose <args>`` on this project; ``ComposeError`` if it fails."""
        cmd = self.command(*args, profiles=profiles)
        try:
            done = subprocess.run(
                cmd,
                cwd=REPO_ROOT,
                env={**os.environ, **self.env},
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise ComposeError(
                f"`docker compose {' '.join(args)}` timed out ({timeout_s:g}s)"
            ) from exc
        if check and done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
            raise ComposeError(
                f"`docker compose {' '.join(args)}` exited {done.returncode}:\n{tail}"
            )
        return done

    # ------------------------------------------------------------ Faults

    def kill(self, service: str) -> None:
        """SIGKILL the container; ``docker kill`` counts as a manual stop, so the
        restart policy leaves it down until ``start``."""
        self.compose("kill", "--signal", "KILL", service, timeout_s=60)

    def start(self, service: str) -> None:
        self.wait_ready(service)

    def restart(self, service: str) -> None:
        """``docker compose restart`` (SIGTERM, then start), then wait until healthy."""
        self.compose("restart", service, timeout_s=120)
        self.wait_ready(service)

    def crash(self, service: str) -> None:
        """SIGKILL the service's process inside the container (the child of the
        container's init, ``init: true``): the container exits 137 and its restart
        policy restarts it, as after a real crash. Returns at once."""
        self.signal(service, "KILL")

    def signal(self, service: str, sig: str, *, every: bool = False) -> None:
        """Send `sig` (KILL, TERM, STOP, CONT) from inside the container: to the service's
        main process, the child of the container's init (``init: true``), or with
        `every` to every process but init (a JVM under a shell too: SIGSTOP, SIGCONT).

        Not ``docker kill``: Docker takes that for an operator's stop, which the restart
        policy leaves down; here the container exits as after a crash (or a graceful
        stop, TERM) and comes back by itself. A process stopped this way (not the cgroup
        freezer of ``pause``) still gets its health checks, which kill a hung service
        (infra/compose/healthcheck.py, ADR 0013)."""
        main = 'set -e; pids=$(cat /proc/1/task/1/children); test -n "$pids"; kill -s {} $pids'
        script = f"kill -s {sig} -- -1" if every else main.format(sig)
        done = self.compose(
            "exec", "-T", "--user", "0", service, "sh", "-c", script, timeout_s=60, check=False
        )
        # 137: the container went down (its init gone, every process in it killed) before
        # the shell that signalled it had exited: the signal was sent.
        if done.returncode not in (0, 137):
            tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
            raise ComposeError(f"{sig} to {service} failed ({done.returncode}): {tail}")

    def pause(self, service: str) -> None:
        """Freeze the container. The cgroup freezer refuses ("unable to freeze") while a
        process of it is being started or killed, e.g. a healthcheck's exec: retried."""
        for attempt in range(5):
            try:
                self.compose("pause", service, timeout_s=60)
                return
            except ComposeError as refused:
                if "unable to freeze" not in str(refused) or attempt == 4:
                    raise
                time.sleep(1.0)

    def unpause(self, service: str) -> None:
        self.compose("unpause", service, timeout_s=60)

    def wait_ready(self, service: str, timeout_s: float = 300.0) -> None:
        """Start the service if it is down, then wait until a healthcheck has passed
        *since its latest start* (Docker keeps the health status of the previous run
        across a restart, so ``up --wait`` may see a stale one)."""
        self.compose("up", "--detach", "--no-deps", service, timeout_s=120)
        deadline = time.monotonic() + timeout_s
        last = "no container"
        while time.monotonic() < deadline:
            state = self._state(service)
            if state is not None:
                last = _describe_state(state)
                if _ready_since_start(state):
                    if service in _PIPELINE_SEEN_BY:
                        self.wait_pipeline_served(deadline - time.monotonic())
                    return
            time.sleep(1.0)
        logs = "\n".join(self.logs(service, tail=60).splitlines()[-60:])
        raise ComposeError(f"{service} not ready within {timeout_s:g}s ({last}); logs:\n{logs}")

    def relays_without_pipeline(self) -> list[str]:
        """The relays that do not accept history now: no pipeline heartbeat reached them."""
        return [
            relay
            for relay, url in self.endpoints.relay_metrics_urls.items()
            if (metric_sample(url, PIPELINE_SERVES_HISTORY) or 0) < 1
        ]

    def wait_pipeline_served(self, timeout_s: float = 120.0) -> None:
        """Wait until every relay accepts history: the pipeline's heartbeat reached it
        (a healthy pipeline container alone does not say so; docs/protocol.md)."""
        deadline = time.monotonic() + timeout_s
        while True:
            waiting = self.relays_without_pipeline()
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise ComposeError(f"{', '.join(waiting)} saw no pipeline heartbeat in time")
            time.sleep(0.5)

    def not_ready(self, services: Iterable[str]) -> list[str]:
        """Those of `services` not ready now, in one look (``wait_ready``'s test, without
        starting or waiting): the container runs, a health check passed since its latest
        start, and for the pipeline and the relays every relay hears the pipeline."""
        wanted = list(services)
        states = self.states()
        late = [s for s in wanted if s not in states or not _ready_since_start(states[s])]
        heard = [s for s in wanted if s in _PIPELINE_SEEN_BY and s not in late]
        if heard and self.relays_without_pipeline():
            late += heard
        return late

    def states(self) -> dict[str, dict[str, Any]]:
        """Each service's container state (``docker inspect``'s ``.State``; the first
        container of a scaled service), in two commands whatever the number of services
        (plain ``docker``, which reads no compose file: polled every second by the soak)."""
        listed = subprocess.run(
            [
                self.docker,
                "ps",
                "--all",
                "--quiet",
                "--filter",
                f"label={PROJECT_LABEL}={self.project}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        ids = listed.stdout.split()
        if not ids:
            return {}
        label = f'{{{{index .Config.Labels "{SERVICE_LABEL}"}}}}'
        done = subprocess.run(
            [self.docker, "inspect", "--format", f"{label} {{{{json .State}}}}", *ids],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )  # a container removed meanwhile fails alone: the others are still printed
        found: dict[str, dict[str, Any]] = {}
        for line in done.stdout.splitlines():
            service, _, state = line.partition(" ")
            if state:
                found.setdefault(service, json.loads(state))
        return found

    def _state(self, service: str) -> dict[str, Any] | None:
        ids = self.compose("ps", "--all", "--quiet", service, timeout_s=60).stdout.split()
        if not ids:
            return None
        done = subprocess.run(
            [self.docker, "inspect", "--format", "{{json .State}}", ids[0]],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            return None
        state: dict[str, Any] = json.loads(done.stdout)
        return state

    # ------------------------------------------------------------ one-shot services

    def run(
        self,
        service: str,
        *args: str,
        profiles: tuple[str, ...] = ("client",),
        timeout_s: float = 300.0,
    ) -> subprocess.CompletedProcess[str]:
        """``docker compose run --rm -T <service> <args>`` inside the network (no check)."""
        return self.compose(
            "run", "--rm", "-T", service, *args, profiles=profiles, timeout_s=timeout_s, check=False
        )

    def logs(self, *services: str, tail: int | None = 200) -> str:
        """The services' logs: their last ``tail`` lines each, or all of them (None)."""
        lines = "all" if tail is None else str(tail)
        done = self.compose("logs", "--no-color", "--tail", lines, *services, check=False)
        return done.stdout + done.stderr


def _ready_since_start(state: Mapping[str, Any]) -> bool:
    """Running, and (with a healthcheck) one probe passed after the latest start."""
    if state.get("Status") != "running":
        return False
    health = state.get("Health")
    if not health:
        return True
    started = docker_time(str(state["StartedAt"]))
    return any(
        entry.get("ExitCode") == 0 and docker_time(str(entry["Start"])) >= started
        for entry in health.get("Log") or []
    )


def _describe_state(state: Mapping[str, Any]) -> str:
    health = state.get("Health") or {}
    return f"status {state.get('Status')}, health {health.get('Status', 'none')}"


_ACTIVE: list[ComposePlatform] = []

#: `mdp-e2e-<pid of the test process>-<random>`: the pid says whether its owner still runs;
#: `mdp-e2e-<8 hex>` is the name from before pids were in it.
_PROJECT = re.compile(r"^mdp-e2e-(?:(?P<pid>\d+)-[0-9a-f]+|[0-9a-f]{8})$")


def abandoned_projects(names: list[str], alive: Callable[[int], bool]) -> list[str]:
    """The e2e projects among `names` whose test process is gone (`alive(pid)` false).

    An interrupted `make e2e` leaves its containers, and their restart policies
    bring them back with every Docker start: a second platform that starves the
    next run on two cores (it failed three e2e tests here once).
    """
    found = []
    for name in names:
        match = _PROJECT.match(name)
        if match and not (match["pid"] and alive(int(match["pid"]))):
            found.append(name)
    return found


def remove_abandoned_projects(docker: str) -> list[str]:
    """Remove the containers, volumes and networks of abandoned e2e projects (every
    profile: `down` without the profiles leaves the simulator and Prometheus up)."""
    listed = subprocess.run(
        [docker, "compose", "ls", "--all", "--format", "json"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if listed.returncode != 0:
        return []
    names = [str(p.get("Name", "")) for p in json.loads(listed.stdout or "[]")]
    gone = abandoned_projects(names, process_alive)
    for name in gone:
        label = f"label={PROJECT_LABEL}={name}"
        for list_cmd, remove_cmd in (
            (["ps", "-aq"], ["rm", "-f"]),
            (["volume", "ls", "-q"], ["volume", "rm", "-f"]),
            (["network", "ls", "-q"], ["network", "rm"]),
        ):
            ids = subprocess.run(
                [docker, *list_cmd, "--filter", label],
                capture_output=True, text=True, timeout=60, check=False,
            ).stdout.split()  # fmt: skip
            if ids:
                subprocess.run([docker, *remove_cmd, *ids], capture_output=True, timeout=300)
        print(f"removed the abandoned e2e project {name} (its test process is gone)")
    return gone


@contextlib.contextmanager
def compose_session(
    *,
    offline: bool = True,
    build: bool = True,
    project: str | None = None,
    image_tag: str | None = None,
    files: list[str] | None = None,
) -> Iterator[ComposePlatform]:
    """Start the compose platform, yield it, tear it down (volumes too).

    Skips the calling test (``pytest.skip``) when no Docker engine is reachable,
    or fails it when ``CI`` is true. ``offline`` adds the exchange simulator (no
    internet needed); ``build`` runs ``up --build`` (cached layers make it cheap
    after ``make e2e``'s build step). ``files`` defaults to ``compose_files()``.
    Without ``project``, a stack this process already runs is reused.
    """
    if project is None and _ACTIVE:
        yield _ACTIVE[-1]
        return
    require_docker()
    from testcontainers.compose import DockerCompose

    remove_abandoned_projects(shutil.which("docker") or "docker")
    chosen = files or compose_files()
    profiles = PROFILES_OFFLINE if offline else ()
    name = project or f"mdp-e2e-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    variables = port_variables(chosen)
    ports = dict(zip(variables, free_ports(len(variables)), strict=True))
    endpoints = endpoints_for(name, ports, offline=offline)
    env = compose_environment(ports, name, image_tag)
    compose = DockerCompose(
        context=str(REPO_ROOT),
        compose_file_name=chosen,
        build=build,
        wait=True,
        profiles=list(profiles) or None,
    )
    running = ComposePlatform(
        endpoints, chosen, env, profiles, docker=shutil.which("docker") or "docker"
    )
    with _environ(env):
        if build and offline:
            # One-shot services are in the `client` profile, which `up` leaves out:
            # build them too, or `run` would use a stale image.
            running.compose("build", "test-client", profiles=("client",), timeout_s=1800)
        try:
            compose.start()
        except subprocess.CalledProcessError:
            _print_logs(compose)
            compose.stop(down=True)
            raise
        _ACTIVE.append(running)
        try:
            running.wait_pipeline_served()
            yield running
        finally:
            _ACTIVE.remove(running)
            compose.stop(down=True)


@contextlib.contextmanager
def compose_platform(
    *,
    offline: bool = True,
    build: bool = True,
    project: str | None = None,
    image_tag: str | None = None,
) -> Iterator[ComposeEndpoints]:
    """``compose_session()``, yielding only the endpoints."""
    with compose_session(
        offline=offline, build=build, project=project, image_tag=image_tag
    ) as running:
        yield running.endpoints


def _print_logs(compose: Any) -> None:
    """Container logs on a failed start: the only trace of why a service was unhealthy."""
    try:
        stdout, stderr = compose.get_logs()
    except subprocess.CalledProcessError:
        return
    tail = (stdout + stderr).splitlines()[-400:]
    print("\n".join(["----- docker compose logs (tail) -----", *tail]), file=sys.stderr)


@pytest.fixture(scope="session")
def compose_stack() -> Iterator[ComposePlatform]:
    """The compose platform for the whole session (skips without a Docker engine,
    fails without one when ``CI`` is true), recording the e2e suite's markets."""
    with compose_session(files=[*compose_files(), E2E_OVERRIDES]) as running:
        yield running
