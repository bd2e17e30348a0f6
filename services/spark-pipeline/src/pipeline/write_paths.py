"""Which way an Iceberg write runs, and what a failed commit is called.

Every write of `Lake` goes one of five ways, chosen here before it starts and
never by trying another engine after an exception: an append from the driver
(pyiceberg), an append as a Spark job from the driver's Arrow, a Spark MERGE, a
merge of candles over stored ones on the driver (`candle_merges`), or,
for a large ``ticks-persist`` or ``book-store`` micro-batch, an append whose rows
never reach the driver (decoded, deduplicated and appended by Spark's executors). The rule and the
figures behind its thresholds: docs/adr/0017-one-write-path-per-batch.md and
docs/adr/0021-writes-on-executors.md.

A commit that fails is named by the exception's class (pyiceberg's, or the Java
class py4j reports), never by its message text: `commit_error`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, get_args

from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]
from pyiceberg.exceptions import (
    CommitFailedException,
    CommitStateUnknownException,
    ValidationException,
)

#: The ways a write can run (the ``path`` label of ``pipeline_iceberg_writes_total``).
#: "executor-append": a Kafka micro-batch decoded, checked against the stored keys and
#: appended by Spark's executors, the driver planning and committing only.
#: "driver-merge": candles (history or live) over stored ones, merged and committed on
#: the driver. "append-then-merge": a driver or Spark append, or a driver merge, whose
#: commit conflicted or whose state is unknown, followed by the Spark MERGE (right
#: whether the first commit landed or not).
WritePath = Literal[
    "driver-append",
    "spark-append",
    "executor-append",
    "driver-merge",
    "spark-merge",
    "append-then-merge",
]
WRITE_PATHS: tuple[WritePath, ...] = get_args(WritePath)
#: Where a Kafka micro-batch's records are decoded (`WriteRule.decode_on`).
DecodePlace = Literal["driver", "executors"]


@dataclass(frozen=True, slots=True)
class WriteRule:
    """The one rule (thresholds from ``catalog.driver_append_max_rows`` and
    ``catalog.executor_append_min_records``)."""

    #: Appends (and merges a table's writer can compute on the driver) of at most this
    #: many rows are written by pyiceberg on the driver; larger ones by Spark's
    #: executors. 0: every write is a Spark job.
    driver_append_max_rows: int = 2_000_000
    #: Kafka micro-batches of ``ticks`` or books of at least this many records are decoded
    #: and appended on Spark's executors ("executor-append"); smaller ones on the driver.
    #: 0: never.
    executor_append_min_records: int = 0

    def decode_on(self, records: int) -> DecodePlace:
        """Where a Kafka micro-batch of ``records`` records (counted from its offsets,
        before any is fetched) is decoded. On the driver every row passes through one
        Python process, then `choose` picks its append; on the executors nothing but the
        plan and the commit does (figures: docs/adr/0021-writes-on-executors.md)."""
        threshold = self.executor_append_min_records
        return "executors" if 0 < threshold <= records else "driver"

    def choose(self, rows: int, *, keys_absent: bool, merges_on_driver: bool = False) -> WritePath:
        """How to write ``rows`` rows. ``keys_absent``: none of their keys is stored (read
        first under the writer's lock, or the table's only writer checked): an append
        is then the same as the MERGE and cheaper. Else a merge, the only way that
        keeps every key once: on the driver if the writer can compute it there
        (``merges_on_driver``) and the rows are few enough, else Spark's MERGE."""
        on_driver = rows <= self.driver_append_max_rows
        if not keys_absent:
            return "driver-merge" if merges_on_driver and on_driver else "spark-merge"
        return "driver-append" if on_driver else "spark-append"


class CommitError(RuntimeError):
    """An Iceberg commit the catalog did not confirm."""


class CommitConflictError(CommitError):
    """The catalog refused the commit: another writer's commit came first (pyiceberg's
    ``CommitFailedException``, Iceberg's Java ``CommitFailedException`` or a MERGE's
    ``ValidationException`` for conflicting files). Nothing of it landed."""


class CommitStateUnknownError(CommitError):
    """The commit may or may not have landed (a 5xx or a lost connection at commit:
    ``CommitStateUnknownException``). Only a write that is right either way may follow."""


_JAVA_ERRORS: dict[str, type[CommitError]] = {
    "org.apache.iceberg.exceptions.CommitFailedException": CommitConflictError,
    "org.apache.iceberg.exceptions.ValidationException": CommitConflictError,
    "org.apache.iceberg.exceptions.CommitStateUnknownException": CommitStateUnknownError,
}
#: Spark wraps a write's failure (e.g. "Writing job aborted"): how deep to look.
_MAX_CAUSES = 8


def commit_error(exc: BaseException) -> CommitError | None:
    """``exc`` as a typed commit error, or None when it is none: by pyiceberg's exception
    class, or by the Java class (and its causes) of a py4j ``Py4JJavaError``."""
    if isinstance(exc, CommitFailedException | ValidationException):
        # ValidationException: a delete's retry found another writer's files in its range.
        return CommitConflictError(str(exc))
    if isinstance(exc, CommitStateUnknownException):
        return CommitStateUnknownError(str(exc))
    if isinstance(exc, Py4JJavaError):
        return java_commit_error(exc.java_exception)
    return None


def java_commit_error(java: Any) -> CommitError | None:
    """The typed error of a Java ``Throwable`` (through py4j), looked up by its class name
    and its causes' (`_JAVA_ERRORS`)."""
    for _ in range(_MAX_CAUSES):
        if java is None:
            return None
        kind = _JAVA_ERRORS.get(str(java.getClass().getName()))
        if kind is not None:
            return kind(str(java.getMessage()))
        java = java.getCause()
    return None


@contextmanager
def typed_commit_errors() -> Iterator[None]:
    """A failed commit inside raised as `CommitConflictError` or `CommitStateUnknownError`
    (the original as its cause); every other error as it is."""
    try:
        yield
    except (
        CommitFailedException,
        CommitStateUnknownException,
        ValidationException,
        Py4JJavaError,
    ) as exc:
        typed = commit_error(exc)
        if typed is None:
            raise
        raise typed from exc
