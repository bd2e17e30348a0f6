"""The driver's pyiceberg appends against the real REST catalog and S3 store: once a table
has more metadata files than it keeps, each commit's oldest one is deleted by the
catalog, and pyiceberg's own delete of the same file after the commit is no warning
(pipeline/iceberg_io.py)."""

from __future__ import annotations

import logging
import uuid

import pyarrow as pa
import pytest
from pyarrow import fs
from pyiceberg.catalog import load_catalog

from infra.localstack import LocalStack
from pipeline.arrow_appends import ArrowAppends

pytestmark = pytest.mark.stack

KEPT = 1  # write.metadata.previous-versions-max


def test_appends_past_the_kept_metadata_delete_it_without_a_warning(
    local_stack: LocalStack, caplog: pytest.LogCaptureFixture
) -> None:
    e = local_stack.endpoints
    appends = ArrowAppends(e.catalog_name, e.pyiceberg_catalog_properties())
    namespace = f"appends_{uuid.uuid4().hex[:8]}"
    rows = pa.table({"x": pa.array([1], pa.int64())})
    catalog = load_catalog(e.catalog_name, **e.pyiceberg_catalog_properties())
    catalog.create_namespace(namespace)
    table = catalog.create_table(
        f"{namespace}.t",
        schema=rows.schema,
        properties={
            "write.metadata.delete-after-commit.enabled": "true",
            "write.metadata.previous-versions-max": str(KEPT),
        },
    )
    with caplog.at_level(logging.WARNING, logger="pyiceberg"):
        for _ in range(KEPT + 3):
            appends.append(f"{namespace}.t", rows)

    assert [r.getMessage() for r in caplog.records] == []
    s3 = fs.S3FileSystem(**e.s3_filesystem_options())
    folder = table.metadata_location.removeprefix("s3://").rsplit("/", 1)[0]
    kept = [
        info.path
        for info in s3.get_file_info(fs.FileSelector(folder))
        if info.path.endswith(".metadata.json")
    ]
    assert len(kept) == KEPT + 1, kept  # the current one and those it keeps
    assert appends.load(f"{namespace}.t").scan().to_arrow().num_rows == KEPT + 3
