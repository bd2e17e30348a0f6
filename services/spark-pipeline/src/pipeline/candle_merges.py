"""Candles merged into ``ohlc`` on the driver: what the batch's ranges hold after.

Why: a history answer over a recorded market's recent hours finds the live candles
stored there, and a live candle or a gap's rebuild finds a stored one of its minute,
so their rows cannot simply be appended. As a Spark MERGE each such write cost seconds
of the two shared cores for a few hundred rows. Here the stored candles of the batch's
ranges are read with pyiceberg (`driver_reads.stored_candles`), merged in Arrow, and
the ranges replaced in one commit (`ArrowAppends.replace`): a data file wholly inside a
range is dropped from the table's metadata, unread; only a file crossing a range's
edge is rewritten. (Deleting the replaced keys alone rewrote every file holding one:
the live engine's small files, one round trip each; docs/adr/0017, amendment.)

The rules are the MERGE statements' that Spark runs above the driver's size limit and
after a failed commit: `history_merge` is `lake.merge_history_candles`, `live_merge`
is `lake.merge_live_candles` (amending). ``test_stack_candle_merges`` checks each pair
leaves the same rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from mdproto.tables import Ohlc

#: A candle's values: what one built from trades has (live candles), then what an
#: exchange may report besides (history candles; null otherwise).
OHLC_VALUE_COLUMNS = (
    *(Ohlc.OPEN, Ohlc.HIGH, Ohlc.LOW, Ohlc.CLOSE, Ohlc.VOLUME, Ohlc.TRADE_COUNT),
    Ohlc.QUOTE_VOLUME,
    Ohlc.TAKER_BUY_VOLUME,
    Ohlc.TAKER_BUY_QUOTE_VOLUME,
)
KEY = Ohlc.SCHEMA.key

_ROW = "_row"
_STORED = "_stored"


@dataclass(frozen=True, slots=True)
class Merged:
    """``rows``: every candle the batch's ranges hold after the merge (the batch's new
    and replacing candles, in batch order, then the stored ones kept); ``written``: how
    many of the batch's candles are among them (0: the merge changes nothing)."""

    rows: pa.Table
    written: int


def history_merge(candles: pa.Table, stored: pa.Table) -> Merged:
    """Exchange ``candles`` (one per key) merged into ``stored``, the stored candles of
    their ranges (every column): `lake.merge_history_candles`'s rule. The exchange is the
    authority: a stored candle is replaced when a value differs or it is ``incomplete``."""

    def replaced(joined: pa.Table) -> pa.ChunkedArray:
        return pc.or_(
            _differ(joined, OHLC_VALUE_COLUMNS),
            pc.fill_null(joined[_theirs(Ohlc.INCOMPLETE)], False),
        )

    return _merge(candles, stored, replaced)


def live_merge(candles: pa.Table, stored: pa.Table) -> Merged:
    """Closed live ``candles`` (one per key) merged into ``stored``:
    `lake.merge_live_candles`'s rule with ``amend``. A stored live candle is replaced when
    a value or its ``incomplete`` note differs, unless it counts more trades (an older
    view stored late); an exchange candle is never touched."""

    def replaced(joined: pa.Table) -> pa.ChunkedArray:
        live = pc.fill_null(pc.equal(joined[_theirs(Ohlc.SOURCE)], "live"), False)
        trades = Ohlc.TRADE_COUNT
        fuller = pc.fill_null(pc.greater_equal(joined[trades], joined[_theirs(trades)]), True)
        changed = _differ(joined, (*OHLC_VALUE_COLUMNS, Ohlc.INCOMPLETE))
        return pc.and_(pc.and_(live, changed), fuller)

    return _merge(candles, stored, replaced)


def _merge(
    candles: pa.Table, stored: pa.Table, replaced: Callable[[pa.Table], pa.ChunkedArray]
) -> Merged:
    """``candles`` merged into ``stored`` by a rule: ``replaced`` says, for each batch
    candle joined with the stored one of its key (``_theirs`` columns, null where none),
    whether it replaces that stored one; a candle whose key is new is always added."""
    keys = list(KEY)
    compared = (*OHLC_VALUE_COLUMNS, Ohlc.INCOMPLETE)
    left = pa.table(
        {
            **{c: candles[c] for c in (*keys, *compared)},
            _ROW: pa.array(range(candles.num_rows), pa.int64()),
        }
    )
    before = stored.select(candles.schema.names).cast(candles.schema)
    right = pa.table(
        {
            **{k: before[k] for k in keys},
            **{_theirs(c): before[c] for c in (*compared, Ohlc.SOURCE)},
            _STORED: pa.array([True] * before.num_rows, pa.bool_()),
        }
    )
    joined = left.join(right, keys=keys, join_type="left outer")
    matched = pc.is_valid(joined[_STORED])
    replacing = pc.and_(matched, pc.fill_null(replaced(joined), False))
    written = pc.unique(joined.filter(pc.or_(pc.invert(matched), replacing))[_ROW])
    gone = joined.filter(replacing).select(keys)
    kept = before.join(gone, keys=keys, join_type="left anti")
    kept = kept.select(candles.schema.names).cast(candles.schema)  # a join drops "not null"
    rows = candles.take(written.take(pc.sort_indices(written)))
    return Merged(pa.concat_tables([rows, kept]), len(written))


def _differ(joined: pa.Table, columns: Sequence[str]) -> pa.ChunkedArray:
    """Whether any of ``columns`` differs between the batch's candle and the stored one
    (nulls equal, as Spark's ``<=>``)."""
    differ = pa.chunked_array([pa.array([False] * joined.num_rows)])
    for column in columns:
        differ = pc.or_(differ, pc.invert(_same(joined[column], joined[_theirs(column)])))
    return differ


def _theirs(column: str) -> str:
    return f"_stored_{column}"


def _same(ours: pa.ChunkedArray, theirs: pa.ChunkedArray) -> pa.ChunkedArray:
    """Element-wise equality where two nulls are equal (Spark's ``<=>``)."""
    both_null = pc.and_(pc.is_null(ours), pc.is_null(theirs))
    return pc.or_(both_null, pc.fill_null(pc.equal(ours, theirs), False))
