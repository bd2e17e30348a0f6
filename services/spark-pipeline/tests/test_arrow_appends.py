"""`MetadataOnce`: a transaction builds its staged metadata once per change, and still
sees every update staged and every refresh of its table (ADR 0029). The appends
themselves run against the real catalog in the stack tests (`test_stack_arrow_appends`,
`test_stack_commit_conflict`, which rebases a commit on another writer's)."""

from __future__ import annotations

from typing import Any

import pytest
from pyiceberg.catalog.noop import NoopCatalog
from pyiceberg.io import load_file_io
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import update_table_metadata
from pyiceberg.types import LongType, NestedField

from pipeline import arrow_appends
from pipeline.arrow_appends import MetadataOnce


def a_table() -> Table:
    metadata = new_table_metadata(
        schema=Schema(NestedField(1, "x", LongType(), required=False)),
        partition_spec=UNPARTITIONED_PARTITION_SPEC,
        sort_order=UNSORTED_SORT_ORDER,
        location="s3://warehouse/t",
        properties={},
    )
    return Table(
        ("ns", "t"),
        metadata,
        "s3://warehouse/t/metadata/00000.metadata.json",
        io=load_file_io(),
        catalog=NoopCatalog("noop"),
    )


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times a metadata was built (one entry per build, the updates it applied)."""
    done: list[int] = []

    def counted(base: TableMetadata, updates: tuple[Any, ...]) -> TableMetadata:
        done.append(len(updates))
        return update_table_metadata(base, updates)

    monkeypatch.setattr(arrow_appends, "update_table_metadata", counted)
    return done


def test_reads_of_an_unchanged_transaction_build_its_metadata_once(builds: list[int]) -> None:
    tx = MetadataOnce(a_table())

    reads = [tx.table_metadata for _ in range(10)]

    assert builds == [0]
    assert all(read is reads[0] for read in reads)


def test_a_staged_update_is_seen_at_the_next_read(builds: list[int]) -> None:
    tx = MetadataOnce(a_table())
    assert "owner" not in tx.table_metadata.properties

    tx.set_properties(owner="pipeline")

    assert tx.table_metadata.properties["owner"] == "pipeline"
    assert tx.table_metadata.properties["owner"] == "pipeline"
    assert builds == [0, 1]


def test_a_refreshed_table_is_seen_at_the_next_read(builds: list[int]) -> None:
    table = a_table()
    tx = MetadataOnce(table)
    assert tx.table_metadata.properties == {}

    # What a commit's response or a retry's refresh does: rebind the table's metadata.
    table.metadata = table.metadata.model_copy(update={"properties": {"owner": "other"}})

    assert tx.table_metadata.properties == {"owner": "other"}
    assert builds == [0, 0]
