"""Spark settings derived from the config (no JVM started)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config import Settings
from pipeline.session import (
    LOCAL_CHECKPOINT_MANAGER,
    S3A_CHECKPOINT_MANAGER,
    S3A_JARS,
    SessionConfigError,
    driver_scratch,
    resolve_jars,
    spark_conf,
)

JARS = (
    "spark-sql-kafka-0-10_2.13-4.0.4.jar",
    "iceberg-spark-runtime-4.0_2.13-1.10.1.jar",
    "iceberg-aws-bundle-1.10.1.jar",
)


@pytest.fixture
def jars_dir(tmp_path: Path) -> Path:
    for name in JARS:
        (tmp_path / name).write_bytes(b"")
    return tmp_path


def test_catalog_and_launch_settings(jars_dir: Path, tmp_path: Path) -> None:
    settings = Settings.model_validate(
        {
            "spark": {
                "jars_dir": str(jars_dir),
                "master": "local[2]",
                "scratch_dir": str(tmp_path / "scratch"),
                "conf": {"spark.ui.enabled": "true"},
            },
            "catalog": {"uri": "http://cat:1", "s3_endpoint": "http://s3:2"},
        }
    )

    conf = spark_conf(settings)

    assert conf["spark.sql.catalog.lake"] == "org.apache.iceberg.spark.SparkCatalog"
    assert conf["spark.sql.catalog.lake.uri"] == "http://cat:1"
    assert conf["spark.sql.catalog.lake.s3.endpoint"] == "http://s3:2"
    assert conf["spark.sql.catalog.lake.cache-enabled"] == "false"
    assert conf["spark.master"] == "local[2]"
    assert conf["spark.driver.bindAddress"] == "127.0.0.1"
    assert sorted(Path(j).name for j in conf["spark.jars"].split(",")) == sorted(JARS)
    assert conf["spark.ui.enabled"] == "true"  # spark.conf wins
    assert conf["spark.local.dir"] == str(tmp_path.resolve() / "scratch" / f"driver-{os.getpid()}")


def test_a_start_removes_only_the_scratch_of_drivers_no_longer_running(tmp_path: Path) -> None:
    exited = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    dead = tmp_path / f"driver-{exited.stdout.strip()}"
    (dead / "userFiles").mkdir(parents=True)
    (dead / "userFiles" / "iceberg.jar").write_bytes(b"jar")
    with subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    ) as running:
        live = tmp_path / f"driver-{running.pid}"
        live.mkdir()
        unrelated = tmp_path / "notes"
        unrelated.mkdir()

        mine = driver_scratch(tmp_path)

        assert mine == tmp_path.resolve() / f"driver-{os.getpid()}" and mine.is_dir()
        assert not dead.exists()
        assert live.is_dir() and unrelated.is_dir()
        assert running.stdin is not None
        running.stdin.close()


def test_under_spark_submit_launch_settings_are_left_to_it(jars_dir: Path) -> None:
    settings = Settings.model_validate({"spark": {"master": "spark://m:7077"}})
    conf = spark_conf(settings, include_launch=False)
    assert "spark.master" not in conf and "spark.jars" not in conf


def test_missing_jars_are_explained(tmp_path: Path) -> None:
    (tmp_path / JARS[0]).write_bytes(b"")
    settings = Settings.model_validate({"spark": {"jars_dir": str(tmp_path)}})
    with pytest.raises(SessionConfigError, match="iceberg-spark-runtime, iceberg-aws-bundle"):
        resolve_jars(settings)
    with pytest.raises(SessionConfigError, match="not a directory"):
        resolve_jars(Settings.model_validate({"spark": {"jars_dir": str(tmp_path / "nope")}}))
    with pytest.raises(SessionConfigError, match="do not exist"):
        resolve_jars(Settings.model_validate({"spark": {"jars": [str(tmp_path / "x.jar")]}}))


def test_an_s3a_checkpoint_dir_gets_s3a_settings_from_the_catalogs_s3_store(
    jars_dir: Path,
) -> None:
    """One home for the S3 settings: the catalog section's, for Iceberg and S3A alike."""
    catalog = {
        "s3_endpoint": "http://minio:9000",
        "s3_access_key": "ak",
        "s3_secret_key": "sk",
        "s3_region": "eu-west-1",
    }
    on_s3 = Settings.model_validate(
        {"catalog": catalog, "checkpoint_dir": "s3a://warehouse/checkpoints"}
    )
    conf = spark_conf(on_s3, include_launch=False)
    prefix = "spark.hadoop.fs.s3a."
    assert {k.removeprefix(prefix): v for k, v in conf.items() if k.startswith(prefix)} == {
        "endpoint": "http://minio:9000",
        "endpoint.region": "eu-west-1",
        "path.style.access": "true",
        "connection.ssl.enabled": "false",
        "aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
        "access.key": "ak",
        "secret.key": "sk",
        "retry.limit": "2",
        "attempts.maximum": "2",
    }
    assert conf["spark.sql.streaming.checkpointFileManagerClass"] == S3A_CHECKPOINT_MANAGER
    patient = Settings.model_validate(
        {
            "catalog": catalog,
            "checkpoint_dir": "s3a://warehouse/checkpoints",
            "spark": {"conf": {f"{prefix}retry.limit": "7"}},
        }
    )
    assert spark_conf(patient, include_launch=False)[f"{prefix}retry.limit"] == "7"
    local = Settings.model_validate({"catalog": catalog})
    assert not [k for k in spark_conf(local, include_launch=False) if "s3a" in k]


def test_a_local_checkpoint_dir_is_written_by_the_file_system_manager() -> None:
    """Spark's FileSystem-based manager (docs/adr/0027), not its FileContext default, which
    spawns readlink and chmod processes for every checkpoint file."""
    conf = spark_conf(Settings.model_validate({}), include_launch=False)
    assert conf["spark.sql.streaming.checkpointFileManagerClass"] == LOCAL_CHECKPOINT_MANAGER


def test_an_s3a_checkpoint_dir_needs_the_s3a_jars(jars_dir: Path) -> None:
    on_s3 = {"spark": {"jars_dir": str(jars_dir)}, "checkpoint_dir": "s3a://b/checkpoints"}
    with pytest.raises(
        SessionConfigError, match="hadoop-aws, s3-transfer-manager, spark-hadoop-cloud"
    ):
        resolve_jars(Settings.model_validate(on_s3))
    for name in S3A_JARS:
        (jars_dir / f"{name}-1.jar").write_bytes(b"")
    assert len(resolve_jars(Settings.model_validate(on_s3))) == len(JARS) + len(S3A_JARS)
