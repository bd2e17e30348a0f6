"""Every live order book the PUB serves: what a late joiner and the periodic snapshot need.

The live engine hands over the ``market.book`` records in Kafka order; the PUB's
outlet applies each one here, under its send lock, right before it goes on the
wire, so the book of a ticker is always the book after the last message sent on
its topic (docs/protocol.md "Order books"). That is what makes a snapshot sent
to a new subscription carry the *topic's* last sequence truthfully.

Books are live, not durable: after a restart the engine reads from the newest
records, and a ticker's book is whole only from its next snapshot (the ingestor
writes one every 10 s); its deltas before that are not published.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from mdproto.book import OrderBook
from mdproto.messages import BookDelta, BookReset, BookSnapshot

log = logging.getLogger(__name__)

BookRecord = BookSnapshot | BookDelta


class LiveBooks:
    """One `OrderBook` per ticker, whole only after a snapshot. Not thread-safe: the
    outlet calls it under the lock it sends under."""

    __slots__ = ("_books", "_changed", "_ingested_at_ms", "held_back", "mismatched")

    def __init__(self) -> None:
        self._books: dict[str, OrderBook] = {}
        self._changed: set[str] = set()
        self._ingested_at_ms: dict[str, int] = {}
        #: Deltas not published: their book was not whole (no snapshot since start).
        self.held_back = 0
        #: Deltas whose exchange ids did not follow the book: it waits for a snapshot.
        self.mismatched = 0

    def apply(self, record: BookRecord) -> bool:
        """Apply `record` to its ticker's book; whether to publish it.

        A snapshot always replaces the book. A delta of a book that is not whole is
        held back. A delta whose ``exchange_prev_sequence`` does not follow the book
        is published (subscribers see the mismatch themselves and wait for the next
        snapshot) but makes this book not whole either: a wrong book is never served.
        """
        ticker = record.ticker
        self._ingested_at_ms[ticker] = record.ingested_at_ms
        if isinstance(record, BookSnapshot):
            book = self._books.get(ticker)
            if book is None:
                book = self._books[ticker] = OrderBook(ticker, record.depth)
            book.replace(record)
            self._changed.discard(ticker)
            return True
        book = self._books.get(ticker)
        if book is None:
            self.held_back += 1
            return False
        if not book.follows(record):
            self.mismatched += 1
            log.warning(
                "book %s: delta after exchange sequence %d, the book is at %d: "
                "not served until the next snapshot",
                ticker,
                record.exchange_prev_sequence,
                book.exchange_sequence,
            )
            del self._books[ticker]
            self._changed.discard(ticker)
            return True
        book.apply(record)
        self._changed.add(ticker)
        return True

    def snapshot(self, ticker: str) -> BookSnapshot | None:
        """The whole book now, as a BookSnapshot with ``reset`` NONE (None: not whole)."""
        book = self._books.get(ticker)
        if book is None:
            return None
        snapshot = book.snapshot(reset=BookReset.BOOK_RESET_NONE)
        snapshot.ingested_at_ms = self._ingested_at_ms.get(ticker, 0)
        return snapshot

    def take_changed(self) -> list[BookSnapshot]:
        """Snapshots of the books changed since their last snapshot, each marked unchanged."""
        changed = sorted(self._changed)
        self._changed.clear()
        return [s for s in map(self.snapshot, changed) if s is not None]

    def forget(self, tickers: Iterable[str]) -> None:
        """Drop these books: their partition moved to another engine, whose book is
        the one to serve (this one would go stale)."""
        for ticker in tickers:
            self._books.pop(ticker, None)
            self._changed.discard(ticker)
            self._ingested_at_ms.pop(ticker, None)

    def tickers(self) -> list[str]:
        """Tickers whose book is whole."""
        return list(self._books)

    def __len__(self) -> int:
        return len(self._books)
