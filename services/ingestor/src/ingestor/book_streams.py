"""One exchange's order books over the ingestor's own websocket (ADR 0019).

`BookStreams` is the `StreamHandler` of one `ingestor.websocket.Connection` per venue
with a `BookWire` (OKX, Bybit, Kraken, Coinbase): the venue writes the requests and
parses the messages, its `BookGuard` checks ids and checksums, and `L2Book` keeps each
market's levels. Per raw message, in order:

1. a refusal of a request (`wire.refusal`) fails the watches still awaiting a first
   book: their subscriptions are forgotten, the next watch subscribes again;
2. `wire.parse`: not a book message (acks, pongs, status) -> ignored;
3. the guard's verdict: an update of a book awaiting its snapshot is dropped; a gap
   or a bad checksum drops the book, unsubscribes the channel and fails the watch with
   `BookIntegrityError` (kept for the next watch if none is waiting), which then
   subscribes again and gets a fresh snapshot (the exchanges send one only then);
4. the book takes the message, and the watch waiting for it gets its `BookView`.

A lost connection fails every subscribed market's watch with a NETWORK
`ExchangeCallError` (a reset of kind RECONNECT for the book feed); the connection
subscribes them all again, and the next watch gets the book rebuilt from the new
snapshots. As with ccxt.pro, a message no watch is waiting for updates the book
without being delivered: a watch returns the book after the next message.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from ingestor.model import BookIntegrityError, BookView, ExchangeCallError, FaultKind
from ingestor.rest import Network
from ingestor.retry import RetryPolicy
from ingestor.venues.base import (
    BookContext,
    BookGuard,
    BookMessage,
    BookTopic,
    BookVerdict,
    BookWire,
)
from ingestor.websocket import Connection, Link

log = logging.getLogger(__name__)


class L2Book:
    """One market's book: a snapshot, then updates (amount 0 removes a level); pure.

    `keep`: the exchange does not remove levels pushed out of this depth (Kraken), so
    the book drops them itself. `nonce`: the exchange's sequence of the last message
    (0: it sends none); `timestamp_ms`: the last message's time (0: none).
    """

    def __init__(self, keep: int | None = None) -> None:
        self.bids: dict[float, float] = {}
        self.asks: dict[float, float] = {}
        self.nonce = 0
        self.timestamp_ms = 0
        self._keep = keep

    def apply(self, message: BookMessage, sequence: int | None = None) -> None:
        if message.snapshot:
            self.bids.clear()
            self.asks.clear()
        for side, levels in ((self.bids, message.bids), (self.asks, message.asks)):
            for price, amount in levels:
                if amount:
                    side[price] = amount
                else:
                    side.pop(price, None)
        if self._keep is not None:
            _cut(self.bids, heapq.nlargest, self._keep)
            _cut(self.asks, heapq.nsmallest, self._keep)
        self.nonce = sequence or 0
        self.timestamp_ms = message.timestamp_ms

    def view(self, depth: int) -> BookView:
        """The best `depth` levels per side (a copy)."""
        bids, asks = self.bids, self.asks
        return BookView(
            bids={p: bids[p] for p in heapq.nlargest(depth, bids)},
            asks={p: asks[p] for p in heapq.nsmallest(depth, asks)},
            nonce=self.nonce,
            timestamp_ms=self.timestamp_ms,
        )


def _cut(side: dict[float, float], best: Callable[..., list[float]], keep: int) -> None:
    if len(side) > keep:
        kept = set(best(keep, side))
        for price in [p for p in side if p not in kept]:
            del side[price]


def link_of(wire: BookWire, connect_timeout_s: float, backoff: RetryPolicy | None = None) -> Link:
    """The connection settings of a venue's book channel."""
    return Link(wire.ping, wire.ping_interval_s, connect_timeout_s, backoff or RetryPolicy())


#: A ccxt market by the exchange's id or the unified symbol.
MarketOf = Callable[[str], Mapping[str, Any]]

#: What a venue's parser or guard raises on a message not in the venue's shape.
_UNREADABLE = (LookupError, TypeError, ValueError, AttributeError)


class BookStreams:
    """The books of one exchange on one connection (see the module)."""

    def __init__(
        self,
        wire: BookWire,
        url: str,
        market: MarketOf,
        name: str,
        link: Link,
        network: Network | None = None,
    ) -> None:
        """`link`: the connection's (its ping and interval are the venue's: `link_of`);
        `network`: ccxt's TLS and websocket proxy for the exchange."""
        self._wire, self._market, self._name = wire, market, name
        self._topics: dict[str, BookTopic] = {}  # symbol -> its subscribed channel
        self._books: dict[str, L2Book] = {}  # symbol -> its book, from its snapshot on
        self._depths: dict[str, int] = {}  # symbol -> the levels a watch returns
        self._waiters: dict[str, asyncio.Future[BookView]] = {}
        self._failed: dict[str, Exception] = {}  # a watch's failure no watch has seen yet
        self._guard: BookGuard | None = None
        self.connection = Connection(url, self, link, name, network)

    async def watch(self, topic: BookTopic, depth: int) -> BookView:
        """`topic`'s best `depth` levels after the book's next message; raises the
        failure of the previous watch's channel first if no watch has seen it."""
        symbol = topic.symbol
        failure = self._failed.pop(symbol, None)
        if failure is not None:
            raise failure
        self._depths[symbol] = depth
        if symbol not in self._topics:
            self._topics[symbol] = topic
            self.connection.subscribe(symbol, self._wire.request("subscribe", topic))
        self.connection.start()  # again after a run that failed
        waiter = self._waiters.get(symbol)
        if waiter is None or waiter.done():
            waiter = self._waiters[symbol] = asyncio.get_running_loop().create_future()
        return await waiter

    def unwatch(self, symbol: str, error: Exception) -> None:
        """End `symbol`'s channel; a waiting watch fails with `error`."""
        self._drop(symbol)
        self._failed.pop(symbol, None)
        waiter = self._waiters.pop(symbol, None)
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)

    async def close(self) -> None:
        """Close the connection; a waiting watch fails (NETWORK), as ccxt's on close."""
        await self.connection.close()
        closed = ExchangeCallError(FaultKind.NETWORK, f"{self._name}: closed")
        for symbol in list(self._waiters):
            self._fail(symbol, closed)

    # ------------------------------------------------------ StreamHandler
    def on_connected(self) -> None:
        self._books.clear()
        context = BookContext(self._market, self._topic_depth)
        self._guard = self._wire.guard(context) if self._wire.guard is not None else None

    def on_lost(self, error: ExchangeCallError) -> None:
        self._books.clear()
        for symbol in self._topics:
            self._fail(symbol, error)

    def on_text(self, text: str) -> None:
        try:
            message = json.loads(text)
        except ValueError:
            return  # a venue's text pong
        if not isinstance(message, dict):
            return
        try:
            self._on_message(message)
        except _UNREADABLE as exc:
            log.warning("%s: book message unreadable (%r): %.200s", self._name, exc, text)

    def _on_message(self, message: Mapping[str, Any]) -> None:
        refusal = self._wire.refusal(message)
        if refusal is not None:
            self._refused(refusal)
            return
        parsed = self._wire.parse(message)
        if parsed is None:
            return
        symbol = str(self._market(parsed.market)["symbol"])
        topic = self._topics.get(symbol)
        if topic is None:
            return  # a channel being unsubscribed
        verdict = self._guard.check(message) if self._guard is not None else BookVerdict(symbol)
        if verdict is None or verdict.stale:
            return
        if verdict.problem is not None:
            self._drop(symbol)
            reason = f"{self._name} {verdict.reason}"
            self._fail(symbol, BookIntegrityError(verdict.problem, reason))
            return
        book = self._books.get(symbol)
        if book is None:
            if not parsed.snapshot:
                return  # an update before the book's snapshot (a venue without a guard)
            book = self._books[symbol] = L2Book(topic.depth if self._wire.truncate else None)
        book.apply(parsed, verdict.sequence)
        waiter = self._waiters.pop(symbol, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(book.view(self._depths.get(symbol, topic.depth)))

    def _refused(self, reason: str) -> None:
        """The exchange refused a request: the channels still without a book fail (a
        refused subscription), and are subscribed again by their next watch."""
        log.warning("%s: the exchange refused a book request: %s", self._name, reason)
        error = ExchangeCallError(FaultKind.EXCHANGE_ERROR, f"{self._name}: {reason}")
        for symbol in [s for s in self._topics if s not in self._books]:
            del self._topics[symbol]
            self.connection.unsubscribe(symbol, None)  # nothing to end on the exchange
            self._fail(symbol, error)

    def _drop(self, symbol: str) -> None:
        """Forget `symbol`'s book and end its channel on the exchange."""
        topic = self._topics.pop(symbol, None)
        self._books.pop(symbol, None)
        if topic is not None:
            self.connection.unsubscribe(symbol, self._wire.request("unsubscribe", topic))

    def _fail(self, symbol: str, error: Exception) -> None:
        """The watch waiting on `symbol` fails; with none waiting, the next one does."""
        waiter = self._waiters.pop(symbol, None)
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)
        else:
            self._failed[symbol] = error

    def _topic_depth(self, symbol: str) -> int | None:
        topic = self._topics.get(symbol)
        return None if topic is None else topic.depth
