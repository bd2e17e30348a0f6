"""Spark drivers' class archive (infra/spark_class_archive.py): one per JDK and jars,
and a real driver maps it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from infra import spark_class_archive
from infra.spark_class_archive import archive_key

JARS = [("spark-core.jar", 100, 1), ("scala-library.jar", 200, 2)]


def test_one_archive_per_jdk_and_per_set_of_jars() -> None:
    key = archive_key("openjdk 17.0.15", JARS)
    assert archive_key("openjdk 17.0.15", list(reversed(JARS))) == key  # listing order
    assert archive_key("openjdk 17.0.16", JARS) != key
    assert archive_key("openjdk 17.0.15", [JARS[0], ("scala-library.jar", 200, 3)]) != key
    assert archive_key("openjdk 17.0.15", JARS[:1]) != key


def test_apply_adds_the_option_once_and_keeps_what_was_there(tmp_path: Path) -> None:
    archive = spark_class_archive.archive_path(tmp_path)
    env = {spark_class_archive.OPTS_ENV: "-Dkeep=1"}
    assert not spark_class_archive.apply(env, tmp_path)  # none made: nothing changes
    assert env == {spark_class_archive.OPTS_ENV: "-Dkeep=1"}
    archive.parent.mkdir(parents=True)
    archive.touch()
    assert spark_class_archive.apply(env, tmp_path)
    assert spark_class_archive.apply(env, tmp_path)
    assert env[spark_class_archive.OPTS_ENV] == f"-Dkeep=1 -XX:SharedArchiveFile={archive}"


@pytest.mark.spark
def test_a_spark_driver_maps_the_archive() -> None:
    """-Xshare:on makes the JVM refuse to start unless it maps the archive: a driver
    that answers a query used it. `make jars` made it (here: found, or made now)."""
    archive = spark_class_archive.ensure_archive(print)
    script = textwrap.dedent(
        """
        import os, sys
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        from pyspark.sql import SparkSession
        builder = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
        spark = builder.getOrCreate()
        print("answer", spark.range(10).count())
        spark.stop()
        """
    )
    env = dict(os.environ)
    env[spark_class_archive.OPTS_ENV] = f"-Xshare:on -XX:SharedArchiveFile={archive}"
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert "answer 10" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
