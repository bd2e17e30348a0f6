"""Candles of one series in a time range at a snapshot, counted on the driver's JVM.

Why: a stored answer's row count was a Spark job (a time-travel scan), whose
fixed cost on two shared cores outweighs the data it reads (`driver_reads` does
the same for the reads before a write). Here Iceberg plans
the files of the range (manifests only) and:

- a data file with no delete file attached whose ``open_time`` bounds lie
  inside the range holds only matching rows: its record count is exact
  (``ticker`` and ``period_seconds`` are identity partitions, so every file
  of the plan is of the series);
- the rows of every other file are read by Iceberg's generic reader (deletes
  applied) within the time ranges those files span, on the driver.

A file counted whole must have no row inside those ranges (else it would be
counted twice): `split` moves such a file to the read side until none is left.
The reader runs in the driver's JVM, one thread; `Lake` falls back to the
Spark count if anything here fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mdproto.tables import Ohlc
from pipeline.driver_reads import timestamp_value


@dataclass(frozen=True, slots=True)
class DataFile:
    """What the plan says of one data file: its ``open_time`` bounds (µs, None when
    not kept), its rows, and whether a delete file applies to it."""

    lower_us: int | None
    upper_us: int | None
    records: int
    deletes: bool


@dataclass(frozen=True, slots=True)
class Split:
    """Rows known from file metadata, and the ``[lo, hi]`` µs ranges to read."""

    whole_rows: int
    read: list[tuple[int, int]]


def split(files: Sequence[DataFile], lo_us: int, hi_us: int) -> Split:
    """Which files of ``[lo_us, hi_us)`` are counted from metadata, and which time ranges
    are read (every other file's span, clipped to the range, touching spans joined)."""

    def whole(f: DataFile) -> bool:
        if f.deletes or f.lower_us is None or f.upper_us is None:
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


def _check_identity(table: Any) -> None:
    """Every file of the plan is of the series only if the series is an identity partition."""
    schema, specs = table.schema(), table.specs()
    wanted = {schema.findField(c).fieldId() for c in (Ohlc.TICKER, Ohlc.PERIOD_SECONDS)}
    for spec_id in specs.keySet():
        identity = {int(i) for i in specs.get(spec_id).identitySourceIds()}
        if not wanted <= identity:
            raise ValueError(f"{table.name()}: ticker and period are not identity partitions")


def count(
    jvm: Any,
    gateway: Any,
    table: Any,
    snapshot_id: int,
    ticker: str,
    period_seconds: int,
    lo_ms: int,
    hi_ms: int,
) -> int:
    """Rows of (``ticker``, ``period_seconds``) with ``open_time`` in ``[lo_ms, hi_ms)`` in
    the loaded Iceberg ``table`` (a Java object) at ``snapshot_id``."""
    iceberg = jvm.org.apache.iceberg
    x = iceberg.expressions.Expressions
    both = getattr(x, "and")
    series = both(x.equal(Ohlc.TICKER, ticker), x.equal(Ohlc.PERIOD_SECONDS, period_seconds))
    lo_us, hi_us = lo_ms * 1000, hi_ms * 1000
    in_range = both(
        x.greaterThanOrEqual(Ohlc.OPEN_TIME, timestamp_value(lo_us)),
        x.lessThan(Ohlc.OPEN_TIME, timestamp_value(hi_us)),
    )
    _check_identity(table)
    column = table.schema().findField(Ohlc.OPEN_TIME)
    field_id, field_type = column.fieldId(), column.type()
    decode = iceberg.types.Conversions.fromByteBuffer
    files: list[DataFile] = []
    tasks = (
        table.newScan()
        .useSnapshot(snapshot_id)
        .filter(both(series, in_range))
        .includeColumnStats()
        .planFiles()
    )
    try:
        it = tasks.iterator()
        while it.hasNext():
            task = it.next()
            f = task.file()
            lower, upper = f.lowerBounds(), f.upperBounds()
            lower_b = lower.get(field_id) if lower is not None else None
            upper_b = upper.get(field_id) if upper is not None else None
            files.append(
                DataFile(
                    lower_us=None if lower_b is None else int(decode(field_type, lower_b)),
                    upper_us=None if upper_b is None else int(decode(field_type, upper_b)),
                    records=int(f.recordCount()),
                    deletes=not task.deletes().isEmpty(),
                )
            )
    finally:
        tasks.close()
    planned = split(files, lo_us, hi_us)
    if not planned.read:
        return planned.whole_rows
    spans = [
        both(
            x.greaterThanOrEqual(Ohlc.OPEN_TIME, timestamp_value(lo)),
            x.lessThanOrEqual(Ohlc.OPEN_TIME, timestamp_value(hi)),
        )
        for lo, hi in planned.read
    ]
    either = getattr(x, "or")
    within = spans[0]
    for span in spans[1:]:
        within = either(within, span)
    columns = gateway.new_array(jvm.java.lang.String, 1)
    columns[0] = Ohlc.OPEN_TIME
    rows = (
        iceberg.data.IcebergGenerics.read(table)
        .useSnapshot(snapshot_id)
        .where(both(both(series, in_range), within))
        .select(columns)
        .build()
    )
    try:
        read = int(iceberg.relocated.com.google.common.collect.Iterables.size(rows))
    finally:
        rows.close()
    return planned.whole_rows + read
