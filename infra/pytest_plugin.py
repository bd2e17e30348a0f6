"""pytest plugin (entry point ``pytest11: infra``): the local stack and Spark as fixtures.

Fixtures (all session-scoped, so the stack starts once per test run):

- ``local_stack``: a running ``LocalStack`` in a temporary data dir on free
  loopback ports (never the default ports: engineers' runs share the machine);
  torn down at the end of the session.
- ``stack_endpoints``: ``local_stack.endpoints``.
- ``spark_factory``: ``make(app_name=..., extra_conf=...) -> SparkSession``, a
  local[2] session wired to the stack; stopped at the end of the session.
- ``spark``: the session from ``spark_factory()``.

Mark tests that use them ``@pytest.mark.stack`` (and ``@pytest.mark.spark``).
This module is imported by every pytest run in the venv, so it imports nothing
heavy at module level.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Protocol

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from infra.localstack import LocalStack, StackEndpoints


class SparkFactory(Protocol):
    """Signature of the ``spark_factory`` fixture's value."""

    def __call__(
        self, app_name: str = ..., extra_conf: Mapping[str, str] | None = ...
    ) -> SparkSession: ...


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "stack: needs the local platform stack (Kafka, S3 store, Iceberg REST catalog)"
    )
    config.addinivalue_line("markers", "spark: starts a Spark session")
    # Every JVM a test starts (Spark drivers above all: Kafka and the catalog already
    # run so) compiles with C1 only. A test's JVM lives seconds to minutes, where C2's
    # compiling costs more CPU than its faster code saves: a pipeline stack test took
    # 99 CPU-seconds with C2, 68 without, on the 2-core machine (docs/development.md).
    # JDK_JAVA_OPTIONS is read by every `java` the JDK launches, in worker processes too.
    os.environ.setdefault("JDK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1")
    # Every Spark driver a test starts maps Spark's classes from the archive `make jars`
    # made (half the driver's start-up CPU; infra/spark_class_archive.py).
    from infra import spark_class_archive

    spark_class_archive.apply(os.environ)
    # Each xdist worker picks free ports in its own part of the range, so that two
    # workers never pick the same port one of them has not bound yet.
    worker = getattr(config, "workerinput", None)
    if worker is not None:
        from infra.localstack.config import PORT_SLICE_ENV

        index = int(str(worker["workerid"]).removeprefix("gw"))
        os.environ[PORT_SLICE_ENV] = f"{index}/{worker['workercount']}"


@pytest.fixture(scope="session")
def local_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """The platform stack, up once per test session on free ports in a temp dir."""
    from infra.localstack import start_on_free_ports

    stack = start_on_free_ports(tmp_path_factory.mktemp("localstack"))
    try:
        yield stack
    finally:
        stack.down()


@pytest.fixture(scope="session")
def stack_endpoints(local_stack: LocalStack) -> StackEndpoints:
    """Addresses and credentials of the session's stack."""
    return local_stack.endpoints


@pytest.fixture(scope="session")
def spark_factory(
    local_stack: LocalStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SparkFactory]:
    """Builds the local[2] SparkSession wired to the stack (one per process: Spark's rule)."""
    from infra.spark import local_spark_session

    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    sessions: list[SparkSession] = []

    def make(
        app_name: str = "infra-tests", extra_conf: Mapping[str, str] | None = None
    ) -> SparkSession:
        session = local_spark_session(
            local_stack.endpoints,
            app_name=app_name,
            warehouse_dir=warehouse,
            extra_conf=extra_conf,
        )
        sessions.append(session)
        return session

    try:
        yield make
    finally:
        if sessions:
            sessions[-1].stop()


@pytest.fixture(scope="session")
def spark(spark_factory: SparkFactory) -> SparkSession:
    """The session's SparkSession (local[2], Kafka source + ``lake`` Iceberg catalog)."""
    return spark_factory()
