"""The coverage read against a real `market.requests`-shaped table (REST catalog, S3):
each data file is read once, appends after a read are seen, and a rewrite of the files
(upkeep's compaction) is read from the new files only."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.io.pyarrow import ArrowScan

from infra.localstack import LocalStack
from ingestor.coverage import IcebergCoverage, Span
from mdproto.tables import Requests

pytestmark = pytest.mark.stack

MIN = 60_000
TICKER = "BINANCE:BTC/USDT"
SCHEMA = pa.schema(
    [
        pa.field(Requests.REQUEST_ID, pa.string()),
        pa.field(Requests.TICKER, pa.string()),
        pa.field(Requests.STATUS, pa.string()),
        pa.field(Requests.PERIOD_SECONDS, pa.int32()),
        pa.field(Requests.START_TIME_MS, pa.int64()),
        pa.field(Requests.END_TIME_MS, pa.int64()),
        pa.field(Requests.EXPECTED_CANDLES, pa.int64()),
        pa.field(Requests.MISSING_CANDLES, pa.int64()),
    ]
)


def answer(
    start_min: int, end_min: int, *, ticker: str = TICKER, status: str = "OK", period: int = 60
) -> dict[str, Any]:
    """One notified request: complete over [start, end) minutes."""
    return {
        Requests.REQUEST_ID: uuid.uuid4().hex,
        Requests.TICKER: ticker,
        Requests.STATUS: status,
        Requests.PERIOD_SECONDS: period,
        Requests.START_TIME_MS: start_min * MIN,
        Requests.END_TIME_MS: end_min * MIN,
        Requests.EXPECTED_CANDLES: (end_min - start_min) * 60 // period,
        Requests.MISSING_CANDLES: 0,
    }


def test_each_file_is_read_once_and_a_rewrite_is_read_from_its_new_files(
    local_stack: LocalStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    e = local_stack.endpoints
    properties = e.pyiceberg_catalog_properties()
    catalog = load_catalog(e.catalog_name, **properties)
    namespace = f"cov_{uuid.uuid4().hex[:8]}"
    catalog.create_namespace(namespace)
    table = catalog.create_table(f"{namespace}.requests", schema=SCHEMA)
    one_per_commit = [
        answer(0, 100),
        answer(100, 150, status="ERROR"),  # proves nothing
        answer(0, 600, period=3600),  # another period
        answer(0, 300, ticker="BINANCE:ETH/USDT"),  # another ticker
        answer(200, 300),
    ]
    for row in one_per_commit:  # one data file and one manifest each, as the pipeline writes
        table.append(pa.Table.from_pylist([row], schema=SCHEMA))

    reads: list[str] = []
    to_table = ArrowScan.to_table

    def counted(scan: ArrowScan, tasks: Any) -> pa.Table:
        tasks = list(tasks)
        reads.extend(task.file.file_path for task in tasks)
        return to_table(scan, tasks)

    monkeypatch.setattr(ArrowScan, "to_table", counted)
    coverage = IcebergCoverage(properties, f"{namespace}.requests", e.catalog_name)

    def stored() -> list[Span]:
        return asyncio.run(coverage.stored(TICKER, 60))

    assert stored() == [Span(0, 100 * MIN), Span(200 * MIN, 300 * MIN)]
    assert len(reads) == len(one_per_commit)
    assert stored() == [Span(0, 100 * MIN), Span(200 * MIN, 300 * MIN)]
    assert len(reads) == len(one_per_commit), "the second read read a file again"

    table.append(pa.Table.from_pylist([answer(100, 200)], schema=SCHEMA))
    assert stored() == [Span(0, 300 * MIN)]
    assert len(reads) == len(one_per_commit) + 1, "only the new file is read"

    # A rewrite into one file (as compaction does), without the first answer this time.
    kept = [r for r in table.scan().to_arrow().to_pylist() if r[Requests.START_TIME_MS] != 0]
    table.refresh().overwrite(pa.Table.from_pylist(kept, schema=SCHEMA))
    before = len(reads)
    assert stored() == [Span(100 * MIN, 300 * MIN)]
    assert len(reads) == before + 1, "the rewritten table is one new file"
