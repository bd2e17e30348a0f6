"""Recording, the pure part: which markets are recorded, and how a gap is repaired.

- `recorded_tickers` turns one exchange's `recording` entry and its market list
  into tickers, and names the configured markets the exchange does not list.
- `RepairPlan` pages the exchange's trade history over one gap (`GapFound`): the
  cursor to ask for next, which trades of a page belong inside the gap, when the
  paging is over, and the verdict (REPAIRED, or UNREPAIRABLE with its reason).
  The repairer (ingestor.repair) only does the calls and the sends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ingestor.config import RecordedMarkets
from ingestor.live import GapFound
from ingestor.model import MarketInfo, Trade
from ingestor.venues.base import TradePaging
from mdproto.messages import TradeGap


@dataclass(frozen=True, slots=True)
class Universe:
    tickers: tuple[str, ...]  # sorted
    unknown: tuple[str, ...]  # configured symbols the exchange does not list (or inactive)


def recorded_tickers(
    prefix: str,
    wanted: RecordedMarkets,
    markets: Sequence[MarketInfo],
    quote_volumes: Mapping[str, float] | None = None,
) -> Universe:
    """The tickers to record of the exchange with `prefix` (`BINANCE`); `quote_volumes`
    (24 h, by symbol) rank them when `wanted.top` is set, a market without one last."""
    active = {m.symbol: m for m in markets if m.active}
    if wanted.markets == "all":
        chosen = [s for s, m in active.items() if wanted.quote is None or m.quote == wanted.quote]
        if wanted.top is not None:
            volumes = quote_volumes or {}
            chosen.sort(key=lambda s: (-volumes.get(s, -1.0), s))
            chosen = chosen[: wanted.top]
        unknown: list[str] = []
    else:
        chosen = [s for s in wanted.markets if s in active]
        unknown = [s for s in wanted.markets if s not in active]
    return Universe(
        tuple(sorted(f"{prefix}:{s}" for s in chosen)),
        tuple(f"{prefix}:{s}" for s in unknown),
    )


def _number(trade_id: str) -> int | None:
    return int(trade_id) if trade_id.isdigit() else None


@dataclass
class RepairPlan:
    """One gap's repair: feed it each page, ask it for the next cursor, then the verdict.

    With consecutive numeric ids the gap is exactly the ids strictly between its ends,
    and the verdict counts them; otherwise it is every trade between the two ends'
    times (the ends themselves excluded by id), complete once a page reaches the end.
    The cursor follows the venue's `TradePaging`: ids upward from the gap's start
    (BY_ID), ids downward from its end (BY_ID_BACKWARD), times upward (BY_TIME, also
    where ids are not consecutive), or none (LATEST_ONLY).
    """

    gap: GapFound
    paging: TradePaging
    consecutive: bool
    page_limit: int
    recovered: dict[str, Trade] = field(default_factory=dict)
    finished: bool = False
    covered_start: bool = False  # a page reached back to the gap's start
    _cursor: int | None = None  # the id to ask from (BY_ID) or below (BY_ID_BACKWARD)
    _next_ms: int | None = None

    def __post_init__(self) -> None:
        first, last = _number(self.gap.before.trade_id), _number(self.gap.after.trade_id)
        self._first, self._last = first, last
        self.exact = self.consecutive and first is not None and last is not None
        self._mode = self.paging
        if self._mode in (TradePaging.BY_ID, TradePaging.BY_ID_BACKWARD) and not self.exact:
            self._mode = TradePaging.BY_TIME  # an id cursor needs numbers to page by
        if self._mode is TradePaging.BY_ID:
            assert first is not None
            self._cursor = first + 1
        elif self._mode is TradePaging.BY_ID_BACKWARD:
            self._cursor = last
        elif self._mode is TradePaging.BY_TIME:
            self._next_ms = self.gap.before.time_ms
        if self.exact and last is not None and first is not None and last - first <= 1:
            self.finished = self.covered_start = True  # nothing is missing

    @property
    def missing(self) -> int | None:
        """How many trades the gap lacks, where the ids tell (consecutive numbers)."""
        if not self.exact or self._first is None or self._last is None:
            return None
        return max(0, self._last - self._first - 1)

    def request(self) -> tuple[str | None, int | None]:
        """The next page's (id cursor, since_ms); (None, None) asks for the latest trades."""
        cursor = None if self._cursor is None else str(self._cursor)
        return cursor, self._next_ms

    def inside(self, trade: Trade) -> bool:
        if self.exact:
            number = _number(trade.trade_id)
            assert self._first is not None and self._last is not None
            return number is not None and self._first < number < self._last
        if trade.trade_id in (self.gap.before.trade_id, self.gap.after.trade_id):
            return False
        return self.gap.before.time_ms <= trade.timestamp_ms <= self.gap.after.time_ms

    def take(self, page: Sequence[Trade]) -> list[Trade]:
        """Keep the page's trades inside the gap (new ones only); move the cursor on."""
        new = [t for t in page if self.inside(t) and t.trade_id not in self.recovered]
        for trade in new:
            self.recovered[trade.trade_id] = trade
        if not page:
            self.finished = True  # the exchange has nothing more from the cursor on
            return new
        self.covered_start = self.covered_start or self._reaches_start(page)
        numbers = [n for t in page if (n := _number(t.trade_id)) is not None]
        if self._mode is TradePaging.LATEST_ONLY:
            self.finished = True  # one page is all there is
        elif self._mode is TradePaging.BY_ID:
            assert self._cursor is not None and self._last is not None
            top = max(numbers, default=self._cursor - 1)
            self.finished = top + 1 <= self._cursor or top >= self._last - 1
            self._cursor = top + 1
        elif self._mode is TradePaging.BY_ID_BACKWARD:
            assert self._cursor is not None and self._first is not None
            bottom = min(numbers, default=self._cursor)
            self.finished = bottom >= self._cursor or bottom <= self._first + 1
            self._cursor = bottom
        else:
            assert self._next_ms is not None
            newest = max(t.timestamp_ms for t in page)
            reached = any(
                t.trade_id == self.gap.after.trade_id or t.timestamp_ms > self.gap.after.time_ms
                for t in page
            )
            self.finished = reached or len(page) < self.page_limit
            # A page of one millisecond's trades only: step past it (the rest of that
            # millisecond would need an id cursor).
            self._next_ms = newest if newest > self._next_ms else self._next_ms + 1
        return new

    def _reaches_start(self, page: Sequence[Trade]) -> bool:
        if self.exact:
            assert self._first is not None
            numbers = [n for t in page if (n := _number(t.trade_id)) is not None]
            return bool(numbers) and min(numbers) <= self._first + 1
        return min(t.timestamp_ms for t in page) <= self.gap.before.time_ms

    def verdict(self, venue: str) -> tuple[int, str]:
        """(TradeGap.State, reason) once `finished`."""
        got = len(self.recovered)
        missing = self.missing
        if missing is not None:
            if got >= missing:
                return TradeGap.REPAIRED, f"{got} trades recovered"
            if self.paging is TradePaging.LATEST_ONLY and not self.covered_start:
                return TradeGap.UNREPAIRABLE, _latest_only(venue, self.page_limit)
            return (
                TradeGap.UNREPAIRABLE,
                f"{venue} returned {got} of the {missing} missing trades",
            )
        if self.paging is TradePaging.LATEST_ONLY and not self.covered_start:
            return TradeGap.UNREPAIRABLE, _latest_only(venue, self.page_limit)
        if not self.covered_start:  # trades may be missing that no count would show
            return (
                TradeGap.UNREPAIRABLE,
                f"{venue} did not return trades from the gap's start on"
                f" ({got} trades after it recovered): its history may not reach that far",
            )
        return TradeGap.REPAIRED, f"{got} trades recovered (by time; ids not consecutive)"


def _latest_only(venue: str, limit: int) -> str:
    return (
        f"{venue} serves only its latest {limit} trades over REST;"
        " the gap began before the oldest of them"
    )
