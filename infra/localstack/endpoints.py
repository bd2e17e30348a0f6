"""How clients reach a running stack: addresses, credentials, ready-made client configs.

Services get these from the ``local_stack`` fixture (``local_stack.endpoints``)
or, for a stack started by ``python -m infra.localstack up``, from
``StackEndpoints.load(data_dir)``, which reads ``<data_dir>/run/endpoints.json``.

``endpoints.json`` holds the stack's fields and, written by ``make run`` (and in
the same layout for compose: ``infra/compose/endpoints.json``), a ``clients``
section with every client-facing address of the platform (``client_addresses``;
docs/protocol.md "Ports and sockets"), so a client in any language finds the
relay, the gateway, the catalog, S3 and the metrics without reading prose.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from mdproto.runtime.settings import CatalogSettings

ENDPOINTS_FILE = Path("run") / "endpoints.json"
#: The key of the client-facing section in endpoints.json.
CLIENTS_KEY = "clients"

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

    def to_json(self, clients: Mapping[str, object] | None = None) -> str:
        """The file's text: the stack's fields, and the platform's `clients` section if given."""
        document: dict[str, object] = dict(dataclasses.asdict(self))
        if clients is not None:
            document[CLIENTS_KEY] = dict(clients)
        return json.dumps(document, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> StackEndpoints:
        """The stack's fields of the file (its `clients` section, if any, is not the stack's)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in json.loads(text).items() if k in fields})

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


def client_addresses(
    *,
    request: Sequence[str],
    market_data: Sequence[str],
    gateway: str,
    catalog: str,
    s3: str,
    metrics: Mapping[str, str],
) -> dict[str, object]:
    """endpoints.json's `clients` section, the one layout of every platform's file.

    `request` / `market_data`: each relay's ROUTER (:5559) and XPUB (:5558), any one
    serves, all listed for failover; `gateway` its base URL ("" where none runs:
    null); `catalog` the Iceberg REST catalog (its `GET /v1/config` hands out S3);
    `s3` the S3 endpoint as this host reaches it (compose's catalog hands out the
    network's `http://minio:9000`, which a host client overrides with this);
    `metrics` service -> base URL of `GET /metrics` and `GET /healthz`.
    """
    ws = "ws" + gateway.removeprefix("http") + "/ws" if gateway else None
    return {
        "request": list(request),
        "market_data": list(market_data),
        "gateway": gateway or None,
        "gateway_ws": ws,
        "catalog": catalog,
        "s3": s3,
        "metrics": dict(metrics),
    }
