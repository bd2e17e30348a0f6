"""ccxt adapter: the only module that imports ccxt.

Creates one ccxt.pro exchange per configured exchange, points its URLs at the
configured base URL, and turns what comes back into `ingestor.model` values and
`ExchangeCallError`s.

REST goes one explicit path (`ExchangeAdapter._call`): the venue writes its
request (`ingestor.venues`), ccxt's `sign` turns it into a URL with auth, ccxt's
rate limiter spaces it, the ingestor's transport (`ingestor.rest`) sends it, and
ccxt's `handle_errors` and HTTP status table raise its typed errors, which are
classified here with the answer's status, headers and body in hand. The venue
parses the exchange's raw rows itself. Markets, tickers and server time stay on
ccxt's unified calls and its own `fetch`; websockets (trades, books) on ccxt.pro.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import aiohttp
import ccxt.async_support as ccxt_async
import ccxt.pro as ccxt_pro
from ccxt.base import errors as ccxt_errors
from ccxt.base.types import Entry

from ingestor.config import Credentials, ExchangeSettings
from ingestor.model import (
    BookIntegrity,
    BookIntegrityError,
    BookView,
    Candle,
    ExchangeCallError,
    FaultKind,
    MarketInfo,
    Trade,
)
from ingestor.rest import HttpAnswer, HttpTransport, Transport, TransportSession
from ingestor.retry import retry_after_from
from ingestor.urls import rewrite_api_urls
from ingestor.venues import Venue, venue_for
from ingestor.venues.base import (
    BookChecksum,
    BookContext,
    BookGuard,
    CandleQuery,
    RestRequest,
    TickersUnsupportedError,
    TradeQuery,
    number,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

# ccxt precisionMode values (ccxt.base.decimal_to_precision).
_DECIMAL_PLACES = 2
_SIGNIFICANT_DIGITS = 3

#: What a ccxt call may raise: its typed errors, and what its parsers raise on a body
#: they do not expect (e.g. coinbaseexchange's `handle_errors` on a 400 without `message`).
_CCXT_FAILURES = (ccxt_errors.BaseError, LookupError, TypeError, ValueError, AttributeError)


class _BookRejected(ccxt_errors.InvalidNonce):  # type: ignore[misc]  # ccxt is untyped
    """A book watch rejected by a venue's `BookGuard` (a gap or a bad checksum)."""

    def __init__(self, kind: BookIntegrity, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind


def _book_class(cls: type[Any], venue: Venue) -> type[Any]:
    """The ccxt.pro class itself, or, for a venue whose books need it, a subclass whose
    book handling goes through the venue's checks. Books only: REST never goes through it.

    With the venue's `book_checksum` (OKX), every raw book message is checked against
    the exchange's checksum, which ccxt 4.5.90 ignores (`_checking_books`); with its
    `book_guard` (Bybit, Kraken), before ccxt applies it (`_guarding_books`). With
    `public_books` (Coinbase), a book subscription goes out unsigned when no
    credentials are configured.
    """

    def authenticate(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not self.apiKey:
            return {}
        parent: Any = super(subclass, self)
        return parent.authenticate(*args, **kwargs)

    methods: dict[str, Any] = {}
    if venue.book_checksum is not None:
        methods["handle_order_book_message"] = _checking_books(
            lambda: subclass, venue.book_checksum
        )
    if venue.book_guard is not None:
        methods["handle_order_book"] = _guarding_books(lambda: subclass, venue.book_guard)
    if venue.public_books:
        methods["authenticate"] = authenticate
    if not methods:
        return cls
    subclass: type[Any] = type(cls.__name__, (cls,), methods)
    return subclass


def _market_of(exchange: Any) -> Callable[[str], Any]:
    """A ccxt market by unified symbol or by spot market id (the platform's markets)."""

    def market(key: str) -> Any:
        markets = exchange.markets or {}
        return markets[key] if key in markets else exchange.safe_market(key, None, None, "spot")

    return market


def _guarding_books(
    owner: Callable[[], type[Any]], new_guard: Callable[[BookContext], BookGuard]
) -> Callable[..., Any]:
    """ccxt.pro's book handler behind the venue's guard (one per exchange object).

    A message the guard accepts goes to ccxt, and the book gets the guard's sequence
    as its `nonce`; an update of a book awaiting its snapshot is dropped. On a gap or
    a bad checksum ccxt's book and subscription are dropped, the watch rejected
    (`_BookRejected`), and the channel unsubscribed (`_book_resyncs`, which the next
    watch awaits before it subscribes again and gets a fresh snapshot).
    """

    def handle_order_book(self: Any, client: Any, message: Any) -> Any:
        guard: BookGuard | None = self.__dict__.get("_book_guard")
        if guard is None:
            depths: dict[str, int] = self.__dict__.setdefault("_book_depths", {})
            guard = self._book_guard = new_guard(BookContext(_market_of(self), depths.get))
        parent: Any = super(owner(), self)
        verdict = guard.check(message)
        if verdict is None:
            return parent.handle_order_book(client, message)
        if verdict.stale:
            return None
        symbol = verdict.symbol
        if verdict.problem is None:
            result = parent.handle_order_book(client, message)
            book = self.orderbooks.get(symbol)
            if verdict.sequence is not None and book is not None:
                book["nonce"] = verdict.sequence
            return result
        message_hash = guard.message_hash(symbol)
        self.orderbooks.pop(symbol, None)
        client.subscriptions.pop(message_hash, None)
        depth = self.__dict__.get("_book_depths", {}).get(symbol)
        resyncs: dict[str, Any] = self.__dict__.setdefault("_book_resyncs", {})
        resyncs[symbol] = asyncio.ensure_future(client.send(guard.unsubscribe(symbol, depth)))
        client.reject(_BookRejected(verdict.problem, f"{self.id} {verdict.reason}"), message_hash)
        return None

    return handle_order_book


def _checking_books(
    owner: Callable[[], type[Any]], new_checker: Callable[[], BookChecksum]
) -> Callable[..., Any]:
    """ccxt.pro okx's per-message book handler, then the checksum of the raw message.

    A mismatch is handled as ccxt handles a `prevSeqId` gap: the book and the
    subscription are dropped, the watch rejected with ChecksumError, and the
    channel marked for a resync, so the next `watch_order_book` unsubscribes and
    subscribes again, and the exchange sends a fresh snapshot.
    """

    def handle_order_book_message(
        self: Any, client: Any, message: Any, orderbook: Any, message_hash: str, market: Any = None
    ) -> Any:
        snapshot = orderbook.get("nonce") is None  # a book ccxt just created for a snapshot
        parent: Any = super(owner(), self)
        result = parent.handle_order_book_message(client, message, orderbook, message_hash, market)
        symbol = orderbook.get("symbol")
        checkers: dict[str, BookChecksum] = self.__dict__.setdefault("_book_checksums", {})
        if message_hash not in client.subscriptions or symbol is None:  # ccxt saw a gap
            checkers.pop(str(symbol), None)
            return result
        checker = checkers.get(symbol) if not snapshot else None
        if checker is None:
            checker = checkers[symbol] = new_checker()
        if checker.apply(message, snapshot):
            return result
        checkers.pop(symbol, None)
        del client.subscriptions[message_hash]
        self.orderbooks.pop(symbol, None)
        client.reject(
            ccxt_errors.ChecksumError(f"{self.id} {self.orderbook_checksum_message(symbol)}"),
            message_hash,
        )
        if snapshot:  # ccxt marks an update's channel for a resync itself, not a snapshot's
            client.subscriptions[message_hash] = "resync"
        return result

    return handle_order_book_message


def fault_from(
    exc: BaseException,
    now_ms: int | None = None,
    *,
    headers: Mapping[str, str] | None = None,
    body: str = "",
    status: int | None = None,
) -> ExchangeCallError:
    """Classify a ccxt (or transport) exception for the retry policy.

    `headers`, `body`, `status`: the HTTP answer that raised it, where there was one:
    the wait it asks for (Retry-After, Binance's ban time) is honoured.
    """
    now = int(time.time() * 1000) if now_ms is None else now_ms
    reason = str(exc) or type(exc).__name__
    headers = headers or {}
    if isinstance(exc, ccxt_errors.DDoSProtection | ccxt_errors.RateLimitExceeded):
        return ExchangeCallError(
            FaultKind.RATE_LIMITED, reason, retry_after_from(headers, body or reason, now)
        )
    if isinstance(exc, ccxt_errors.ExchangeNotAvailable):
        return ExchangeCallError(
            FaultKind.UNAVAILABLE, reason, retry_after_from(headers, body, now)
        )
    if isinstance(exc, ccxt_errors.RequestTimeout | TimeoutError):
        return ExchangeCallError(FaultKind.TIMEOUT, reason)
    if isinstance(exc, ccxt_errors.NetworkError | ccxt_errors.BadResponse | ConnectionError):
        return ExchangeCallError(FaultKind.NETWORK, reason)
    if isinstance(exc, ccxt_errors.BadSymbol):
        return ExchangeCallError(FaultKind.BAD_SYMBOL, reason)
    if isinstance(exc, ccxt_errors.BadRequest | ccxt_errors.ArgumentsRequired):
        return ExchangeCallError(FaultKind.BAD_REQUEST, reason)
    if isinstance(exc, ccxt_errors.NotSupported):
        return ExchangeCallError(FaultKind.NOT_SUPPORTED, reason)
    if isinstance(exc, ccxt_errors.OperationFailed):
        return ExchangeCallError(FaultKind.NETWORK, reason)
    if isinstance(exc, ccxt_errors.ExchangeClosedByUser):
        return ExchangeCallError(FaultKind.NETWORK, reason)
    if isinstance(exc, ccxt_errors.UnsubscribeError):  # another watcher unsubscribed: resubscribe
        return ExchangeCallError(FaultKind.NETWORK, f"unsubscribed: {reason}")
    if status == 400 and type(exc) is ccxt_errors.ExchangeError:
        # ccxt knew no better name for the exchange's message: a refused request
        # (Coinbase's "... exceeds 300" window).
        return ExchangeCallError(FaultKind.BAD_REQUEST, reason)
    if isinstance(exc, ccxt_errors.BaseError):
        return ExchangeCallError(FaultKind.EXCHANGE_ERROR, reason)
    return ExchangeCallError(FaultKind.EXCHANGE_ERROR, f"{type(exc).__name__}: {reason}")


_float = number


def _trades(trades: Sequence[Mapping[str, Any]]) -> list[Trade]:
    """ccxt's unified trades as ours (the websocket's, and a GENERIC venue's REST history)."""
    return [
        Trade(
            trade_id=str(t.get("id") or ""),
            price=_float(t.get("price")),
            amount=_float(t.get("amount")),
            timestamp_ms=int(t.get("timestamp") or 0),
            side=str(t.get("side") or ""),
        )
        for t in trades
    ]


def _candle(row: list[Any]) -> Candle:
    """A row of ccxt's unified OHLCV (a GENERIC venue's candles)."""
    values = [_float(row[i]) if i < len(row) else 0.0 for i in range(1, 6)]
    return Candle(int(row[0]), values[0], values[1], values[2], values[3], values[4])


def candle_page(candles: Sequence[Candle], since_ms: int, limit: int) -> list[Candle]:
    """A page as the paging reads it: oldest first, none opening before `since`, the
    first `limit` (what ccxt's `fetch_ohlcv` made of an answer, kept)."""
    kept = sorted((c for c in candles if c.open_time_ms >= since_ms), key=_open_time)
    return kept[:limit]


def trade_page(trades: Sequence[Trade], since_ms: int | None, limit: int) -> list[Trade]:
    """A page of trades oldest first (ties by id): from `since` on, the first `limit`;
    without `since`, the last `limit` (what ccxt's `fetch_trades` made of an answer)."""
    ordered = sorted(trades, key=_time_and_id)
    if since_ms is None:
        return ordered[-limit:] if limit > 0 else ordered
    return [t for t in ordered if t.timestamp_ms >= since_ms][:limit]


def _open_time(candle: Candle) -> int:
    return candle.open_time_ms


def _time_and_id(trade: Trade) -> tuple[int, str]:
    return trade.timestamp_ms, trade.trade_id


@functools.cache
def _endpoint_config(cls: Any, api: str, method: str, path: str) -> Mapping[str, Any]:
    """ccxt's declaration of an endpoint (its rate-limit `cost`, Binance's `byLimit`);
    {} where ccxt declares none (its cost is then 1)."""
    for klass in cls.__mro__:
        for entry in vars(klass).values():
            if (
                isinstance(entry, Entry)
                and (entry.path, entry.api, entry.method) == (path, [api], method)
                and isinstance(entry.config, dict)
            ):
                return dict(entry.config)
    return {}


def _tick_size(value: Any, mode: Any) -> float:
    """ccxt precision as a step size, whatever the exchange's precisionMode."""
    number = _float(value)
    if mode in (_DECIMAL_PLACES, _SIGNIFICANT_DIGITS) and value is not None:
        return float(10.0 ** (-number))
    return number


def paging_mode(venue: Venue, configured: bool | None) -> bool:
    """Whether pages are bounded windows: the venue's need unless configured.

    Refuses unbounded pages for a venue that returns a window's newest candles:
    such a request would silently lose the oldest candles of every long range.
    """
    if configured is None:
        return venue.bounded
    if not configured and venue.bounded:
        raise ValueError(
            f"bounded_pages: false cannot serve {venue.exchange_id}: it returns the newest"
            " candles of a window, so unbounded pages would lose the oldest ones"
        )
    return configured


class ExchangeAdapter:
    """One exchange, REST and websocket, as the rest of the ingestor sees it."""

    def __init__(
        self,
        exchange_id: str,
        settings: ExchangeSettings,
        credentials: Credentials | None = None,
        *,
        transport: Transport | None = None,
    ) -> None:
        self.exchange_id = exchange_id
        self.venue: Venue = venue_for(exchange_id)
        self.prefix = settings.prefix or self.venue.platform_prefix(exchange_id)
        self.settings = settings
        self.rest_calls = 0  # candle pages requested (tests, benchmarks)
        base = getattr(ccxt_pro, exchange_id, None) or getattr(ccxt_async, exchange_id, None)
        if base is None:
            raise ValueError(f"ccxt has no exchange {exchange_id!r}")
        config: dict[str, Any] = {
            "enableRateLimit": settings.enable_rate_limit,
            "timeout": settings.timeout_ms,
            "options": {"tradesLimit": settings.trades_cache, **settings.ccxt_options},
        }
        if settings.rate_limit_ms is not None:
            config["rateLimit"] = settings.rate_limit_ms
        if credentials is not None:
            config.update(credentials.ccxt_config())
        self._exchange: Any = _book_class(base, self.venue)(config)
        if settings.api_base_url:
            # A new dict: class-level defaults shared with other instances stay untouched.
            urls = dict(self._exchange.urls)
            urls["api"] = rewrite_api_urls(urls["api"], settings.api_base_url, settings.ws_base_url)
            self._exchange.urls = urls
        exchange = self._exchange
        self._http: HttpTransport | None = None
        if transport is None:
            # ccxt's own settings for the network: timeout, CA file, HTTP(S) proxy.
            proxy = exchange.httpsProxy or exchange.httpProxy or exchange.aiohttp_proxy
            self._http = HttpTransport(
                settings.timeout_ms,
                cafile=exchange.cafile if exchange.verify else None,
                verify=bool(exchange.verify),
                proxy=proxy,
                trust_env=bool(exchange.aiohttp_trust_env),
            )
        self._transport: Transport = transport or self._http  # type: ignore[assignment]
        # An injected transport answers ccxt's own fetch too (markets, tickers, time),
        # as its `session`, set on the first such call (so none is left open otherwise).
        self._session = None if transport is None else TransportSession(transport)
        self.supports_websocket = bool(self._exchange.has.get("watchTrades"))
        self.supports_books = bool(self._exchange.has.get("watchOrderBook"))
        self.consecutive_trade_ids = settings.consecutive_trade_ids
        self.bounded_pages = paging_mode(self.venue, settings.bounded_pages)
        features = (self._exchange.features or {}).get("spot") or {}
        exchange_limit = (features.get("fetchOHLCV") or {}).get("limit")
        caps = (settings.page_limit, self.venue.page_cap, exchange_limit)
        self.page_limit = min(int(c) for c in caps if c)

    async def load_markets(self, reload: bool = False) -> None:
        await self._unified(self._exchange.load_markets(reload))

    def preload_markets(self, markets: Sequence[Mapping[str, Any]]) -> None:
        """Use these ccxt market dicts instead of loading them (replayed payloads)."""
        self._exchange.set_markets([dict(m) for m in markets])

    async def probe(self) -> None:
        """One cheap call to see whether the exchange answers: its server time
        (Binance weight 1), else a market reload where it has no time endpoint."""
        if self._exchange.has.get("fetchTime"):
            await self._unified(self._exchange.fetch_time())
        else:
            await self._unified(self._exchange.load_markets(True))

    async def quote_volumes(self) -> dict[str, float]:
        """24 h volume in the quote currency by symbol, from the exchange's tickers
        (base volume x last price where the venue gives no quote volume). Raises
        `TickersUnsupportedError` where the venue has no such call (Coinbase)."""
        if self.venue.tickers_unsupported:
            raise TickersUnsupportedError(self.exchange_id, self.venue.tickers_unsupported)
        params = dict(self.venue.ticker_params)
        tickers = await self._unified(self._exchange.fetch_tickers(None, params))
        volumes = {}
        for symbol, t in tickers.items():
            quote = _float(t.get("quoteVolume"))
            if quote is None:
                base, last = _float(t.get("baseVolume")), _float(t.get("last"))
                quote = base * last if base is not None and last is not None else None
            if quote is not None:
                volumes[str(symbol)] = quote
        return volumes

    def timeframes(self) -> list[str]:
        return list((self._exchange.timeframes or {}).keys())

    def markets(self) -> list[MarketInfo]:
        """Spot markets as MarketInfo (after load_markets)."""
        mode = self._exchange.precisionMode
        result = []
        for m in (self._exchange.markets or {}).values():
            if not m.get("spot", True):
                continue
            precision = m.get("precision") or {}
            limits = m.get("limits") or {}
            amount = limits.get("amount") or {}
            price = limits.get("price") or {}
            cost = limits.get("cost") or {}
            active = m.get("active")
            result.append(
                MarketInfo(
                    symbol=m["symbol"],
                    exchange_symbol=str(m.get("id") or ""),
                    base=str(m.get("base") or ""),
                    quote=str(m.get("quote") or ""),
                    active=True if active is None else bool(active),
                    price_precision=_tick_size(precision.get("price"), mode),
                    amount_precision=_tick_size(precision.get("amount"), mode),
                    min_amount=_float(amount.get("min")),
                    max_amount=_float(amount.get("max")),
                    min_price=_float(price.get("min")),
                    max_price=_float(price.get("max")),
                    min_cost=_float(cost.get("min")),
                )
            )
        return result

    async def _unified(self, call: Awaitable[T]) -> T:
        """A ccxt unified call (markets, tickers, server time: no raw fields needed),
        through ccxt's own `fetch`. Its failure is classified with the answer ccxt kept
        (`last_response_headers`, `last_http_response`): these calls are rare and not
        run side by side, so that answer is this call's."""
        exchange = self._exchange
        if self._session is not None and exchange.session is None:
            exchange.session = self._session
        exchange.last_response_headers = None
        exchange.last_http_response = None
        try:
            return await call
        except _CCXT_FAILURES as exc:
            headers = exchange.last_response_headers or {}
            body = exchange.last_http_response or ""
            raise fault_from(exc, headers=headers, body=str(body)) from exc

    async def _market_id(self, symbol: str) -> str:
        """The exchange's id of a market (unified symbol or id); markets loaded first
        if they never were."""
        if self._exchange.markets is None:
            await self.load_markets()
        try:
            return str(self._exchange.market(symbol)["id"])
        except _CCXT_FAILURES as exc:
            raise fault_from(exc) from exc

    async def _call(self, request: RestRequest) -> Any:
        """One venue request, the one REST path: ccxt's `sign` writes it (URL, auth),
        ccxt's rate limiter spaces it, the transport answers, ccxt's `handle_errors` and
        HTTP status table judge the answer. The decoded JSON body, or ExchangeCallError
        classified with the answer's status, headers and body."""
        exchange = self._exchange
        params = dict(request.params)
        try:
            if exchange.enableRateLimit:  # first: a signature's timestamp must not wait
                where = (request.api, request.method, request.path)
                config = _endpoint_config(exchange.__class__, *where)
                cost = exchange.calculate_rate_limiter_cost(
                    [request.api], request.method, request.path, params, config
                )
                await exchange.throttle(cost)
            signed = exchange.sign(request.path, [request.api], request.method, dict(params))
            url, method, body = signed["url"], signed["method"], signed.get("body")
            headers = exchange.prepare_request_headers(signed.get("headers"))
            answer = await self._send(url, method, headers, body)
        except _CCXT_FAILURES as exc:
            raise fault_from(exc) from exc
        text = exchange.on_rest_response(
            answer.status, answer.reason, url, method, answer.headers, answer.body, headers, body
        )
        decoded = exchange.parse_json(text)
        answered = {"headers": answer.headers, "body": text, "status": answer.status}
        try:
            exchange.handle_errors(
                answer.status,
                answer.reason,
                url,
                method,
                dict(answer.headers),
                text,
                decoded,
                headers,
                body,
            )
        except ccxt_errors.BaseError as exc:
            raise fault_from(exc, **answered) from exc
        except (LookupError, TypeError, ValueError, AttributeError) as exc:
            # ccxt's reader of error bodies choked on this one (Kraken's on an empty
            # body): the HTTP status is judged next, as for a body it found no error in.
            log.debug("%s: error body unreadable to ccxt (%r)", self.exchange_id, exc)
        try:
            exchange.handle_http_status_code(answer.status, answer.reason, url, method, text)
        except ccxt_errors.BaseError as exc:
            raise fault_from(exc, **answered) from exc
        if decoded is None:
            problem = ccxt_errors.BadResponse(f"{self.exchange_id} {method} {url}: {text[:200]!r}")
            raise fault_from(problem)
        return decoded

    async def _send(
        self, url: str, method: str, headers: Mapping[str, str], body: str | None
    ) -> HttpAnswer:
        """The transport's answer; its failures as ccxt's own `fetch` names aiohttp's."""
        details = f"{self.exchange_id} {method} {url}"
        try:
            return await self._transport(url, method, headers, body)
        except TimeoutError as exc:
            raise ccxt_errors.RequestTimeout(details) from exc
        except (aiohttp.ClientConnectionError, socket.gaierror) as exc:
            raise ccxt_errors.ExchangeNotAvailable(details) from exc
        except aiohttp.ClientError as exc:
            raise ccxt_errors.ExchangeError(details) from exc

    def _parsed(self, parse: Callable[[Any, str], list[T]], body: Any, market_id: str) -> list[T]:
        """The venue's reading of a body; a body not in the venue's shape is a bad answer."""
        try:
            return parse(body, market_id)
        except (LookupError, TypeError, ValueError, AttributeError) as exc:
            problem = ccxt_errors.BadResponse(f"{self.exchange_id} unreadable answer: {exc!r}")
            raise fault_from(problem) from exc

    async def fetch_candles(
        self, symbol: str, timeframe: str, since_ms: int, until_ms: int, limit: int
    ) -> list[Candle]:
        """One page of candles opening in [since, until] (the exchange may return fewer),
        oldest first: the venue's request, the venue's parser."""
        self.rest_calls += 1
        request, parse = self.venue.candle_request, self.venue.parse_candles
        if request is None or parse is None:
            return await self._unified_candles(symbol, timeframe, since_ms, until_ms, limit)
        market_id = await self._market_id(symbol)
        exchange = self._exchange
        query = CandleQuery(
            market_id=market_id,
            interval=str((exchange.timeframes or {}).get(timeframe, timeframe)),
            period_ms=int(exchange.parse_timeframe(timeframe)) * 1000,
            since_ms=since_ms,
            until_ms=until_ms,
            limit=limit,
            now_ms=int(time.time() * 1000),
        )
        body = await self._call(request(query))
        return candle_page(self._parsed(parse, body, market_id), since_ms, limit)

    async def _unified_candles(
        self, symbol: str, timeframe: str, since_ms: int, until_ms: int, limit: int
    ) -> list[Candle]:
        """A venue without a module (`GENERIC`): ccxt's `fetch_ohlcv`, OHLCV only."""
        params = {"until": until_ms}
        rows = await self._unified(
            self._exchange.fetch_ohlcv(symbol, timeframe, since_ms, limit, params)
        )
        return [_candle(r) for r in rows if r and r[0] is not None]

    async def watch_trades(self, symbol: str) -> list[Trade]:
        """Trades received since the previous call; reconnects after a drop."""
        try:
            trades = await self._exchange.watch_trades(symbol)
        except Exception as exc:
            raise fault_from(exc) from exc
        return _trades(trades)

    async def fetch_trades(
        self,
        symbol: str,
        limit: int,
        *,
        since_ms: int | None = None,
        cursor: str | None = None,
    ) -> list[Trade]:
        """One page of the trade history, oldest first: at the venue's id `cursor`
        (`TradePaging`), from `since_ms` on, or the latest (neither)."""
        request, parse = self.venue.trade_request, self.venue.parse_trades
        if request is None or parse is None:  # GENERIC: ccxt's fetch_trades, by time
            trades = await self._unified(self._exchange.fetch_trades(symbol, since_ms, limit))
            return sorted(_trades(trades), key=lambda t: t.timestamp_ms)
        market_id = await self._market_id(symbol)
        body = await self._call(request(TradeQuery(market_id, limit, since_ms, cursor)))
        return trade_page(self._parsed(parse, body, market_id), since_ms, limit)

    async def unwatch_trades(self, symbol: str) -> None:
        """Unsubscribe from the symbol's trade stream (best effort)."""
        await self._unwatch("unWatchTrades", "un_watch_trades", symbol)

    async def watch_order_book(self, symbol: str, depth: int) -> BookView:
        """The book's best `depth` levels after the next update; BookIntegrityError when
        the exchange's ids skipped or its checksum disagreed (watch again: ccxt then
        rebuilds the book from a fresh snapshot)."""
        limit = self.venue.book_depth(depth)
        self._exchange.__dict__.setdefault("_book_depths", {})[symbol] = limit
        try:
            resync = self._exchange.__dict__.get("_book_resyncs", {}).pop(symbol, None)
            if resync is not None:  # the unsubscribe goes out before the new subscribe
                with contextlib.suppress(Exception):
                    await resync
            params = dict(self.venue.book_params)
            book = await self._exchange.watch_order_book(symbol, limit, params)
            # Copied before the next await: ccxt updates this book in place.
            return BookView(
                bids={float(p): float(a) for p, a, *_ in book["bids"][:depth]},
                asks={float(p): float(a) for p, a, *_ in book["asks"][:depth]},
                nonce=int(book.get("nonce") or 0),
                timestamp_ms=int(book.get("timestamp") or 0),
            )
        except _BookRejected as exc:
            raise BookIntegrityError(exc.kind, str(exc)) from exc
        except ccxt_errors.ChecksumError as exc:  # first: it subclasses InvalidNonce
            # ccxt's binance raises ChecksumError for a skipped update id: a gap where
            # the exchange sends no checksum.
            checked = self.venue.book_checksum is not None
            kind = BookIntegrity.CHECKSUM if checked else BookIntegrity.SEQUENCE_GAP
            raise BookIntegrityError(kind, str(exc)) from exc
        except ccxt_errors.InvalidNonce as exc:
            raise BookIntegrityError(BookIntegrity.SEQUENCE_GAP, str(exc)) from exc
        except Exception as exc:
            raise fault_from(exc) from exc

    async def unwatch_order_book(self, symbol: str) -> None:
        """Unsubscribe from the symbol's book stream (best effort), at the depth watched."""
        limit = self._exchange.__dict__.get("_book_depths", {}).get(symbol)
        params = {"limit": limit} if self.venue.book_depths and limit else {}
        await self._unwatch("unWatchOrderBook", "un_watch_order_book", symbol, params)

    async def _unwatch(
        self, capability: str, method: str, symbol: str, params: dict[str, Any] | None = None
    ) -> None:
        """Call ccxt's `method` where the exchange has `capability`; failures only logged:
        the stream is going away anyway."""
        if not self._exchange.has.get(capability):
            return
        try:
            await getattr(self._exchange, method)(symbol, *([params] if params else []))
        except Exception as exc:
            log.debug("%s %s %s failed: %s", method, self.exchange_id, symbol, exc)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
        try:
            await self._exchange.close()
        except Exception as exc:
            log.debug("closing %s failed: %s", self.exchange_id, exc)
