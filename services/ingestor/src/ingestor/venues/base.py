"""The shape of a venue description (see `ingestor.venues`)."""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from ingestor.model import BookIntegrity, RawFields

#: (decoded response body, exchange market id) -> {open time ms: fields ccxt drops}
RawReader = Callable[[Any, str], dict[int, RawFields]]


class BookChecksum(Protocol):
    """Verifies an exchange's book checksum from its raw messages, one market."""

    def apply(self, message: Mapping[str, Any], snapshot: bool) -> bool:
        """Apply one raw book message; False when its checksum disagrees with the book."""
        ...


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
    `sequence`: the exchange id the book is at after it, where ccxt leaves `nonce`
    unset; `stale`: an update of a book that awaits its new snapshot, to be dropped.
    """

    symbol: str
    problem: BookIntegrity | None = None
    reason: str = ""
    sequence: int | None = None
    stale: bool = False


class BookGuard(Protocol):
    """Checks one exchange's raw book messages (all markets) BEFORE ccxt applies them,
    where ccxt checks neither sequence nor checksum (pure: no I/O, no ccxt)."""

    def check(self, message: Mapping[str, Any]) -> BookVerdict | None:
        """The verdict on `message`; None when it is not a book message."""
        ...

    def message_hash(self, symbol: str) -> str:
        """ccxt 4.5.90's hash of `symbol`'s book watch (and of its subscription)."""
        ...

    def unsubscribe(self, symbol: str, depth: int | None) -> dict[str, Any]:
        """The request that ends `symbol`'s book channel, so the next subscription
        brings a fresh snapshot (the exchange sends one only on subscribing)."""
        ...


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
    `sends_until`: ccxt maps `params["until"]` to the exchange's end parameter;
    where it does not, ccxt would pass it on raw, so it is left out.
    `until_exclusive`: the exchange's end parameter excludes its own instant
    (OKX `after`), so the inclusive bound is sent one millisecond later.
    `raw_fields`: reads what ccxt's OHLCV drops (trade count, quote and taker
    volumes, the final flag) from the raw candle response; None: nothing to add.
    `book_checksum`: a new checker of the exchange's order-book checksum, one per
    market, fed the raw messages after ccxt applied them (OKX; ccxt checks its ids).
    `book_guard`: a new `BookGuard` for the exchange, run before ccxt applies each
    raw book message (Bybit's ids, Kraken's checksum: ccxt 4.5.90 checks neither).
    `book_depths`: the depths the exchange's book channel serves (ccxt refuses
    others): the smallest one holding the configured depth is watched.
    `book_params`: ccxt `params` of `watch_order_book` (Coinbase: its public channel).
    `public_books`: the book channel needs no credentials though ccxt signs it.
    `trade_paging`, `trade_page_cap`, `trade_params`, `trade_id_param`: how the trade
    history the gap repairer reads is paged (`TradePaging`).
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
    sends_until: bool = True
    until_exclusive: bool = False
    raw_fields: RawReader | None = None
    book_checksum: Callable[[], BookChecksum] | None = None
    book_guard: Callable[[BookContext], BookGuard] | None = None
    book_depths: tuple[int, ...] = ()
    book_params: Mapping[str, Any] = field(default_factory=dict)
    public_books: bool = False
    trade_paging: TradePaging = TradePaging.BY_TIME
    trade_page_cap: int = 1000  # the most trades one trade-history call returns
    # ccxt `fetch_trades` params of id paging, the cursor given as `{trade_id_param: id}`.
    trade_params: Mapping[str, Any] = field(default_factory=dict)
    trade_id_param: str = ""
    trade_history_key: bool = False  # ccxt sends the trade-history call only with an API key
    ticker_params: Mapping[str, Any] = field(default_factory=dict)
    tickers_unsupported: str = ""

    def platform_prefix(self, exchange_id: str) -> str:
        """`prefix`, or the ccxt id in upper case for an exchange without a module."""
        return self.prefix or re.sub(r"[^A-Z0-9_]", "_", exchange_id.upper())

    def until_params(self, until_ms: int) -> dict[str, int]:
        """ccxt `params` carrying the inclusive end `until_ms` the way this exchange reads it."""
        if not self.sends_until:
            return {}
        return {"until": until_ms + 1 if self.until_exclusive else until_ms}

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
