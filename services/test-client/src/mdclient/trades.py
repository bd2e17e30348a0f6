"""Trade history: the stored trades of one ticker over a range, with an integrity report
(docs/protocol.md "Trade history").

    Client.trades / Client.trade_batches / mdclient trades / the gateway's GET /trades
      -> open_trades
           IcebergReader.read_tick_pieces(ticker)  market.ticks manifests: the ticker's
                                                   oldest and newest stored trade
           IcebergReader.read_gaps(ticker)         market.gaps: the ticker's gaps
           integrity_report (pure)                 -> TradeIntegrity; NotRecorded if the
                                                      range holds no recording
           IcebergReader.read_trades(gap)          a lately REPAIRED gap's stored trades,
                                                   counted (`stored_inside`): not all
                                                   stored yet -> the gap is repairing
      -> TradesResult (one Arrow table)  or  TradeBatches (record batches, one group of
         overlapping files in memory at a time: IcebergReader.trade_groups)

*Recorded since* is the ticker's oldest trade in ``market.ticks``, as
`Client.recording` has it: Iceberg holds no other record of when a recording
began (the ingestors' checkpoints live in the compacted Kafka topic
``market.recording``, which keeps only the newest). Gaps are the rows of
``market.gaps``, which only a recording writes: trades stored from a client's live
subscription to a market outside the recording have no gap detection, so their
holes are not reported (the report's `gaps_note` says none are known only when
``market.gaps`` could not be read). Plain data and pure functions first, then the
read.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from mdclient import extras, timeparse
from mdclient.errors import InvalidRequest, NotRecorded
from mdclient.recording import (
    REPAIRED,
    REPAIRING,
    UNREPAIRABLE,
    GapCounts,
    LostGap,
    _int64,
    _ms,
    gap_dict,
    gap_rows,
    known_status,
    lost_gap,
    spans_of,
)
from mdproto import gaps as gap_rules
from mdproto import rules
from mdproto.error_codes import BAD_TIME, BAD_TIME_RANGE
from mdproto.tables import Gaps, Ticks, arrow_schema

if TYPE_CHECKING:
    from mdclient.config import ClientSettings
    from mdclient.frames import IcebergReader

#: What a trade read returns by default: every ``market.ticks`` column, storage order.
COLUMNS: tuple[str, ...] = Ticks.SCHEMA.names
#: Rows per record batch `TradeBatches` yields (Arrow's and Parquet's usual size).
BATCH_ROWS = 65_536
#: How long before the ticker's newest stored trade a REPAIRED gap may have been
#: repaired and still have its stored trades counted (`to_count`).
STORED_CHECK_MS = 3_600_000
#: The key of the integrity report (its `as_dict` as JSON) in the schema metadata of
#: the Arrow and Parquet answers (`mdclient trades --parquet`, the gateway's GET /trades).
REPORT_KEY = b"mdp.integrity"

#: complete: recorded over the whole range, every gap in it repaired; repairing: gaps in
#: it open or being repaired; incomplete: an unrepairable gap in it (trades lost for
#: good); partial: the range starts before the recording did; unknown: market.gaps not
#: read; not_recorded: nothing of the range is recorded (raised as NotRecorded).
TradeState = Literal["complete", "repairing", "incomplete", "partial", "unknown", "not_recorded"]


@dataclass(frozen=True, slots=True)
class RangeGap(LostGap):
    """A ``market.gaps`` row of any status: the trades strictly between its two ends
    may be missing (a null end: unknown, taken to reach that far)."""

    status: str  # OPEN, REPAIRING, REPAIRED, UNREPAIRABLE (an unknown one counts as OPEN)
    from_trade_id: str = ""
    to_trade_id: str = ""
    updated_at_ms: int | None = None
    #: A REPAIRED gap's recovered trades found in ``market.ticks`` (`stored_inside`);
    #: None: not counted (another status, or repaired long before the newest trade).
    trades_stored: int | None = None

    @property
    def awaiting_trades(self) -> bool:
        """REPAIRED, but ``market.ticks`` does not hold all its recovered trades yet: the
        ingestor marks a gap REPAIRED once they are in Kafka, and ticks-persist stores
        them up to a minute later."""
        return (
            self.status == REPAIRED
            and self.trades_stored is not None
            and self.trades_stored < self.trades_recovered
        )

    def overlaps(self, start_ms: int, end_ms: int) -> bool:
        """A missing trade may lie in [start_ms, end_ms): in milliseconds it may share
        either end's time, so [from, to] is what must meet the range."""
        before_end = self.from_time_ms is None or self.from_time_ms < end_ms
        after_start = self.to_time_ms is None or self.to_time_ms >= start_ms
        return before_end and after_start


@dataclass(frozen=True, slots=True)
class TradeIntegrity:
    """How far a range's trades can be trusted (docs/protocol.md "Trade history")."""

    ticker: str
    start_ms: int
    end_ms: int
    recorded_since_ms: int | None  # the ticker's oldest stored trade; None: none stored
    last_trade_ms: int | None  # its newest stored trade
    #: The range is not recorded from start_ms up to this time (the recording began
    #: then); None: recorded from start_ms on. Equal to end_ms when nothing is.
    not_recorded_until_ms: int | None
    gaps: tuple[RangeGap, ...] | None  # the gaps that meet the range; None: not read
    gaps_note: str = ""  # why gaps is None
    reason: str = ""  # not_recorded: why

    @property
    def counts(self) -> GapCounts | None:
        if self.gaps is None:
            return None
        # A REPAIRED gap whose trades are not all stored yet counts as repairing.
        by = [REPAIRING if g.awaiting_trades else g.status for g in self.gaps]
        return GapCounts(
            open=sum(s not in (REPAIRING, REPAIRED, UNREPAIRABLE) for s in by),
            repairing=by.count(REPAIRING),
            repaired=by.count(REPAIRED),
            unrepairable=by.count(UNREPAIRABLE),
        )

    @property
    def state(self) -> TradeState:
        """The worst that holds: not_recorded, incomplete, repairing, partial, unknown."""
        if self.reason:
            return "not_recorded"
        counts = self.counts
        if counts is not None and counts.unrepairable:
            return "incomplete"
        if counts is not None and (counts.open or counts.repairing):
            return "repairing"
        if self.not_recorded_until_ms is not None:
            return "partial"
        return "unknown" if counts is None else "complete"

    def as_dict(self) -> dict[str, Any]:
        """The JSON shape (`mdclient trades --format json`, the gateway's ``GET /trades``):
        times in epoch ms and 64-bit counts as decimal strings, as every platform JSON."""
        counts = self.counts
        return {
            "ticker": self.ticker,
            "state": self.state,
            "start_ms": str(self.start_ms),
            "end_ms": str(self.end_ms),
            "recorded_since_ms": _int64(self.recorded_since_ms),
            "last_trade_ms": _int64(self.last_trade_ms),
            "not_recorded_until_ms": _int64(self.not_recorded_until_ms),
            "reason": self.reason or None,
            "gaps_known": self.gaps is not None,
            "gaps_note": self.gaps_note or None,
            "gap_counts": None if counts is None else asdict(counts),
            "gaps": [
                {**gap_dict(g), "status": g.status, "trades_stored": _int64(g.trades_stored)}
                for g in self.gaps or ()
            ],
        }


# --- pure: the report ---------------------------------------------------------------------


def gaps_from_table(rows: pa.Table) -> list[RangeGap]:
    """``market.gaps`` rows (`recording.GAP_COLUMNS`) -> RangeGaps."""
    return [
        RangeGap(
            **asdict(lost_gap(row)),
            status=known_status(row[Gaps.STATUS]),
            from_trade_id=row[Gaps.FROM_TRADE_ID] or "",
            to_trade_id=row[Gaps.TO_TRADE_ID] or "",
            updated_at_ms=_ms(row[Gaps.UPDATED_AT]),
        )
        for row in gap_rows(rows)
    ]


def to_count(gaps: Iterable[RangeGap], last_trade_ms: int | None) -> list[RangeGap]:
    """The REPAIRED gaps whose stored trades `Client.trades` counts: those repaired
    within `STORED_CHECK_MS` of the ticker's newest stored trade (ticks-persist stores a
    repair's trades a minute or so after REPAIRED; the pipeline gives up waiting after
    15 minutes, with a warning), with both ends known."""
    if last_trade_ms is None:
        return []
    return [
        g
        for g in gaps
        if g.status == REPAIRED
        and g.trades_recovered > 0
        and g.from_time_ms is not None
        and g.to_time_ms is not None
        and g.updated_at_ms is not None
        and g.updated_at_ms >= last_trade_ms - STORED_CHECK_MS
    ]


def stored_inside(gap: RangeGap, trades: pa.Table) -> int:
    """The recovered trades of `gap` that `trades` (``trade_id``, ``trade_time`` of its
    ticker over [from_time, to_time]) holds, counted as the repair counted them
    (`mdproto.gaps.counted_by_id`): the ids strictly between the ends, or every trade of
    the span but the two ends."""
    ids = trades.column(Ticks.TRADE_ID).to_pylist()
    if gap_rules.counted_by_id(gap.from_trade_id, gap.to_trade_id, gap.trades_recovered):
        low, high = int(gap.from_trade_id), int(gap.to_trade_id)
        return sum(1 for i in ids if i.isdigit() and low < int(i) < high)
    ends = {gap.from_trade_id, gap.to_trade_id}
    return sum(1 for i in ids if i not in ends)


def integrity_report(
    ticker: str,
    start_ms: int,
    end_ms: int,
    *,
    span: tuple[int, int] | None,
    gaps: Iterable[RangeGap] | None,
    gaps_note: str = "",
) -> TradeIntegrity:
    """The report of [start_ms, end_ms) from the ticker's stored span (oldest, newest
    trade; None: none stored) and its gaps (None: ``market.gaps`` not read, `gaps_note`
    says why). A range after the newest stored trade is not recorded either: the
    recording may have stopped, and a quiet market cannot be told from it."""
    since, last = span if span is not None else (None, None)
    reason = ""
    if since is None or last is None:
        reason = f"no trade of {ticker} is stored: it was never recorded"
    elif since >= end_ms:
        reason = f"the recording of {ticker} began after the range ends"
    elif last < start_ms:
        reason = f"no trade of {ticker} is stored after the range starts (the newest before it)"
    in_range = (
        None
        if gaps is None
        else tuple(
            sorted(
                (g for g in gaps if g.overlaps(start_ms, end_ms)),
                key=lambda g: (g.from_time_ms or 0, g.gap_id),
            )
        )
    )
    if reason:
        not_until: int | None = end_ms
    else:
        assert since is not None
        not_until = since if since > start_ms else None
    return TradeIntegrity(
        ticker=ticker,
        start_ms=start_ms,
        end_ms=end_ms,
        recorded_since_ms=since,
        last_trade_ms=last,
        not_recorded_until_ms=not_until,
        gaps=in_range,
        gaps_note="" if gaps is not None else gaps_note,
        reason=reason,
    )


def with_report(schema: pa.Schema, report: TradeIntegrity) -> pa.Schema:
    """`schema` carrying the report (`REPORT_KEY`): a file says what its rows are worth
    wherever it is copied."""
    text = json.dumps(report.as_dict(), separators=(",", ":")).encode()
    return schema.with_metadata({**(schema.metadata or {}), REPORT_KEY: text})


def _ascending(times: pa.ChunkedArray | pa.Array) -> bool:
    return len(times) < 2 or bool(pc.all(pc.greater_equal(times[1:], times[:-1])).as_py())


def in_time_order(rows: pa.Table) -> pa.Table:
    """Rows sorted by trade_time, ties in the order read (a stable sort); no copy when
    they already are (files the pipeline appends in time order mostly are). A scan
    yields a day's files in manifest order, not time order: when every chunk is in
    order and the chunks, put in order of their first trade, meet without a tie, they
    are only reordered (what the stable sort gives, without copying a row)."""
    if rows.num_rows < 2:
        return rows
    times = rows.column(Ticks.TRADE_TIME).cast(pa.int64())
    if _ascending(times):
        return rows
    batches = [b for b in rows.to_batches() if b.num_rows]
    chunks = [(b.column(Ticks.TRADE_TIME).cast(pa.int64()), b) for b in batches]
    if all(_ascending(c) for c, _ in chunks):
        chunks.sort(key=lambda chunk: chunk[0][0].as_py())
        ends = [(c[0].as_py(), c[-1].as_py()) for c, _ in chunks]
        if all(last < first for (_, last), (first, _) in itertools.pairwise(ends)):
            return pa.Table.from_batches([b for _, b in chunks], schema=rows.schema)
    return rows.take(pc.sort_indices(times))


# --- the answers --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TradesResult:
    """`Client.trades`' answer: the trades in time order and the range's report."""

    table: pa.Table
    report: TradeIntegrity

    def __len__(self) -> int:
        return int(self.table.num_rows)

    def to_pandas(self) -> Any:
        """A pandas DataFrame (the optional extra `mdclient[pandas]`)."""
        extras.require("pandas", "TradesResult.to_pandas()")
        return self.table.to_pandas()


class TradeBatches(Iterator[pa.RecordBatch]):
    """`Client.trade_batches`' answer: record batches in time order, `report` known before
    the first. Reads one group of overlapping files at a time (about a day of the
    ticker), so a range larger than memory streams."""

    def __init__(
        self, report: TradeIntegrity, schema: pa.Schema, groups: Iterator[pa.Table], rows: int
    ) -> None:
        self.report = report
        self.schema = schema
        self.rows = 0  # yielded so far
        self._batches = self._iterate(groups, rows)

    def _iterate(self, groups: Iterator[pa.Table], rows: int) -> Iterator[pa.RecordBatch]:
        for group in groups:
            for batch in in_time_order(group.cast(self.schema)).to_batches(max_chunksize=rows):
                if batch.num_rows:
                    self.rows += batch.num_rows
                    yield batch

    def __iter__(self) -> TradeBatches:
        return self

    def __next__(self) -> pa.RecordBatch:
        return next(self._batches)


# --- the read -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TradeQuery:
    """A checked trade read: `trade_range`'s answer."""

    ticker: str
    start_ms: int
    end_ms: int
    columns: tuple[str, ...] = COLUMNS  # storage order, trade_time always


def trade_range(
    ticker: str,
    start: int | datetime | str,
    end: int | datetime | str,
    *,
    now_ms: int,
    columns: Sequence[str] | None = None,
) -> TradeQuery:
    """A trade read checked, or InvalidRequest (bad_ticker, bad_time, bad_time_range, an
    unknown column): the SDK's, the CLI's and the gateway's one check."""
    try:
        rules.ticker(ticker)
        start_ms = timeparse.to_ms(start, now_ms=now_ms)
        end_ms = timeparse.to_ms(end, now_ms=now_ms)
    except rules.RuleViolation as bad:
        raise InvalidRequest(bad.reason, error_code=bad.error_code) from None
    except timeparse.TimeFormatError as exc:
        raise InvalidRequest(str(exc), error_code=BAD_TIME) from None
    if start_ms < 0 or end_ms <= start_ms:
        raise InvalidRequest(
            f"need 0 <= start < end, got [{start_ms}, {end_ms}) in epoch ms",
            error_code=BAD_TIME_RANGE,
        )
    return TradeQuery(ticker, start_ms, end_ms, check_columns(columns))


def check_columns(columns: Sequence[str] | None) -> tuple[str, ...]:
    """The columns asked for, in storage order; trade_time always (the order needs it)."""
    if columns is None:
        return COLUMNS
    unknown = sorted(set(columns) - set(COLUMNS))
    if unknown:
        raise InvalidRequest(f"market.ticks has no column(s) {unknown}; it has {list(COLUMNS)}")
    wanted = {*columns, Ticks.TRADE_TIME}
    return tuple(name for name in COLUMNS if name in wanted)


def read_report(
    reader: IcebergReader, settings: ClientSettings, ticker: str, start_ms: int, end_ms: int
) -> TradeIntegrity:
    """The report of the range, from the ticker's ``market.ticks`` manifests and its
    ``market.gaps`` rows; a missing ``market.gaps`` is told in `gaps_note`, not raised."""
    from mdclient.errors import StorageError
    from mdproto.error_codes import NO_TABLE

    pieces = reader.read_tick_pieces(settings.ticks_table, None, ticker=ticker)
    found: list[RangeGap] | None
    note = ""
    try:
        found = gaps_from_table(reader.read_gaps(settings.gaps_table, None, ticker=ticker))
    except StorageError as exc:
        if exc.error_code != NO_TABLE:
            raise
        found, note = None, exc.reason
    report = integrity_report(
        ticker, start_ms, end_ms, span=spans_of(pieces).get(ticker), gaps=found, gaps_note=note
    )
    if not report.gaps:
        return report
    counted = count_stored(reader, settings, ticker, report.gaps, report.last_trade_ms)
    return dataclasses.replace(report, gaps=tuple(counted))


def count_stored(
    reader: IcebergReader,
    settings: ClientSettings,
    ticker: str,
    gaps: Sequence[RangeGap],
    last_trade_ms: int | None,
) -> list[RangeGap]:
    """`gaps` (of `ticker`) with the stored trades of those `to_count` counted: one read
    of trade ids and times per gap, over the gap alone (`Client.trades` and
    `Client.recording` both)."""
    counted: dict[str, int] = {}
    for gap in to_count(gaps, last_trade_ms):
        assert gap.from_time_ms is not None and gap.to_time_ms is not None  # to_count's
        trades = reader.read_trades(
            settings.ticks_table,
            ticker,
            gap.from_time_ms,
            gap.to_time_ms + 1,
            (Ticks.TRADE_ID, Ticks.TRADE_TIME),
        )
        counted[gap.gap_id] = stored_inside(gap, trades)
    return [dataclasses.replace(g, trades_stored=counted.get(g.gap_id)) for g in gaps]


def _recorded(reader: IcebergReader, settings: ClientSettings, query: TradeQuery) -> TradeIntegrity:
    """The range's report; NotRecorded when nothing of it is recorded."""
    report = read_report(reader, settings, query.ticker, query.start_ms, query.end_ms)
    if report.state == "not_recorded":
        raise NotRecorded(report)
    return report


def read_trades(reader: IcebergReader, settings: ClientSettings, query: TradeQuery) -> TradesResult:
    """The report, then (unless NotRecorded) the rows in one read, sorted."""
    report = _recorded(reader, settings, query)
    rows = reader.read_trades(
        settings.ticks_table, query.ticker, query.start_ms, query.end_ms, query.columns
    )
    table = in_time_order(rows.cast(arrow_schema(Ticks.SCHEMA, query.columns)))
    return TradesResult(table=table, report=report)


def open_trade_batches(
    reader: IcebergReader,
    settings: ClientSettings,
    query: TradeQuery,
    batch_rows: int = BATCH_ROWS,
) -> TradeBatches:
    """The report now (NotRecorded raised here, before any row), the rows as iterated."""
    if batch_rows < 1:
        raise InvalidRequest(f"batch_rows must be at least 1, not {batch_rows}")
    report = _recorded(reader, settings, query)
    groups = reader.trade_groups(
        settings.ticks_table, query.ticker, query.start_ms, query.end_ms, query.columns
    )
    return TradeBatches(report, arrow_schema(Ticks.SCHEMA, query.columns), groups, batch_rows)
