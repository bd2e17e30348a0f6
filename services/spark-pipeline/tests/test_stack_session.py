"""The pipeline's Spark session settings that need a real JVM to check."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from pipeline.session import EXPECTED_WARNINGS, quiet_expected_warnings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.stack, pytest.mark.spark]


def test_the_expected_warnings_loggers_are_named_as_spark_logs_them_and_set_to_error(
    spark: SparkSession,
) -> None:
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    log_manager = jvm.org.apache.logging.log4j.LogManager

    def level(name: str) -> str:
        return str(log_manager.getLogger(name).getLevel().toString())

    quiet_expected_warnings(spark)

    for name in EXPECTED_WARNINGS:
        assert jvm.java.lang.Class.forName(name) is not None  # the class is there, so the logger is
        assert level(name) == "ERROR", name
    assert level("org.apache.spark.sql.execution.streaming.MicroBatchExecution") != "ERROR"
