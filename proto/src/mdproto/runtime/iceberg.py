"""pyiceberg catalog properties for the platform's REST catalog with S3 storage.

One builder for every pyiceberg reader (the SDK, the ingestor's coverage
planning), so path-style S3 and the optional keys are set the same way.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


def pyiceberg_properties(
    uri: str,
    *,
    s3_endpoint: str,
    s3_region: str,
    warehouse: str = "",
    s3_access_key: str = "",
    s3_secret_key: str = "",
) -> dict[str, str]:
    """Properties for `pyiceberg.catalog.load_catalog` (empty keys: the default AWS chain)."""
    props = {
        "type": "rest",
        "uri": uri,
        "s3.endpoint": s3_endpoint,
        "s3.region": s3_region,
        "s3.path-style-access": "true",
    }
    if warehouse:
        props["warehouse"] = warehouse
    if s3_access_key:
        props["s3.access-key-id"] = s3_access_key
    if s3_secret_key:
        props["s3.secret-access-key"] = s3_secret_key
    return props


class CatalogSettings(BaseModel):
    """A service's connection to the REST catalog and its S3 store (a config section)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "rest"
    uri: str = "http://127.0.0.1:8181"
    warehouse: str = ""
    s3_endpoint: str = "http://127.0.0.1:8333"
    s3_region: str = "us-east-1"
    s3_access_key: str = ""
    s3_secret_key: str = ""

    def properties(self) -> dict[str, str]:
        return pyiceberg_properties(
            self.uri,
            s3_endpoint=self.s3_endpoint,
            s3_region=self.s3_region,
            warehouse=self.warehouse,
            s3_access_key=self.s3_access_key,
            s3_secret_key=self.s3_secret_key,
        )
