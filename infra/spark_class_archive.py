"""Spark drivers start from a class-data-sharing archive of Spark's own classes.

A local Spark driver spends most of its start-up CPU reading, parsing and
verifying the ~10,000 classes of pyspark's jars. Java's AppCDS keeps them
pre-parsed in an archive the JVM maps instead: a driver with the pipeline's jars
took 12.7 CPU-seconds to its first query without it and 6.1 with it on the
2-core machine (docs/development.md, Test durations). The tests start dozens of
drivers, and `make run` one, so the archive is made once, where the jars are
fetched (`python -m infra.artifacts`, i.e. `make jars`), and every driver that
inherits ``SPARK_SUBMIT_OPTS`` from :func:`apply` uses it.

The archive belongs to one JDK and one set of pyspark jars: its file name is a
hash of both, so another JDK or pyspark just finds none (and the JVM itself
refuses an archive whose jars changed, with a warning, and starts as before).
Classes that ``spark.jars`` adds (Kafka source, Iceberg) come from Spark's own
class loader and stay outside the archive.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, MutableMapping
from pathlib import Path

from infra.artifacts import cache_dir, spark_jars

OPTS_ENV = "SPARK_SUBMIT_OPTS"  # spark-submit adds these to the driver JVM's options
TRAINING_TIMEOUT_S = 300

# Started with -XX:ArchiveClassesAtExit, this session loads what a pipeline start
# loads (session, SQL, the Iceberg extensions) and waits for its JVM to write the
# archive at exit.
_TRAINING = textwrap.dedent(
    """
    import os, sys
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.jars", sys.argv[1])
        .config(
            "spark.sql.extensions",
            "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        )
        .getOrCreate()
    )
    spark.range(1000).selectExpr("id % 7 AS k", "id").groupBy("k").count().collect()
    spark.sql("SELECT 1").collect()
    gateway = spark.sparkContext._gateway
    spark.stop()
    gateway.shutdown()
    gateway.proc.stdin.close()
    sys.exit(gateway.proc.wait(timeout=120))
    """
)


def _pyspark_jars() -> Path:
    """pyspark's jars folder, found without importing pyspark (pytest imports this)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise ImportError("pyspark is not installed")
    return Path(spec.origin).resolve().parent / "jars"


@functools.cache
def _java_version() -> str:
    """`java -version` (a JVM start): once per process."""
    out = subprocess.run(
        ["java", "-version"], capture_output=True, text=True, check=True, timeout=60
    )
    return out.stderr


def archive_key(java_version: str, jars: list[tuple[str, int, int]]) -> str:
    """One archive per JDK build and per set of jars (name, size, mtime): the JVM
    accepts an archive only with the very jars it was made from."""
    h = hashlib.sha256(java_version.encode())
    for name, size, mtime in sorted(jars):
        h.update(f"{name}\0{size}\0{mtime}\n".encode())
    return h.hexdigest()[:16]


def archive_path(cache: Path | None = None) -> Path:
    jars = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in _pyspark_jars().glob("*.jar")]
    key = archive_key(_java_version(), jars)
    return (cache or cache_dir()) / "spark-cds" / f"spark-{key}.jsa"


def ensure_archive(log: Callable[[str], None], cache: Path | None = None) -> Path:
    """The archive for this JDK and pyspark, made now (~30 s) if there is none."""
    path = archive_path(cache)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    log(f"[artifacts] spark-cds: archiving Spark's classes once into {path.name} (~30 s)")
    env = dict(os.environ, **{OPTS_ENV: f"-XX:ArchiveClassesAtExit={partial}"})
    jars = ",".join(str(p) for p in spark_jars(cache))
    done = subprocess.run(
        [sys.executable, "-c", _TRAINING, jars],
        env=env,
        capture_output=True,
        text=True,
        timeout=TRAINING_TIMEOUT_S,
    )
    if done.returncode != 0 or not partial.exists():
        partial.unlink(missing_ok=True)
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
        raise RuntimeError(f"the training run exited {done.returncode}:\n{tail}")
    partial.replace(path)
    return path


def apply(env: MutableMapping[str, str], cache: Path | None = None) -> bool:
    """Point Spark drivers started with ``env`` at the archive, if it was made."""
    current = env.get(OPTS_ENV, "")
    if "SharedArchiveFile" in current:  # inherited (an xdist worker): no JVM started to check
        return True
    try:
        path = archive_path(cache)
    except (OSError, ImportError, subprocess.SubprocessError):
        return False
    if not path.exists():
        return False
    env[OPTS_ENV] = f"{current} -XX:SharedArchiveFile={path}".strip()
    return True
