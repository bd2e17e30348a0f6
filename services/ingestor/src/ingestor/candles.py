"""A history request's candles, pure: the pages to ask for, and the records to write.

No I/O; `history.py` drives these with an exchange adapter and a Kafka sink.
Flow: period -> the exchange's timeframe, the closed-candle range cut into
pages (`plan_fetch`, `split_plan`, `next_since`: our own loop, never ccxt's
`paginate`, which silently stops after 10 calls), each page filtered
(`accept_page`), the accepted candles cut into OHLCBatch records
(`BatchBuilder`), the exchange's answers weighed for the final marker's
exchange gaps (`ExchangeGaps`).

The records, in the order they must be written (docs/protocol.md, "OHLCBatch
records of one request"):
- sequence 0 carries `metadata` and the first rows;
- sequences 1..n-1 carry up to `batch_size` rows each;
- the final marker (`is_final`, no rows, `metadata` with status and totals)
  has sequence n = `total_batches`, the number of data records before it;
- a request without candles is a lone final marker (NOT_FOUND) at sequence 0;
- a failure ends with an ERROR final marker after the records already written.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from ingestor.model import Candle
from mdproto.contracts import FROM_STORAGE, FROM_TRADES
from mdproto.messages import OHLC, BatchMetadata, DataRequest, OHLCBatch, Status

_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_TIMEFRAME = re.compile(r"^(\d+)([smhdwMy])$")


class UnsupportedPeriodError(ValueError):
    """The exchange offers no candles of the requested period."""

    def __init__(self, period_seconds: int, offered: Sequence[int]) -> None:
        listed = ", ".join(str(p) for p in offered) or "none"
        super().__init__(
            f"period {period_seconds} s is not offered by the exchange (offered: {listed})"
        )
        self.period_seconds = period_seconds


def timeframe_seconds(timeframe: str) -> int | None:
    """`15m` -> 900. None for calendar units (months, years), whose length varies."""
    match = _TIMEFRAME.match(timeframe)
    if match is None:
        return None
    count, unit = int(match.group(1)), match.group(2)
    if unit not in _UNIT_SECONDS or count <= 0:
        return None
    return count * _UNIT_SECONDS[unit]


def timeframe_map(offered: Iterable[str]) -> dict[int, str]:
    """Period seconds -> the exchange's timeframe string, fixed-length ones only."""
    result: dict[int, str] = {}
    for timeframe in offered:
        seconds = timeframe_seconds(timeframe)
        if seconds is not None and (seconds not in result or len(timeframe) < len(result[seconds])):
            result[seconds] = timeframe
    return result


def timeframe_for(period_seconds: int, offered: Iterable[str]) -> str:
    """The timeframe for `period_seconds`, or UnsupportedPeriodError."""
    mapping = timeframe_map(offered)
    try:
        return mapping[period_seconds]
    except KeyError:
        raise UnsupportedPeriodError(period_seconds, sorted(mapping)) from None


@dataclass(frozen=True, slots=True)
class FetchPlan:
    """What to fetch: candle open times in [start_ms, end_ms), closed candles only.

    `end_ms` is the requested end clamped so that every candle opening before it
    has closed at planning time (open + period <= now): the still-open candle is
    never written, and no page is requested past it.
    """

    start_ms: int
    end_ms: int
    period_ms: int
    timeframe: str
    page_limit: int
    bounded: bool = False  # each page asks for at most page_limit periods (Coinbase needs it)

    @property
    def empty(self) -> bool:
        return self.start_ms >= self.end_ms

    @property
    def until_ms(self) -> int:
        """Inclusive upper bound for the exchange's endTime/until parameter."""
        return self.end_ms - 1

    def page_until(self, since_ms: int) -> int:
        """`until` for the page starting at `since_ms`.

        Unbounded (Binance): the range's end; the exchange returns the first
        `limit` candles from `since`, skipping empty stretches in one call.
        Bounded: at most `page_limit` periods, for exchanges that reject a
        window holding more candles than the limit.
        """
        if not self.bounded:
            return self.until_ms
        return min(self.until_ms, since_ms + self.page_limit * self.period_ms - 1)


def plan_fetch(
    start_ms: int,
    end_ms: int,
    period_seconds: int,
    timeframe: str,
    now_ms: int,
    page_limit: int,
    bounded: bool = False,
) -> FetchPlan:
    if period_seconds <= 0:
        raise ValueError(f"period must be positive, got {period_seconds}")
    if page_limit <= 0:
        raise ValueError(f"page limit must be positive, got {page_limit}")
    if start_ms < 0 or end_ms <= start_ms:
        raise ValueError(f"range [{start_ms}, {end_ms}) is empty or negative")
    period_ms = period_seconds * 1000
    closed_end = now_ms - period_ms + 1  # open < closed_end  <=>  open + period <= now
    end = min(end_ms, closed_end)
    return FetchPlan(start_ms, end, period_ms, timeframe, page_limit, bounded)


def split_plan(plan: FetchPlan) -> list[FetchPlan]:
    """`plan` cut into consecutive windows of `page_limit` periods, each pageable alone.

    Every open time in [start, end) lies in exactly one window, whatever the
    candles' phase, so windows fetched independently (and concurrently) yield
    each candle once; a window is normally one exchange call.
    """
    if plan.empty:
        return [plan]
    width = plan.page_limit * plan.period_ms
    return [
        replace(plan, start_ms=start, end_ms=min(plan.end_ms, start + width))
        for start in range(plan.start_ms, plan.end_ms, width)
    ]


def accept_page(plan: FetchPlan, page: Sequence[Candle], after_ms: int | None) -> list[Candle]:
    """The page's candles that belong to the request, ascending and unique.

    Drops candles outside [start, end) (including the still-open one), those
    at or before `after_ms` (the last open time already accepted), so pages that
    overlap never produce duplicate rows, and those the exchange itself marks
    not final (OKX `confirm=0`, after Kraken's `last`) even if the local clock
    says they closed: a still-forming candle is never written.
    """
    floor = plan.start_ms if after_ms is None else max(plan.start_ms, after_ms + 1)
    accepted: list[Candle] = []
    last = -1
    for candle in sorted(page, key=lambda c: c.open_time_ms):
        t = candle.open_time_ms
        if floor <= t < plan.end_ms and t != last and candle.final is not False:
            accepted.append(candle)
            last = t
    return accepted


class PagingStalledError(ValueError):
    """A page made no progress: continuing would loop, stopping would lose candles."""


def next_since(plan: FetchPlan, page: Sequence[Candle], since_ms: int) -> int | None:
    """Where the next page starts (last open + period), or None when done.

    Done when the page is empty (the exchange has nothing at or after `since`;
    with bounded pages: nothing in the window, so go on after it) or when the
    next page would start at or past the end. A page whose candles all open
    before `since` (an exchange ignoring the parameter) is a PagingStalledError:
    stopping there would report the rest of the range as gaps.
    """
    if not page:
        if plan.bounded:
            following = plan.page_until(since_ms) + 1
            return following if following < plan.end_ms else None
        return None
    last = max(c.open_time_ms for c in page)
    following = last + plan.period_ms
    if following <= since_ms:
        raise PagingStalledError(
            f"the exchange answered a page from {since_ms} with candles up to {last} only"
        )
    return following if following < plan.end_ms else None


def count_slots(start_ms: int, end_ms: int, period_ms: int, phase_ms: int = 0) -> int:
    """How many open times t = phase (mod period) lie in [start, end)."""
    if end_ms <= start_ms:
        return 0
    first = start_ms + ((phase_ms - start_ms) % period_ms)
    if first >= end_ms:
        return 0
    return (end_ms - 1 - first) // period_ms + 1


def candle_slots(plan: FetchPlan, first_open_ms: int | None) -> int:
    """Closed candle slots in the planned range: what a complete answer holds at most.

    The grid's phase is taken from the first candle (weekly candles open on
    Mondays, not on the epoch's Thursday).
    """
    phase = 0 if first_open_ms is None else first_open_ms % plan.period_ms
    return count_slots(plan.start_ms, plan.end_ms, plan.period_ms, phase)


@dataclass(frozen=True, slots=True)
class Answer:
    """One exchange call of a request: the page asked for and what came back.

    `candles` is everything the exchange returned (unfinished candles and ones
    outside the window included): the evidence for `ExchangeGaps`. `accepted`
    is what gets written (`accept_page`).
    """

    plan: FetchPlan  # the window the call belonged to
    since_ms: int
    candles: Sequence[Candle]
    accepted: list[Candle]

    @property
    def until_ms(self) -> int:
        return self.plan.page_until(self.since_ms)

    @property
    def short(self) -> bool:
        """Fewer candles than asked for: the exchange had no more up to `until`."""
        return len(self.candles) < self.plan.page_limit


def vouched_span(answer: Answer) -> tuple[int, int] | None:
    """The open times `[lo, hi)` this answer speaks for, or None (an empty answer).

    From `since`: Binance and Kraken return the oldest candles from `since`, and a
    bounded window never spans more slots than the page limit, so OKX, Bybit and
    Coinbase (newest first) return it whole: no candle before the first one
    returned was left out. Up to the last candle, and on to `until` when the
    answer is short (the exchange had nothing more there); a full answer says
    nothing past its last candle, the next page asks from there. Clipped to the
    window.
    """
    if not answer.candles:
        return None
    window = answer.plan
    hi = max(c.open_time_ms for c in answer.candles) + window.period_ms
    if answer.short:
        hi = max(hi, answer.until_ms + 1)
    lo, hi = max(answer.since_ms, window.start_ms), min(hi, window.end_ms)
    return (lo, hi) if lo < hi else None


def merge_spans(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Union of half-open spans, ascending, touching ones joined."""
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


class ExchangeGaps:
    """Slots the exchange itself reported empty: `BatchMetadata.expected_gaps`.

    The pipeline reports `missing = expected - rows - exchange_gaps`, so a slot
    left out here is a missing candle. A slot counts only when an answer of the
    exchange speaks for it (`vouched_span`) and holds no candle for it. Fed
    every answer of the request in range order (`add`), then `count`ed.

    - An empty answer speaks for nothing: an exchange answers the same for a
      range it does not serve, and a dropped or emptied response looks alike.
      Its slots, between answers with candles, are missing (so is a quiet
      stretch longer than a whole page window: fetching it again is harmless,
      storing it as complete would not be).
    - Except at the edges of a complete answer, where empty answers do count:
      before its first candle (the market listed later, or did not trade
      since the start: every page there answered, and the exchange does serve
      the market; as missing, such a range could never be complete), and after
      its last candle when the answer holding it was short (the exchange said
      it had nothing more, and every later page agreed: a halted or delisted
      market). After a full answer a silent tail is missing: a dropped last
      page looks like that. No candle at all (NOT_FOUND): every slot asked for.
    - A candle the exchange returned but marks unfinished (OKX `confirm=0`) is
      no gap, the exchange has it: it is missing until a later fetch stores it.
      The still-open candle lies past the plan's end (`plan_fetch`): no count.
    - A failed request counts what its answers spoke for, without the edges:
      what it never asked for is missing.

    Undetectable: an exchange cutting a page's oldest candles without saying
    so looks like quiet minutes. Cutting its newest is harmless, the next page
    asks again from the last candle returned.
    """

    def __init__(self) -> None:
        self._period_ms = 0
        self._spans: list[tuple[int, int]] = []  # vouched for, merged, ascending
        self._candles = 0  # distinct candle open times inside `_spans`
        self._newest = -1  # newest candle counted
        self._any_candle = False  # an answer with candles came (the edges are known)
        self._leading: list[tuple[int, int]] = []  # empty answers before the first candle
        self._trailing: list[tuple[int, int]] = []  # empty answers after the last candle
        self._last_short = False  # the answer holding the last candle so far was short

    def add(self, answer: Answer) -> None:
        window = answer.plan
        self._period_ms = window.period_ms
        span = vouched_span(answer)
        if span is None:
            lo, hi = max(answer.since_ms, window.start_ms), min(answer.until_ms + 1, window.end_ms)
            if lo < hi and not answer.candles:
                (self._trailing if self._any_candle else self._leading).append((lo, hi))
            return
        self._any_candle, self._last_short = True, answer.short
        self._trailing.clear()  # empty answers between candles: missing
        lo, hi = span
        times = {t for c in answer.candles if lo <= (t := c.open_time_ms) < hi and t > self._newest}
        if times:
            self._candles += len(times)
            self._newest = max(times)
        self._spans[-1:] = merge_spans([*self._spans[-1:], span])  # spans ascend

    def count(self, first_open_ms: int | None, complete: bool) -> int:
        """Exchange gaps on the candle grid of `first_open_ms` (as `candle_slots`).

        `complete`: every page was answered (status OK or NOT_FOUND), so the
        edges count too.
        """
        spans = list(self._spans)
        if complete:
            spans += self._leading
            if self._last_short:
                spans += self._trailing
        if not spans:
            return 0
        period = self._period_ms
        phase = 0 if first_open_ms is None else first_open_ms % period
        slots = sum(count_slots(lo, hi, period, phase) for lo, hi in merge_spans(spans))
        return max(0, slots - self._candles)


# --- the request's OHLCBatch records ----------------------------------------


def metadata_for(request: DataRequest, ingestor_id: str) -> BatchMetadata:
    return BatchMetadata(
        request_id=request.request_id,
        client_id=request.client_id,
        ticker=request.ticker,
        period_seconds=request.period_seconds,
        start_time_ms=request.start_time_ms,
        end_time_ms=request.end_time_ms,
        notification_topic=request.notification_topic,
        ingestor_id=ingestor_id,
        submitted_at_ms=request.submitted_at_ms,
        bars=request.bars,
    )


def ohlc_row(ticker: str, period_seconds: int, candle: Candle) -> OHLC:
    """The OHLC row of a closed candle; fields the exchange did not report stay unset
    (protobuf treats a None keyword as unset)."""
    return OHLC(
        ticker=ticker,
        period_seconds=period_seconds,
        open_time_ms=candle.open_time_ms,
        open=candle.open,
        high=candle.high,
        low=candle.low,
        close=candle.close,
        volume=candle.volume,
        trade_count=candle.trade_count,
        quote_volume=candle.quote_volume,
        taker_buy_volume=candle.taker_buy_volume,
        taker_buy_quote_volume=candle.taker_buy_quote_volume,
        closed=True,
    )


class BatchBuilder:
    """Cuts a request's candles into OHLCBatch records as they arrive."""

    def __init__(self, metadata: BatchMetadata, batch_size: int) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self._metadata = metadata
        self._batch_size = batch_size
        self._pending: list[Candle] = []
        self._sequence = 0
        self._rows_emitted = 0
        self._finished = False

    @property
    def rows_emitted(self) -> int:
        """Rows in the data records handed out so far."""
        return self._rows_emitted

    @property
    def batches_emitted(self) -> int:
        """Data records handed out so far (the final marker not included)."""
        return self._sequence

    def add(self, candles: Iterable[Candle]) -> list[OHLCBatch]:
        """Queue candles; returns the records that are now full."""
        self._check_open()
        self._pending.extend(candles)
        records: list[OHLCBatch] = []
        while len(self._pending) >= self._batch_size:
            chunk = self._pending[: self._batch_size]
            del self._pending[: self._batch_size]
            records.append(self._data_record(chunk))
        return records

    def flush(self) -> list[OHLCBatch]:
        """The last, partial data record, if rows are still queued."""
        self._check_open()
        records = [self._data_record(self._pending)] if self._pending else []
        self._pending = []
        return records

    def set_source(self, source: int) -> None:
        """Where the answer comes from (HistorySource), carried by the final marker."""
        self._metadata.source = source  # type: ignore[assignment]

    def final(self, expected_gaps: int, expected_candles: int = 0) -> OHLCBatch:
        """The final marker after a successful fetch: OK, or NOT_FOUND without rows.

        Call `flush` first and make sure its records were delivered.
        """
        self._check_open()
        if self._pending:
            raise RuntimeError("rows are still queued: flush() before final()")
        # Stored candles count too: the pipeline counts them in Iceberg (docs/protocol.md).
        if self._rows_emitted > 0 or self._metadata.source in FROM_STORAGE:
            return self._final(Status.OK, "", "", expected_gaps, expected_candles)
        reason = "the exchange has no candles in the range"
        return self._final(Status.NOT_FOUND, reason, "", expected_gaps, expected_candles)

    def from_trades(self, reason: str) -> OHLCBatch:
        """The lone OK final marker of a request the pipeline answers with bars built
        from recorded trades (``source`` SOURCE_TRADES; it fills in the report)."""
        self._check_open()
        self.set_source(FROM_TRADES)
        return self._final(Status.OK, reason, "", 0, 0)

    def fail(
        self, reason: str, error_code: str, expected_gaps: int = 0, expected_candles: int = 0
    ) -> OHLCBatch:
        """The ERROR final marker; queued rows are dropped, totals count the emitted ones."""
        self._pending = []
        return self._final(Status.ERROR, reason, error_code, expected_gaps, expected_candles)

    def _data_record(self, chunk: list[Candle]) -> OHLCBatch:
        meta = self._metadata
        record = OHLCBatch(request_id=meta.request_id, sequence=self._sequence)
        if self._sequence == 0:
            record.metadata.CopyFrom(meta)
        rows = record.rows
        ticker, period = meta.ticker, meta.period_seconds
        for c in chunk:  # ohlc_row's fields again: sharing them as a dict made this 3x slower
            rows.add(
                ticker=ticker,
                period_seconds=period,
                open_time_ms=c.open_time_ms,
                open=c.open,
                high=c.high,
                low=c.low,
                close=c.close,
                volume=c.volume,
                trade_count=c.trade_count,  # None: unset, the exchange did not say
                quote_volume=c.quote_volume,
                taker_buy_volume=c.taker_buy_volume,
                taker_buy_quote_volume=c.taker_buy_quote_volume,
                closed=True,
            )
        self._sequence += 1
        self._rows_emitted += len(chunk)
        return record

    def _final(self, status: int, reason: str, error_code: str, gaps: int, slots: int) -> OHLCBatch:
        meta = BatchMetadata()
        meta.CopyFrom(self._metadata)
        meta.status = status  # type: ignore[assignment]
        meta.reason = reason
        meta.error_code = error_code
        meta.total_rows = self._rows_emitted
        meta.total_batches = self._sequence
        meta.expected_gaps = gaps
        meta.expected_candles = slots
        self._finished = True
        return OHLCBatch(
            request_id=meta.request_id, sequence=self._sequence, metadata=meta, is_final=True
        )

    def _check_open(self) -> None:
        if self._finished:
            raise RuntimeError("the request's final marker was already built")
