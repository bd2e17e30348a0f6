"""Unit tests of the stack's pure parts: config sources, endpoints, generated configs."""

from __future__ import annotations

import os
import random
import shutil
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from infra.localstack import KafkaSettings, Ports, StackConfig, endpoints_for
from infra.localstack.components import (
    IcebergRest,
    Kafka,
    NotReadyError,
    SeaweedFS,
    base_env,
    check_disk_for_weed,
)
from infra.localstack.config import REPO_ROOT
from infra.localstack.process import StackError


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests must not see a developer's own INFRA_STACK_* settings."""
    import os

    for key in list(os.environ):
        if key.startswith("INFRA_STACK_"):
            monkeypatch.delenv(key)


def test_defaults() -> None:
    cfg = StackConfig()
    assert cfg.data_dir == REPO_ROOT / ".data"
    assert (cfg.ports.kafka, cfg.ports.s3, cfg.ports.catalog) == (9092, 8333, 8181)
    assert cfg.kafka.num_partitions == 6  # = the services' kafka.topic_partitions (ADR 0014)
    assert cfg.kafka.auto_create_topics is True


def test_env_overrides(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("INFRA_STACK_PORTS__KAFKA", "19092")
    monkeypatch.setenv("INFRA_STACK_KAFKA__NUM_PARTITIONS", "7")
    monkeypatch.setenv("INFRA_STACK_DATA_DIR", str(tmp_path))
    cfg = StackConfig()
    assert cfg.ports.kafka == 19092
    assert cfg.ports.s3 == 8333  # untouched fields keep their defaults
    assert cfg.kafka.num_partitions == 7
    assert cfg.data_dir == tmp_path


def test_precedence_init_over_env_over_yaml(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    yaml_file = tmp_path / "stack.yaml"
    yaml_file.write_text("ports:\n  kafka: 20000\n  s3: 20001\nkafka:\n  num_partitions: 5\n")
    cfg = StackConfig.load(yaml_file)
    assert (cfg.ports.kafka, cfg.ports.s3, cfg.kafka.num_partitions) == (20000, 20001, 5)

    monkeypatch.setenv("INFRA_STACK_KAFKA__NUM_PARTITIONS", "9")
    assert StackConfig.load(yaml_file).kafka.num_partitions == 9

    monkeypatch.setenv("INFRA_STACK_CONFIG", str(yaml_file))
    cfg = StackConfig.load(data_dir=tmp_path / "d")
    assert cfg.ports.kafka == 20000
    assert cfg.data_dir == tmp_path / "d"


def test_missing_yaml_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        StackConfig.load(tmp_path / "nope.yaml")


def test_ports_must_be_distinct_and_valid() -> None:
    with pytest.raises(ValidationError, match="distinct"):
        Ports(kafka=9000, s3=9000)
    with pytest.raises(ValidationError):
        Ports(kafka=70000)


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = Ports.free()
    values = list(ports.model_dump().values())
    assert len(set(values)) == len(values) == len(Ports.model_fields)
    for port in values:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))


def test_endpoints_and_client_configs(tmp_path: Path) -> None:
    cfg = StackConfig(data_dir=tmp_path, ports=Ports(kafka=1111, s3=2222, catalog=3333))
    e = endpoints_for(cfg)
    assert e.kafka_bootstrap == "127.0.0.1:1111"
    assert e.s3_endpoint == "http://127.0.0.1:2222"
    assert e.catalog_uri == "http://127.0.0.1:3333"
    assert e.warehouse == "s3://warehouse/lake"

    props = e.pyiceberg_catalog_properties()
    assert props["type"] == "rest"
    assert props["uri"] == e.catalog_uri
    assert props["s3.path-style-access"] == "true"
    assert props["s3.region"] == "us-east-1"

    conf = e.spark_conf(jars=[Path("/j/a.jar"), Path("/j/b.jar")])
    assert conf["spark.jars"] == "/j/a.jar,/j/b.jar"
    assert conf["spark.sql.catalog.lake"] == "org.apache.iceberg.spark.SparkCatalog"
    assert conf["spark.sql.catalog.lake.type"] == "rest"
    assert conf["spark.sql.catalog.lake.uri"] == e.catalog_uri
    assert conf["spark.sql.catalog.lake.s3.endpoint"] == e.s3_endpoint
    assert "IcebergSparkSessionExtensions" in conf["spark.sql.extensions"]

    assert type(e).from_json(e.to_json()) == e


def test_kafka_properties_follow_config(tmp_path: Path) -> None:
    cfg = StackConfig(
        data_dir=tmp_path,
        ports=Ports(kafka=4001, kafka_controller=4002),
        kafka=KafkaSettings(num_partitions=6, extra_properties={"log.retention.hours": "1"}),
    )
    props = Kafka(cfg, endpoints_for(cfg)).server_properties()
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:4001,CONTROLLER://127.0.0.1:4002"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:4002"
    assert props["num.partitions"] == "6"
    assert props["auto.create.topics.enable"] == "true"
    assert props["log.dirs"] == str(tmp_path / "kafka" / "data")
    assert props["log.retention.hours"] == "1"


def _fixture_property(env_name: str) -> str:
    """The REST fixture's env-to-property rule: strip CATALOG_, __ is -, _ is ., lowercase."""
    return env_name.removeprefix("CATALOG_").replace("__", "-").replace("_", ".").lower()


def test_iceberg_rest_env_maps_to_catalog_properties(tmp_path: Path) -> None:
    cfg = StackConfig(data_dir=tmp_path)
    env = IcebergRest(cfg, endpoints_for(cfg)).catalog_env()
    props = {_fixture_property(k): v for k, v in env.items() if k.startswith("CATALOG_")}
    assert props["catalog-impl"] == "org.apache.iceberg.jdbc.JdbcCatalog"
    assert props["uri"] == f"jdbc:postgresql://127.0.0.1:{cfg.ports.catalog_db}/catalog"
    assert props["jdbc.user"] == cfg.catalog_db_user
    assert props["io-impl"] == "org.apache.iceberg.aws.s3.S3FileIO"
    assert props["s3.path-style-access"] == "true"
    assert props["s3.access-key-id"] == cfg.s3_access_key
    assert props["s3.endpoint"] == "http://127.0.0.1:8333"
    assert props["client.region"] == "us-east-1"
    assert props["rest.port"] == "8181"
    assert props["warehouse"] == "s3://warehouse/lake"
    assert env["REST_HOST"] == "127.0.0.1"  # not every interface, as upstream's server
    # What clients are told at GET /v1/config (CatalogServer.java's CLIENT_* rule).
    client = {
        _fixture_property(k.removeprefix("CLIENT_")): v
        for k, v in env.items()
        if k.startswith("CLIENT_")
    }
    assert client["s3.endpoint"] == props["s3.endpoint"]
    assert client["s3.access-key-id"] == cfg.s3_access_key
    assert client["s3.region"] == client["client.region"] == "us-east-1"


def test_weed_command_pins_every_port_to_loopback(tmp_path: Path) -> None:
    cfg = StackConfig(data_dir=tmp_path, ports=Ports.free())
    comp = SeaweedFS(cfg, endpoints_for(cfg))
    argv, env = comp.command()
    flags = dict(a.lstrip("-").split("=", 1) for a in argv[2:])
    assert flags["ip"] == flags["ip.bind"] == "127.0.0.1"
    assert flags["s3.port.iceberg"] == "0"  # its own catalog would take :8181
    pinned = {int(v) for k, v in flags.items() if k.endswith((".port", ".port.grpc"))}
    assert pinned == set(comp.ports.values())
    assert env["AWS_ACCESS_KEY_ID"] == cfg.s3_access_key


def test_base_env_drops_variables_that_would_reconfigure_components(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CATALOG_WAREHOUSE", "s3://elsewhere")
    monkeypatch.setenv("AWS_PROFILE", "prod")
    monkeypatch.setenv("KEEP_ME", "1")
    env = base_env()
    assert "CATALOG_WAREHOUSE" not in env
    assert "AWS_PROFILE" not in env
    assert env["KEEP_ME"] == "1"


def test_a_nearly_full_disk_is_refused_before_seaweedfs_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    gib = 1 << 30

    def usage(total: int, free: int) -> SimpleNamespace:
        return SimpleNamespace(total=total, used=total - free, free=free)

    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(252 * gib, 2 * gib))
    with pytest.raises(StackError, match=r"only 2\.0 GiB free .*needs 3\.5 GiB"):
        check_disk_for_weed(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(252 * gib, 52 * gib))
    check_disk_for_weed(tmp_path)  # plenty: no error


# `weed mini`'s own lines (SeaweedFS 4.48), from a test stack whose admin port
# another stack's process took between the free-port check and the bind.
WEED_ADMIN_PORT_TAKEN = """
===== 2026-11-28 00:21:16 starting seaweedfs: weed mini -admin.port=41525
  S3           ready     0.2s
  Admin        starting
E1128 00:21:17.220396 mini.go:1673 Admin server error: admin server: listen tcp \
127.0.0.1:41525: bind: address already in use
  Admin        stopped   0.1s
"""
WEED_ALL_UP = """
===== 2026-11-28 00:21:16 starting seaweedfs: weed mini -admin.port=33335
  S3           ready     0.2s
  Admin        starting
  Admin        ready     0.5s
  All enabled components are running and ready to use:
"""


def test_seaweedfs_is_ready_only_when_its_admin_server_is_up(tmp_path: Path) -> None:
    """S3 answers before the admin server binds; a lost admin port kills weed 240 s later."""
    cfg = StackConfig(data_dir=tmp_path)
    comp = SeaweedFS(cfg, endpoints_for(cfg))
    comp.log_file.parent.mkdir(parents=True)
    log_until_admin = WEED_ALL_UP.split("  Admin        ready")[0]
    comp.log_file.write_text(log_until_admin)
    with pytest.raises(NotReadyError, match="admin server"):
        comp.check_started_log()
    comp.log_file.write_text(WEED_ALL_UP)
    comp.check_started_log()
    # A later start's conflict counts; the earlier start's success does not hide it.
    comp.log_file.write_text(WEED_ALL_UP + WEED_ADMIN_PORT_TAKEN)
    with pytest.raises(StackError, match="address already in use"):
        comp.check_started_log()
    # ... and an earlier start's conflict is history once a start succeeded.
    comp.log_file.write_text(WEED_ADMIN_PORT_TAKEN + WEED_ALL_UP)
    comp.check_started_log()


def test_free_ports_come_from_below_the_ephemeral_range_and_skip_taken_ones() -> None:
    """Outgoing connections take local ports in the ephemeral range: a server port
    picked there could be taken before its server binds it, or while a test restarts it."""
    import random

    from infra.localstack.config import ephemeral_low, free_ports

    first = free_ports(1, random.Random(7))[0]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first))
        taken.listen()
        ports = free_ports(20, random.Random(7))
    assert first not in ports
    assert len(set(ports)) == 20
    assert all(1024 <= p < ephemeral_low() for p in ports)
    assert all(p < ephemeral_low() for p in Ports.free().model_dump().values())


def test_each_test_worker_picks_ports_in_its_own_part_of_the_range() -> None:
    """A port one worker picked and binds later must never be another worker's pick."""
    from infra.localstack.config import pick_range

    whole = pick_range(32768, 12_000, None)
    assert whole == range(20768, 32768)
    parts = [pick_range(32768, 12_000, f"{k}/3") for k in range(3)]
    assert [len(p) for p in parts] == [4000, 4000, 4000]
    assert all(set(a).isdisjoint(b) for i, a in enumerate(parts) for b in parts[i + 1 :])
    assert all(set(p) <= set(whole) for p in parts)
    assert pick_range(2000, 12_000, None) == range(1024, 2000)
    for bad in ("3/3", "x", "1-3"):
        with pytest.raises(ValueError, match="MDP_PORT_SLICE"):
            pick_range(32768, 12_000, bad)


def test_free_ports_keep_to_the_workers_part(monkeypatch: pytest.MonkeyPatch) -> None:
    from infra.localstack.config import PICK_SPAN, PORT_SLICE_ENV, ephemeral_low, free_ports

    monkeypatch.setenv(PORT_SLICE_ENV, "2/4")
    low = max(1024, ephemeral_low() - PICK_SPAN)
    width = (ephemeral_low() - low) // 4
    assert all(low + 2 * width <= p < low + 3 * width for p in free_ports(50))


def test_the_pytest_plugin_gives_each_xdist_worker_its_part() -> None:
    from infra.localstack.config import PORT_SLICE_ENV

    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:  # one process: the whole range is its own
        assert PORT_SLICE_ENV not in os.environ
        return
    count = os.environ["PYTEST_XDIST_WORKER_COUNT"]
    assert os.environ[PORT_SLICE_ENV] == f"{worker.removeprefix('gw')}/{count}"


def test_a_port_handed_out_is_not_handed_out_again_before_it_is_bound() -> None:
    """A platform picks its services' ports and its stack's in two calls; neither binds
    before both have picked (CI: a relay and a stack component got the same port)."""
    from infra.localstack.config import free_ports

    first = free_ports(30)
    second = free_ports(30)  # nothing bound meanwhile
    assert not set(first) & set(second)
    assert len(set(first)) == len(set(second)) == 30


def test_the_picks_go_round_the_range_and_skip_what_is_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from infra.localstack import config

    monkeypatch.setattr(config, "_CURSORS", {})
    monkeypatch.setattr(config, "ephemeral_low", lambda: 20_010)
    monkeypatch.setattr(config, "PICK_SPAN", 10)  # ports 20000-20009
    monkeypatch.delenv(config.PORT_SLICE_ENV, raising=False)
    monkeypatch.setattr(config, "_bindable", lambda port: port != 20_004)
    picked = [config.free_ports(3, random.Random(1)) for _ in range(3)]
    flat = [p for ports in picked for p in ports]
    assert 20_004 not in flat
    assert len(set(flat[:9])) == 9  # every free port once before any comes again
    with pytest.raises(RuntimeError, match="fewer than 10 free ports"):
        config.free_ports(10)
