"""SparkSession from the pipeline config: jars, Iceberg REST catalog, small-machine defaults."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from py4j.protocol import Py4JNetworkError  # type: ignore[import-untyped]

from mdproto.runtime.processes import process_alive
from pipeline.config import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

ICEBERG_EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
ICEBERG_CATALOG = "org.apache.iceberg.spark.SparkCatalog"
# Dispatches by scheme: S3FileIO for the warehouse (s3://), HadoopFileIO for file:
# paths. Iceberg 1.10's streaming source writes its initial offset into the
# checkpoint through the table's FileIO (apache/iceberg#14762, fixed after 1.10.1);
# plain S3FileIO fails on a local checkpoint with "Invalid S3 URI".
RESOLVING_FILE_IO = "org.apache.iceberg.io.ResolvingFileIO"
REQUIRED_JARS = ("spark-sql-kafka-0-10", "iceberg-spark-runtime", "iceberg-aws-bundle")
#: What an ``s3a://`` checkpoint_dir needs besides: Hadoop's S3A file system, the AWS
#: SDK's transfer manager it uploads with (the rest of the SDK is iceberg-aws-bundle's),
#: and Spark's checkpoint manager that writes without a rename (docs/adr/0022).
S3A_JARS = ("hadoop-aws", "s3-transfer-manager", "spark-hadoop-cloud")
#: The catalog's access key and secret, nothing else (no instance metadata, no env).
S3A_STATIC_KEYS = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
#: Writes each checkpoint file straight to its name through an abortable stream: no
#: temporary file and rename (on S3 a copy and a delete), no half-written file seen.
S3A_CHECKPOINT_MANAGER = (
    "org.apache.spark.internal.io.cloud.AbortableStreamBasedCheckpointFileManager"
)
#: A local checkpoint_dir's writer (docs/adr/0027): Spark's FileSystem-based manager.
#: Spark's default, FileContext's, spawns `readlink` and `chmod` processes for every
#: checkpoint file where Hadoop's native library is absent (pyspark ships none); this
#: one spawns a fifth as many.
LOCAL_CHECKPOINT_MANAGER = (
    "org.apache.spark.sql.execution.streaming.FileSystemBasedCheckpointFileManager"
)
#: S3A's retries of a failing checkpoint read or write, and the AWS SDK's attempts inside
#: each: few, so a store that refuses connections fails the query within seconds and it
#: restarts from its checkpoint with the pipeline's own backoff (``restart.*``, logged and
#: counted), instead of holding its batch silently through Hadoop's defaults (7 retries
#: of 5 attempts: minutes, docs/adr/0022). Throttling keeps Hadoop's own, longer retries.
S3A_RETRY_LIMIT = 2
S3A_SDK_ATTEMPTS = 2
LOOPBACK = "127.0.0.1"


class SessionConfigError(RuntimeError):
    """The config cannot give a working SparkSession (e.g. the jars are missing)."""


def under_spark_submit() -> bool:
    """spark-submit starts the JVM first and hands Python its gateway port."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def resolve_jars(settings: Settings) -> list[str]:
    jars = [str(Path(j).expanduser()) for j in settings.spark.jars]
    if settings.spark.jars_dir:
        directory = Path(settings.spark.jars_dir).expanduser()
        if not directory.is_dir():
            raise SessionConfigError(
                f"spark.jars_dir {directory} is not a directory "
                "(resolve the jars with `python -m infra.artifacts`)"
            )
        jars += sorted(str(p) for p in directory.glob("*.jar"))
    missing_files = [j for j in jars if not Path(j).is_file()]
    if missing_files:
        raise SessionConfigError(f"spark.jars lists files that do not exist: {missing_files}")
    names = " ".join(Path(j).name for j in jars)
    required = REQUIRED_JARS + (S3A_JARS if checkpoints_on_s3(settings) else ())
    absent = [r for r in required if r not in names]
    if absent:
        raise SessionConfigError(
            f"no {', '.join(absent)} jar in spark.jars / spark.jars_dir ({jars or 'empty'}): "
            "the Kafka source, Iceberg runtime and S3A file system are Maven artifacts "
            "(`python -m infra.artifacts` puts them in .cache/spark)"
        )
    return jars


def checkpoints_on_s3(settings: Settings) -> bool:
    """Whether Spark's checkpoints go to the S3 store (``s3a://``, Hadoop's S3A)."""
    return settings.checkpoint_dir.startswith("s3a://")


def s3a_conf(settings: Settings) -> dict[str, str]:
    """Hadoop's S3A settings for an ``s3a://`` checkpoint_dir, from the pipeline's one set
    of S3 settings (``catalog.s3_*``, which Iceberg and pyarrow use too); none otherwise.
    """
    if not checkpoints_on_s3(settings):
        return {}
    c = settings.catalog
    hadoop = "spark.hadoop.fs.s3a"
    return {
        f"{hadoop}.endpoint": c.s3_endpoint,
        f"{hadoop}.endpoint.region": c.s3_region,
        f"{hadoop}.path.style.access": "true",
        f"{hadoop}.connection.ssl.enabled": str(c.s3_endpoint.startswith("https:")).lower(),
        f"{hadoop}.aws.credentials.provider": S3A_STATIC_KEYS,
        f"{hadoop}.access.key": c.s3_access_key,
        f"{hadoop}.secret.key": c.s3_secret_key,
        f"{hadoop}.retry.limit": str(S3A_RETRY_LIMIT),
        f"{hadoop}.attempts.maximum": str(S3A_SDK_ATTEMPTS),
        "spark.sql.streaming.checkpointFileManagerClass": S3A_CHECKPOINT_MANAGER,
    }


def local_checkpoint_conf(settings: Settings) -> dict[str, str]:
    """The checkpoint manager for a local checkpoint_dir; none for an ``s3a://`` one
    (`s3a_conf` has its own)."""
    if checkpoints_on_s3(settings):
        return {}
    return {"spark.sql.streaming.checkpointFileManagerClass": LOCAL_CHECKPOINT_MANAGER}


def spark_conf(settings: Settings, *, include_launch: bool = True) -> dict[str, str]:
    """Every Spark setting the pipeline needs.

    ``include_launch`` adds what only applies when we start the JVM (master, jars,
    driver memory); under spark-submit those come from its command line.
    """
    c = settings.catalog
    prefix = f"spark.sql.catalog.{c.name}"
    conf = {
        "spark.app.name": settings.spark.app_name,
        "spark.sql.extensions": ICEBERG_EXTENSIONS,
        prefix: ICEBERG_CATALOG,
        f"{prefix}.type": "rest",
        f"{prefix}.uri": c.uri,
        f"{prefix}.warehouse": c.warehouse,
        f"{prefix}.io-impl": RESOLVING_FILE_IO,
        f"{prefix}.s3.endpoint": c.s3_endpoint,
        f"{prefix}.s3.path-style-access": "true",
        f"{prefix}.s3.access-key-id": c.s3_access_key,
        f"{prefix}.s3.secret-access-key": c.s3_secret_key,
        f"{prefix}.client.region": c.s3_region,
        # Read table metadata fresh: notifications carry the snapshot just committed.
        f"{prefix}.cache-enabled": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(settings.spark.shuffle_partitions),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
        "spark.scheduler.mode": "FAIR",
        **s3a_conf(settings),
        **local_checkpoint_conf(settings),
    }
    if include_launch:
        conf["spark.scheduler.allocation.file"] = str(scheduler_pools_file())
        conf["spark.master"] = settings.spark.master
        conf["spark.driver.memory"] = settings.spark.driver_memory
        jars = resolve_jars(settings)
        conf["spark.jars"] = ",".join(jars)
        conf["spark.local.dir"] = str(driver_scratch(Path(settings.spark.scratch_dir)))
        if settings.spark.master.startswith("local"):
            conf["spark.driver.host"] = LOOPBACK
            conf["spark.driver.bindAddress"] = LOOPBACK
    conf.update(settings.spark.conf)
    return conf


def driver_scratch(root: Path) -> Path:
    """This process's scratch directory under ``root``, after removing dead drivers'.

    Spark deletes its scratch only on a clean JVM exit; a killed driver leaves a copy of
    every jar it served behind, and restarts would fill the disk."""
    root.mkdir(parents=True, exist_ok=True)
    for child in root.glob("driver-*"):
        pid = child.name.removeprefix("driver-")
        if pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(child, ignore_errors=True)
    mine = root.resolve() / f"driver-{os.getpid()}"
    mine.mkdir(exist_ok=True)
    return mine


BACKGROUND_POOL = "background"  # table upkeep, market metadata: the other queries first
#: What a py4j call raises once Spark's JVM has gone (its shutdown hook ran first at a
#: SIGTERM to the process group, or it died): the answer cut off, or no one listening.
JVM_GONE: tuple[type[BaseException], ...] = (Py4JNetworkError, ConnectionError)
_POOLS = f"""<?xml version="1.0"?>
<allocations>
  <pool name="default">
    <schedulingMode>FIFO</schedulingMode><weight>10</weight><minShare>0</minShare>
  </pool>
  <pool name="{BACKGROUND_POOL}">
    <schedulingMode>FIFO</schedulingMode><weight>1</weight><minShare>0</minShare>
  </pool>
</allocations>
"""


def scheduler_pools_file() -> Path:
    """FAIR pools: history and the live stores' tasks go before upkeep's and markets'.

    One file per machine, not a directory per start (tests start hundreds): written
    beside and renamed over, so concurrent starts never read half of it."""
    path = Path(tempfile.gettempdir()) / "mdp-pipeline-fairscheduler.xml"
    if not path.exists() or path.read_text() != _POOLS:
        partial = path.with_name(f"{path.name}.{os.getpid()}")
        partial.write_text(_POOLS)
        partial.replace(path)
    return path


def build_session(settings: Settings) -> SparkSession:
    """Start (or, under spark-submit, attach to) Spark with the pipeline's settings."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    launching = not under_spark_submit()
    if launching:
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        if settings.spark.master.startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in spark_conf(settings, include_launch=launching).items():
        builder = builder.config(key, value)
    spark: SparkSession = builder.getOrCreate()
    level = os.environ.get("SPARK_LOG_LEVEL", "WARN")
    spark.sparkContext.setLogLevel(level)
    if level.upper() == "WARN":
        quiet_expected_warnings(spark)
    master = spark.sparkContext.master or ""
    if not master.startswith("local"):
        ship_python_packages(spark)
    log.info("Spark %s up, master %s", spark.version, master)
    return spark


#: Loggers whose warnings restate the pipeline's design, once per batch or query start:
#: the history query's 0.1 s trigger runs its batches back to back on purpose ("Current
#: batch is falling behind"), and streaming queries never use adaptive execution. Batch
#: durations are in the pipeline's own progress lines and metrics.
EXPECTED_WARNINGS = (
    "org.apache.spark.sql.execution.streaming.ProcessingTimeExecutor",
    "org.apache.spark.sql.execution.streaming.ResolveWriteToStream",
)


def quiet_expected_warnings(spark: SparkSession) -> None:
    """`EXPECTED_WARNINGS`' loggers at ERROR (SPARK_LOG_LEVEL=INFO or DEBUG keeps them)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    configurator = jvm.org.apache.logging.log4j.core.config.Configurator
    error = jvm.org.apache.logging.log4j.Level.ERROR
    for name in EXPECTED_WARNINGS:
        configurator.setLevel(name, error)


def ship_python_packages(spark: SparkSession) -> Path:
    """Zip `pipeline` and `mdproto` for executors on other hosts (their Python workers
    import `pipeline.records` for mapInArrow); protobuf and pyarrow must be installed there.
    """
    import mdproto
    import pipeline

    target = Path(tempfile.mkdtemp(prefix="pipeline-pyfiles-")) / "pipeline-packages.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for package in (pipeline, mdproto):
            assert package.__file__ is not None
            root = Path(package.__file__).resolve().parent
            for path in root.rglob("*.py"):
                archive.write(path, Path(root.name) / path.relative_to(root))
    spark.sparkContext.addPyFile(str(target))
    log.info("shipped pipeline + mdproto to executors as %s", target)
    return target


def jvm_pid(spark: SparkSession) -> int | None:
    """The driver JVM's pid (None if it cannot be read)."""
    try:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        return int(jvm.java.lang.ProcessHandle.current().pid())
    except Exception:
        return None
