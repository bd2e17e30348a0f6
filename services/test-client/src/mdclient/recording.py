"""What the platform records: per ticker, the span of its stored trades, today's count
and its gaps (docs/protocol.md "Recording").

    Client.recording / mdclient recording / the gateway's GET /recording
      -> read_recording
           IcebergReader.read_tick_pieces  market.ticks: per data file, its statistics
                                           (rows, first and last trade_time); rows are read
                                           only where those are not exact  -> pieces
           IcebergReader.read_gaps         market.gaps: a few columns, a few rows a day
           IcebergReader.read_trades       a lately REPAIRED gap's stored trades, counted
                                           (`mdclient.trades.count_stored`)
      -> summarise (pure)                  -> RecordingStatus

*Recorded* here means stored: every ticker with trades in ``market.ticks``, and every
ticker with a row in ``market.gaps`` (only a recording reports gaps). The recording's
universe itself is the ingestors' configuration, which Iceberg does not hold, so a
market a client's live subscription fed is listed too; its gap counts are all 0.

Pieces, not rows: a ``market.ticks`` data file without delete files, of one ticker
(its identity partition) and one UTC day (its trade_time bounds), is summarised by
its manifest entry alone, so the answer costs the table's file count, not its
trade count. Plain data and pure functions first, then `read_recording`, which runs
the reader.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from mdproto.messages import TradeGap
from mdproto.tables import Gaps, Ticks

if TYPE_CHECKING:
    from mdclient.config import ClientSettings
    from mdclient.frames import IcebergReader
    from mdclient.trades import RangeGap

DAY_US = 86_400_000_000

#: The trades of one ticker on one UTC day (a data file's, or a group of rows read).
PIECES = pa.schema(
    [
        pa.field(Ticks.TICKER, pa.string()),
        pa.field("day", pa.date32()),
        pa.field("trades", pa.int64()),
        pa.field("first_trade", pa.timestamp("us", tz="UTC")),
        pa.field("last_trade", pa.timestamp("us", tz="UTC")),
    ]
)
#: What `read_ticks` reads of ``market.ticks`` where file statistics do not do.
TICK_COLUMNS = (Ticks.TICKER, Ticks.TRADE_TIME)
#: What `read_gaps` reads of ``market.gaps``.
GAP_COLUMNS = (
    Gaps.GAP_ID,
    Gaps.TICKER,
    Gaps.STATUS,
    Gaps.CAUSE,
    Gaps.REASON,
    Gaps.FROM_TIME,
    Gaps.TO_TIME,
    Gaps.MISSING_IDS,
    Gaps.TRADES_RECOVERED,
    Gaps.FROM_TRADE_ID,
    Gaps.TO_TRADE_ID,
    Gaps.UPDATED_AT,
)

OPEN = TradeGap.State.Name(TradeGap.OPEN)
REPAIRING = TradeGap.State.Name(TradeGap.REPAIRING)
REPAIRED = TradeGap.State.Name(TradeGap.REPAIRED)
UNREPAIRABLE = TradeGap.State.Name(TradeGap.UNREPAIRABLE)

#: ok: nothing waits or is lost; repairing: gaps open or being repaired; incomplete: a gap
#: is unrepairable (its trades are lost for good); unknown: market.gaps was not read.
MarketState = Literal["ok", "repairing", "incomplete", "unknown"]


@dataclass(frozen=True, slots=True)
class GapCounts:
    open: int = 0
    repairing: int = 0
    repaired: int = 0
    unrepairable: int = 0


@dataclass(frozen=True, slots=True)
class LostGap:
    """An UNREPAIRABLE gap: the trades between its ends are not all in ``market.ticks``."""

    gap_id: str
    ticker: str
    cause: str  # SKIPPED_IDS, RECONNECT, RESTART, DELIVERY_FAILED
    from_time_ms: int | None
    to_time_ms: int | None
    missing_ids: int  # 0: unknown (no consecutive ids)
    trades_recovered: int
    reason: str


@dataclass(frozen=True, slots=True)
class RecordedMarket:
    ticker: str
    since_ms: int | None  # its oldest trade in market.ticks; None: no trade stored
    last_trade_ms: int | None  # its newest
    trades_today: int  # stored trades of the UTC day `RecordingStatus.day`
    gaps: GapCounts | None  # None: market.gaps not read (RecordingStatus.gaps_note)
    unrepairable: tuple[LostGap, ...] = ()

    @property
    def state(self) -> MarketState:
        if self.gaps is None:
            return "unknown"
        if self.gaps.unrepairable:
            return "incomplete"
        if self.gaps.open or self.gaps.repairing:
            return "repairing"
        return "ok"


@dataclass(frozen=True, slots=True)
class RecordingStatus:
    """`Client.recording`'s answer: one `RecordedMarket` per ticker, sorted."""

    exchange: str | None  # None: every exchange
    as_of_ms: int
    day: str  # the UTC day trades_today counts, 2026-11-20
    markets: tuple[RecordedMarket, ...]
    gaps_note: str = ""  # why the gap counts are unknown (market.gaps missing); else ""

    @property
    def lost_gaps(self) -> list[LostGap]:
        return [gap for market in self.markets for gap in market.unrepairable]

    def table(self) -> pa.Table:
        """One row per market (gap counts null when unknown), for pandas or files."""
        times = pa.timestamp("ms", tz="UTC")
        columns: dict[str, pa.Array] = {
            "ticker": pa.array([m.ticker for m in self.markets], pa.string()),
            "state": pa.array([m.state for m in self.markets], pa.string()),
            "since": pa.array([m.since_ms for m in self.markets], times),
            "last_trade": pa.array([m.last_trade_ms for m in self.markets], times),
            "trades_today": pa.array([m.trades_today for m in self.markets], pa.int64()),
        }
        for name in ("open", "repairing", "repaired", "unrepairable"):
            values = [None if m.gaps is None else getattr(m.gaps, name) for m in self.markets]
            columns[f"gaps_{name}"] = pa.array(values, pa.int64())
        return pa.table(columns)

    def as_dict(self) -> dict[str, Any]:
        """The JSON shape of `mdclient recording --format json` and the gateway's
        ``GET /recording``: 64-bit integers (times in ms, trade counts) as decimal strings,
        as in every JSON the platform sends (docs/protocol.md "Gateway")."""
        return {
            "exchange": self.exchange,
            "as_of_ms": str(self.as_of_ms),
            "day": self.day,
            "gaps_known": not self.gaps_note,
            "gaps_note": self.gaps_note or None,
            "markets": [_market_dict(m) for m in self.markets],
        }


def _int64(value: int | None) -> str | None:
    return None if value is None else str(value)


def _market_dict(market: RecordedMarket) -> dict[str, Any]:
    gaps = market.gaps
    return {
        "ticker": market.ticker,
        "state": market.state,
        "since_ms": _int64(market.since_ms),
        "last_trade_ms": _int64(market.last_trade_ms),
        "trades_today": str(market.trades_today),
        "gaps": None if gaps is None else asdict(gaps),
        "unrepairable": [gap_dict(g) for g in market.unrepairable],
    }


def gap_dict(gap: LostGap) -> dict[str, Any]:
    """A gap's JSON (`GET /recording`'s unrepairable ones, `GET /trades`' report)."""
    return {
        "gap_id": gap.gap_id,
        "cause": gap.cause,
        "from_time_ms": _int64(gap.from_time_ms),
        "to_time_ms": _int64(gap.to_time_ms),
        "missing_ids": str(gap.missing_ids),
        "trades_recovered": str(gap.trades_recovered),
        "reason": gap.reason,
    }


# --- pure: pieces and the summary ---------------------------------------------------------


def file_piece(
    ticker: str | None, rows: int, first_us: int | None, last_us: int | None
) -> dict[str, Any] | None:
    """A data file's piece from its statistics, or None when they do not tell it exactly
    (no single ticker, no bounds, or trades of more than one UTC day: its rows are read)."""
    if ticker is None or first_us is None or last_us is None:
        return None
    day = first_us // DAY_US
    if last_us // DAY_US != day:
        return None
    return {
        Ticks.TICKER: ticker,
        "day": day,
        "trades": rows,
        "first_trade": first_us,
        "last_trade": last_us,
    }


def pieces_from_files(files: Iterable[Mapping[str, Any]]) -> pa.Table:
    """`file_piece` dicts -> PIECES."""
    return pa.Table.from_pylist(list(files), schema=PIECES)


def pieces_from_trades(trades: pa.Table) -> pa.Table:
    """Rows (ticker, trade_time) -> PIECES, one per ticker and UTC day."""
    if trades.num_rows == 0:
        return PIECES.empty_table()
    times = trades.column(Ticks.TRADE_TIME).cast(pa.timestamp("us", tz="UTC"))
    days = pa.table(
        {Ticks.TICKER: trades.column(Ticks.TICKER), "day": pc.cast(times, pa.date32()), "t": times}
    )
    grouped = days.group_by([Ticks.TICKER, "day"]).aggregate(
        [("t", "count"), ("t", "min"), ("t", "max")]
    )
    return pa.table(
        [
            grouped.column(Ticks.TICKER),
            grouped.column("day"),
            grouped.column("t_count"),
            grouped.column("t_min"),
            grouped.column("t_max"),
        ],
        schema=PIECES,
    )


def summarise(
    pieces: pa.Table,
    gaps: pa.Table | None,
    *,
    exchange: str | None,
    now_ms: int,
    gaps_note: str = "",
    awaiting: frozenset[str] = frozenset(),
) -> RecordingStatus:
    """Pieces of ``market.ticks`` and rows of ``market.gaps`` (None: not read, gaps_note
    says why) -> one `RecordedMarket` per ticker of either, of `exchange` if given. The
    REPAIRED gaps in `awaiting` (ids) count as repairing: their recovered trades are not
    all stored yet (`mdclient.trades.RangeGap.awaiting_trades`)."""
    prefix = f"{exchange}:" if exchange else ""
    today = now_ms * 1000 // DAY_US
    spans = spans_of(pieces)
    today_counts = _trades_on(pieces, today)
    counts, lost = _gap_summary(gaps, awaiting) if gaps is not None else ({}, {})
    tickers = sorted(t for t in {*spans, *counts} if t.startswith(prefix))
    markets = tuple(
        RecordedMarket(
            ticker=ticker,
            since_ms=spans[ticker][0] if ticker in spans else None,
            last_trade_ms=spans[ticker][1] if ticker in spans else None,
            trades_today=today_counts.get(ticker, 0),
            gaps=None if gaps is None else counts.get(ticker, GapCounts()),
            unrepairable=tuple(lost.get(ticker, ())),
        )
        for ticker in tickers
    )
    return RecordingStatus(
        exchange=exchange,
        as_of_ms=now_ms,
        day=_iso_day(today),
        markets=markets,
        gaps_note=gaps_note if gaps is None else "",
    )


def spans_of(pieces: pa.Table) -> dict[str, tuple[int, int]]:
    """Each ticker's (oldest, newest) stored trade in epoch ms, from its pieces."""
    if not pieces.num_rows:
        return {}
    by_ticker = pieces.group_by(Ticks.TICKER).aggregate(
        [("first_trade", "min"), ("last_trade", "max")]
    )
    firsts = by_ticker.column("first_trade_min").cast(pa.int64()).to_pylist()
    lasts = by_ticker.column("last_trade_max").cast(pa.int64()).to_pylist()
    tickers = by_ticker.column(Ticks.TICKER).to_pylist()
    return {
        ticker: (first // 1000, last // 1000)
        for ticker, first, last in zip(tickers, firsts, lasts, strict=True)
    }


def _trades_on(pieces: pa.Table, day: int) -> dict[str, int]:
    of_day = pieces.filter(pc.equal(pieces.column("day").cast(pa.int32()), day))
    if of_day.num_rows == 0:
        return {}
    sums = of_day.group_by(Ticks.TICKER).aggregate([("trades", "sum")])
    return dict(
        zip(
            sums.column(Ticks.TICKER).to_pylist(),
            sums.column("trades_sum").to_pylist(),
            strict=True,
        )
    )


def _gap_summary(
    gaps: pa.Table, awaiting: frozenset[str]
) -> tuple[dict[str, GapCounts], dict[str, list[LostGap]]]:
    """Counts per ticker by status (a status this client does not know counts as open:
    not known to be repaired; a gap in `awaiting` as repairing), and the unrepairable
    gaps, oldest first."""
    tallies: dict[str, dict[str, int]] = {}
    lost: dict[str, list[LostGap]] = {}
    for row in gap_rows(gaps):
        ticker, key = row[Gaps.TICKER], known_status(row[Gaps.STATUS])
        if row[Gaps.GAP_ID] in awaiting:
            key = REPAIRING
        tally = tallies.setdefault(ticker, {})
        tally[key] = tally.get(key, 0) + 1
        if key == UNREPAIRABLE:
            lost.setdefault(ticker, []).append(lost_gap(row))
    counts = {
        ticker: GapCounts(
            open=t.get(OPEN, 0),
            repairing=t.get(REPAIRING, 0),
            repaired=t.get(REPAIRED, 0),
            unrepairable=t.get(UNREPAIRABLE, 0),
        )
        for ticker, t in tallies.items()
    }
    for items in lost.values():
        items.sort(key=lambda g: (g.from_time_ms or 0, g.gap_id))
    return counts, lost


def gap_rows(gaps: pa.Table) -> list[dict[str, Any]]:
    """``market.gaps`` rows, `GAP_COLUMNS`, from/to and updated times as epoch µs (exact:
    a datetime is not)."""
    rows = gaps.select(list(GAP_COLUMNS))
    for name in (Gaps.FROM_TIME, Gaps.TO_TIME, Gaps.UPDATED_AT):
        at = rows.schema.get_field_index(name)
        rows = rows.set_column(at, name, rows.column(name).cast(pa.int64()))
    listed: list[dict[str, Any]] = rows.to_pylist()
    return listed


def known_status(status: str | None) -> str:
    """A gap's status; one this client does not know counts as OPEN (not known to be
    repaired)."""
    return status if status in (REPAIRING, REPAIRED, UNREPAIRABLE) else OPEN


def lost_gap(row: Mapping[str, Any]) -> LostGap:
    """A `gap_rows` row as a LostGap (its ends in ms)."""
    return LostGap(
        gap_id=row[Gaps.GAP_ID],
        ticker=row[Gaps.TICKER],
        cause=row[Gaps.CAUSE] or "",
        from_time_ms=_ms(row[Gaps.FROM_TIME]),
        to_time_ms=_ms(row[Gaps.TO_TIME]),
        missing_ids=row[Gaps.MISSING_IDS] or 0,
        trades_recovered=row[Gaps.TRADES_RECOVERED] or 0,
        reason=row[Gaps.REASON] or "",
    )


def _ms(micros: int | None) -> int | None:
    return None if micros is None else micros // 1000


def _iso_day(day: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(day * 86_400, tz=UTC).strftime("%Y-%m-%d")


# --- the read -----------------------------------------------------------------------------


def read_recording(
    reader: IcebergReader, settings: ClientSettings, exchange: str | None, now_ms: int
) -> RecordingStatus:
    """`Client.recording` and the CLI without a relay. StorageError when ``market.ticks``
    cannot be read; a missing ``market.gaps`` is told in `gaps_note`, not raised."""
    from mdclient.errors import StorageError
    from mdproto.error_codes import NO_TABLE

    pieces = reader.read_tick_pieces(settings.ticks_table, exchange)
    note = ""
    gaps: pa.Table | None
    try:
        gaps = reader.read_gaps(settings.gaps_table, exchange)
    except StorageError as exc:
        if exc.error_code != NO_TABLE:
            raise
        gaps, note = None, exc.reason
    awaiting = frozenset() if gaps is None else _awaiting(reader, settings, pieces, gaps)
    return summarise(
        pieces, gaps, exchange=exchange, now_ms=now_ms, gaps_note=note, awaiting=awaiting
    )


def _awaiting(
    reader: IcebergReader, settings: ClientSettings, pieces: pa.Table, gaps: pa.Table
) -> frozenset[str]:
    """The REPAIRED gaps whose recovered trades ``market.ticks`` does not all hold yet,
    found as `Client.trades` finds them (`mdclient.trades.count_stored`), per ticker."""
    from mdclient.trades import count_stored, gaps_from_table

    by_ticker: dict[str, list[RangeGap]] = {}
    for gap in gaps_from_table(gaps):
        by_ticker.setdefault(gap.ticker, []).append(gap)
    spans = spans_of(pieces)
    awaiting: set[str] = set()
    for ticker, found in by_ticker.items():
        newest = spans[ticker][1] if ticker in spans else None
        counted = count_stored(reader, settings, ticker, found, newest)
        awaiting |= {g.gap_id for g in counted if g.awaiting_trades}
    return frozenset(awaiting)
