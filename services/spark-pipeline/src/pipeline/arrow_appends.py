"""The driver's pyiceberg client of the catalog Spark writes to: Arrow rows appended
without a Spark job, and tables loaded for the reads before a write (`driver_reads`,
`row_counts`; docs/adr/0008-driver-reads-and-appends.md, 0017).

Why: every row the pipeline stores is decoded on the driver into Arrow first.
Handing it to Spark for an append costs a transfer into the JVM, a job and a
commit; pyiceberg writes the same Arrow to Parquet and commits through the same
REST catalog and S3 store, several times faster (figures: the ADR). The same
holds for a merge of candles over stored ones: it is computed on the driver
(`candle_merges`) and committed here as one delete and append (`replace`).

The catalog client is made on first use; the caller decides what a failed
append means (`lake.py`, `write_paths.commit_error`). Every commit goes through
`MetadataOnce`, so its cost does not grow with the table's history (ADR 0029).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING

import pyarrow as pa
from pyiceberg.table import Transaction
from pyiceberg.table.update import TableUpdate, update_table_metadata

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.table import Table
    from pyiceberg.table.metadata import TableMetadata

#: The client's FileIO (``py-io-impl``): a delete of a file the catalog already deleted
#: is done, not a warning.
FILE_IO = "pipeline.iceberg_io.IdempotentDeletes"

# Said by pyiceberg on every delete from a merge-on-read table (``ohlc``): `replace`'s
# docstring says what it does instead.
warnings.filterwarnings("ignore", "Merge on read is not yet supported", UserWarning)


class MetadataOnce(Transaction):
    """pyiceberg's transaction, its staged metadata built once per change.

    pyiceberg builds `table_metadata` afresh, a deep copy of every snapshot the table
    keeps, at each of the many reads one append makes, so a commit's cost grew with
    the table's history (ADR 0029; apache/iceberg-python PRs 3302 and 3784, approved
    upstream and not released). Staged updates are an immutable tuple and a refresh
    rebinds the table's metadata, so the built one is kept until either changes.
    """

    _built: tuple[TableMetadata, tuple[TableUpdate, ...], TableMetadata] | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        base, updates = self._table.metadata, self._updates
        built = self._built
        if built is None or built[0] is not base or built[1] is not updates:
            built = self._built = (base, updates, update_table_metadata(base, updates))
        return built[2]


class ArrowAppends:
    """Appends Arrow tables to the catalog's Iceberg tables, one commit each; loads them."""

    def __init__(self, name: str, properties: Mapping[str, str]) -> None:
        self._name = name
        self._properties = {"py-io-impl": FILE_IO, **properties}
        self._catalog: Catalog | None = None
        self._lock = threading.Lock()  # the history and live threads share the client

    def append(self, identifier: str, rows: pa.Table, loaded: Table | None = None) -> int:
        """Append ``rows`` to ``identifier`` (``namespace.table``) in one commit; the id of
        the snapshot it made.

        ``loaded``: the table as the caller just loaded it for its reads before the
        write (a catalog round trip saved). Had another writer committed since, the
        catalog refuses the commit and pyiceberg retries it on the new snapshot, as
        after its own load.
        """
        table = self.load(identifier) if loaded is None else loaded
        with MetadataOnce(table) as tx:
            tx.append(rows)
        return _snapshot_id(table)

    def replace(
        self,
        identifier: str,
        rows: pa.Table,
        deleted: BooleanExpression,
        loaded: Table | None = None,
    ) -> int:
        """Delete the rows ``deleted`` matches and append ``rows``, in one commit; the id of
        the snapshot it made.

        A data file whose rows all match is dropped from the metadata, unread; one that
        holds others too is rewritten without the matched rows (copy-on-write: pyiceberg
        writes no delete files, whatever the table's ``write.delete.mode``), Spark's
        position deletes on it applied as it is read.
        """
        table = self.load(identifier) if loaded is None else loaded
        with MetadataOnce(table) as tx:
            tx.delete(deleted)
            tx.append(rows)
        return _snapshot_id(table)

    def purge(self, identifier: str) -> None:
        """Drop ``identifier`` and delete its files: the catalog deletes them, no Spark job
        (Spark's DROP TABLE ... PURGE runs one to list the files)."""
        self._client().purge_table(identifier)

    def load(self, identifier: str) -> Table:
        """``identifier`` (``namespace.table``) at its current metadata, loaded fresh."""
        return self._client().load_table(identifier)

    def _client(self) -> Catalog:
        with self._lock:
            if self._catalog is None:
                from pyiceberg.catalog import load_catalog

                self._catalog = load_catalog(self._name, **self._properties)
            return self._catalog


def _snapshot_id(table: Table) -> int:
    snapshot = table.current_snapshot()
    assert snapshot is not None  # a commit just made one
    return int(snapshot.snapshot_id)
