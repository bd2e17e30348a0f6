"""Live trade feeds: websocket trades -> Tick records, one asyncio task per ticker.

- `mdproto.recent.RecentKeys` drops trade ids seen before (a reconnect may replay trades).
- `LeaseBook` tracks which tickers the relay still wants: the relay re-announces
  active tickers every few seconds (`DataRequest{REALTIME}`), a repeat refreshes
  the lease, a CANCEL_REALTIME ends it, and an unrefreshed lease expires.
- `FeedPhase` is one feed run's state for its subscribers (FeedStatus via the
  relay on `{ticker}|status`): STARTED with the first data, LOST on a disconnect
  after that and RECOVERED with data again, FAILED for a permanent fault (bad
  symbol, not supported) or when `start_attempts` tries in a row fail before any
  data (exchange down). Only changes are reported.
- `LiveFeeds` starts/stops the feed tasks. Feeds never block historical work:
  each is its own task and Kafka produce does not block the loop.
- A *recorded* ticker (ingestor.recorder) runs the same feed with a `Recording`:
  no lease, deaf to cancels, its gaps reported as `GapFound` and its delivered
  trades as checkpoints. Clients' REALTIME requests share it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from google.protobuf.message import Message

from ingestor.clock import wall_clock_ms
from ingestor.model import ExchangeCallError, Trade
from ingestor.retry import RetryPolicy, backoff_delay
from mdproto import ProtocolError
from mdproto.messages import FeedStatus, TakerSide, Tick, TradeGap
from mdproto.recent import RecentKeys
from mdproto.topics import parse_ticker

log = logging.getLogger(__name__)


def reconnect_delay(
    fault: ExchangeCallError, failures: int, policy: RetryPolicy, rand: float
) -> float:
    """How long a feed waits before its next connection: the backoff for `failures`
    in a row, or longer when the exchange said when to come back (every feed's rule)."""
    return max(backoff_delay(failures, policy, rand), fault.retry_after_s or 0.0)


class LeaseBook:
    """Ticker -> time of the last REALTIME announcement (monotonic seconds)."""

    def __init__(self, lease_s: float) -> None:
        self.lease_s = lease_s
        self._refreshed: dict[str, float] = {}

    def refresh(self, ticker: str, now: float) -> bool:
        """Record an announcement; True if the ticker was not leased before."""
        new = ticker not in self._refreshed
        self._refreshed[ticker] = now
        return new

    def cancel(self, ticker: str) -> bool:
        return self._refreshed.pop(ticker, None) is not None

    def expired(self, now: float) -> list[str]:
        """Remove and return the tickers whose lease ran out."""
        gone = [t for t, at in self._refreshed.items() if now - at > self.lease_s]
        for ticker in gone:
            del self._refreshed[ticker]
        return gone

    def __contains__(self, ticker: object) -> bool:
        return ticker in self._refreshed

    def tickers(self) -> list[str]:
        return sorted(self._refreshed)


_SIDES = {"buy": TakerSide.BUY, "sell": TakerSide.SELL}


def tick_record(
    ticker: str, trade: Trade, ingested_at_ms: int, *, gap_before: bool = False
) -> Tick:
    return Tick(
        ticker=ticker,
        trade_id=trade.trade_id,
        price=trade.price,
        amount=trade.amount,
        timestamp_ms=trade.timestamp_ms,
        side=_SIDES.get(trade.side, TakerSide.SIDE_UNSPECIFIED),
        ingested_at_ms=ingested_at_ms,
        gap_before=gap_before,
    )


class GapDetector:
    """Says which trade follows trades the feed may have missed (`Tick.gap_before`).

    Pure. The pipeline marks the live candles around such a trade incomplete, so a
    candle built across an outage is never published or stored as complete. The
    feed's first trade is always marked (its window began before the feed). Where
    the exchange numbers a symbol's trades consecutively (`consecutive_ids`) skipped
    ids show a gap exactly, a reconnect that lost nothing none; otherwise the first
    trade after every reconnect is marked.
    """

    def __init__(self, consecutive_ids: bool = True, resume_from: str | None = None) -> None:
        self._consecutive = consecutive_ids
        self._last_number: int | None = None
        self._unsure = True  # no trade yet, or reconnected since the last one
        if resume_from is not None and resume_from.isdigit():  # an earlier run's last trade
            self._last_number = int(resume_from)

    def reconnected(self) -> None:
        self._unsure = True

    def follows_gap(self, trade_id: str) -> tuple[bool, int]:
        """(trades may be missing before this new trade, how many ids were skipped)."""
        unsure, self._unsure = self._unsure, False
        if not (self._consecutive and trade_id.isdigit()):
            return unsure, 0
        number, last = int(trade_id), self._last_number
        self._last_number = number if last is None else max(last, number)
        if last is None:
            return True, 0
        skipped = max(0, number - last - 1)
        return skipped > 0, skipped


@dataclass(frozen=True, slots=True)
class TradePoint:
    """A trade's place in its market's stream: where a gap starts or ends."""

    trade_id: str
    time_ms: int


@dataclass(frozen=True, slots=True)
class GapFound:
    """Trades between `before` and `after` may be missing (`cause` a TradeGap.Cause)."""

    ticker: str
    before: TradePoint
    after: TradePoint
    cause: int
    missing_ids: int  # skipped consecutive ids (0: unknown)


@dataclass(frozen=True, slots=True)
class Recording:
    """What a recorded feed does beyond a live one (ingestor.recorder).

    `resume_from()`: the newest trade delivered so far (an earlier run's checkpoint);
    the first trade of each run is compared with it (RESTART). `on_gap` is told every gap;
    `on_sent` gets the newest trade of each batch with the delivery of its tick and the
    number of trades the batch sent.
    """

    resume_from: Callable[[], TradePoint | None]
    on_gap: Callable[[GapFound], None]
    on_sent: Callable[[TradePoint, asyncio.Future[int], int], None]


def _follows(last: TradePoint, point: TradePoint) -> bool:
    """`point` is newer than `last`: by number where both ids are numbers (a replayed or
    out-of-order trade does not move a gap's start back), else by arrival."""
    if last.trade_id.isdigit() and point.trade_id.isdigit():
        return int(point.trade_id) > int(last.trade_id)
    return True


class TradeSource(Protocol):
    prefix: str
    supports_websocket: bool
    consecutive_trade_ids: bool  # skipped ids are lost trades (GapDetector)

    async def watch_trades(self, symbol: str) -> list[Trade]: ...

    async def unwatch_trades(self, symbol: str) -> None: ...


class TickSink(Protocol):
    async def send_tick(self, key: str, record: Message) -> None: ...

    async def send_tick_tracked(self, key: str, record: Message) -> asyncio.Future[int]: ...


@dataclass
class FeedStats:
    ticks: int = 0
    duplicates: int = 0
    reconnects: int = 0
    id_gaps: int = 0  # trades missing between consecutive numeric ids (drops, cache overflow)
    gaps_marked: int = 0  # ticks sent with gap_before (their live candles are incomplete)
    failed: str = ""  # the error that ended the feed
    retryable: bool = False  # it ended on transient faults: the next announcement restarts it


@dataclass(frozen=True, slots=True)
class StatusChange:
    """A feed's new state, as FeedStatus reports it (`state` is a FeedStatus.State)."""

    state: int
    error_code: str = ""
    reason: str = ""


_HEALTHY = (FeedStatus.STARTED, FeedStatus.RECOVERED)


class FeedPhase:
    """One feed run: starting -> STARTED <-> LOST -> RECOVERED ..., or FAILED (final).

    Pure; each method returns the change to report, or None when the state holds
    (a reconnect loop reports LOST once, not per attempt).
    """

    def __init__(self, start_attempts: int) -> None:
        self.state: int | None = None  # None: no data yet
        self._start_attempts = max(1, start_attempts)
        self._start_failures = 0

    @property
    def failed(self) -> bool:
        return self.state == FeedStatus.FAILED

    def data(self) -> StatusChange | None:
        """The exchange delivered (possibly an empty batch): the subscription works."""
        if self.state is None:
            return self._to(StatusChange(FeedStatus.STARTED))
        if self.state == FeedStatus.LOST:
            return self._to(StatusChange(FeedStatus.RECOVERED))
        return None

    def fault(self, fault: ExchangeCallError) -> StatusChange | None:
        code = fault.kind.value
        if not fault.kind.transient:
            return self._to(StatusChange(FeedStatus.FAILED, code, fault.reason))
        if self.state is None:
            self._start_failures += 1
            if self._start_failures < self._start_attempts:
                return None
            reason = f"no live data after {self._start_failures} attempts: {fault.reason}"
            return self._to(StatusChange(FeedStatus.FAILED, code, reason))
        if self.state in _HEALTHY:
            return self._to(StatusChange(FeedStatus.LOST, code, f"{fault.reason}; reconnecting"))
        return None

    def _to(self, change: StatusChange) -> StatusChange:
        self.state = change.state
        return change


def _no_report(change: StatusChange) -> None:
    return None


@dataclass
class _Feed:
    task: asyncio.Task[None]
    stats: FeedStats = field(default_factory=FeedStats)


async def run_feed(
    ticker: str,
    source: TradeSource,
    sink: TickSink,
    stats: FeedStats,
    *,
    dedupe: RecentKeys[str],
    reconnect: RetryPolicy,
    start_attempts: int = 4,
    report: Callable[[StatusChange], None] = _no_report,
    now_ms: Callable[[], int] = wall_clock_ms,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    rand: Callable[[], float] = random.random,
    recording: Recording | None = None,
) -> None:
    """Stream one ticker's trades into Kafka until cancelled or FAILED; `report` its changes."""
    symbol = parse_ticker(ticker).symbol
    phase = FeedPhase(start_attempts)
    failures = 0
    resume = recording.resume_from() if recording is not None else None
    gaps = GapDetector(source.consecutive_trade_ids, resume.trade_id if resume else None)
    last = resume  # the newest trade sent (recorded feeds: a gap's start)
    cause = TradeGap.RESTART  # what a gap before the next trade would be due to
    while True:
        try:
            trades = await source.watch_trades(symbol)
        except ExchangeCallError as fault:
            change = phase.fault(fault)
            if change is not None:
                report(change)
            if phase.failed:
                stats.failed, stats.retryable = str(fault), fault.kind.transient
                log.error("live %s stopped: %s", ticker, change.reason if change else fault)
                return
            failures += 1
            stats.reconnects += 1
            gaps.reconnected()
            if last is not None:
                cause = TradeGap.RECONNECT
            delay = reconnect_delay(fault, failures, reconnect, rand())
            log.warning("live %s: %s; reconnecting in %.2f s", ticker, fault, delay)
            await sleep(delay)
            continue
        failures = 0
        change = phase.data()
        if change is not None:
            report(change)
        ingested = now_ms()
        record = None
        sent = 0
        for trade in trades:
            if not trade.trade_id or not dedupe.first_time(trade.trade_id):
                stats.duplicates += 1
                continue
            gap, skipped = gaps.follows_gap(trade.trade_id)
            if skipped:
                stats.id_gaps += skipped
                log.warning("live %s: %d trade ids skipped", ticker, skipped)
            stats.gaps_marked += gap
            point = TradePoint(trade.trade_id, trade.timestamp_ms)
            if gap and recording is not None and last is not None:
                why = TradeGap.SKIPPED_IDS if cause == TradeGap.CAUSE_UNSPECIFIED else cause
                recording.on_gap(GapFound(ticker, last, point, why, skipped))
            if last is None or _follows(last, point):
                last, cause = point, TradeGap.CAUSE_UNSPECIFIED
            if record is not None:
                await sink.send_tick(ticker, record)
            record = tick_record(ticker, trade, ingested, gap_before=gap)
            sent += 1
        stats.ticks += sent
        if record is None:
            continue
        if recording is None:
            await sink.send_tick(ticker, record)
        else:  # the batch's newest trade: its delivery vouches for the ones before (one key)
            assert last is not None
            recording.on_sent(last, await sink.send_tick_tracked(ticker, record), sent)


class LiveFeeds:
    """Starts, refreshes and stops feeds as REALTIME requests and cancels arrive.

    Sources and sink are `TradeSource`s and a `TickSink` here; a subclass runs
    another kind of feed through the hooks below `request` (`ingestor.books`).
    """

    def __init__(
        self,
        sources: Mapping[str, Any],
        sink: Any,
        *,
        lease_s: float,
        dedupe_capacity: int,
        reconnect: RetryPolicy,
        monotonic: Callable[[], float] | None = None,
        start_attempts: int = 4,
        on_status: Callable[[FeedStatus], None] | None = None,
        ingestor_id: str = "",
        now_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self._sources = dict(sources)  # exchange prefix ("BINANCE:") -> source
        self._start_attempts = start_attempts
        self._on_status = on_status
        self._ingestor_id = ingestor_id
        self._now_ms = now_ms
        self._last_status: dict[str, FeedStatus] = {}  # ticker -> the last one sent
        self._sink = sink
        self._leases = LeaseBook(lease_s)
        self._dedupe_capacity = dedupe_capacity
        self._reconnect = reconnect
        self._monotonic = monotonic or asyncio.get_running_loop().time
        self._feeds: dict[str, _Feed] = {}
        # ticker -> set once its cancelled feed has unsubscribed: a feed started in the
        # meantime waits for it, or that unsubscribe would end the new subscription too.
        self._stopping: dict[str, asyncio.Event] = {}
        # Recorded tickers this ingestor runs (no lease, cancels ignored), with their
        # recording (None: a pinned feed with nothing more, e.g. a book).
        self._recorded: dict[str, Recording | None] = {}
        #: True for a ticker some ingestor records: a REALTIME request starts no second
        #: feed for it (its recorder's feed serves the clients).
        self.recorded_anywhere: Callable[[str], bool] = lambda _ticker: False

    @property
    def leases(self) -> LeaseBook:
        return self._leases

    def set_lease(self, lease_s: float) -> None:
        self._leases.lease_s = lease_s

    def stats(self, ticker: str) -> FeedStats | None:
        feed = self._feeds.get(ticker)
        return None if feed is None else feed.stats

    def snapshot(self) -> dict[str, tuple[bool, FeedStats]]:
        """ticker -> (still running, its stats); safe to call from another thread."""
        return {t: (not f.task.done(), f.stats) for t, f in self._feeds.copy().items()}

    def active(self) -> list[str]:
        return sorted(t for t, f in self._feeds.items() if not f.task.done())

    def request(self, ticker: str) -> bool:
        """A REALTIME announcement: start the feed if new, else refresh its lease.

        A feed that FAILED on transient faults (exchange down) starts again, reported as
        LOST; one that FAILED for good, or is LOST, has its status sent again (once per
        announcement, so a relay that restarted learns it).
        """
        try:
            prefix = parse_ticker(ticker).prefix
        except ProtocolError as exc:
            log.warning("REALTIME request with bad ticker ignored: %s", exc.reason)
            return False
        source = self._sources.get(prefix)
        if source is None or not self._serves(source):
            log.warning("%s %s ignored: no live source for %s", self.kind, ticker, prefix)
            return False
        if ticker not in self._recorded:  # (a recorded feed serves every client: no lease)
            if self.recorded_anywhere(ticker):  # recorded by another ingestor
                return False
            self._leases.refresh(ticker, self._monotonic())
        feed = self._feeds.get(ticker)
        if feed is not None:
            if not (feed.task.done() and feed.stats.retryable):
                self._repeat_status(ticker)
                return False
            log.info("live feed %s starts again (it failed: %s)", ticker, feed.stats.failed)
            # LOST replaces the FAILED the relay keeps: new subscribers wait, not give up.
            last = self._last_status.get(ticker)
            code = last.error_code if last is not None else ""
            self._report(
                ticker, StatusChange(FeedStatus.LOST, code, f"retrying: {feed.stats.failed}")
            )
        self._launch(ticker, source)
        return True

    def _launch(self, ticker: str, source: Any) -> None:
        stats = self._new_stats()
        report = functools.partial(self._report, ticker)
        task = asyncio.create_task(
            self._start(ticker, source, stats, report), name=f"{self.kind.lower()}-{ticker}"
        )
        self._feeds[ticker] = _Feed(task, stats)
        log.info("%s feed %s started", self.kind, ticker)

    # --- recorded tickers (ingestor.recorder) -------------------------------

    @property
    def recorded(self) -> list[str]:
        return sorted(self._recorded)

    async def record(self, ticker: str, recording: Recording | None = None) -> bool:
        """Run `ticker`'s feed for the recording until `unrecord`; False if no source.

        A feed a client started before is replaced, so that the recording's gap
        tracking sees every trade from its start.
        """
        source = self._sources.get(parse_ticker(ticker).prefix)
        if source is None or not self._serves(source):
            log.error("%s %s not recorded: no live source for it", self.kind, ticker)
            return False
        if ticker in self._feeds:
            await self._stop(ticker, "the recording takes it over")
        self._leases.cancel(ticker)
        self._recorded[ticker] = recording
        self._launch(ticker, source)
        return True

    def revive_recorded(self) -> list[str]:
        """Start again the recorded feeds that ended on transient faults (the exchange
        was down): a recording needs no relay to announce it again."""
        return [
            ticker
            for ticker in list(self._recorded)
            if (feed := self._feeds.get(ticker)) is not None
            and feed.task.done()
            and feed.stats.retryable
            and self.request(ticker)
        ]

    async def unrecord(self, ticker: str, why: str) -> bool:
        """Stop recording `ticker` here (its slot moved, or shutdown)."""
        if self._recorded.pop(ticker, False) is False:
            return False
        return await self._stop(ticker, why)

    # What a kind of feed changes (ingestor.books.BookFeeds: the order book's).
    kind = "REALTIME"

    def _serves(self, source: Any) -> bool:
        return bool(source.supports_websocket)

    def _new_stats(self) -> FeedStats:
        return FeedStats()

    async def _start(
        self,
        ticker: str,
        source: Any,
        stats: Any,
        report: Callable[[StatusChange], None],
    ) -> None:
        stopping = self._stopping.get(ticker)
        if stopping is not None:
            await stopping.wait()
        await self._run(ticker, source, stats, report)

    def _run(
        self,
        ticker: str,
        source: Any,
        stats: Any,
        report: Callable[[StatusChange], None],
    ) -> Coroutine[Any, Any, None]:
        return run_feed(
            ticker,
            source,
            self._sink,
            stats,
            dedupe=RecentKeys(self._dedupe_capacity),
            reconnect=self._reconnect,
            start_attempts=self._start_attempts,
            report=report,
            recording=self._recorded.get(ticker),
        )

    async def _unwatch(self, source: Any, symbol: str) -> None:
        await source.unwatch_trades(symbol)

    def _report(self, ticker: str, change: StatusChange) -> None:
        status = FeedStatus(
            ticker=ticker,
            state=change.state,  # type: ignore[arg-type]  # a FeedStatus.State value
            error_code=change.error_code,
            reason=change.reason,
            ingestor_id=self._ingestor_id,
            at_ms=self._now_ms(),
        )
        if change.state in _HEALTHY:
            log.info("live feed %s %s", ticker, FeedStatus.State.Name(status.state))
        self._last_status[ticker] = status
        self._send(status)

    def _repeat_status(self, ticker: str) -> None:
        last = self._last_status.get(ticker)
        if last is not None and last.state not in _HEALTHY:
            self._send(last)

    def _send(self, status: FeedStatus) -> None:
        if self._on_status is None:
            return
        try:
            self._on_status(status)
        except Exception:  # reporting must never stop the feed
            log.exception("feed status of %s not sent", status.ticker)

    async def cancel(self, ticker: str, why: str = "cancelled") -> bool:
        """Nobody wants the feed any more; a recorded one runs on."""
        self._leases.cancel(ticker)
        if ticker in self._recorded:
            return False
        return await self._stop(ticker, why)

    async def _stop(self, ticker: str, why: str) -> bool:
        self._last_status.pop(ticker, None)
        feed = self._feeds.pop(ticker, None)
        if feed is None:
            return False
        stopped = self._stopping[ticker] = asyncio.Event()
        try:
            feed.task.cancel()
            await asyncio.gather(feed.task, return_exceptions=True)
            source = self._sources.get(parse_ticker(ticker).prefix)
            if source is not None:
                await self._unwatch(source, parse_ticker(ticker).symbol)
        finally:
            stopped.set()
            if self._stopping.get(ticker) is stopped:
                del self._stopping[ticker]
        log.info("%s feed %s stopped (%s; %s)", self.kind, ticker, why, feed.stats)
        return True

    async def sweep(self) -> list[str]:
        """Stop feeds whose lease expired (the cancel may have been lost)."""
        expired = self._leases.expired(self._monotonic())
        for ticker in expired:
            await self.cancel(ticker, "lease expired")
        return expired

    async def run_sweeper(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            await self.sweep()

    async def stop_all(self) -> None:
        self._recorded.clear()
        for ticker in list(self._feeds):
            await self._stop(ticker, "shutdown")
