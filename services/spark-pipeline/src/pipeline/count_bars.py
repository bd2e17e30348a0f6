"""Tick bars (every N trades) and volume bars (every V of base volume) from recorded
trades: the history answer to a request with ``bars`` (docs/adr/0015-bars-from-trades.md).

    ingestor: ``bars`` set -> a lone OK final marker, ``source = SOURCE_TRADES``
    history query (this module, per such marker, beside `trade_bars` for time bars):
      the ticker's recording and unrepaired gaps -> `plan` (pure): the trades counted
      -> `bars_sql` (pure): one Spark SQL job over ``ticks`` (executors): trade order
         by a window over the ticker, bar number per trade, one group per bar
      -> cached, counted, MERGEd into ``trade_bars`` (`merge_sql`)
      -> `report` (pure): status and integrity report of the notification

Counting starts at the first trade at or after the request's start (the *anchor*), in
trade order (time, id length, id: the live engine's order), and covers the trades the
recording has settled: before ``end`` and before the newest stored trade (trades of
that instant may still be on their way). Only full bars are stored: a tick bar of N
trades; a volume bar once the volume since the anchor reaches V x (its number + 1). A
trade is never split: bar ``seq`` of a volume bar holds the trades whose volume before
them lies in [V x seq, V x (seq + 1)), so a trade larger than V closes its bar with
more than V and the next bar's number skips. Volumes are summed as DECIMAL(38, 18):
ten trades of 0.1 make one bar of 1, as a person would count.

Bars are keyed by (ticker, bars, anchor, seq): the same request again, or a longer
range from the same start, finds the same rows. A gap not repaired shifts every count
after it: a bar ending at or after the gap's start is ``incomplete``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mdproto import rules, topics
from mdproto.error_codes import INVALID_REQUEST, NOT_RECORDED
from mdproto.messages import Status
from mdproto.tables import Ticks, TradeBars
from pipeline.records import MAX_TIME_MS
from pipeline.trade_bars import TRADE_ORDER, BarCounts, BarReport, GapSpan, Recording

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from mdproto.messages import BatchMetadata
    from pipeline.lake import Lake

#: Exact volume sums: 20 integer digits, 18 decimals (any exchange's amount step).
VOLUME_DECIMAL = "DECIMAL(38, 18)"


@dataclass(frozen=True, slots=True)
class CountPlan:
    """What one request's tick or volume bars are made of."""

    ticker: str
    bars: rules.Bars
    start_ms: int  # the anchor: counting starts at the first trade at or after it
    end_ms: int
    trades_ms: tuple[int, int] | None  # [lo, hi) of the trades counted; None: none settled
    doubt_from_ms: int | None  # a gap not repaired starts here (bars ending at or after it)


def plan(
    ticker: str,
    bars: rules.Bars,
    start_ms: int,
    end_ms: int,
    recording: Recording,
    gaps: Iterable[GapSpan],
) -> CountPlan:
    """The settled trades of [start_ms, end_ms) and where doubt begins."""
    rules.time_range(start_ms, end_ms)
    topics.parse_ticker(ticker)  # validated tickers are safe SQL literals
    window: tuple[int, int] | None = None
    if recording.first_ms is not None and recording.last_ms is not None:
        lo, hi = max(start_ms, recording.first_ms), min(end_ms, recording.last_ms)
        window = (lo, hi) if lo < hi else None
    doubt: int | None = None
    if window is not None:
        for gap in gaps:
            if gap.status == "REPAIRED":
                continue
            begins = window[0] if gap.from_ms is None else max(window[0], gap.from_ms)
            ends_after = gap.to_ms is None or gap.to_ms >= window[0]
            if ends_after and begins < window[1]:
                doubt = begins if doubt is None else min(doubt, begins)
    return CountPlan(ticker, bars, start_ms, end_ms, window, doubt)


def _timestamp(ms: int) -> str:
    return f"timestamp_micros({int(ms) * 1000})"


def bars_sql(ticks_table: str, count_plan: CountPlan, request_id: str) -> str:
    """The request's full bars as ``trade_bars`` rows: one Spark job over ``ticks``.

    A window over the ticker's trades in trade order numbers them (tick bars) or sums
    their volume (volume bars, exact decimals); each trade's bar number is then an
    integer division, and one GROUP BY builds the bars. Raises ValueError when no trade
    is settled in the range.
    """
    window = count_plan.trades_ms
    if window is None:
        raise ValueError("no recorded, settled trade in the range: nothing to count")
    if not topics.is_valid_id(request_id):  # ids are [A-Za-z0-9_.-]: safe as SQL literals
        raise ValueError(f"request id {request_id!r} is not a valid id")
    spec = count_plan.bars
    size = format(spec.size.normalize(), "f")  # digits and a dot only (rules.bars)
    price, amount, side, trade_id = Ticks.PRICE, Ticks.AMOUNT, Ticks.SIDE, Ticks.TRADE_ID
    order = f"PARTITION BY {Ticks.TICKER} ORDER BY {TRADE_ORDER}"
    v = f"CAST('{size}' AS {VOLUME_DECIMAL})"
    if spec.kind == rules.TICKS:
        numbered = f"(row_number() OVER ({order}) - 1) DIV {size} AS seq"
        full = f"count(1) = {size}"
    else:
        cumulative = f"sum(amt) OVER ({order} ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)"
        numbered = f"({cumulative} - amt) DIV {v} AS seq, {cumulative} AS cum"
        full = f"max(cum) DIV {v} > seq"  # the volume after its last trade reaches V(seq+1)
    all_sided = f"count({side}) = count(1)"
    buy = f"CASE {side} WHEN 'BUY' THEN {amount} ELSE 0D END"
    buy_quote = f"CASE {side} WHEN 'BUY' THEN {price} * {amount} ELSE 0D END"
    incomplete = (
        "false"
        if count_plan.doubt_from_ms is None
        else f"max({Ticks.TRADE_TIME}) >= {_timestamp(count_plan.doubt_from_ms)}"
    )
    return f"""SELECT
  '{count_plan.ticker}' AS {TradeBars.TICKER},
  '{spec.name}' AS {TradeBars.BARS},
  {_timestamp(count_plan.start_ms)} AS {TradeBars.ANCHOR_TIME},
  CAST(seq AS BIGINT) AS {TradeBars.SEQ},
  max({Ticks.EXCHANGE}) AS {TradeBars.EXCHANGE},
  max({Ticks.SYMBOL}) AS {TradeBars.SYMBOL},
  min({Ticks.TRADE_TIME}) AS {TradeBars.OPEN_TIME},
  max({Ticks.TRADE_TIME}) AS {TradeBars.CLOSE_TIME},
  min_by({price}, {TRADE_ORDER}) AS {TradeBars.OPEN},
  max({price}) AS {TradeBars.HIGH},
  min({price}) AS {TradeBars.LOW},
  max_by({price}, {TRADE_ORDER}) AS {TradeBars.CLOSE},
  sum({amount}) AS {TradeBars.VOLUME},
  count(1) AS {TradeBars.TRADE_COUNT},
  sum({price} * {amount}) AS {TradeBars.QUOTE_VOLUME},
  CASE WHEN {all_sided} THEN sum({buy}) END AS {TradeBars.TAKER_BUY_VOLUME},
  CASE WHEN {all_sided} THEN sum({buy_quote}) END AS {TradeBars.TAKER_BUY_QUOTE_VOLUME},
  min_by({trade_id}, {TRADE_ORDER}) AS {TradeBars.FIRST_TRADE_ID},
  max_by({trade_id}, {TRADE_ORDER}) AS {TradeBars.LAST_TRADE_ID},
  {incomplete} AS {TradeBars.INCOMPLETE},
  '{request_id}' AS {TradeBars.REQUEST_ID},
  current_timestamp() AS {TradeBars.INGESTED_AT}
FROM (
  SELECT *, {numbered}
  FROM (
    SELECT *, CAST({amount} AS {VOLUME_DECIMAL}) AS amt
    FROM {ticks_table}
    WHERE {Ticks.TICKER} = '{count_plan.ticker}'
      AND {Ticks.TRADE_TIME} >= {_timestamp(window[0])}
      AND {Ticks.TRADE_TIME} < {_timestamp(window[1])}
  )
)
GROUP BY seq
HAVING {full}"""


def merge_sql(target: str, source_view: str) -> str:
    """Upsert bars by their key: new ones inserted, a stored one whose values or
    ``incomplete`` note differ (trades repaired since) updated; equal ones untouched."""
    key = " AND ".join(f"t.{c} = s.{c}" for c in TradeBars.SCHEMA.key)
    skip = {*TradeBars.SCHEMA.key, TradeBars.REQUEST_ID, TradeBars.INGESTED_AT}
    values = [c for c in TradeBars.SCHEMA.names if c not in skip]
    same = " AND ".join(f"t.{c} <=> s.{c}" for c in values)
    return (
        f"MERGE INTO {target} t USING {source_view} s ON {key} "
        f"WHEN MATCHED AND NOT ({same}) THEN UPDATE SET * "
        "WHEN NOT MATCHED THEN INSERT *"
    )


def _utc(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


def report(
    count_plan: CountPlan,
    recording: Recording,
    counts: BarCounts,
    iceberg_table: str = "",
    snapshot_id: int = 0,
) -> BarReport:
    """OK with bars; NOT_FOUND otherwise, ``not_recorded`` when no settled trade of the
    range is recorded (never an empty OK). ``expected_candles`` is the full bars the
    settled trades make (the trailing partial one is not stored, so none is missing)."""
    name = count_plan.bars.name
    notes = []
    window = count_plan.trades_ms
    if window is not None:
        if window[0] > count_plan.start_ms:
            notes.append(f"not recorded before {_utc(window[0])}")
        if window[1] < count_plan.end_ms:
            notes.append(f"recorded and settled until {_utc(window[1])}")
    if counts.incomplete:
        notes.append(
            f"{counts.incomplete} bars marked incomplete (at or after a gap not repaired "
            f"from {_utc(count_plan.doubt_from_ms or 0)})"
        )
    tail = "".join(f"; {n}" for n in notes)
    if counts.rows > 0:
        reason = f"{counts.rows} bars of {name} from recorded trades{tail}"
        return BarReport(
            Status.OK, reason, "", counts.rows, counts.rows, 0, 0, iceberg_table, snapshot_id
        )
    if window is None:
        if recording.first_ms is None or recording.last_ms is None:
            reason = f"no trade of {count_plan.ticker} is recorded"
        else:
            reason = (
                f"{count_plan.ticker} is recorded from {_utc(recording.first_ms)} to "
                f"{_utc(recording.last_ms)}: no settled trade of the range lies in it"
            )
        return BarReport(Status.NOT_FOUND, reason, NOT_RECORDED, 0, 0, 0, 0)
    reason = f"the recorded trades of the range do not fill one bar of {name}{tail}"
    return BarReport(Status.NOT_FOUND, reason, "", 0, 0, 0, 0)


def check(meta: BatchMetadata, request_id: str) -> str:
    """Why no bar can be built for the marker ('' if one can)."""
    try:
        rules.ticker(meta.ticker)
        rules.history_bars(meta.bars, meta.period_seconds)
        rules.time_range(meta.start_time_ms, meta.end_time_ms)
    except rules.RuleViolation as bad:
        return bad.reason
    if meta.end_time_ms > MAX_TIME_MS:
        return f"end_time_ms {meta.end_time_ms} is after 9999-12-31"
    if not topics.is_valid_id(request_id):
        return f"request id {request_id!r} is not a valid id"
    return ""


def table_names(lake: Lake) -> tuple[str, str]:
    """(Spark identifier, the name notifications carry) of ``trade_bars``."""
    names = lake.names
    return names.trade_bars, f"{names.namespace}.{names.trade_bars_table}"


def answer(lake: Lake, session: SparkSession, meta: BatchMetadata, request_id: str) -> BarReport:
    """Build, store and report one request's tick or volume bars (Spark jobs; only two
    counts reach the driver). Raises what Spark raises: the micro-batch fails and is
    replayed, and the MERGE finds its own rows. A marker no bar can be built for is an
    ERROR ``invalid_request``, never a failed batch."""
    problem = check(meta, request_id)
    if problem:
        return BarReport(Status.ERROR, problem, INVALID_REQUEST, 0, 0, 0, 0)
    spec = rules.history_bars(meta.bars, meta.period_seconds)
    recording = lake.recording(session, meta.ticker)
    gaps = lake.unrepaired_gaps(session, meta.ticker) if recording.first_ms is not None else []
    count_plan = plan(meta.ticker, spec, meta.start_time_ms, meta.end_time_ms, recording, gaps)
    if count_plan.trades_ms is None:
        return report(count_plan, recording, BarCounts(0, 0))
    target, for_clients = table_names(lake)
    counts = lake.write_count_bars(session, bars_sql(lake.names.ticks, count_plan, request_id))
    snapshot = lake.snapshot_id(target) if counts.rows else 0
    return report(count_plan, recording, counts, for_clients, snapshot)
