"""Which tickers need live data, derived from the clients' subscriptions.

The relay's XPUB (non-verbose) reports a topic's first subscription and its
last unsubscription, whatever the number of clients, so this module sees topic
*edges* and keeps a set, not counts. (XPUB_VERBOSER would report every
subscribe but a SUB that subscribed twice unsubscribes once, so counts drift;
see README "Design decisions".)

A ticker is live while any of its market topics (`{ticker}|tick`,
`{ticker}|ohlc:` or `{ticker}|ohlc:{period}` for a served period) has a
subscriber; a period outside `live_periods` starts nothing (the relay refuses it
on `{ticker}|status`, see feedstatus.py). The first one
starts it (`Announce`); when the last one leaves a `Cancel` follows after
`grace` seconds unless a subscriber comes back. A ticker with CEP triggers is
`pin`ned: it stays live as if it had a subscriber until `unpin`. Every `refresh` seconds all
live tickers are announced again, because PUB/SUB loses messages to ingestors
that (re)connect late; ingestors treat announcements as idempotent start/lease
refresh. Pure: the caller passes `now` (monotonic seconds).

The order book is a feed of its own (docs/protocol.md "Order books"):
`{ticker}|book` holds a *book* stream of the ticker, with its own request_id,
re-announcement, grace and cancel (`kind` "book": DataRequest{BOOK},
IngestorControl{CANCEL_BOOK}); it never starts the trade feed, nor the reverse.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from mdproto import topics
from mdproto.errors import ProtocolError

#: What a stream carries: the ticker's trades (REALTIME) or its order book (BOOK).
FeedKind = Literal["trades", "book"]


@dataclass(frozen=True, slots=True)
class Announce:
    """Publish `DataRequest{REALTIME, ticker}` (kind "book": `{BOOK, ticker}`) on :5555."""

    ticker: str
    request_id: str
    why: Literal["start", "refresh", "ingestor joined"]
    kind: FeedKind = "trades"

    @property
    def prefix(self) -> str:
        return topics.exchange_prefix(self.ticker)


@dataclass(frozen=True, slots=True)
class Cancel:
    """Publish `IngestorControl{CANCEL_REALTIME, ticker}` (kind "book": CANCEL_BOOK)."""

    ticker: str
    request_id: str
    kind: FeedKind = "trades"

    @property
    def prefix(self) -> str:
        return topics.exchange_prefix(self.ticker)


Action = Announce | Cancel

#: What holds a pinned ticker in `_Stream.topics`: never a market topic, so never a clash.
PINNED = "<cep triggers>"


@dataclass(slots=True)
class _Stream:
    request_id: str
    topics: set[str] = field(default_factory=set)
    cancel_at: float | None = None  # set while in the grace period


class LiveSubscriptions:
    def __init__(
        self,
        *,
        grace: float,
        refresh: float,
        known_exchanges: Iterable[str],
        new_id: Callable[[], str],
        now: float,
        live_periods: Iterable[int] | None = None,
    ) -> None:
        self._grace = grace
        self._periods = None if live_periods is None else frozenset(live_periods)  # None: any
        self._refresh = refresh
        self._exchanges = frozenset(known_exchanges)
        self._new_id = new_id
        self._topics: set[str] = set()
        self._streams: dict[tuple[str, FeedKind], _Stream] = {}
        self._next_refresh = now + refresh

    @property
    def topic_count(self) -> int:
        """Distinct topics with at least one subscriber (market data or not)."""
        return len(self._topics)

    @property
    def live_tickers(self) -> list[str]:
        """Tickers being streamed (trades or book), including those in their grace period."""
        return sorted({ticker for ticker, _ in self._streams})

    def is_live(self, ticker: str) -> bool:
        return any(t == ticker for t, _ in self._streams)

    def subscribed(self, topic: str, now: float) -> list[Action]:
        self._topics.add(topic)
        feed = self._feed_of(topic)
        if feed is None:
            return []
        return self._hold(*feed, topic)

    def unsubscribed(self, topic: str, now: float) -> list[Action]:
        self._topics.discard(topic)
        feed = self._feed_of(topic)
        return self._release(*feed, topic, now) if feed else []

    def pin(self, ticker: str, now: float) -> list[Action]:
        """Keep `ticker` live without any subscriber: it has CEP triggers to evaluate."""
        if not self._known(ticker):
            return []
        return self._hold(ticker, "trades", PINNED)

    def unpin(self, ticker: str, now: float) -> list[Action]:
        """Its last trigger is gone: the ticker now lives by its subscribers alone."""
        return self._release(ticker, "trades", PINNED, now)

    def _hold(self, ticker: str, kind: FeedKind, reason: str) -> list[Action]:
        stream = self._streams.get((ticker, kind))
        if stream is None:
            stream = self._streams[ticker, kind] = _Stream(self._new_id())
            stream.topics.add(reason)
            return [Announce(ticker, stream.request_id, "start", kind)]
        stream.topics.add(reason)
        stream.cancel_at = None  # back within the grace period: keep streaming
        return []

    def _release(self, ticker: str, kind: FeedKind, reason: str, now: float) -> list[Action]:
        stream = self._streams.get((ticker, kind))
        if stream is None or reason not in stream.topics:
            return []
        stream.topics.discard(reason)
        if not stream.topics:
            stream.cancel_at = now + self._grace
        return []

    def due(self, now: float) -> list[Action]:
        """Cancels whose grace period is over, then the periodic re-announcement."""
        actions: list[Action] = []
        for (ticker, kind), stream in list(self._streams.items()):
            if stream.cancel_at is not None and stream.cancel_at <= now:
                del self._streams[ticker, kind]
                actions.append(Cancel(ticker, stream.request_id, kind))
        if now >= self._next_refresh:
            self._next_refresh = now + self._refresh
            actions.extend(
                Announce(ticker, stream.request_id, "refresh", kind)
                for (ticker, kind), stream in sorted(self._streams.items())
            )
        return actions

    def ingestor_joined(self, subscription: str) -> list[Action]:
        """Announce at once what a newly subscribed ingestor would receive.

        `subscription` is the prefix an ingestor subscribed to on the work socket
        (normally `BINANCE:`); ZeroMQ delivers a topic to every subscription that
        is a prefix of it.
        """
        return [
            Announce(ticker, stream.request_id, "ingestor joined", kind)
            for (ticker, kind), stream in sorted(self._streams.items())
            if topics.exchange_prefix(ticker).startswith(subscription)
        ]

    def next_deadline(self) -> float:
        cancels = [s.cancel_at for s in self._streams.values() if s.cancel_at is not None]
        return min([self._next_refresh, *cancels])

    def _feed_of(self, topic: str) -> tuple[str, FeedKind] | None:
        """The (ticker, feed kind) a market topic needs live; None for anything else."""
        market = topics.parse_market_topic(topic)
        if market is None or not self._known(market.ticker):
            return None
        if market.kind == "book":
            return market.ticker, "book"
        if self._periods is not None and market.period_seconds not in (None, *self._periods):
            return None
        return market.ticker, "trades"

    def _known(self, ticker: str) -> bool:
        """A valid ticker of a configured exchange (any exchange when none is configured)."""
        try:
            exchange = topics.parse_ticker(ticker).exchange
        except ProtocolError:
            return False
        return not self._exchanges or exchange in self._exchanges
