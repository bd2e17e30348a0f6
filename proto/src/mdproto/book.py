"""An L2 order book kept from BookSnapshot + BookDelta: the one model every service applies.

The ingestor turns the exchange's book into deltas (`diff_side`), the pipeline keeps
each ticker's book to answer a late joiner with a snapshot, and the SDK keeps the
client's book. All three apply messages through this class, so a book that is
equal level by level at the exchange's end is equal at the client's
(docs/protocol.md "Order books").

A side is a `SortedDict` (sortedcontainers) from price to amount: levels stay
ordered on insert and removal, so the best price and the top N are cheap reads.
Bids are keyed by the negated price so both sides iterate best first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from sortedcontainers import SortedDict

from mdproto.gen.marketdata_pb2 import BookDelta, BookLevel, BookReset, BookSnapshot

#: (price, amount): one level as plain numbers.
Level = tuple[float, float]


class BookSide:
    """One side of a book, best price first (highest bid, lowest ask)."""

    __slots__ = ("_descending", "_levels")

    def __init__(self, *, descending: bool) -> None:
        self._descending = descending
        self._levels: SortedDict = SortedDict()

    def _key(self, price: float) -> float:
        return -price if self._descending else price

    def set(self, price: float, amount: float) -> None:
        """Put `amount` at `price`; 0 (or less) removes the level."""
        key = self._key(price)
        if amount > 0:
            self._levels[key] = amount
        else:
            self._levels.pop(key, None)

    def replace(self, levels: Iterable[Level]) -> None:
        self._levels.clear()
        for price, amount in levels:
            self.set(price, amount)

    def best(self) -> Level | None:
        if not self._levels:
            return None
        key, amount = self._levels.peekitem(0)
        return (self._key(key), amount)

    def top(self, n: int = 0) -> list[Level]:
        """The best `n` levels (all with 0), best first."""
        items = self._levels.items()
        chosen = items if n <= 0 else items[:n]
        return [(self._key(key), amount) for key, amount in chosen]

    def as_dict(self) -> dict[float, float]:
        return {self._key(key): amount for key, amount in self._levels.items()}

    def __len__(self) -> int:
        return len(self._levels)


class OrderBook:
    """One ticker's L2 book and the exchange sequence it is at."""

    __slots__ = ("asks", "bids", "depth", "exchange_sequence", "exchange_time_ms", "ticker")

    def __init__(self, ticker: str, depth: int = 0) -> None:
        self.ticker = ticker
        self.depth = depth
        self.bids = BookSide(descending=True)
        self.asks = BookSide(descending=False)
        self.exchange_sequence = 0
        self.exchange_time_ms = 0

    def replace(self, snapshot: BookSnapshot) -> None:
        """Become the book `snapshot` describes (whatever was there before)."""
        self.bids.replace((level.price, level.amount) for level in snapshot.bids)
        self.asks.replace((level.price, level.amount) for level in snapshot.asks)
        self.depth = snapshot.depth
        self.exchange_sequence = snapshot.exchange_sequence
        self.exchange_time_ms = snapshot.exchange_time_ms

    def apply(self, delta: BookDelta) -> None:
        """Apply changed levels: absolute amounts, 0 removes."""
        for level in delta.bids:
            self.bids.set(level.price, level.amount)
        for level in delta.asks:
            self.asks.set(level.price, level.amount)
        if delta.exchange_sequence:
            self.exchange_sequence = delta.exchange_sequence
        if delta.exchange_time_ms:
            self.exchange_time_ms = delta.exchange_time_ms

    def follows(self, delta: BookDelta) -> bool:
        """False when the exchange's own ids say deltas are missing before `delta`.

        Only where both ids are known: exchanges without a previous id (or without
        ids at all) cannot be checked here; the platform's `sequence` still can.
        """
        if not delta.exchange_prev_sequence or not self.exchange_sequence:
            return True
        return delta.exchange_prev_sequence == self.exchange_sequence

    def best_bid(self) -> Level | None:
        return self.bids.best()

    def best_ask(self) -> Level | None:
        return self.asks.best()

    def spread(self) -> float | None:
        bid, ask = self.best_bid(), self.best_ask()
        return None if bid is None or ask is None else ask[0] - bid[0]

    def crossed(self) -> bool:
        """A best bid at or above the best ask: a book no exchange would show."""
        spread = self.spread()
        return spread is not None and spread <= 0

    def snapshot(
        self, *, reset: int = BookReset.BOOK_RESET_NONE, reason: str = "", depth: int = 0
    ) -> BookSnapshot:
        """The book as a BookSnapshot (its best `depth` levels per side; 0: all of it)."""
        return BookSnapshot(
            ticker=self.ticker,
            bids=levels_message(self.bids.top(depth)),
            asks=levels_message(self.asks.top(depth)),
            depth=depth or self.depth,
            exchange_sequence=self.exchange_sequence,
            exchange_time_ms=self.exchange_time_ms,
            reset=reset,  # type: ignore[arg-type]
            reason=reason,
        )

    def __eq__(self, other: object) -> bool:
        """Equal level by level on both sides (the sequences may differ)."""
        if not isinstance(other, OrderBook):
            return NotImplemented
        return self.bids.top() == other.bids.top() and self.asks.top() == other.asks.top()

    __hash__ = None  # type: ignore[assignment]


def reset_name(reset: int) -> str:
    """``BOOK_RESET_SEQUENCE_GAP`` -> ``SEQUENCE_GAP`` (an unknown value: its number), as
    logs, the CLI and Iceberg ``book_snapshots.reset`` spell it."""
    if reset in BookReset.values():
        return BookReset.Name(reset).removeprefix("BOOK_RESET_")  # type: ignore[arg-type]
    return str(reset)


def levels_message(levels: Iterable[Level]) -> list[BookLevel]:
    return [BookLevel(price=price, amount=amount) for price, amount in levels]


def diff_side(old: Mapping[float, float], new: Mapping[float, float]) -> list[Level]:
    """The levels that turn side `old` into side `new`: changed or new ones, and
    every level gone from `new` with amount 0.

    The ingestor diffs the exchange's top-N views, so a level pushed out of the top
    N is removed and one that comes into view is added: every consumer's book stays
    exactly the top N without trimming.
    """
    changed = [(price, amount) for price, amount in new.items() if old.get(price) != amount]
    changed.extend((price, 0.0) for price in old if price not in new)
    return changed


def book_from_levels(
    ticker: str, bids: Sequence[Level], asks: Sequence[Level], depth: int = 0
) -> OrderBook:
    """A book from plain levels (tests, exchange snapshots)."""
    book = OrderBook(ticker, depth)
    book.bids.replace(bids)
    book.asks.replace(asks)
    return book
