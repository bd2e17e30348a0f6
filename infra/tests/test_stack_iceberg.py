"""Iceberg REST catalog of the local stack, used from pyiceberg; data lands in SeaweedFS."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest
from pyarrow import fs
from pyiceberg.catalog import load_catalog

from infra.localstack import LocalStack
from infra.testing import race_commits

pytestmark = pytest.mark.stack

SCHEMA = pa.schema(
    [
        pa.field("symbol", pa.string(), nullable=False),
        pa.field("ts", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("price", pa.float64(), nullable=False),
    ]
)


def _rows(symbol: str, start: int, n: int) -> pa.Table:
    return pa.table(
        {
            "symbol": [symbol] * n,
            "ts": pa.array(
                [(start + i) * 1_000_000 for i in range(n)], pa.timestamp("us", tz="UTC")
            ),
            "price": [100.0 + i for i in range(n)],
        },
        schema=SCHEMA,
    )


def test_namespace_table_append_and_read_back(local_stack: LocalStack) -> None:
    e = local_stack.endpoints
    catalog = load_catalog(e.catalog_name, **e.pyiceberg_catalog_properties())
    namespace = f"ns_{uuid.uuid4().hex[:8]}"
    catalog.create_namespace(namespace)
    assert (namespace,) in catalog.list_namespaces()

    table = catalog.create_table(f"{namespace}.ticks", schema=SCHEMA)
    table.append(_rows("BTC/USDT", 0, 5))
    table.append(_rows("ETH/USDT", 100, 3))

    reloaded = catalog.load_table(f"{namespace}.ticks")
    assert len(reloaded.snapshots()) == 2
    data = reloaded.scan().to_arrow()
    assert data.num_rows == 8
    assert sorted(set(data.column("symbol").to_pylist())) == ["BTC/USDT", "ETH/USDT"]
    filtered = reloaded.scan(row_filter="price >= 103.0").to_arrow()
    assert filtered.num_rows == 2

    # Metadata and data files are objects in the S3 store under the warehouse.
    assert reloaded.metadata_location.startswith(e.warehouse + "/")
    s3 = fs.S3FileSystem(**e.s3_filesystem_options())
    prefix = reloaded.location().removeprefix("s3://")
    files = s3.get_file_info(fs.FileSelector(prefix, recursive=True))
    names = [f.path for f in files if f.type == fs.FileType.File]
    assert sum(n.endswith(".parquet") for n in names) == 2
    assert any(n.endswith(".metadata.json") for n in names)


def test_a_client_needs_only_the_catalog_address(local_stack: LocalStack) -> None:
    """The catalog tells clients the S3 endpoint, path style, region and keys."""
    e = local_stack.endpoints
    writer = load_catalog(e.catalog_name, **e.pyiceberg_catalog_properties())
    namespace = f"ns_{uuid.uuid4().hex[:8]}"
    writer.create_namespace(namespace)
    writer.create_table(f"{namespace}.ticks", schema=SCHEMA).append(_rows("BTC/USDT", 0, 3))

    bare = load_catalog("bare", type="rest", uri=e.catalog_uri)
    assert bare.properties["s3.endpoint"] == e.s3_endpoint
    assert bare.load_table(f"{namespace}.ticks").scan().to_arrow().num_rows == 3


def test_concurrent_commits_all_land(local_stack: LocalStack) -> None:
    """8 writers x 50 commits, half of them on one shared table: no HTTP 500, none lost."""
    race = race_commits(local_stack.endpoints.pyiceberg_catalog_properties())
    assert race.landed == race.expected
    # A real conflict is answered 409 (refused, not applied), so "none lost" means something.
    assert race.stale_refused
