"""What markets each exchange lists, from the compacted Kafka topic `market.markets`.

    ingestors -> Market records (key ticker) -> market.markets (compacted)
        -> consumer thread: MarketBook (mutable, the thread's own)
        -> KnownMarkets snapshot (immutable) -> one attribute the relay's loop reads

The relay refuses a request for a symbol its exchange does not list (or lists as
inactive) with `bad_symbol` at once, instead of an OK followed by the ingestor's
ERROR seconds later. An exchange without any Market record is not judged: its
requests pass as before (the ingestor still reports bad_symbol). An inactive
market (e.g. delisted, Binance status BREAK) still has its past candles, so only
live uses (CEP triggers, live data) refuse it: nothing would ever trade.

The loop never waits: the consumer thread builds a new immutable snapshot and
swaps one reference, which the loop reads without a lock. No snapshot is
published before the topic was read to its end at start, so a half-read topic
never refuses a symbol it simply has not reached yet.
"""

from __future__ import annotations

import difflib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from mdproto import ProtocolError, contracts
from mdproto.markets import decode_market_record
from mdproto.messages import Market
from mdproto.runtime import kafka

log = logging.getLogger(__name__)

_SUGGESTIONS = 3
# Enough to find BTC/USDT for BTC/USDC or ETH/USD, not so loose that anything goes.
_CUTOFF = 0.6


#: Longest a run of arriving records delays the next snapshot (a steady stream).
_DRAIN_S = 1.0
_RETRY_MAX_S = 30.0  # a failed market-metadata reader starts over after at most this
_HINTS_KEPT = 1024  # memoised suggestions per exchange: a repeated typo costs one lookup


class ExchangeMarkets:
    """One exchange's markets, frozen: ticker -> active, and the indexes hints use.

    Suggestions compare the base with the bases quoted in the same currency and the
    quote with the quotes of the same base (a few hundred short strings at most),
    not the symbol with every symbol: ~100 ms for 3,000 markets, on the loop.
    """

    __slots__ = ("_bases_by_quote", "_hints", "_quotes_by_base", "active")

    def __init__(self, markets: Mapping[str, bool]) -> None:
        self.active: Mapping[str, bool] = MappingProxyType(dict(markets))
        bases: dict[str, set[str]] = {}
        quotes: dict[str, set[str]] = {}
        for ticker, active in markets.items():
            if active:
                base, _, quote = ticker.partition(":")[2].partition("/")
                bases.setdefault(quote, set()).add(base)
                quotes.setdefault(base, set()).add(quote)
        self._bases_by_quote = {q: sorted(b) for q, b in bases.items()}
        self._quotes_by_base = {b: sorted(q) for b, q in quotes.items()}
        self._hints: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self.active)

    def hint(self, symbol: str) -> str:
        """ "; did you mean A/B, C/D?" for an unknown BASE/QUOTE, or ""."""
        cached = self._hints.get(symbol)
        if cached is None:
            base, _, quote = symbol.partition("/")
            close = [
                *(f"{base}/{q}" for q in _close(quote, self._quotes_by_base.get(base, []))),
                *(f"{b}/{quote}" for b in _close(base, self._bases_by_quote.get(quote, []))),
            ][:_SUGGESTIONS]
            cached = f"; did you mean {', '.join(close)}?" if close else ""
            if len(self._hints) >= _HINTS_KEPT:
                self._hints.clear()
            self._hints[symbol] = cached
        return cached


def _close(word: str, candidates: list[str]) -> list[str]:
    return difflib.get_close_matches(word, candidates, n=_SUGGESTIONS, cutoff=_CUTOFF)


@dataclass(frozen=True, slots=True)
class KnownMarkets:
    """Per exchange, its markets as the topic said when the snapshot was taken."""

    by_exchange: Mapping[str, ExchangeMarkets] = field(default_factory=lambda: MappingProxyType({}))

    def check(self, ticker: str, live: bool = False) -> str | None:
        """Why `ticker` cannot be served, or None (also when its exchange has no metadata).

        `ticker` is a valid `EXCHANGE:BASE/QUOTE` (the caller checked the format);
        `live`: trades are wanted (triggers, live data), so an inactive market fails.
        """
        exchange, _, symbol = ticker.partition(":")
        markets = self.by_exchange.get(exchange)
        if not markets:
            return None
        active = markets.active.get(ticker)
        if active is None:
            return (
                f"unknown symbol {symbol}: {exchange} lists no such market ({len(markets)} "
                f"known from {contracts.KAFKA_MARKETS}){markets.hint(symbol)}"
            )
        if live and not active:
            return f"symbol {symbol} is inactive on {exchange} (not trading)"
        return None

    def counts(self) -> dict[str, tuple[int, int]]:
        """Per exchange: (markets known, of which active)."""
        return {ex: (len(m), sum(m.active.values())) for ex, m in self.by_exchange.items()}


class MarketBook:
    """The topic's current state, owned by one thread; `snapshot()` freezes it."""

    def __init__(self) -> None:
        self._markets: dict[str, dict[str, bool]] = {}
        self._frozen: dict[str, ExchangeMarkets] = {}
        self._dirty: set[str] = set()

    def apply(self, ticker: str, market: Market | None) -> None:
        """A record for `ticker`: a Market (re)places it, a tombstone (None) removes it."""
        exchange = ticker.partition(":")[0]
        markets = self._markets.setdefault(exchange, {})
        if market is None:
            markets.pop(ticker, None)
        else:
            markets[ticker] = market.active
        self._dirty.add(exchange)

    def apply_record(self, key: bytes | None, value: bytes | None) -> bool:
        """A raw Kafka record; False (and ignored) if it does not decode or names no ticker."""
        try:
            ticker, market = decode_market_record(key, value)
        except ProtocolError as exc:
            log.warning("%s: record %r ignored: %s", contracts.KAFKA_MARKETS, key, exc)
            return False
        self.apply(ticker, market)
        return True

    @property
    def changed(self) -> bool:
        return bool(self._dirty)

    def snapshot(self) -> KnownMarkets:
        """An immutable copy; only exchanges that changed since the last one are copied."""
        for exchange in self._dirty:
            markets = self._markets.get(exchange)
            if markets:
                self._frozen[exchange] = ExchangeMarkets(markets)
            else:
                self._frozen.pop(exchange, None)
        self._dirty.clear()
        return KnownMarkets(MappingProxyType(dict(self._frozen)))


class MarketDirectory:
    """Reads `market.markets` on its own thread; `check` is safe from any thread.

    Kafka is optional: until the topic was read (or without Kafka at all) the
    snapshot is empty and every symbol passes. A reader that fails starts over
    (backoff up to `_RETRY_MAX_S`), and until it has read the topic again every
    symbol passes too: a stale snapshot would refuse new listings `bad_symbol`,
    while an unchecked bad symbol still ends in the ingestor's ERROR
    notification. `failure` says why meanwhile (relay health, a metric).
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        on_snapshot: Callable[[KnownMarkets], None] = lambda _: None,
        partitions: int = 3,
        replication: int = 1,
        timeout_s: float = 10.0,
        consumer_factory: Callable[[dict[str, Any]], Any] | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self._on_snapshot = on_snapshot
        self._partitions = partitions
        self._replication = replication
        self._timeout_s = timeout_s
        self.snapshot = KnownMarkets()  # replaced whole, never mutated: the loop's view
        self._stop = threading.Event()
        self._caught_up = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer_factory = consumer_factory
        #: Why the reader is not following the topic right now; None while it is.
        self.failure: str | None = None

    @property
    def alive(self) -> bool:
        """The reader thread runs (it only ends on `close`)."""
        return self._thread is not None and self._thread.is_alive()

    def check(self, ticker: str, live: bool = False) -> str | None:
        """Why `ticker` cannot be served per the latest snapshot, or None.

        The predicate the relay's validation (and its live-data path) calls.
        """
        return self.snapshot.check(ticker, live)

    def start(self) -> MarketDirectory:
        self._thread = threading.Thread(target=self._run, name="relay-markets", daemon=True)
        self._thread.start()
        log.info("market metadata from Kafka topic %s at %s", self.topic, self.bootstrap)
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def wait_caught_up(self, timeout_s: float) -> bool:
        """True once the topic was read to where it ended at start (and published)."""
        return self._caught_up.wait(timeout_s)

    def _publish(self, book: MarketBook) -> None:
        self.snapshot = snapshot = book.snapshot()
        self._on_snapshot(snapshot)

    def _run(self) -> None:
        try:
            kafka.ensure_topics(
                self.bootstrap,
                [kafka.spec(contracts.KAFKA_MARKETS, self.topic)],
                partitions=self._partitions,
                replication=self._replication,
                timeout_s=self._timeout_s,
            )
        except Exception as exc:  # the ingestors create it too; keep waiting for it below
            log.warning("cannot create Kafka topic %s: %s; waiting for it", self.topic, exc)
        delay = 1.0
        while not self._stop.is_set():
            try:
                self._follow()
            except Exception as exc:
                self._publish(MarketBook())  # every symbol passes until it is read again
                self.failure = f"{type(exc).__name__}: {exc}"
                log.exception(
                    "market metadata reader failed; symbols unchecked until it has read %s "
                    "again (retry in %.0f s)",
                    self.topic,
                    delay,
                )
                self._stop.wait(delay)
                delay = min(delay * 2, _RETRY_MAX_S)

    def _follow(self) -> None:
        """Read the topic to its end, then follow it until `close` (a fresh book each time)."""
        conf = {
            "bootstrap.servers": self.bootstrap,
            "group.id": "relay-markets",
            "enable.auto.commit": False,
            "logger": kafka.quiet_logger("markets"),
        }
        if self._consumer_factory is not None:
            consumer = self._consumer_factory(conf)
        else:
            from confluent_kafka import Consumer

            consumer = Consumer(conf)
        book = MarketBook()
        try:
            self._load(consumer, book)
            self.failure = None
            while not self._stop.is_set():
                self._drain(consumer, book)
                if book.changed:
                    self._publish(book)
        finally:
            consumer.close()

    def _drain(self, consumer: Any, book: MarketBook) -> None:
        """Apply what arrives, reading on until a poll comes back empty (at most
        `_DRAIN_S`): one ingestor's markets land on several partitions and may arrive in
        separate polls, and a snapshot of part of them would refuse the rest
        (bad_symbol) until the next poll."""
        deadline = time.monotonic() + _DRAIN_S
        batch: list[Any] = consumer.consume(num_messages=1000, timeout=0.2)
        while batch:
            for msg in batch:
                if msg.error() is None:
                    book.apply_record(msg.key(), msg.value())
            if time.monotonic() > deadline:
                return
            batch = consumer.consume(num_messages=1000, timeout=0.2)

    def _load(self, consumer: Any, book: MarketBook) -> None:
        ends = kafka.wait_end_offsets(consumer, self.topic, self._stop)
        for msg in kafka.read_to_end(consumer, self.topic, ends or {}):
            if self._stop.is_set():
                return
            if msg is not None:
                book.apply_record(msg.key(), msg.value())
        self._publish(book)
        self._caught_up.set()
        counts = ", ".join(f"{ex} {n}" for ex, (n, _) in sorted(self.snapshot.counts().items()))
        log.info("market metadata loaded: %s", counts or "no markets yet")
