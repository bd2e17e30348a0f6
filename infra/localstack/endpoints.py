"""How clients reach a running stack: addresses, credentials, ready-made client configs.

Services get these from the ``local_stack`` fixture (``local_stack.endpoints``)
or, for a stack started by ``python -m infra.localstack up``, from
``StackEndpoints.load(data_dir)``, which reads ``<data_dir>/run/endpoints.json``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mdproto.runtime.settings import CatalogSettings

ENDPOINTS_FILE = Path("run") / "endpoints.json"

ICEBERG_SPARK_EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
ICEBERG_SPARK_CATALOG = "org.apache.iceberg.spark.SparkCatalog"
S3_FILE_IO = "org.apache.iceberg.aws.s3.S3FileIO"


@dataclass(frozen=True)
class StackEndpoints:
    """Addresses and credentials of one stack; all hosts are 127.0.0.1."""

    kafka_bootstrap: str
    s3_endpoint: str
    s3_access_key: str
    s3_secret_key: str
    s3_region: str
    s3_bucket: str
    warehouse: str
    catalog_uri: str
    catalog_name: str

    def pyiceberg_catalog_properties(self) -> dict[str, str]:
        """Properties for ``pyiceberg.catalog.load_catalog(endpoints.catalog_name, **props)``."""
        return self.catalog_settings().properties()

    def catalog_settings(self) -> CatalogSettings:
        return CatalogSettings(
            name=self.catalog_name,
            uri=self.catalog_uri,
            warehouse=self.warehouse,
            s3_endpoint=self.s3_endpoint,
            s3_region=self.s3_region,
            s3_access_key=self.s3_access_key,
            s3_secret_key=self.s3_secret_key,
        )

    def catalog_env(self, prefix: str) -> dict[str, str]:
        """This catalog as a service's environment overrides, e.g. prefix PIPELINE_CATALOG__."""
        fields = self.catalog_settings().model_dump()
        return {f"{prefix}{key.upper()}": str(value) for key, value in fields.items()}

    def s3_filesystem_options(self) -> dict[str, str]:
        """Keyword arguments for ``pyarrow.fs.S3FileSystem`` against this stack."""
        return {
            "endpoint_override": self.s3_endpoint,
            "access_key": self.s3_access_key,
            "secret_key": self.s3_secret_key,
            "region": self.s3_region,
            "scheme": "http",
        }

    def spark_conf(self, jars: Sequence[Path] | None = None) -> dict[str, str]:
        """Spark settings for the Kafka source and the Iceberg REST catalog of this stack.

        ``jars`` defaults to the cached Spark artifacts (resolved on first use).
        The catalog is registered under ``catalog_name`` (``lake`` by default), so
        tables are addressed as ``lake.<namespace>.<table>``.
        """
        if jars is None:
            from infra.artifacts import spark_jars

            jars = spark_jars()
        prefix = f"spark.sql.catalog.{self.catalog_name}"
        return {
            "spark.jars": ",".join(str(j) for j in jars),
            "spark.sql.extensions": ICEBERG_SPARK_EXTENSIONS,
            prefix: ICEBERG_SPARK_CATALOG,
            f"{prefix}.type": "rest",
            f"{prefix}.uri": self.catalog_uri,
            f"{prefix}.warehouse": self.warehouse,
            f"{prefix}.io-impl": S3_FILE_IO,
            f"{prefix}.s3.endpoint": self.s3_endpoint,
            f"{prefix}.s3.path-style-access": "true",
            f"{prefix}.s3.access-key-id": self.s3_access_key,
            f"{prefix}.s3.secret-access-key": self.s3_secret_key,
            f"{prefix}.client.region": self.s3_region,
        }

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> StackEndpoints:
        return cls(**json.loads(text))

    @classmethod
    def load(cls, data_dir: Path) -> StackEndpoints:
        """Endpoints of the stack last started with this data dir (``run/endpoints.json``)."""
        path = data_dir / ENDPOINTS_FILE
        try:
            return cls.from_json(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(
                f"{path} not found: start the stack with `python -m infra.localstack up "
                f"--data-dir {data_dir}`"
            ) from None
