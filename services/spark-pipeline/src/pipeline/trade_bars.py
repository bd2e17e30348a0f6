"""Bars of any period from recorded trades: the history answer for a period the exchange
does not serve (docs/adr/0015-bars-from-trades.md).

    ingestor: period not served -> a lone OK final marker, ``source = SOURCE_TRADES``
    history query (this module, per such marker):
      the ticker's recording (oldest and newest stored trade) and its unrepaired gaps
      -> `plan` (pure): the bar slots of [start, end), which of them are recorded and
         settled, which trades to aggregate
      -> `bars_sql` (pure): one Spark aggregation over ``ticks`` (executors), cached
      -> counted, then MERGEd into ``ohlc`` as ``source = 'trades'`` (`lake.merge_trade_bars`)
      -> `report` (pure): status and the integrity report of the notification

A slot is an epoch-aligned open time ``t = k * period`` with ``start <= t < end``. It
is *known* when the recording covers it: at or after the window of the ticker's
oldest stored trade, and closed, i.e. a stored trade lies at or past its end (the
window of the newest stored trade may still be filling: ticks-persist commits a
minute or so after the trades happen). A known slot overlapping a gap that is not
``REPAIRED`` is *doubtful*: its bar (if any) is written with ``incomplete = true``.
Known, undoubted slots without a bar had no trades (``exchange_gaps``: empty, not an
error); every other slot without a bar is ``missing_candles``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mdproto import rules, topics
from mdproto.error_codes import INVALID_REQUEST, NOT_RECORDED
from mdproto.messages import Status
from mdproto.tables import Gaps, Ohlc, Ticks
from pipeline.records import MAX_PERIOD_SECONDS, MAX_TIME_MS, SOURCE_TRADES

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from mdproto.messages import BatchMetadata
    from pipeline.lake import Lake

#: A gap of this status has every trade back in ``ticks``: its bars are complete.
REPAIRED = "REPAIRED"
#: A trade's place in trade order, as `candle_close.TradeKey` and the live engine have it:
#: time, then id (shorter first, so "9" < "10").
TRADE_ORDER = f"struct(unix_micros({Ticks.TRADE_TIME}), length({Ticks.TRADE_ID}), {Ticks.TRADE_ID})"

Span = tuple[int, int]  # slot indices, both ends in


@dataclass(frozen=True, slots=True)
class Recording:
    """The ticker's oldest and newest trade in ``ticks`` (None: nothing stored)."""

    first_ms: int | None
    last_ms: int | None


@dataclass(frozen=True, slots=True)
class GapSpan:
    """A ``gaps`` row of the ticker: [from_ms, to_ms], an unknown (null) end unbounded."""

    status: str | None
    from_ms: int | None
    to_ms: int | None


@dataclass(frozen=True, slots=True)
class BarPlan:
    """What one request's bars are made of (`plan`)."""

    ticker: str
    period_seconds: int
    first_slot: int  # index of the range's first slot (open time = index x period)
    slots: int  # slots in [start, end): the integrity report's expected_candles
    known: Span | None  # recorded and settled slots (None: none)
    doubtful: tuple[Span, ...]  # known slots overlapping an unrepaired gap, disjoint, sorted

    @property
    def period_ms(self) -> int:
        return self.period_seconds * 1000

    @property
    def trades_ms(self) -> tuple[int, int] | None:
        """[lo, hi) of the trade times aggregated: exactly the known slots' windows."""
        if self.known is None:
            return None
        return self.known[0] * self.period_ms, (self.known[1] + 1) * self.period_ms

    @property
    def doubtful_slots(self) -> int:
        return sum(hi - lo + 1 for lo, hi in self.doubtful)

    @property
    def known_slots(self) -> int:
        return 0 if self.known is None else self.known[1] - self.known[0] + 1


@dataclass(frozen=True, slots=True)
class BarCounts:
    """What the aggregation wrote: bars, and those of them over an unrepaired gap."""

    rows: int
    incomplete: int


@dataclass(frozen=True, slots=True)
class BarReport:
    """The notification's outcome and integrity report for one request."""

    status: int
    reason: str
    error_code: str
    row_count: int
    expected_candles: int
    exchange_gaps: int  # known slots without trades
    missing_candles: int  # slots without a bar that are not known to be empty
    iceberg_table: str = ""  # where the bars are, if not ``ohlc`` (tick and volume bars)
    snapshot_id: int = 0  # that table's snapshot holding them (0: ``ohlc``'s)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def plan(
    ticker: str,
    period_seconds: int,
    start_ms: int,
    end_ms: int,
    recording: Recording,
    gaps: Iterable[GapSpan],
) -> BarPlan:
    """The slots of [start_ms, end_ms), and which of them the recording speaks for."""
    rules.history_range(period_seconds, start_ms, end_ms)
    topics.parse_ticker(ticker)  # validated tickers are safe SQL literals
    p = period_seconds * 1000
    first, last = _ceil_div(start_ms, p), _ceil_div(end_ms, p) - 1
    slots = max(0, last - first + 1)
    known: Span | None = None
    if recording.first_ms is not None and recording.last_ms is not None and slots:
        lo = max(first, recording.first_ms // p)
        hi = min(last, recording.last_ms // p - 1)  # closed: a trade at or past its end
        known = (lo, hi) if lo <= hi else None
    doubtful: list[Span] = []
    if known is not None:
        for gap in gaps:
            if gap.status == REPAIRED:
                continue
            lo = known[0] if gap.from_ms is None else max(known[0], gap.from_ms // p)
            hi = known[1] if gap.to_ms is None else min(known[1], gap.to_ms // p)
            if lo <= hi:
                doubtful.append((lo, hi))
    return BarPlan(ticker, period_seconds, first, slots, known, tuple(_union(doubtful)))


def _union(spans: Iterable[Span]) -> list[Span]:
    out: list[Span] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _timestamp(ms: int) -> str:
    return f"timestamp_micros({int(ms) * 1000})"


def bars_sql(ticks_table: str, bar_plan: BarPlan, request_id: str) -> str:
    """The request's bars as ``ohlc`` rows, one Spark aggregation over ``ticks``.

    Grouped by ``floor(trade_time / period)``; open and close by trade order, high,
    low, volume, quote volume (price x amount), trade count; the taker-buy volumes
    only where every trade of the bar has a side (else null, as for an exchange that
    does not report them). Raises ValueError when the plan has no known slot.
    """
    window = bar_plan.trades_ms
    if window is None:
        raise ValueError("no recorded, settled slot in the range: nothing to aggregate")
    if not topics.is_valid_id(request_id):  # ids are [A-Za-z0-9_.-]: safe as SQL literals
        raise ValueError(f"request id {request_id!r} is not a valid id")
    p_us = bar_plan.period_ms * 1000
    price, amount, side = Ticks.PRICE, Ticks.AMOUNT, Ticks.SIDE
    micros = f"unix_micros({Ticks.TRADE_TIME})"
    all_sided = f"count({side}) = count(1)"
    buy = f"CASE {side} WHEN 'BUY' THEN {amount} ELSE 0D END"
    buy_quote = f"CASE {side} WHEN 'BUY' THEN {price} * {amount} ELSE 0D END"
    return f"""SELECT
  '{bar_plan.ticker}' AS {Ohlc.TICKER},
  max({Ticks.EXCHANGE}) AS {Ohlc.EXCHANGE},
  max({Ticks.SYMBOL}) AS {Ohlc.SYMBOL},
  CAST({bar_plan.period_seconds} AS INT) AS {Ohlc.PERIOD_SECONDS},
  timestamp_micros(open_us) AS {Ohlc.OPEN_TIME},
  min_by({price}, {TRADE_ORDER}) AS {Ohlc.OPEN},
  max({price}) AS {Ohlc.HIGH},
  min({price}) AS {Ohlc.LOW},
  max_by({price}, {TRADE_ORDER}) AS {Ohlc.CLOSE},
  sum({amount}) AS {Ohlc.VOLUME},
  count(1) AS {Ohlc.TRADE_COUNT},
  '{SOURCE_TRADES}' AS {Ohlc.SOURCE},
  '{request_id}' AS {Ohlc.REQUEST_ID},
  current_timestamp() AS {Ohlc.INGESTED_AT},
  sum({price} * {amount}) AS {Ohlc.QUOTE_VOLUME},
  CASE WHEN {all_sided} THEN sum({buy}) END AS {Ohlc.TAKER_BUY_VOLUME},
  CASE WHEN {all_sided} THEN sum({buy_quote}) END AS {Ohlc.TAKER_BUY_QUOTE_VOLUME},
  {incomplete_sql(bar_plan, "open_us")} AS {Ohlc.INCOMPLETE}
FROM (
  SELECT *, {micros} - pmod({micros}, {p_us}) AS open_us
  FROM {ticks_table}
  WHERE {Ticks.TICKER} = '{bar_plan.ticker}'
    AND {Ticks.TRADE_TIME} >= {_timestamp(window[0])}
    AND {Ticks.TRADE_TIME} < {_timestamp(window[1])}
)
GROUP BY open_us"""


def incomplete_sql(bar_plan: BarPlan, open_us: str) -> str:
    """A boolean SQL expression: the bar at ``open_us`` lies in a doubtful span."""
    p_us = bar_plan.period_ms * 1000
    terms = [f"({open_us} BETWEEN {lo * p_us} AND {hi * p_us})" for lo, hi in bar_plan.doubtful]
    return " OR ".join(terms) if terms else "false"


def recording_sql(ticks_table: str, ticker: str) -> str:
    """The ticker's oldest and newest stored trade time (ms), one row (nulls: none)."""
    topics.parse_ticker(ticker)
    return (
        f"SELECT unix_millis(min({Ticks.TRADE_TIME})) AS first_ms, "
        f"unix_millis(max({Ticks.TRADE_TIME})) AS last_ms "
        f"FROM {ticks_table} WHERE {Ticks.TICKER} = '{ticker}'"
    )


def gaps_sql(gaps_table: str, ticker: str) -> str:
    """The ticker's gaps not REPAIRED (a small table: one row per gap)."""
    topics.parse_ticker(ticker)
    return (
        f"SELECT {Gaps.STATUS} AS status, unix_millis({Gaps.FROM_TIME}) AS from_ms, "
        f"unix_millis({Gaps.TO_TIME}) AS to_ms FROM {gaps_table} "
        f"WHERE {Gaps.TICKER} = '{ticker}' "
        f"AND ({Gaps.STATUS} IS NULL OR {Gaps.STATUS} <> '{REPAIRED}')"
    )


def _utc(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


def report(bar_plan: BarPlan, recording: Recording, counts: BarCounts) -> BarReport:
    """Status and integrity report: OK with bars; NOT_FOUND otherwise, ``not_recorded``
    when the recording does not cover the range (never an empty OK)."""
    expected = bar_plan.slots
    doubtful = bar_plan.doubtful_slots
    empty = max(0, bar_plan.known_slots - doubtful - (counts.rows - counts.incomplete))
    missing = max(0, expected - counts.rows - empty)
    notes = _notes(bar_plan, recording, counts)
    if counts.rows > 0:
        reason = f"{counts.rows} bars from recorded trades" + "".join(f"; {n}" for n in notes)
        return BarReport(Status.OK, reason, "", counts.rows, expected, empty, missing)
    if bar_plan.known is None:
        reason = _not_recorded(bar_plan, recording)
        return BarReport(Status.NOT_FOUND, reason, NOT_RECORDED, 0, expected, 0, expected)
    reason = "no trades recorded in the range" + "".join(f"; {n}" for n in notes)
    return BarReport(Status.NOT_FOUND, reason, "", 0, expected, empty, missing)


def _notes(bar_plan: BarPlan, recording: Recording, counts: BarCounts) -> list[str]:
    notes = []
    p = bar_plan.period_ms
    if recording.first_ms is not None and bar_plan.known is not None:
        if bar_plan.known[0] > bar_plan.first_slot:
            notes.append(f"not recorded before {_utc(bar_plan.known[0] * p)}")
        if bar_plan.known[1] < bar_plan.first_slot + bar_plan.slots - 1:
            notes.append(f"recorded and settled until {_utc((bar_plan.known[1] + 1) * p)}")
    if bar_plan.doubtful:
        notes.append(
            f"{bar_plan.doubtful_slots} slots overlap gaps not repaired "
            f"({counts.incomplete} bars marked incomplete)"
        )
    return notes


def _not_recorded(bar_plan: BarPlan, recording: Recording) -> str:
    if recording.first_ms is None or recording.last_ms is None:
        return f"no trade of {bar_plan.ticker} is recorded"
    return (
        f"{bar_plan.ticker} is recorded from {_utc(recording.first_ms)} to "
        f"{_utc(recording.last_ms)}: no closed {bar_plan.period_seconds} s bar of the "
        "range lies in it"
    )


def check(meta: BatchMetadata, request_id: str) -> str:
    """Why no bar can be built for the marker ('' if one can): the request rules, and what
    Spark and Iceberg can hold (an int period, times up to 9999)."""
    try:
        rules.ticker(meta.ticker)
        rules.history_range(meta.period_seconds, meta.start_time_ms, meta.end_time_ms)
    except rules.RuleViolation as bad:
        return bad.reason
    if meta.period_seconds > MAX_PERIOD_SECONDS:
        return f"period_seconds {meta.period_seconds} exceeds {MAX_PERIOD_SECONDS}"
    if meta.end_time_ms > MAX_TIME_MS:
        return f"end_time_ms {meta.end_time_ms} is after 9999-12-31"
    if not topics.is_valid_id(request_id):
        return f"request id {request_id!r} is not a valid id"
    return ""


def answer(lake: Lake, session: SparkSession, meta: BatchMetadata, request_id: str) -> BarReport:
    """Build, store and report one request's bars (Spark jobs; the MERGE under the lock
    every ``ohlc`` writer holds). Raises what Spark raises: the micro-batch fails and is
    replayed, and the MERGE finds its own rows. A marker no bar can be built for (a
    record from elsewhere) is an ERROR ``invalid_request``, never a failed batch."""
    problem = check(meta, request_id)
    if problem:
        return BarReport(Status.ERROR, problem, INVALID_REQUEST, 0, 0, 0, 0)
    recording = lake.recording(session, meta.ticker)
    gaps = lake.unrepaired_gaps(session, meta.ticker) if recording.first_ms is not None else []
    bar_plan = plan(
        meta.ticker, meta.period_seconds, meta.start_time_ms, meta.end_time_ms, recording, gaps
    )
    counts = BarCounts(0, 0)
    if bar_plan.known is not None:
        counts = lake.write_trade_bars(
            session, bars_sql(lake.names.ticks, bar_plan, request_id), bar_plan
        )
    return report(bar_plan, recording, counts)
