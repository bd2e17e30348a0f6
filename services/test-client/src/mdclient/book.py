"""A live L2 order book: `{ticker}|book` applied to an `mdproto.book.OrderBook`.

The pipeline publishes a ticker's book as a BookSnapshot, then BookDeltas, and
a BookSnapshot again every second while the book changes (docs/protocol.md
"Order books"). `BookSync` (pure) decides what each message does to the local
book; `BookStream` runs it on the subscriber thread and serves the book to the
caller's thread.

Integrity: the platform's per-topic ``sequence`` (a gap, or a publisher
restart) and the exchange's ``exchange_prev_sequence`` (where the exchange gives
one) are checked; either mismatch marks the book out of sync: deltas are dropped
until the next snapshot, which resyncs it. Each reset by the exchange's side
(``reset`` other than NONE), each loss and each resync is a `BookEvent` to
`on_event`, or the log.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from google.protobuf.message import Message

from mdclient.dispatch import SequenceTracker, Verdict
from mdclient.errors import StorageError
from mdclient.live import FeedWatch, StatusCallback
from mdclient.streams import QueueStream
from mdproto import topics
from mdproto.book import Level, OrderBook, reset_name
from mdproto.markets import Precision
from mdproto.messages import BookDelta, BookReset, BookSnapshot, FeedStatus
from mdproto.tables import Markets

if TYPE_CHECKING:
    from mdclient.config import ClientSettings
    from mdclient.frames import IcebergReader

log = logging.getLogger(__name__)

BookMessage = BookSnapshot | BookDelta
BookEventKind = Literal["reset", "gap", "resynced"]
BookEventCallback = Callable[["BookEvent"], None]
BookCallback = Callable[[BookMessage], None]


@dataclass(frozen=True, slots=True)
class BookEvent:
    """What happened to a local book.

    reset: the exchange's side rebuilt the book (``reset`` START, SEQUENCE_GAP,
    CHECKSUM, RECONNECT; `reason` says which and why) and the local book took it.
    gap: messages were lost (`missed` by the platform's sequence, or the exchange's
    ids did not follow, or the publisher restarted; `reason`): the book is out of
    sync until the next snapshot. resynced: that snapshot came (`waited_ms` after
    the gap).
    """

    ticker: str
    kind: BookEventKind
    reason: str = ""
    missed: int = 0
    waited_ms: int = 0

    def describe(self) -> str:
        if self.kind == "reset":
            return f"{self.ticker}: book reset by the feed: {self.reason}"
        if self.kind == "gap":
            lost = f"{self.missed} message(s) lost, " if self.missed else ""
            return f"{self.ticker}: book out of sync ({lost}{self.reason}); waiting for a snapshot"
        return f"{self.ticker}: book resynced from a snapshot after {self.waited_ms} ms"


@dataclass(slots=True)
class Outcome:
    """What one message did: `applied` to the book, and the events to report."""

    applied: bool
    events: list[BookEvent] = field(default_factory=list)


class BookSync:
    """The local book and whether it can be trusted; pure (the caller holds a lock).

    Before the first snapshot the book is not in sync (a stream that joins
    mid-way waits for one: the pipeline's last value is one, so it comes first).
    """

    def __init__(self, ticker: str) -> None:
        self.ticker = ticker
        self.book = OrderBook(ticker)
        self.in_sync = False
        self.snapshots = 0  # taken (the first, resets, periodic ones)
        self.dropped_deltas = 0  # while out of sync
        self.duplicates = 0
        self.gaps = 0
        self._tracker = SequenceTracker()
        self._lost_at_ms: int | None = None

    def on_message(self, message: BookMessage, now_ms: int) -> Outcome:
        check = self._tracker.check(0, message.publisher_epoch, message.sequence)
        if check.verdict is Verdict.DUPLICATE:
            self.duplicates += 1
            return Outcome(False)
        events: list[BookEvent] = []
        if check.verdict is Verdict.GAP:
            events += self._lose(now_ms, "sequence gap", check.missed)
        elif check.verdict is Verdict.RESTART:
            events += self._lose(now_ms, "the publisher restarted")
        if isinstance(message, BookSnapshot):
            events += self._take(message, now_ms)
            return Outcome(True, events)
        if not self.in_sync:
            self.dropped_deltas += 1
            return Outcome(False, events)
        if not self.book.follows(message):
            reason = (
                f"exchange sequence: delta after {message.exchange_prev_sequence}, "
                f"book at {self.book.exchange_sequence}"
            )
            events += self._lose(now_ms, reason)
            self.dropped_deltas += 1
            return Outcome(False, events)
        self.book.apply(message)
        return Outcome(True, events)

    def _lose(self, now_ms: int, reason: str, missed: int = 0) -> list[BookEvent]:
        """Out of sync from now on; an event only when it was in sync (one per loss)."""
        self.gaps += 1
        if not self.in_sync:
            return []
        self.in_sync = False
        self._lost_at_ms = now_ms
        return [BookEvent(self.ticker, "gap", reason, missed=missed)]

    def _take(self, snapshot: BookSnapshot, now_ms: int) -> list[BookEvent]:
        self.book.replace(snapshot)
        self.snapshots += 1
        events = []
        if snapshot.reset != BookReset.BOOK_RESET_NONE:
            reason = reset_name(snapshot.reset) + (
                f": {snapshot.reason}" if snapshot.reason else ""
            )
            events.append(BookEvent(self.ticker, "reset", reason))
        if self._lost_at_ms is not None:
            events.append(BookEvent(self.ticker, "resynced", waited_ms=now_ms - self._lost_at_ms))
            self._lost_at_ms = None
        self.in_sync = True
        return events


class BookStream(QueueStream[BookMessage]):
    """A ticker's live book. Read it any time (`best_bid`, `depth`, ...); iterate for the
    messages applied to it (each one after it was applied), or pass `callback`.

    The iterator's queue is bounded: when the consumer falls behind, the oldest
    queued message is dropped (counted in `dropped`): the book itself misses nothing.
    """

    def __init__(
        self,
        ticker: str,
        closer: Callable[[BookStream], None],
        *,
        maxsize: int = 10_000,
        callback: BookCallback | None = None,
        on_event: BookEventCallback | None = None,
        on_status: StatusCallback | None = None,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        super().__init__([topics.status_topic(ticker), topics.book_topic(ticker)], closer, maxsize)
        self.ticker = ticker
        self._sync = BookSync(ticker)
        self._lock = threading.Lock()
        self._callback = callback
        self._on_event = on_event
        self._feed = FeedWatch((), on_status)
        self._clock_ms = clock_ms or _now_ms
        self._synced = threading.Condition(self._lock)

    # -- the subscriber thread --------------------------------------------------------

    def deliver(self, message: Message) -> None:
        """Sink for the dispatcher."""
        if self._closed.is_set():
            return
        if isinstance(message, FeedStatus):
            error = self._feed.see(message)
            if error is not None:
                self.fail(error)
            return
        if not isinstance(message, BookSnapshot | BookDelta) or message.ticker != self.ticker:
            return
        with self._lock:
            outcome = self._sync.on_message(message, self._clock_ms())
            if outcome.applied:
                self.received += 1
                self._synced.notify_all()
        for event in outcome.events:
            self._event(event)
        if outcome.applied:
            self._hand_over(message, self._callback)

    def _event(self, event: BookEvent) -> None:
        if self._on_event is not None:
            try:
                self._on_event(event)
            except Exception:
                log.exception("book event callback failed for %s", self.ticker)
            return
        level = logging.INFO if event.kind == "resynced" else logging.WARNING
        log.log(level, "%s", event.describe())

    # -- the caller's thread ----------------------------------------------------------

    @property
    def status(self) -> FeedStatus | None:
        """The latest FeedStatus of the ticker's feed."""
        return self._feed.status

    @property
    def in_sync(self) -> bool:
        """Whether the book is whole: a snapshot was taken and nothing was lost since."""
        with self._lock:
            return self._sync.in_sync

    def wait_synced(self, timeout_s: float) -> bool:
        """Block until the book is in sync (True), or `timeout_s` passed (False)."""
        with self._synced:
            return self._synced.wait_for(lambda: self._sync.in_sync, timeout_s)

    def best_bid(self) -> Level | None:
        with self._lock:
            return self._sync.book.best_bid()

    def best_ask(self) -> Level | None:
        with self._lock:
            return self._sync.book.best_ask()

    def spread(self) -> float | None:
        with self._lock:
            return self._sync.book.spread()

    def depth(self, levels: int = 10) -> tuple[list[Level], list[Level]]:
        """(bids, asks): the best `levels` of each side (0: all), best first."""
        with self._lock:
            book = self._sync.book
            return book.bids.top(levels), book.asks.top(levels)

    def snapshot(self) -> OrderBook:
        """A copy of the whole book now (the stream goes on updating its own)."""
        with self._lock:
            copy = OrderBook(self.ticker)
            copy.replace(self._sync.book.snapshot())
            return copy

    @property
    def stats(self) -> dict[str, int]:
        """snapshots, dropped_deltas (while out of sync), duplicates, gaps, dropped (queue)."""
        with self._lock:
            s = self._sync
            return {
                "snapshots": s.snapshots,
                "dropped_deltas": s.dropped_deltas,
                "duplicates": s.duplicates,
                "gaps": s.gaps,
                "dropped": self.dropped,
            }


def read_precision(reader: IcebergReader, settings: ClientSettings, ticker: str) -> Precision:
    """How to show `ticker`'s prices and amounts: at its tick and lot size in Iceberg
    `market.markets` (`Client.precision`, and the CLI's `book --at`; the stored book
    itself is `mdclient.book_history`'s).

    Unknown (each value in its shortest form) when the table has no row for it or
    cannot be read (logged): a ladder is still worth showing without it.
    """
    exchange = topics.parse_ticker(ticker).exchange
    try:
        rows = reader.read_markets(settings.markets_table, exchange)
    except StorageError as exc:
        log.info("prices of %s shown as they come: %s", ticker, exc)
        return Precision()
    for row in rows.to_pylist():
        if row[Markets.TICKER] != ticker:
            continue
        return Precision.of(
            float(row.get(Markets.PRICE_PRECISION) or 0),
            float(row.get(Markets.AMOUNT_PRECISION) or 0),
        )
    log.info("prices of %s shown as they come: no row in %s", ticker, settings.markets_table)
    return Precision()


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
