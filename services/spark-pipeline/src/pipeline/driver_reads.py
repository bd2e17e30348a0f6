"""The few rows a write must know of first, read on the driver's JVM: no Spark job.

Why: before every ``ohlc`` append the writer asks whether the range holds a
candle yet, and before every ``ticks`` append which of the batch's trades are
stored already (a replayed micro-batch's, or the boundary's). As Spark jobs
(a probe query, a MERGE's scan and join) each costs a job, once a minute per live
query and once per history answer, for a handful of files (figures:
docs/adr/0008-driver-reads-and-appends.md). Here Iceberg plans the files from
manifests (files outside the range are pruned) and its generic reader reads what
is left, deletes applied.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa

from mdproto.tables import Ohlc, Ticks

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def any_candle_in(jvm: Any, table: Any, ranges: Sequence[tuple[str, int, int, int]]) -> bool:
    """Whether the loaded ``ohlc`` ``table`` (a Java object) holds, at its current snapshot,
    a candle of one of ``ranges``: (ticker, period_seconds, lo_ms, hi_ms), ``open_time``
    within ``[lo_ms, hi_ms]``. The reader stops at the first matching row."""
    x = jvm.org.apache.iceberg.expressions.Expressions
    both, either = getattr(x, "and"), getattr(x, "or")
    wanted = None
    for ticker, period_seconds, lo_ms, hi_ms in ranges:
        term = both(
            both(x.equal(Ohlc.TICKER, ticker), x.equal(Ohlc.PERIOD_SECONDS, period_seconds)),
            _within(x, Ohlc.OPEN_TIME, lo_ms, hi_ms),
        )
        wanted = term if wanted is None else either(wanted, term)
    if wanted is None:
        return False
    rows = jvm.org.apache.iceberg.data.IcebergGenerics.read(table).where(wanted).build()
    try:
        return bool(rows.iterator().hasNext())
    finally:
        rows.close()


def tick_keys(
    jvm: Any, gateway: Any, table: Any, tickers: Sequence[str], lo_ms: int, hi_ms: int
) -> pa.Table:
    """(ticker, trade_id) of the trades the loaded ``ticks`` ``table`` holds for ``tickers``
    with ``trade_time`` within ``[lo_ms, hi_ms]``, at its current snapshot."""
    x = jvm.org.apache.iceberg.expressions.Expressions
    names = jvm.java.util.ArrayList()
    for ticker in tickers:
        names.add(ticker)
    among = getattr(x, "in")(Ticks.TICKER, names)  # the Iterable overload
    wanted = getattr(x, "and")(among, _within(x, Ticks.TRADE_TIME, lo_ms, hi_ms))
    columns = gateway.new_array(jvm.java.lang.String, 2)
    columns[0], columns[1] = Ticks.TICKER, Ticks.TRADE_ID
    rows = (
        jvm.org.apache.iceberg.data.IcebergGenerics.read(table)
        .where(wanted)
        .select(columns)
        .build()
    )
    stored: dict[str, list[str]] = {Ticks.TICKER: [], Ticks.TRADE_ID: []}
    try:
        it = rows.iterator()
        while it.hasNext():
            row = it.next()
            stored[Ticks.TICKER].append(row.getField(Ticks.TICKER))
            stored[Ticks.TRADE_ID].append(row.getField(Ticks.TRADE_ID))
    finally:
        rows.close()
    return pa.table({name: pa.array(values, pa.string()) for name, values in stored.items()})


def timestamp_value(us: int) -> str:
    """An Iceberg expression's value for a ``timestamptz`` column at ``us`` µs since the epoch.

    Why a string: py4j hands a Python int below 2**31 to Java as an Integer, which
    Iceberg refuses to bind to a timestamp (an early time, e.g. the epoch's first
    minutes); an ISO-8601 string binds to timestamptz exactly, at any time.
    """
    return (EPOCH + timedelta(microseconds=us)).isoformat(timespec="microseconds")


def _within(x: Any, column: str, lo_ms: int, hi_ms: int) -> Any:
    """``column`` (a timestamptz) within ``[lo_ms, hi_ms]``."""
    return getattr(x, "and")(
        x.greaterThanOrEqual(column, timestamp_value(lo_ms * 1000)),
        x.lessThanOrEqual(column, timestamp_value(hi_ms * 1000)),
    )
