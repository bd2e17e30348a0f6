"""Candles of one series in a time range at a snapshot, counted on the driver (pyiceberg).

Why: a stored answer's row count was a Spark job (a time-travel scan), whose
fixed cost on two shared cores outweighs the data it reads (`driver_reads` does
the same for the reads before a write). Here pyiceberg's scan plans the files of
the range (manifests only) and:

- a data file of the series alone (its partition says so where ``ticker`` and
  ``period_seconds`` are identity partitions; else its ``ticker`` and
  ``period_seconds`` bounds are both the series': a ``bucket[N](ticker)``
  partition holds several tickers), with no delete file attached, whose
  ``open_time`` bounds lie inside the range holds only matching rows: its
  record count is exact;
- the rows of every other file are read by pyiceberg (deletes applied) within
  the time ranges those files span, on the driver.

A file counted whole must have no row inside those ranges (else it would be
counted twice): `split` moves such a file to the read side until none is left.
A failure here fails the count (no second engine): the caller's batch or
stored answer fails and is retried the way any failed read is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from mdproto.tables import Ohlc
from pipeline.driver_reads import any_of, compare, timestamp_value, within

if TYPE_CHECKING:
    from pyiceberg.table import Table


@dataclass(frozen=True, slots=True)
class DataFile:
    """What the plan says of one data file: its ``open_time`` bounds (µs, None when
    not kept), its rows, whether a delete file applies to it, and whether every row
    is of the counted series (`of_series` decides)."""

    lower_us: int | None
    upper_us: int | None
    records: int
    deletes: bool
    series_only: bool = True


@dataclass(frozen=True, slots=True)
class Split:
    """Rows known from file metadata, and the ``[lo, hi]`` µs ranges to read."""

    whole_rows: int
    read: list[tuple[int, int]]


def split(files: Sequence[DataFile], lo_us: int, hi_us: int) -> Split:
    """Which files of ``[lo_us, hi_us)`` are counted from metadata, and which time ranges
    are read (every other file's span, clipped to the range, touching spans joined)."""

    def whole(f: DataFile) -> bool:
        if f.deletes or not f.series_only or f.lower_us is None or f.upper_us is None:
            return False
        return lo_us <= f.lower_us and f.upper_us < hi_us

    counted = [f for f in files if whole(f)]
    read = _join(_clip(f, lo_us, hi_us) for f in files if not whole(f))
    while True:  # a counted file overlapping a read range would be counted twice
        overlapping = [f for f in counted if _overlaps(f, read)]
        if not overlapping:
            return Split(sum(f.records for f in counted), read)
        counted = [f for f in counted if f not in overlapping]
        read = _join([*read, *(_clip(f, lo_us, hi_us) for f in overlapping)])


def _clip(f: DataFile, lo_us: int, hi_us: int) -> tuple[int, int]:
    lower = lo_us if f.lower_us is None else max(lo_us, f.lower_us)
    upper = hi_us - 1 if f.upper_us is None else min(hi_us - 1, f.upper_us)
    return lower, upper


def _join(spans: Any) -> list[tuple[int, int]]:
    joined: list[tuple[int, int]] = []
    for lo, hi in sorted(s for s in spans if s[0] <= s[1]):
        if joined and lo <= joined[-1][1] + 1:
            joined[-1] = (joined[-1][0], max(joined[-1][1], hi))
        else:
            joined.append((lo, hi))
    return joined


def _overlaps(f: DataFile, spans: Sequence[tuple[int, int]]) -> bool:
    assert f.lower_us is not None and f.upper_us is not None  # only whole files are tested
    return any(lo <= f.upper_us and f.lower_us <= hi for lo, hi in spans)


def of_series(table: Table, ticker: str, period_seconds: int) -> Callable[[Any], bool]:
    """Whether a data file (pyiceberg's ``DataFile``) of ``table`` holds rows of (``ticker``,
    ``period_seconds``) only: its spec's identity partitions say so, else its column bounds
    (a truncated ``ticker`` bound, of a long ticker, never equals the ticker: read)."""
    from pyiceberg.conversions import to_bytes
    from pyiceberg.transforms import IdentityTransform

    schema = table.schema()
    fields = [schema.find_field(c) for c in (Ohlc.TICKER, Ohlc.PERIOD_SECONDS)]
    wanted = {f.field_id for f in fields}
    by_identity = {
        spec_id: wanted
        <= {f.source_id for f in spec.fields if isinstance(f.transform, IdentityTransform)}
        for spec_id, spec in table.specs().items()
    }
    values: tuple[str | int, ...] = (ticker, period_seconds)
    exact = {
        f.field_id: bytes(to_bytes(cast(Any, f.field_type), value))
        for f, value in zip(fields, values, strict=True)
    }

    def only(data: Any) -> bool:
        if by_identity.get(data.spec_id, False):
            return True
        lower, upper = data.lower_bounds or {}, data.upper_bounds or {}
        return all(lower.get(i) == v and upper.get(i) == v for i, v in exact.items())

    return only


def count(
    table: Table, snapshot_id: int, ticker: str, period_seconds: int, lo_ms: int, hi_ms: int
) -> int:
    """Rows of (``ticker``, ``period_seconds``) with ``open_time`` in ``[lo_ms, hi_ms)`` in
    the loaded Iceberg ``table`` (pyiceberg's) at ``snapshot_id``."""
    from pyiceberg.conversions import from_bytes
    from pyiceberg.expressions import And

    series = And(
        compare(Ohlc.TICKER, "=", ticker), compare(Ohlc.PERIOD_SECONDS, "=", period_seconds)
    )
    lo_us, hi_us = lo_ms * 1000, hi_ms * 1000
    in_range = And(
        compare(Ohlc.OPEN_TIME, ">=", timestamp_value(lo_us)),
        compare(Ohlc.OPEN_TIME, "<", timestamp_value(hi_us)),
    )
    only = of_series(table, ticker, period_seconds)
    column = table.schema().find_field(Ohlc.OPEN_TIME)
    field_id, field_type = column.field_id, column.field_type

    def bound(bounds: dict[int, bytes] | None) -> int | None:
        raw = None if bounds is None else bounds.get(field_id)
        return None if raw is None else int(from_bytes(cast(Any, field_type), raw))

    scan = table.scan(row_filter=And(series, in_range), snapshot_id=snapshot_id)
    files = [
        DataFile(
            lower_us=bound(task.file.lower_bounds),
            upper_us=bound(task.file.upper_bounds),
            records=int(task.file.record_count),
            deletes=bool(task.delete_files),
            series_only=only(task.file),
        )
        for task in scan.plan_files()
    ]
    planned = split(files, lo_us, hi_us)
    if not planned.read:
        return planned.whole_rows
    wanted = any_of([within(Ohlc.OPEN_TIME, lo, hi) for lo, hi in planned.read])
    rows = table.scan(
        row_filter=And(And(series, in_range), wanted),
        selected_fields=(Ohlc.OPEN_TIME,),
        snapshot_id=snapshot_id,
    ).to_arrow()
    return planned.whole_rows + int(rows.num_rows)
