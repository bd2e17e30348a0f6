"""Pinned JVM artifact versions, read from the Maven pom (their single home).

The versions are written once, as <properties> of ``infra/maven/pom.xml``;
Maven uses them to resolve the jars and Python reads the same file, so the two
can never disagree.
"""

from __future__ import annotations

import functools
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

MAVEN_DIR = Path(__file__).resolve().parent / "maven"
POM = MAVEN_DIR / "pom.xml"
_NS = "{http://maven.apache.org/POM/4.0.0}"


@dataclass(frozen=True)
class Versions:
    """Versions of the JVM pieces of the local platform."""

    spark: str
    scala_binary: str
    spark_kafka_token_provider: str
    iceberg: str
    iceberg_spark_major: str
    kafka: str
    slf4j: str
    postgresql_jdbc: str
    hadoop: str
    awssdk: str
    spark_hadoop_cloud: str

    @property
    def coordinates(self) -> dict[str, list[str]]:
        """Maven coordinates resolved per cache component (for docs and status)."""
        sb = self.scala_binary
        return {
            "kafka": [
                f"org.apache.kafka:kafka_{sb}:{self.kafka}",
                f"org.slf4j:slf4j-simple:{self.slf4j}",
            ],
            "iceberg-rest": [
                f"org.apache.iceberg:iceberg-open-api:{self.iceberg}",
                f"org.postgresql:postgresql:{self.postgresql_jdbc}",
            ],
            "spark": [
                f"org.apache.spark:spark-sql-kafka-0-10_{sb}:{self.spark}",
                f"org.apache.spark:spark-token-provider-kafka-0-10_{sb}:"
                f"{self.spark_kafka_token_provider}",
                f"org.apache.iceberg:iceberg-spark-runtime-{self.iceberg_spark_major}_{sb}:"
                f"{self.iceberg}",
                f"org.apache.iceberg:iceberg-aws-bundle:{self.iceberg}",
                f"org.apache.hadoop:hadoop-aws:{self.hadoop}",
                f"software.amazon.awssdk:s3-transfer-manager:{self.awssdk}",
                f"org.apache.spark:spark-hadoop-cloud_{sb}:{self.spark_hadoop_cloud}",
            ],
        }


def pom_properties(pom: Path = POM) -> dict[str, str]:
    """Return the <properties> of a pom as a plain dict."""
    root = ET.parse(pom).getroot()
    props = root.find(f"{_NS}properties")
    if props is None:
        raise ValueError(f"{pom} has no <properties>")
    return {child.tag.removeprefix(_NS): (child.text or "").strip() for child in props}


@functools.cache
def load_versions(pom: Path = POM) -> Versions:
    """Parse the versions out of the pom (cached: the file does not change at run time)."""
    p = pom_properties(pom)
    return Versions(
        spark=p["spark.version"],
        scala_binary=p["scala.binary.version"],
        spark_kafka_token_provider=p["spark.kafka.token.provider.version"],
        iceberg=p["iceberg.version"],
        iceberg_spark_major=p["iceberg.spark.major"],
        kafka=p["kafka.version"],
        slf4j=p["slf4j.version"],
        postgresql_jdbc=p["postgresql.jdbc.version"],
        hadoop=p["hadoop.version"],
        awssdk=p["awssdk.version"],
        spark_hadoop_cloud=p["spark.hadoop.cloud.version"],
    )
