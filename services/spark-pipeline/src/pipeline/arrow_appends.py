"""Arrow rows appended to Iceberg tables from the driver with pyiceberg: no Spark job
(docs/adr/0008-driver-reads-and-appends.md).

Why: every row the pipeline stores is decoded on the driver into Arrow first.
Handing it to Spark for an append costs a transfer into the JVM, a job and a
commit; pyiceberg writes the same Arrow to Parquet and commits through the same
REST catalog and S3 store, several times faster (figures: the ADR). Appends
only: a MERGE (new keys inserted, changed values amended) stays a Spark statement.

The catalog client is made on first use (Lake's fallbacks keep Spark's path
when it cannot be); the caller decides what a failed append means (`lake.py`).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog


class ArrowAppends:
    """Appends Arrow tables to the catalog's Iceberg tables, one commit each."""

    def __init__(self, name: str, properties: Mapping[str, str]) -> None:
        self._name = name
        self._properties = dict(properties)
        self._catalog: Catalog | None = None
        self._lock = threading.Lock()  # the history and live threads share the client

    def append(self, identifier: str, rows: pa.Table) -> None:
        """Append ``rows`` to ``identifier`` (``namespace.table``) in one commit."""
        self._client().load_table(identifier).append(rows)

    def _client(self) -> Catalog:
        with self._lock:
            if self._catalog is None:
                from pyiceberg.catalog import load_catalog

                self._catalog = load_catalog(self._name, **self._properties)
            return self._catalog
