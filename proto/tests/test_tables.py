from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pytest

from mdproto import contracts
from mdproto.tables import (
    TABLES,
    BookSnapshots,
    Markets,
    Ohlc,
    Requests,
    TableSchema,
    Ticks,
    arrow_schema,
)

PROTOCOL_MD = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
NAMESPACES = (Ohlc, Ticks, Requests, Markets, BookSnapshots)


@pytest.mark.parametrize("namespace", NAMESPACES, ids=lambda n: n.__name__)
def test_the_name_constants_are_the_columns_in_storage_order(namespace: type) -> None:
    constants = [v for k, v in vars(namespace).items() if k.isupper() and isinstance(v, str)]
    schema: TableSchema = namespace.SCHEMA  # type: ignore[attr-defined]
    assert tuple(constants) == schema.names
    assert len(set(schema.names)) == len(schema.names)


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.name)
def test_keys_partitions_and_added_columns_name_real_columns(table: TableSchema) -> None:
    assert all(table.column(name).required for name in table.key)  # a key is never null
    assert {p.column for p in table.partitioning} <= set(table.names)
    # Added columns are nullable and come last, in the order they were added: where
    # ALTER TABLE ADD COLUMNS puts them in an older table.
    if table.added:
        assert table.names[-len(table.added) :] == table.added
    assert not any(table.column(name).required for name in table.added)


def test_tables_carry_the_contract_names() -> None:
    assert [t.name for t in TABLES] == [
        contracts.ICEBERG_OHLC,
        contracts.ICEBERG_TICKS,
        contracts.ICEBERG_REQUESTS,
        contracts.ICEBERG_MARKETS,
        contracts.ICEBERG_BOOK_SNAPSHOTS,
        contracts.ICEBERG_BOOK_DELTAS,
        contracts.ICEBERG_GAPS,
        contracts.ICEBERG_TRADE_BARS,
    ]
    assert all(t.name.startswith(f"{contracts.ICEBERG_NAMESPACE}.") for t in TABLES)


def test_arrow_schema_has_iceberg_read_back_types_and_nullability() -> None:
    schema = arrow_schema(Ohlc.SCHEMA)
    assert schema.names == list(Ohlc.SCHEMA.names)
    assert schema.field(Ohlc.OPEN_TIME) == pa.field(
        "open_time", pa.timestamp("us", tz="UTC"), nullable=False
    )
    assert schema.field(Ohlc.PERIOD_SECONDS).type == pa.int32()
    assert schema.field(Ohlc.TRADE_COUNT) == pa.field("trade_count", pa.int64())
    assert schema.field(Ohlc.INCOMPLETE).type == pa.bool_()
    assert arrow_schema(Ticks.SCHEMA).field(Ticks.PRICE).type == pa.float64()
    assert arrow_schema(Markets.SCHEMA).field(Markets.SYMBOL).type == pa.string()
    level = pa.struct([pa.field("price", pa.float64()), pa.field("amount", pa.float64())])
    assert arrow_schema(BookSnapshots.SCHEMA).field(BookSnapshots.BIDS).type == pa.list_(level)


def test_arrow_schema_of_some_columns_follows_the_order_asked() -> None:
    schema = arrow_schema(Requests.SCHEMA, [Requests.STATUS, Requests.REQUEST_ID])
    assert schema.names == ["status", "request_id"]
    assert not schema.field(Requests.REQUEST_ID).nullable
    with pytest.raises(KeyError, match="no column 'nope'"):
        arrow_schema(Requests.SCHEMA, ["nope"])


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.name)
def test_the_protocol_documents_every_column(table: TableSchema) -> None:
    text = PROTOCOL_MD.read_text()
    section = text[text.index("## Iceberg tables") :]
    section = section[: section.index("\n## ", 1)]
    start = section.index(f"\n`{table.name}`:")
    end = section.find("\n`market.", start + 1)
    paragraph = section[start : end if end > 0 else None]
    documented = set(re.findall(r"`([a-z_]+)`", paragraph))
    assert set(table.names) <= documented
