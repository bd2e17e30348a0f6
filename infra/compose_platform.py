"""The platform as Docker Compose containers, for the end-to-end tests (`make e2e`).

``compose_platform()`` starts ``docker-compose.yml`` (with the ``offline`` profile:
the exchange simulator stands in for Binance) through testcontainers'
``DockerCompose``, waits until every container is healthy, and yields a
``ComposeEndpoints`` saying where the host reaches it. Host ports are free ports
picked at start (``MDP_PORT_*``) and the compose project has its own name, so it
never collides with a ``make up`` stack, the local stack, or another run.

Without a Docker engine (these machines have only the docker CLI) it skips the
calling test with a one-line reason instead of failing: ``docker_unavailable_reason()``.

The e2e suite picks its stack with ``MDP_E2E_STACK`` (``compose`` here; see
``STACK_ENV``); ``compose_stack``, used by e2e/conftest.py, is a session fixture
around ``compose_platform()``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from infra.localstack.endpoints import StackEndpoints
    from infra.platform.supervisor import PlatformEndpoints

REPO_ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = "docker-compose.yml"
STACK_ENV = "MDP_E2E_STACK"
STACK_NAME = "compose"
DOCKER_TIMEOUT_S = 20.0

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
}
HOST = "127.0.0.1"


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
    offline: bool
    s3_access_key: str = S3_ACCESS_KEY
    s3_secret_key: str = S3_SECRET_KEY
    s3_region: str = S3_REGION
    warehouse: str = WAREHOUSE

    @property
    def kafka_bootstrap(self) -> str:
        return f"{self.relay_host}:{self.kafka_port}"

    @property
    def catalog_uri(self) -> str:
        return f"http://{self.relay_host}:{self.catalog_port}"

    @property
    def s3_endpoint(self) -> str:
        return f"http://{self.relay_host}:{self.s3_port}"

    @property
    def exchange_sim_url(self) -> str | None:
        """Base URL of the simulator's REST + control API (offline profile only)."""
        return f"http://{self.relay_host}:{self.exchange_sim_port}" if self.offline else None

    def client_settings(self) -> dict[str, Any]:
        """Keyword overrides for ``mdclient.config.load_settings`` (same keys as its YAML)."""
        return {
            "relay_host": self.relay_host,
            "request_port": self.request_port,
            "market_data_port": self.market_data_port,
            "catalog_uri": self.catalog_uri,
            "warehouse": self.warehouse,
            "s3_endpoint": self.s3_endpoint,
            "s3_access_key_id": self.s3_access_key,
            "s3_secret_access_key": self.s3_secret_key,
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
            stack=self.stack_endpoints(),
        )

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


def free_ports(count: int, host: str = HOST) -> list[int]:
    """Distinct free TCP ports (all held open until every one is chosen)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def compose_environment(
    ports: Mapping[str, int], project: str, image_tag: str | None = None
) -> dict[str, str]:
    """Variables docker-compose.yml reads: project name, bind address, published ports."""
    env = {
        "COMPOSE_PROJECT_NAME": project,
        "MDP_BIND": HOST,
        "MDP_KAFKA_HOST": HOST,
    }
    env.update({PORT_VARIABLES[field]: str(port) for field, port in ports.items()})
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


@contextlib.contextmanager
def compose_platform(
    *,
    offline: bool = True,
    build: bool = True,
    project: str | None = None,
    image_tag: str | None = None,
) -> Iterator[ComposeEndpoints]:
    """Start the compose platform, yield its endpoints, tear it down (volumes too).

    Skips the calling test (``pytest.skip``) when no Docker engine is reachable.
    ``offline`` adds the exchange simulator (no internet needed); ``build`` runs
    ``up --build`` (cached layers make it cheap after ``make e2e``'s build step).
    """
    reason = docker_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    from testcontainers.compose import DockerCompose

    name = project or f"mdp-e2e-{uuid.uuid4().hex[:8]}"
    ports = dict(zip(PORT_VARIABLES, free_ports(len(PORT_VARIABLES)), strict=True))
    endpoints = endpoints_for(name, ports, offline=offline)
    compose = DockerCompose(
        context=str(REPO_ROOT),
        compose_file_name=COMPOSE_FILE,
        build=build,
        wait=True,
        profiles=["offline"] if offline else None,
    )
    with _environ(compose_environment(ports, name, image_tag)):
        try:
            compose.start()
        except subprocess.CalledProcessError:
            _print_logs(compose)
            compose.stop(down=True)
            raise
        try:
            yield endpoints
        finally:
            compose.stop(down=True)


def _print_logs(compose: Any) -> None:
    """Container logs on a failed start: the only trace of why a service was unhealthy."""
    try:
        stdout, stderr = compose.get_logs()
    except subprocess.CalledProcessError:
        return
    tail = (stdout + stderr).splitlines()[-400:]
    print("\n".join(["----- docker compose logs (tail) -----", *tail]), file=sys.stderr)


@pytest.fixture(scope="session")
def compose_stack() -> Iterator[ComposeEndpoints]:
    """The compose platform for the whole session (skips without a Docker engine)."""
    with compose_platform() as endpoints:
        yield endpoints
