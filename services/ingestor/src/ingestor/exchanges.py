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
ccxt's unified calls and its own `fetch`; trades on ccxt.pro's websocket. Order books
of a venue with a `BookWire` come over the ingestor's own websocket
(`ingestor.book_streams`, ADR 0019), others' (Binance) over ccxt.pro's. No ccxt class
is subclassed.
"""

from __future__ import annotations

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

from ingestor.book_streams import BookStreams, link_of
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
from ingestor.rest import HttpAnswer, HttpTransport, Network, Transport, TransportSession
from ingestor.retry import retry_after_from
from ingestor.urls import rewrite_api_urls
from ingestor.venues import Venue, venue_for
from ingestor.venues.base import (
    BookTopic,
    BookWire,
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


def _market_of(exchange: Any) -> Callable[[str], Any]:
    """A ccxt market by unified symbol or by spot market id (the platform's markets)."""

    def market(key: str) -> Any:
        markets = exchange.markets or {}
        return markets[key] if key in markets else exchange.safe_market(key, None, None, "spot")

    return market


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
        self._exchange: Any = base(config)
        if settings.api_base_url:
            # A new dict: class-level defaults shared with other instances stay untouched.
            urls = dict(self._exchange.urls)
            urls["api"] = rewrite_api_urls(urls["api"], settings.api_base_url, settings.ws_base_url)
            self._exchange.urls = urls
        exchange = self._exchange
        self._http: HttpTransport | None = None
        if transport is None:
            # ccxt's own settings for the network: timeout, CA file, HTTP(S) proxy.
            self._http = HttpTransport(settings.timeout_ms, Network.of(exchange))
        self._transport: Transport = transport or self._http  # type: ignore[assignment]
        # An injected transport answers ccxt's own fetch too (markets, tickers, time),
        # as its `session`, set on the first such call (so none is left open otherwise).
        self._session = None if transport is None else TransportSession(transport)
        self._books: BookStreams | None = None  # the venue's book channel, from the first watch
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

    async def _market(self, symbol: str) -> Mapping[str, Any]:
        """ccxt's market (unified symbol or id); markets loaded first if they never were."""
        if self._exchange.markets is None:
            await self.load_markets()
        try:
            market: Mapping[str, Any] = self._exchange.market(symbol)
        except _CCXT_FAILURES as exc:
            raise fault_from(exc) from exc
        return market

    async def _market_id(self, symbol: str) -> str:
        """The exchange's id of a market (unified symbol or id)."""
        return str((await self._market(symbol))["id"])

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
        the exchange's ids skipped or its checksum disagreed (watch again: the book is
        then rebuilt from a fresh snapshot). A venue with a `BookWire` is watched on the
        ingestor's own websocket (`ingestor.book_streams`), others through ccxt.pro."""
        wire = self.venue.books
        if wire is None:
            return await self._ccxt_order_book(symbol, depth)
        market = await self._market(symbol)
        topic = BookTopic(str(market["symbol"]), str(market["id"]), self.venue.book_depth(depth))
        return await self._book_streams(wire).watch(topic, depth)

    def _book_streams(self, wire: BookWire) -> BookStreams:
        if self._books is None:
            url = self._exchange.implode_hostname(wire.url(self._exchange.urls["api"]))
            link = link_of(wire, self.settings.timeout_ms / 1000)
            self._books = BookStreams(
                wire, url, _market_of(self._exchange), self.exchange_id, link,
                Network.of(self._exchange),
            )  # fmt: skip
        return self._books

    async def _ccxt_order_book(self, symbol: str, depth: int) -> BookView:
        """ccxt.pro's book (Binance: ccxt checks its update ids and refetches the REST
        snapshot after a gap)."""
        try:
            book = await self._exchange.watch_order_book(symbol, self.venue.book_depth(depth))
            # Copied before the next await: ccxt updates this book in place.
            return BookView(
                bids={float(p): float(a) for p, a, *_ in book["bids"][:depth]},
                asks={float(p): float(a) for p, a, *_ in book["asks"][:depth]},
                nonce=int(book.get("nonce") or 0),
                timestamp_ms=int(book.get("timestamp") or 0),
            )
        except ccxt_errors.InvalidNonce as exc:
            # ccxt's binance raises ChecksumError, an InvalidNonce, for a skipped update
            # id: a gap where the exchange sends no checksum.
            raise BookIntegrityError(BookIntegrity.SEQUENCE_GAP, str(exc)) from exc
        except Exception as exc:
            raise fault_from(exc) from exc

    async def unwatch_order_book(self, symbol: str) -> None:
        """Unsubscribe from the symbol's book stream (best effort); a watch waiting on
        it fails as ccxt's does (NETWORK: "unsubscribed")."""
        if self.venue.books is None:
            await self._unwatch("unWatchOrderBook", "un_watch_order_book", symbol)
            return
        if self._books is not None:
            unified = str((await self._market(symbol))["symbol"])
            gone = ExchangeCallError(FaultKind.NETWORK, f"unsubscribed: {symbol}")
            self._books.unwatch(unified, gone)

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
        if self._books is not None:
            await self._books.close()
        try:
            await self._exchange.close()
        except Exception as exc:
            log.debug("closing %s failed: %s", self.exchange_id, exc)
