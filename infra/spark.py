"""A small local SparkSession wired to a stack (Kafka source + Iceberg REST catalog).

Kept small on purpose (2 cores shared by several engineers): no UI, two shuffle
partitions, 1 GiB driver. ``PYSPARK_PYTHON`` is forced to the running
interpreter, or Python workers start the system python and fail to connect back.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from infra.localstack.config import LOOPBACK
from infra.localstack.endpoints import StackEndpoints
from infra.versions import load_versions

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOCAL_DEFAULTS: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.driver.memory": "1g",
    "spark.driver.host": LOOPBACK,
    "spark.driver.bindAddress": LOOPBACK,
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
}


def check_pyspark_version() -> str:
    """Fail early if pyspark does not match the Spark version the jars were pinned for."""
    import pyspark

    expected = load_versions().spark
    if pyspark.__version__ != expected:
        raise RuntimeError(
            f"pyspark {pyspark.__version__} is installed but the Spark jars are pinned for "
            f"{expected} (infra/maven/pom.xml): align constraints.txt and the pom"
        )
    return expected


def local_spark_conf(
    endpoints: StackEndpoints,
    *,
    warehouse_dir: Path | None = None,
    extra_conf: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Everything a local SparkSession needs: small-machine defaults + the stack's conf."""
    conf = dict(LOCAL_DEFAULTS)
    conf.update(endpoints.spark_conf())
    if warehouse_dir is not None:
        # Spark's built-in catalog would otherwise create spark-warehouse/ in the cwd.
        conf["spark.sql.warehouse.dir"] = str(warehouse_dir)
    conf.update(extra_conf or {})
    return conf


def local_spark_session(
    endpoints: StackEndpoints,
    *,
    app_name: str = "infra-local",
    master: str = "local[2]",
    warehouse_dir: Path | None = None,
    extra_conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Create (or return the process's existing) SparkSession wired to the stack.

    Spark allows one SparkContext per process: settings that only apply at JVM
    start (jars, driver memory) are fixed by the first call.
    """
    check_pyspark_version()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # Keep Spark on loopback (it would pick the first non-loopback interface).
    os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in local_spark_conf(
        endpoints, warehouse_dir=warehouse_dir, extra_conf=extra_conf
    ).items():
        builder = builder.config(key, value)
    session: SparkSession = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
