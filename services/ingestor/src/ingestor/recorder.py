"""Recording: the configured markets of one exchange, recorded whether anyone watches
or not, spread over the ingestors that serve the exchange (docs/protocol.md "Recording").

    recording.exchanges.<id>  ->  Universe (ingestor.recording)
    Kafka group {group_prefix}-{PREFIX} on market.recording -> the slots this ingestor owns
      slot assigned  -> its partition read from the start: checkpoints, gaps
      slot restored  -> its markets' feeds recorded here (LiveFeeds.record, BookFeeds.record),
                        resuming from their checkpoints; its open gaps repaired
      slot revoked   -> its feeds stopped (the new owner resumes from the checkpoints)
    every checkpoint_interval_s: delivered trades -> RecordingCheckpoint; open gaps -> repair

A market's slot is `mdproto.topics.recording_slot`; Kafka's group protocol (session
timeout) is the only membership: a dead ingestor's slots move within seconds, a
stopped one's at once. Slot events and gap reports arrive on the loop thread; one
task applies them in order (`_actions`), so a revoke never overtakes its assign.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from google.protobuf.message import Message

from ingestor.books import BookFeeds
from ingestor.clock import wall_clock_ms
from ingestor.config import RecordedMarkets, RecordingSettings
from ingestor.exchange_calls import FetchEnv
from ingestor.exchanges import ExchangeAdapter
from ingestor.kafka_sink import GroupSlots, KafkaSink, SlotRecord
from ingestor.live import GapFound, LiveFeeds, Recording, TradePoint
from ingestor.model import ExchangeCallError
from ingestor.recording import Universe, recorded_tickers
from ingestor.repair import Outcome, repair_gap
from mdproto import ProtocolError, contracts, envelope
from mdproto.messages import RecordingCheckpoint, TradeGap
from mdproto.topics import gap_id, parse_ticker, recording_slot

log = logging.getLogger(__name__)

#: How often the market list is tried again while the exchange does not answer.
MARKETS_RETRY_S = 5.0
_OPEN = (TradeGap.OPEN, TradeGap.REPAIRING)


@dataclass
class RecorderStats:
    trades: int = 0  # sent to Kafka by the feeds recorded here
    checkpoints: int = 0
    gaps_found: int = 0
    trades_recovered: int = 0
    repairs_failed: int = 0  # attempts that left a gap open (retried)
    delivery_failures: int = 0  # recorded trades Kafka did not take (become a gap)


@dataclass
class _Sent:
    point: TradePoint
    delivery: asyncio.Future[int]


@dataclass
class _SlotState:
    """What this process knows of the recording topic (restored and kept current)."""

    checkpoints: dict[str, TradePoint] = field(default_factory=dict)
    gaps: dict[str, TradeGap] = field(default_factory=dict)

    def apply(self, record: SlotRecord, prefix: str) -> None:
        """Keep `record` if it is about a ticker of `prefix` (`BINANCE:`)."""
        if not record.value:
            return
        try:
            message = envelope.decode_record(record.value)
        except ProtocolError as exc:
            log.warning("recording record %r ignored: %s", record.key, exc.reason)
            return
        if isinstance(message, RecordingCheckpoint) and message.ticker.startswith(prefix):
            point = TradePoint(message.last_trade_id, message.last_trade_time_ms)
            known = self.checkpoints.get(message.ticker)
            if known is None or point.time_ms >= known.time_ms:
                self.checkpoints[message.ticker] = point
        elif isinstance(message, TradeGap) and message.ticker.startswith(prefix):
            held = self.gaps.get(message.gap_id)
            if held is None or message.updated_at_ms >= held.updated_at_ms:
                self.gaps[message.gap_id] = message


class Recorder:
    """One exchange's recording in this ingestor; `run()` until cancelled."""

    def __init__(
        self,
        adapter: ExchangeAdapter,
        wanted: RecordedMarkets,
        settings: RecordingSettings,
        *,
        feeds: LiveFeeds,
        books: BookFeeds,
        sink: KafkaSink,
        env: Callable[[ExchangeAdapter], FetchEnv],
        ingestor_id: str,
        bootstrap: str,
        topic: str,
        now_ms: Callable[[], int] = wall_clock_ms,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.adapter = adapter
        self.prefix = adapter.prefix
        self._wanted = wanted
        self._settings = settings
        self._feeds = feeds
        self._books = books
        self._sink = sink
        self._env = env
        self._ingestor_id = ingestor_id
        self._bootstrap = bootstrap
        self._topic = topic
        self._now_ms = now_ms
        self._monotonic = monotonic
        self.universe = Universe((), ())
        self._universe_set: frozenset[str] = frozenset()
        self.ready = asyncio.Event()  # the universe is known
        self.stats = RecorderStats()
        self._state = _SlotState()
        self.owned: set[int] = set()  # slots restored and recorded here
        self._actions: asyncio.Queue[Callable[[], Awaitable[None]]] = asyncio.Queue()
        self._sent: dict[str, _Sent] = {}
        self._broken: dict[str, TradePoint] = {}  # ticker -> last checkpoint before a loss
        self._repairing: dict[str, asyncio.Task[None]] = {}  # gap_id -> its repair
        self._retry_at: dict[str, float] = {}
        self._slots: GroupSlots | None = None

    # --- what others ask ---------------------------------------------------

    def records(self, ticker: str) -> bool:
        """The ticker is in this exchange's recorded universe (recorded by some ingestor)."""
        return ticker in self._universe_set

    def recorded_here(self) -> list[str]:
        return sorted(t for t in self.universe.tickers if self._slot(t) in self.owned)

    def gaps(self) -> list[TradeGap]:
        return list(self._state.gaps.values())

    def checkpoint(self, ticker: str) -> TradePoint | None:
        return self._state.checkpoints.get(ticker)

    # --- lifecycle ------------------------------------------------------------

    async def run(self) -> None:
        await self._load_universe()
        slots = GroupSlots(
            self._bootstrap,
            self._topic,
            f"{self._settings.group_prefix}-{self.prefix}",
            self,
            session_timeout_s=self._settings.session_timeout_s,
            client_id=f"{self._ingestor_id}-recorder-{self.prefix}",
        )
        self._slots = slots
        slots.start()
        applier = asyncio.create_task(self._apply_actions(), name=f"recorder-{self.prefix}-actions")
        try:
            while True:
                await asyncio.sleep(self._settings.checkpoint_interval_s)
                await self._checkpoint()
                self._feeds.revive_recorded()
                self._books.revive_recorded()
                self._schedule_repairs()
        finally:
            applier.cancel()
            for task in self._repairing.values():
                task.cancel()
            await asyncio.gather(applier, *self._repairing.values(), return_exceptions=True)
            await slots.stop()
            for ticker in self.recorded_here():
                await self._stop_feeds(ticker, "shutdown")
            with contextlib.suppress(Exception):
                await self._checkpoint()

    def use_universe(self, universe: Universe) -> None:
        """The markets to record (from the exchange's market list)."""
        self.universe = universe
        self._universe_set = frozenset(universe.tickers)

    async def _load_universe(self) -> None:
        volumes: dict[str, float] | None = None
        while True:
            try:
                await self.adapter.load_markets()
                if self._wanted.top is not None:
                    volumes = await self.adapter.quote_volumes()
                break
            except ExchangeCallError as fault:
                log.warning(
                    "recording %s waits for its market list: %s; again in %.0f s",
                    self.prefix,
                    fault,
                    MARKETS_RETRY_S,
                )
                await asyncio.sleep(MARKETS_RETRY_S)
        markets = self.adapter.markets()
        self.use_universe(recorded_tickers(self.prefix, self._wanted, markets, volumes))
        for ticker in self.universe.unknown:
            log.error(
                "recording: %s is not an active market of %s; it is not recorded",
                ticker,
                self.adapter.exchange_id,
            )
        log.info(
            "recording %s: %d markets (%s), channels %s",
            self.prefix,
            len(self.universe.tickers),
            ", ".join(self.universe.tickers[:10])
            + (" ..." if len(self.universe.tickers) > 10 else ""),
            ", ".join(self._wanted.channels),
        )
        self.ready.set()

    # --- slot events (GroupSlots, on the loop thread) ---------------------------

    def slot_records(self, records: list[SlotRecord]) -> None:
        for record in records:
            self._state.apply(record, self.prefix + ":")

    def slot_restored(self, partition: int) -> None:
        self._actions.put_nowait(lambda: self._take_slot(partition))

    def slot_revoked(self, partition: int) -> None:
        self._actions.put_nowait(lambda: self._drop_slot(partition))

    async def _apply_actions(self) -> None:
        while True:
            action = await self._actions.get()
            await action()

    async def _take_slot(self, partition: int) -> None:
        self.owned.add(partition)
        tickers = [t for t in self.universe.tickers if self._slot(t) == partition]
        for ticker in tickers:
            if "trades" in self._wanted.channels:
                await self._feeds.record(ticker, self._recording(ticker))
            if "book" in self._wanted.channels:
                await self._books.record(ticker)
        if tickers:
            log.info("recording slot %d of %s: %s", partition, self.prefix, ", ".join(tickers))

    async def _drop_slot(self, partition: int) -> None:
        self.owned.discard(partition)
        for ticker in [t for t in self.universe.tickers if self._slot(t) == partition]:
            await self._stop_feeds(ticker, "its recording slot moved")
        for gap_key, task in list(self._repairing.items()):
            gap = self._state.gaps.get(gap_key)
            if gap is not None and self._slot(gap.ticker) == partition:
                task.cancel()

    async def _stop_feeds(self, ticker: str, why: str) -> None:
        await self._feeds.unrecord(ticker, why)
        await self._books.unrecord(ticker, why)

    def _slot(self, ticker: str) -> int:
        return recording_slot(ticker, contracts.RECORDING_SLOTS)

    # --- a recorded feed's reports ------------------------------------------

    def _recording(self, ticker: str) -> Recording:
        return Recording(
            resume_from=lambda: self._state.checkpoints.get(ticker),
            on_gap=self._on_gap,
            on_sent=functools.partial(self._on_sent, ticker),
        )

    def _on_sent(
        self, ticker: str, point: TradePoint, delivery: asyncio.Future[int], count: int
    ) -> None:
        self.stats.trades += count
        self._sent[ticker] = _Sent(point, delivery)
        delivery.add_done_callback(lambda d: self._delivered(ticker, d))

    def _delivered(self, ticker: str, delivery: asyncio.Future[int]) -> None:
        if delivery.cancelled() or delivery.exception() is None:
            return
        self.stats.delivery_failures += 1
        last = self._state.checkpoints.get(ticker)
        if last is not None:  # trades from here on may be lost: a gap once Kafka is back
            self._broken.setdefault(ticker, last)

    def _on_gap(self, found: GapFound) -> None:
        self.stats.gaps_found += 1
        now = self._now_ms()
        gap = TradeGap(
            gap_id=gap_id(found.ticker, found.before.trade_id, found.after.trade_id),
            ticker=found.ticker,
            from_trade_id=found.before.trade_id,
            to_trade_id=found.after.trade_id,
            from_time_ms=found.before.time_ms,
            to_time_ms=found.after.time_ms,
            detected_at_ms=now,
            cause=found.cause,  # type: ignore[arg-type]  # a TradeGap.Cause value
            state=TradeGap.OPEN,
            missing_ids=found.missing_ids,
            ingestor_id=self._ingestor_id,
            updated_at_ms=now,
        )
        if gap.gap_id in self._state.gaps:
            return  # found again (a takeover replays the same trades)
        log.warning(
            "recording %s: gap %s..%s (%s, %d ids skipped)",
            found.ticker,
            found.before.trade_id,
            found.after.trade_id,
            TradeGap.Cause.Name(found.cause),  # type: ignore[arg-type]
            found.missing_ids,
        )
        self._write_gap(gap)

    def _write_gap(self, gap: TradeGap) -> None:
        self._state.gaps[gap.gap_id] = gap
        self._publish(f"gap:{gap.gap_id}", gap, gap.ticker)

    def _publish(self, key: str, record: Message, ticker: str) -> None:
        """Queue a record in the ticker's slot; a failed delivery is logged (the next
        checkpoint or gap state supersedes it)."""

        def delivered(delivery: asyncio.Future[int]) -> None:
            if not delivery.cancelled() and delivery.exception() is not None:
                log.warning("recording record %s not delivered: %s", key, delivery.exception())

        def queued(task: asyncio.Task[asyncio.Future[int]]) -> None:
            if not task.cancelled():
                task.result().add_done_callback(delivered)

        send = self._sink.send_recording(key, record, self._slot(ticker))
        asyncio.ensure_future(send).add_done_callback(queued)

    # --- the periodic round ------------------------------------------------------

    async def _checkpoint(self) -> None:
        """Write the newest delivered trade of every recorded feed that moved."""
        for ticker, sent in list(self._sent.items()):
            delivery = sent.delivery
            if not delivery.done():
                continue
            del self._sent[ticker]
            if delivery.cancelled() or delivery.exception() is not None:
                continue
            broken = self._broken.pop(ticker, None)
            if broken is not None:
                self._on_gap(GapFound(ticker, broken, sent.point, TradeGap.DELIVERY_FAILED, 0))
            known = self._state.checkpoints.get(ticker)
            if known is not None and known.time_ms > sent.point.time_ms:
                continue
            self._state.checkpoints[ticker] = sent.point
            record = RecordingCheckpoint(
                ticker=ticker,
                last_trade_id=sent.point.trade_id,
                last_trade_time_ms=sent.point.time_ms,
                ingestor_id=self._ingestor_id,
                written_at_ms=self._now_ms(),
            )
            self._publish(ticker, record, ticker)
            self.stats.checkpoints += 1

    def _schedule_repairs(self) -> None:
        repair = self._settings.repair
        if not repair.enabled:
            return
        now = self._monotonic()
        for gap in list(self._state.gaps.values()):
            if len(self._repairing) >= repair.concurrency:
                return
            if (
                gap.state not in _OPEN
                or gap.gap_id in self._repairing
                or self._slot(gap.ticker) not in self.owned
                or self._retry_at.get(gap.gap_id, 0.0) > now
            ):
                continue
            task = asyncio.create_task(self._repair(gap), name=f"repair-{gap.gap_id}")
            self._repairing[gap.gap_id] = task
            task.add_done_callback(functools.partial(self._repair_done, gap.gap_id))

    def _repair_done(self, gap_key: str, task: asyncio.Task[None]) -> None:
        self._repairing.pop(gap_key, None)
        if not task.cancelled() and task.exception() is not None:
            self.stats.repairs_failed += 1
            self._retry_at[gap_key] = self._monotonic() + self._settings.repair.retry_s
            log.error("repair of gap %s failed", gap_key, exc_info=task.exception())

    async def _repair(self, gap: TradeGap) -> None:
        found = GapFound(
            gap.ticker,
            TradePoint(gap.from_trade_id, gap.from_time_ms),
            TradePoint(gap.to_trade_id, gap.to_time_ms),
            gap.cause,
            gap.missing_ids,
        )

        async def progress(state: int, reason: str) -> None:
            self._update(gap, state, reason, gap.trades_recovered)

        repair = self._settings.repair
        outcome: Outcome = await repair_gap(
            found,
            self.adapter,
            self._sink,
            self._env(self.adapter),
            page_limit=repair.page_limit,
            max_pages=repair.max_pages,
            progress=progress,
            now_ms=self._now_ms,
        )
        self.stats.trades_recovered += outcome.recovered
        if outcome.state == TradeGap.OPEN:
            self.stats.repairs_failed += 1
            self._retry_at[gap.gap_id] = self._monotonic() + repair.retry_s
            log.warning("gap %s left open: %s", gap.gap_id, outcome.reason)
        else:
            self._retry_at.pop(gap.gap_id, None)
        self._update(gap, outcome.state, outcome.reason, outcome.recovered)

    def _update(self, gap: TradeGap, state: int, reason: str, recovered: int) -> None:
        new = TradeGap()
        new.CopyFrom(gap)
        new.state = state  # type: ignore[assignment]  # a TradeGap.State value
        new.reason = reason
        new.trades_recovered = recovered
        new.ingestor_id = self._ingestor_id
        new.updated_at_ms = self._now_ms()
        self._write_gap(new)


def recorders_universe(recorders: dict[str, Recorder]) -> Callable[[str], bool]:
    """`LiveFeeds.recorded_anywhere` for an ingestor's recorders (by ticker prefix)."""

    def recorded(ticker: str) -> bool:
        try:
            recorder = recorders.get(parse_ticker(ticker).prefix)
        except ProtocolError:
            return False
        return recorder is not None and recorder.records(ticker)

    return recorded
