"""The shape of a venue description (see `ingestor.venues`)."""

from __future__ import annotations

import enum
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from ingestor.model import BookIntegrity, Candle, RawFields, Trade

log = logging.getLogger(__name__)

#: (open time ms, open, high, low, close, volume): what every exchange's candle row holds.
Ohlcv = tuple[int, float, float, float, float, float]


@dataclass(frozen=True, slots=True)
class RestRequest:
    """One call of a venue's REST endpoint, as the venue writes it.

    `api`: the section of ccxt's `urls['api']` the path is under (`public`), so the
    configured base URL (the simulator's) and ccxt's signing apply; `path`: the endpoint
    under it, `{name}` filled from `params` (Coinbase `products/{id}/candles`); `params`:
    the query, in the order it goes out.
    """

    api: str
    path: str
    params: Mapping[str, str | int]
    method: str = "GET"


@dataclass(frozen=True, slots=True)
class CandleQuery:
    """One page of candles to ask for: opening in [since_ms, until_ms] (inclusive), at
    most `limit`. `interval`: the exchange's own name of the period (ccxt's `timeframes`
    table); `now_ms`: the wall clock, for venues whose endpoint depends on the age."""

    market_id: str
    interval: str
    period_ms: int
    since_ms: int
    until_ms: int
    limit: int
    now_ms: int


@dataclass(frozen=True, slots=True)
class TradeQuery:
    """One page of the trade history: at the venue's id `cursor` (`TradePaging`), from
    `since_ms` on, or the latest (neither); at most `limit` trades."""

    market_id: str
    limit: int
    since_ms: int | None = None
    cursor: str | None = None


def number(value: Any) -> float:
    """A price or amount as a float; 0.0 where the exchange sent nothing readable."""
    try:
        return float(value) if value is not None else 0.0
    except (TypeError, ValueError):
        return 0.0


def ohlcv(
    row: Sequence[Any], columns: tuple[int, int, int, int, int] = (1, 2, 3, 4, 5), unit_ms: int = 1
) -> Ohlcv:
    """A raw row's OHLCV: the open time at index 0 (in units of `unit_ms`), open, high,
    low, close and volume at `columns` (by default the layout Binance, OKX, Bybit share)."""
    o, h, low, c, v = (number(row[i]) for i in columns)
    return (int(row[0]) * unit_ms, o, h, low, c, v)


def read_candles(
    venue: str,
    rows: Sequence[Sequence[Any]],
    extras: Callable[[Sequence[Any]], RawFields],
    read: Callable[[Sequence[Any]], Ohlcv] = ohlcv,
) -> list[Candle]:
    """Each row's candle with what it says beyond OHLCV (`extras`), rows without an open
    time skipped. A page whose extras do not read costs the extras (left None, i.e.
    unknown), never its candles."""
    rows = [r for r in rows if r and r[0] is not None]
    values = [read(r) for r in rows]
    try:
        fields = [extras(r) for r in rows]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        log.warning("%s: raw candle fields unreadable (%s); left unknown", venue, exc)
        return [Candle(*v) for v in values]
    return [Candle(*v, *f) for v, f in zip(values, fields, strict=True)]


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def iso_ms(stamp: str) -> int:
    """An exchange's ISO 8601 time in UTC (`2019-08-14T20:42:27.265Z`, microseconds
    too) in whole milliseconds, without float rounding."""
    return (datetime.fromisoformat(stamp) - _EPOCH) // timedelta(milliseconds=1)


def book_levels(rows: Iterable[Sequence[Any]]) -> tuple[tuple[float, float], ...]:
    """`[price, amount, ...]` rows of strings or numbers as (price, amount) floats."""
    return tuple((number(row[0]), number(row[1])) for row in rows)


@dataclass(frozen=True, slots=True)
class BookContext:
    """What a `BookGuard` may ask of the exchange: the ccxt market of an exchange id or
    symbol, and the depth a symbol's book is watched with (None: not known)."""

    market: Callable[[str], Mapping[str, Any]]
    depth: Callable[[str], int | None]


@dataclass(frozen=True, slots=True)
class BookVerdict:
    """A guard's reading of one raw book message of `symbol` (unified).

    `problem`: the gap or bad checksum it reveals (None: the book may take it);
    `sequence`: the exchange id the book is at after it (the book's `nonce`; None: the
    exchange sends none); `stale`: an update of a book that awaits its new snapshot,
    to be dropped.
    """

    symbol: str
    problem: BookIntegrity | None = None
    reason: str = ""
    sequence: int | None = None
    stale: bool = False


class BookGuard(Protocol):
    """Checks one connection's raw book messages (all markets) before the book takes
    them: the exchange's sequence ids and checksum (pure: no I/O, no ccxt)."""

    def check(self, message: Mapping[str, Any]) -> BookVerdict | None:
        """The verdict on `message`; None when it is not a book message."""
        ...


@dataclass(frozen=True, slots=True)
class BookTopic:
    """One market's book channel: the unified `symbol`, the exchange's `market_id`, and
    the `depth` subscribed (one the exchange serves: `Venue.book_depth`)."""

    symbol: str
    market_id: str
    depth: int


@dataclass(frozen=True, slots=True)
class BookMessage:
    """One raw book message as plain data (a venue's `BookWire.parse`).

    `market`: the market as the message names it (an exchange id, or Kraken's unified
    symbol: `BookContext.market` reads both); `snapshot`: it replaces the book; levels
    as (price, amount), amount 0 removing the level; `timestamp_ms`: the exchange's
    time of the message (0: it sends none, e.g. Kraken's and Coinbase's snapshots).
    """

    market: str
    snapshot: bool
    bids: tuple[tuple[float, float], ...]
    asks: tuple[tuple[float, float], ...]
    timestamp_ms: int = 0


@dataclass(frozen=True, slots=True)
class BookWire:
    """A venue's public order-book channel over its websocket, written and read by the
    venue (ADR 0019); the connection itself is `ingestor.websocket`'s, shared by all.

    `url`: the public stream's URL from ccxt's `urls['api']` (after the configured
    base URL's rewrite; a `{hostname}` left in it is ccxt's to fill);
    `request`: ("subscribe" or "unsubscribe", a `BookTopic`) -> the request that opens or
    ends the channel (the exchange sends a snapshot only on subscribing, so a rebuilt
    book subscribes again);
    `parse`: a decoded message -> `BookMessage`, None when it is no book message (acks,
    pongs, status); `refusal`: the exchange's reason when a message refuses a request,
    else None; `guard`: a new `BookGuard` per connection (None: the exchange sends
    neither ids nor checksums); `ping`: the keep-alive request the exchange expects
    every `ping_interval_s` (None: websocket protocol pings); `truncate`: the exchange
    does not remove a level pushed out of the subscribed depth, so the book is cut to it.
    """

    url: Callable[[Mapping[str, Any]], str]
    request: Callable[[str, BookTopic], Mapping[str, Any]]
    parse: Callable[[Mapping[str, Any]], BookMessage | None]
    refusal: Callable[[Mapping[str, Any]], str | None]
    guard: Callable[[BookContext], BookGuard] | None = None
    ping: str | None = None
    ping_interval_s: float = 20.0
    truncate: bool = False


class Paging(enum.Enum):
    """Which candles an exchange returns when a window holds more than `limit`.

    OLDEST_FROM_SINCE: the first `limit` candles opening at or after `since`
    (Binance, Kraken). A page may span the whole rest of the range and skip
    empty stretches in one call; the next page starts after its last candle.

    NEWEST_IN_WINDOW: the last `limit` candles of [since, until] (OKX, Bybit,
    Coinbase). Asking for the whole range would lose its oldest candles, so each
    call asks for a window of at most `limit` periods, which comes back whole.
    """

    OLDEST_FROM_SINCE = "oldest_from_since"
    NEWEST_IN_WINDOW = "newest_in_window"


class TradePaging(enum.Enum):
    """How the exchange's REST trade history is paged: the gap repairer's cursor.

    BY_ID: the trades from a trade id on, oldest first (Binance `fromId`): a gap
    of consecutive ids is paged exactly. BY_ID_BACKWARD: the trades older than a
    trade id, a page at a time (OKX `history-trades` `after`, Coinbase `after`): the
    gap is paged from its end down to its start. BY_TIME: the trades from a time on,
    oldest first (ccxt's `since`). LATEST_ONLY: only the newest trades (Bybit
    spot's last 60 over REST): a gap older than those is unrepairable.
    """

    BY_ID = "by_id"
    BY_ID_BACKWARD = "by_id_backward"
    BY_TIME = "by_time"
    LATEST_ONLY = "latest_only"


class HistoryUnavailableError(ValueError):
    """The exchange does not serve candles that old (e.g. Kraken's last 720 entries)."""

    def __init__(self, exchange_id: str, start_ms: int, earliest_ms: int) -> None:
        super().__init__(
            f"{exchange_id or 'the exchange'} serves candles of this period only from"
            f" {_iso(earliest_ms)} ({earliest_ms} ms) on, its latest entries;"
            f" the request starts at {_iso(start_ms)} ({start_ms} ms)"
        )
        self.earliest_ms = earliest_ms


class TickersUnsupportedError(ValueError):
    """The exchange has no call giving every market's 24 h volume, so `top` cannot rank
    its markets (Coinbase Exchange: ccxt's `fetchTickers` reads `/products/spark-lines`,
    prices without volumes)."""

    def __init__(self, exchange_id: str, reason: str) -> None:
        super().__init__(
            f"{exchange_id} cannot rank markets by 24 h quote volume ({reason});"
            " record it with a `markets` list instead of `top`"
        )
        self.exchange_id = exchange_id


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class Venue:
    """One exchange's candle paging facts.

    `page_cap`: the most candles one call returns (None: whatever ccxt says).
    `history_entries`: the exchange serves only its latest N candles of a
    period (counting the one still open); older ranges are refused with the
    earliest time it can serve, never returned as gaps.
    `candle_request`, `parse_candles`: the venue's candle endpoint, written and read
    by the venue itself (`CandleQuery` -> `RestRequest`; the decoded body and the market
    id -> `Candle`s with every field the exchange reports: trade count, quote and taker
    volumes, the final flag); `trade_request`, `parse_trades`: its trade history
    (`TradeQuery`; trades with the taker's side). None (`GENERIC`): ccxt's unified calls.
    `books`: the exchange's public book channel, over the ingestor's own websocket
    (`BookWire`: subscribe, parse, sequence and checksum checks); None: ccxt.pro's
    `watch_order_book` (Binance: ccxt checks its update ids itself).
    `book_depths`: the depths the exchange's book channel serves: the smallest one
    holding the configured depth is watched.
    `trade_paging`, `trade_page_cap`: how the trade history the gap repairer reads is
    paged (`TradePaging`; the venue's `trade_request` writes the cursor's parameters).
    `ticker_params`: ccxt `params` of `fetch_tickers` so that it lists the spot markets
    (Bybit's default category is linear). `tickers_unsupported`: why the exchange has
    no bulk 24 h volumes (`quote_volumes` raises `TickersUnsupportedError`); "": it has.
    `prefix`: the platform prefix (tickers `PREFIX:BASE/QUOTE`) when the
    configuration names none. `status_url`: a cheap public endpoint that
    answers when the real exchange is reachable (the platform's probe).
    """

    exchange_id: str
    paging: Paging
    page_cap: int | None
    prefix: str = ""
    status_url: str = ""
    history_entries: int | None = None
    candle_request: Callable[[CandleQuery], RestRequest] | None = None
    parse_candles: Callable[[Any, str], list[Candle]] | None = None
    trade_request: Callable[[TradeQuery], RestRequest] | None = None
    parse_trades: Callable[[Any, str], list[Trade]] | None = None
    books: BookWire | None = None
    book_depths: tuple[int, ...] = ()
    trade_paging: TradePaging = TradePaging.BY_TIME
    trade_page_cap: int = 1000  # the most trades one trade-history call returns
    trade_history_key: bool = False  # ccxt sends the trade-history call only with an API key
    ticker_params: Mapping[str, Any] = field(default_factory=dict)
    tickers_unsupported: str = ""

    def platform_prefix(self, exchange_id: str) -> str:
        """`prefix`, or the ccxt id in upper case for an exchange without a module."""
        return self.prefix or re.sub(r"[^A-Z0-9_]", "_", exchange_id.upper())

    def book_depth(self, depth: int) -> int:
        """The depth to watch for a book kept to `depth` levels: the smallest the
        exchange serves that holds it (its largest if none does)."""
        if not self.book_depths:
            return depth
        return min((d for d in self.book_depths if d >= depth), default=max(self.book_depths))

    @property
    def bounded(self) -> bool:
        """Each call must ask for a window of at most `limit` periods."""
        return self.paging is Paging.NEWEST_IN_WINDOW

    def earliest_open_ms(self, now_ms: int, period_ms: int) -> int | None:
        """The oldest open time a request planned at `now_ms` can rely on, if windowed.

        The window holds `history_entries` candles ending with the open one; its
        oldest is left out because the window slides past it at the next period
        boundary, possibly before the first page is fetched: refusing one candle
        too many is a clear error, losing it would be a silent gap.
        """
        if self.history_entries is None:
            return None
        current_open = now_ms - now_ms % period_ms
        return current_open - (self.history_entries - 2) * period_ms

    def check_history(self, start_ms: int, now_ms: int, period_ms: int) -> None:
        """HistoryUnavailableError when [start, ...) begins before the exchange's window."""
        earliest = self.earliest_open_ms(now_ms, period_ms)
        if earliest is not None and start_ms < earliest:
            raise HistoryUnavailableError(self.exchange_id, start_ms, earliest)
