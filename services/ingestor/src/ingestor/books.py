"""Order-book feeds: the exchange's L2 book -> BookSnapshot / BookDelta records, one task
per ticker (docs/protocol.md "Order books").

- `delta_record` diffs two top-`depth` views (`mdproto.book.diff_side`): a level
  pushed out of the top is removed and one coming into view is added, so every
  copy downstream stays exactly the top `depth`.
- `reset_of` says why the next snapshot replaces the book: the feed's first book
  (START), a skipped exchange id (SEQUENCE_GAP) or a bad checksum (CHECKSUM)
  reported by the adapter, a lost connection (RECONNECT).
- `run_book_feed` loops on the adapter's `watch_order_book`; after a gap or a bad
  checksum, watching again makes ccxt fetch a fresh snapshot, published with its
  reset; every `store_interval_s` it also writes a snapshot with reset NONE (the
  pipeline stores those). Its FeedStatus changes (FeedPhase) are those of trades.
- `BookFeeds` is `LiveFeeds` for books: DataRequest{BOOK} starts or refreshes a
  lease, IngestorControl{CANCEL_BOOK} stops the feed, an unrefreshed lease expires.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from google.protobuf.message import Message

from ingestor.clock import wall_clock_ms
from ingestor.live import FeedPhase, FeedStats, LiveFeeds, StatusChange, reconnect_delay
from ingestor.model import BookIntegrity, BookIntegrityError, BookView, ExchangeCallError
from ingestor.retry import RetryPolicy
from mdproto.book import diff_side, levels_message
from mdproto.messages import BookDelta, BookReset, BookSnapshot
from mdproto.topics import parse_ticker

log = logging.getLogger(__name__)

_RESETS = {
    BookIntegrity.SEQUENCE_GAP: BookReset.BOOK_RESET_SEQUENCE_GAP,
    BookIntegrity.CHECKSUM: BookReset.BOOK_RESET_CHECKSUM,
}


class BookSource(Protocol):
    prefix: str
    supports_books: bool

    async def watch_order_book(self, symbol: str, depth: int) -> BookView: ...

    async def unwatch_order_book(self, symbol: str) -> None: ...


class BookSink(Protocol):
    async def send_book(self, key: str, record: Message) -> None: ...


@dataclass
class BookStats(FeedStats):
    snapshots: int = 0  # BookSnapshot records (resets and periodic ones)
    deltas: int = 0
    resets: int = 0  # snapshots after a gap, a bad checksum or a reconnect


@dataclass(frozen=True, slots=True)
class Reset:
    """Why the next snapshot replaces the book (`kind` a BookReset value)."""

    kind: int
    reason: str


START = Reset(BookReset.BOOK_RESET_START, "the feed started")


def reset_of(error: BookIntegrityError | ExchangeCallError) -> Reset:
    """The reset the snapshot after `error` reports."""
    if isinstance(error, BookIntegrityError):
        return Reset(_RESETS[error.kind], error.reason)
    return Reset(BookReset.BOOK_RESET_RECONNECT, error.reason)


def snapshot_record(
    ticker: str, view: BookView, depth: int, reset: Reset | None, ingested_at_ms: int
) -> BookSnapshot:
    return BookSnapshot(
        ticker=ticker,
        bids=levels_message(sorted(view.bids.items(), reverse=True)),
        asks=levels_message(sorted(view.asks.items())),
        depth=depth,
        exchange_sequence=view.nonce,
        exchange_time_ms=view.timestamp_ms,
        ingested_at_ms=ingested_at_ms,
        reset=reset.kind if reset else BookReset.BOOK_RESET_NONE,  # type: ignore[arg-type]
        reason=reset.reason if reset else "",
    )


def delta_record(
    ticker: str, before: BookView, after: BookView, ingested_at_ms: int
) -> BookDelta | None:
    """The levels that turn `before` into `after`; None when none changed."""
    bids, asks = diff_side(before.bids, after.bids), diff_side(before.asks, after.asks)
    if not bids and not asks:
        return None
    return BookDelta(
        ticker=ticker,
        bids=levels_message(bids),
        asks=levels_message(asks),
        exchange_sequence=after.nonce,
        exchange_prev_sequence=before.nonce,
        exchange_time_ms=after.timestamp_ms,
        ingested_at_ms=ingested_at_ms,
    )


def _no_report(change: StatusChange) -> None:
    return None


async def run_book_feed(
    ticker: str,
    source: BookSource,
    sink: BookSink,
    stats: BookStats,
    *,
    depth: int,
    store_interval_s: float,
    reconnect: RetryPolicy,
    start_attempts: int = 4,
    report: Callable[[StatusChange], None] = _no_report,
    now_ms: Callable[[], int] = wall_clock_ms,
    monotonic: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    rand: Callable[[], float] = random.random,
) -> None:
    """Stream one ticker's book into Kafka until cancelled or FAILED; `report` its changes."""
    symbol = parse_ticker(ticker).symbol
    phase = FeedPhase(start_attempts)
    failures = 0
    reset: Reset | None = START  # why the next snapshot (after `last` is None) is sent
    last: BookView | None = None
    store_at = 0.0
    while True:
        try:
            view = await source.watch_order_book(symbol, depth)
        except BookIntegrityError as error:
            reset, last = reset_of(error), None
            log.warning("book %s: %s; rebuilding from a fresh snapshot", ticker, error)
            continue  # watching again makes ccxt fetch a fresh snapshot
        except ExchangeCallError as fault:
            change = phase.fault(fault)
            if change is not None:
                report(change)
            if phase.failed:
                stats.failed, stats.retryable = str(fault), fault.kind.transient
                log.error("book %s stopped: %s", ticker, change.reason if change else fault)
                return
            if last is not None:
                reset, last = reset_of(fault), None
            failures += 1
            stats.reconnects += 1
            delay = reconnect_delay(fault, failures, reconnect, rand())
            log.warning("book %s: %s; reconnecting in %.2f s", ticker, fault, delay)
            await sleep(delay)
            continue
        failures = 0
        change = phase.data()
        if change is not None:
            report(change)
        ingested = now_ms()
        delta = None if last is None else delta_record(ticker, last, view, ingested)
        if delta is not None:
            await sink.send_book(ticker, delta)
            stats.deltas += 1
        if last is None or monotonic() >= store_at:  # a new book, or time to store one
            await sink.send_book(ticker, snapshot_record(ticker, view, depth, reset, ingested))
            stats.snapshots += 1
            stats.resets += reset is not None and reset is not START
            reset, store_at = None, monotonic() + store_interval_s
        last = view


class BookFeeds(LiveFeeds):
    """Book feeds by ticker, leased like trade feeds (`LiveFeeds`)."""

    kind = "BOOK"

    def __init__(
        self,
        sources: dict[str, BookSource],
        sink: BookSink,
        *,
        depth: int,
        store_interval_s: float,
        lease_s: float,
        reconnect: RetryPolicy,
        start_attempts: int = 4,
        on_status: Callable[[Any], None] | None = None,
        ingestor_id: str = "",
    ) -> None:
        super().__init__(
            sources,
            sink,
            lease_s=lease_s,
            dedupe_capacity=1,
            reconnect=reconnect,
            start_attempts=start_attempts,
            on_status=on_status,
            ingestor_id=ingestor_id,
        )
        self._depth = depth
        self._store_interval_s = store_interval_s

    def _serves(self, source: Any) -> bool:
        return bool(source.supports_books)

    def _new_stats(self) -> BookStats:
        return BookStats()

    def _run(
        self, ticker: str, source: Any, stats: Any, report: Callable[[StatusChange], None]
    ) -> Coroutine[Any, Any, None]:
        return run_book_feed(
            ticker,
            source,
            self._sink,
            stats,
            depth=self._depth,
            store_interval_s=self._store_interval_s,
            reconnect=self._reconnect,
            start_attempts=self._start_attempts,
            report=report,
        )

    async def _unwatch(self, source: Any, symbol: str) -> None:
        await source.unwatch_order_book(symbol)
