"""The few rows a write must know of first, read on the driver with pyiceberg: no Spark job.

Why: before every ``ohlc`` append the writer asks whether the range holds a
candle yet, and before every ``ticks``, ``book_snapshots`` and ``book_deltas``
append which of the batch's rows are stored already (a replayed micro-batch's, or
the boundary's). As Spark jobs
(a probe query, a MERGE's scan and join) each costs a job, once a minute per live
query and once per history answer, for a handful of files (figures:
docs/adr/0008-driver-reads-and-appends.md). Here pyiceberg's table scan (a public
API) plans the files from manifests (files outside the range are pruned) and
reads what is left, deletes applied.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, cast

import pyarrow as pa
import pyarrow.compute as pc

from mdproto.tables import Ohlc, Ticks

if TYPE_CHECKING:
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.table import Table

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def any_candle_in(table: Table, ranges: Sequence[tuple[str, int, int, int]]) -> bool:
    """Whether the loaded ``ohlc`` ``table`` holds, at its current snapshot, a candle of one
    of ``ranges``: (ticker, period_seconds, lo_ms, hi_ms), ``open_time`` within
    ``[lo_ms, hi_ms]``. The scan stops at the first matching row."""
    if not ranges:
        return False
    wanted = candle_filter(ranges)
    found = table.scan(row_filter=wanted, selected_fields=(Ohlc.TICKER,), limit=1).to_arrow()
    return bool(found.num_rows > 0)


def stored_candles(table: Table, ranges: Sequence[tuple[str, int, int, int]]) -> pa.Table:
    """Every candle the loaded ``ohlc`` ``table`` holds, at its current snapshot, in
    ``ranges`` (non-empty; as `any_candle_in`'s): what a merge on the driver starts from."""
    return table.scan(row_filter=candle_filter(ranges)).to_arrow()


def candle_filter(ranges: Sequence[tuple[str, int, int, int]]) -> BooleanExpression:
    """The ``ohlc`` rows of ``ranges`` (non-empty): one ``ticker IN (...)`` term per
    (period, range) shared by the tickers, as a live batch's closed candles share their
    window, and the terms OR-ed as a balanced tree. A term per ticker OR-ed in a chain, as
    pyiceberg's ``Or`` nests them, raised RecursionError at ~500 tickers in one batch."""
    from pyiceberg.expressions import And

    windows: dict[tuple[int, int, int], list[str]] = {}
    for ticker, period_seconds, lo_ms, hi_ms in ranges:
        windows.setdefault((period_seconds, lo_ms, hi_ms), []).append(ticker)
    return any_of(
        [
            And(
                compare(Ohlc.TICKER, "in", tuple(tickers)),
                compare(Ohlc.PERIOD_SECONDS, "=", period_seconds),
                within(Ohlc.OPEN_TIME, lo_ms * 1000, hi_ms * 1000),
            )
            for (period_seconds, lo_ms, hi_ms), tickers in windows.items()
        ]
    )


def any_of(terms: Sequence[BooleanExpression]) -> BooleanExpression:
    """``terms`` (non-empty) OR-ed as a balanced tree: its depth grows as log2 of their
    number, where pyiceberg's ``Or(a, b, c, ...)`` nests one level per term."""
    from pyiceberg.expressions import Or

    if len(terms) == 1:
        return terms[0]
    middle = len(terms) // 2
    return Or(any_of(terms[:middle]), any_of(terms[middle:]))


def stored_keys(
    table: Table,
    key: Sequence[str],
    time_column: str,
    tickers: Sequence[str],
    lo_ms: int,
    hi_ms: int,
) -> pa.Table:
    """The ``key`` columns of the rows the loaded ``table`` holds, at its current snapshot,
    for ``tickers`` (its ``ticker`` column) with ``time_column`` within ``[lo_ms, hi_ms]``:
    what a batch of those tickers and times may find stored already (``ticks``,
    ``book_snapshots``, ``book_deltas``)."""
    from pyiceberg.expressions import And

    in_time = within(time_column, lo_ms * 1000, hi_ms * 1000)
    wanted = And(compare(Ticks.TICKER, "in", tuple(tickers)), in_time)
    return table.scan(row_filter=wanted, selected_fields=tuple(key)).to_arrow()


def unstored(rows: pa.Table, key: Sequence[str], stored: pa.Table) -> pa.Table:
    """The ``rows`` whose ``key`` is not among ``stored``'s, in their order. Joined on the
    key columns only: Arrow's join carries no list columns (the books' levels)."""
    columns = list(key)
    keyed = pa.table({k: rows[k] for k in columns}).append_column(
        "_row", pa.array(range(rows.num_rows), pa.int64())
    )
    found = pa.table({k: stored[k].cast(rows.schema.field(k).type) for k in columns})
    new = keyed.join(found, keys=columns, join_type="left anti")["_row"]
    return rows.take(new.take(pc.sort_indices(new)))


def timestamp_value(us: int) -> str:
    """An Iceberg expression's value for a ``timestamptz`` column at ``us`` µs since the epoch.

    Why a string: an ISO-8601 string with its offset binds to timestamptz exactly, at
    any time, whatever integer type a client would give a small number.
    """
    return (EPOCH + timedelta(microseconds=us)).isoformat(timespec="microseconds")


Operator = Literal["=", ">=", "<=", "<", "in"]


def compare(column: str, op: Operator, value: Any) -> BooleanExpression:
    """pyiceberg's predicate ``column op value`` (a timestamptz value: `timestamp_value`).

    Why a helper: pyiceberg's predicate classes are pydantic models whose
    generated signature mypy reads as keyword-only; at run time they take
    (term, value) as documented.
    """
    import pyiceberg.expressions as x

    kinds = {
        "=": x.EqualTo,
        ">=": x.GreaterThanOrEqual,
        "<=": x.LessThanOrEqual,
        "<": x.LessThan,
        "in": x.In,
    }
    kind = cast(Any, kinds[op])
    return cast("BooleanExpression", kind(column, value))


def within(column: str, lo_us: int, hi_us: int) -> BooleanExpression:
    """``column`` (a timestamptz) within ``[lo_us, hi_us]``."""
    from pyiceberg.expressions import And

    return And(
        compare(column, ">=", timestamp_value(lo_us)),
        compare(column, "<=", timestamp_value(hi_us)),
    )
