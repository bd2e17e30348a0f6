"""Binance spot front-end: REST (``/api/v3/...``) and market streams (websocket).

Why these shapes: unmodified ccxt (``binance``, ``async_support.binance``,
``pro.binance``) must parse every response, so payloads, error bodies and
status codes follow Binance's documented wire format (see README.md).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import json
import operator
import re
import struct
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from aiohttp import WSMsgType, web

from . import books, bybit, coinbase, kraken, okx
from .faults import Fault
from .model import (
    DAY_MS,
    INTERVAL_MS,
    MINUTE_MS,
    MODEL_ID_FLOOR,
    SymbolSpec,
    Trade,
    TradeColumns,
    UnknownSymbolError,
    fmt8,
    units_text,
)
from .state import SimState
from .tickers import DayTicker, day_tickers

#: Request weights (Binance documents a weight per endpoint; 6000 per minute per IP).
WEIGHTS: dict[str, int] = {
    "/api/v3/ping": 1,
    "/api/v3/time": 1,
    "/api/v3/exchangeInfo": 20,
    "/api/v3/klines": 2,
    "/api/v3/aggTrades": 4,
    "/api/v3/trades": 25,
    "/api/v3/historicalTrades": 25,
    "/api/v3/depth": 5,  # limit <= 100 (Binance: 25 up to 500, 50 up to 1000, 250 beyond)
    "/api/v3/ticker/24hr": 80,  # every symbol (Binance: 2 for one, up to 80 for many)
    "/fapi/v1/exchangeInfo": 1,
    "/dapi/v1/exchangeInfo": 1,
}
DEFAULT_WEIGHT_LIMIT = 6000
MAX_BACKLOG_MS = 10 * MINUTE_MS  # streams never replay more than this after a clock jump
_STREAM_RE = re.compile(r"^[a-z0-9]+@[A-Za-z0-9_]+(@[0-9]+ms)?$")
MAX_DEPTH_LIMIT = 5000
BINANCE_PONG_S = 60.0  # Binance closes a stream whose pong is a minute late
OUTBOX_LIMIT = 100_000  # messages a connection may have queued; beyond: discarded, counted
WRITE_BATCH = 4096  # messages written to the socket at once
HIGH_WATER = 4 << 20  # bytes buffered for a slow reader before its sender waits
#: The streams generate the next minute's trades in a worker thread from this second of
#: the minute on, so a busy universe's minute never starts with a stall on the loop.
PREFETCH_AFTER_MS = 20_000
#: Threads that generate trades ahead of the streams (prefetch, warm-up): a pool of
#: their own. Why not the loop's default pool: the REST handlers read the model there
#: (``asyncio.to_thread``), and a klines request queued behind a minute's generation
#: timed out (the ingestor waits 30 s). Generation holds the GIL: more threads than
#: two would not generate faster.
GENERATOR_THREADS = 2
#: A paced prefetch sleeps in steps this long, re-reading the simulator clock.
PACE_STEP_S = 0.05


def binance_error(
    status: int, code: int, msg: str, headers: Mapping[str, str] | None = None
) -> web.Response:
    """Binance's error body ``{"code": -1121, "msg": "Invalid symbol."}``."""
    return web.json_response({"code": code, "msg": msg}, status=status, headers=headers)


class _ParamError(Exception):
    def __init__(self, response: web.Response) -> None:
        super().__init__(response.text)
        self.response = response


def _int_param(request: web.Request, name: str) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return None
    if not raw.isdigit():
        raise _ParamError(
            binance_error(
                400,
                -1100,
                f"Illegal characters found in parameter '{name}'; "
                "legal range is '^[0-9]{1,20}$'.",
            )
        )
    return int(raw)


def _mandatory(request: web.Request, name: str) -> str:
    raw = request.query.get(name)
    if not raw:
        raise _ParamError(
            binance_error(
                400,
                -1102,
                f"Mandatory parameter '{name}' was not sent, was empty/null, or malformed.",
            )
        )
    return raw


def _limit(request: web.Request, default: int, maximum: int) -> int:
    limit = _int_param(request, "limit")
    if limit is None:
        return default
    if limit < 1:
        raise _ParamError(
            binance_error(400, -1130, "Data sent for parameter 'limit' is not valid.")
        )
    return min(limit, maximum)


class WeightMeter:
    """Request weight used in the current minute (``x-mbx-used-weight-1m``).

    Minutes follow the simulator clock, so a frozen clock makes limits exact in tests.
    """

    def __init__(self, limit: int | None, now_ms: Callable[[], int]) -> None:
        self.limit = limit
        self._now_ms = now_ms
        self._minute = -1
        self.used = 0

    def add(self, weight: int) -> int:
        minute = self._now_ms() // MINUTE_MS
        if minute != self._minute:
            self._minute, self.used = minute, 0
        self.used += weight
        return self.used

    def reset(self) -> None:
        self._minute, self.used = -1, 0

    def retry_after(self) -> int:
        """Seconds until the weight window resets."""
        return max(1, -(-(MINUTE_MS - self._now_ms() % MINUTE_MS) // 1000))

    def exceeded(self) -> bool:
        return self.limit is not None and self.used > self.limit


def _symbol_info(spec: SymbolSpec, now_ms: int) -> dict[str, Any]:
    trading = spec.trading_at(now_ms)
    tick, step = Decimal(spec.tick), Decimal(spec.step)
    return {
        "symbol": spec.binance_id,
        "status": "TRADING" if trading else "BREAK",
        "baseAsset": spec.base,
        "baseAssetPrecision": 8,
        "quoteAsset": spec.quote,
        "quotePrecision": 8,
        "quoteAssetPrecision": 8,
        "baseCommissionPrecision": 8,
        "quoteCommissionPrecision": 8,
        "orderTypes": ["LIMIT", "LIMIT_MAKER", "MARKET", "STOP_LOSS_LIMIT", "TAKE_PROFIT_LIMIT"],
        "icebergAllowed": True,
        "ocoAllowed": True,
        "otoAllowed": True,
        "quoteOrderQtyMarketAllowed": True,
        "allowTrailingStop": True,
        "cancelReplaceAllowed": True,
        "amendAllowed": True,
        "isSpotTradingAllowed": trading,
        "isMarginTradingAllowed": False,
        "filters": [
            {
                "filterType": "PRICE_FILTER",
                "minPrice": fmt8(tick),
                "maxPrice": fmt8(Decimal(1_000_000)),
                "tickSize": fmt8(tick),
            },
            {
                "filterType": "LOT_SIZE",
                "minQty": fmt8(step),
                "maxQty": fmt8(Decimal(spec.max_qty)),
                "stepSize": fmt8(step),
            },
            {"filterType": "ICEBERG_PARTS", "limit": 10},
            {
                "filterType": "MARKET_LOT_SIZE",
                "minQty": fmt8(Decimal(0)),
                "maxQty": fmt8(Decimal(spec.max_qty) / 10),
                "stepSize": fmt8(Decimal(0)),
            },
            {
                "filterType": "NOTIONAL",
                "minNotional": fmt8(Decimal(spec.min_notional)),
                "applyMinToMarket": True,
                "maxNotional": fmt8(Decimal(9_000_000)),
                "applyMaxToMarket": False,
                "avgPriceMins": 5,
            },
            {"filterType": "MAX_NUM_ORDERS", "maxNumOrders": 200},
            {"filterType": "MAX_NUM_ALGO_ORDERS", "maxNumAlgoOrders": 5},
        ],
        "permissions": [],
        "permissionSets": [["SPOT"]],
        "defaultSelfTradePreventionMode": "EXPIRE_MAKER",
        "allowedSelfTradePreventionModes": ["EXPIRE_TAKER", "EXPIRE_MAKER", "EXPIRE_BOTH"],
    }


class BinanceRest:
    """Handlers of the Binance REST endpoints the platform (and ccxt) use."""

    def __init__(self, state: SimState, *, weight_limit: int | None = DEFAULT_WEIGHT_LIMIT) -> None:
        self.state = state
        self.weights = WeightMeter(weight_limit, state.clock.now_ms)

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/api/v3/ping", self.ping),
            web.get("/api/v3/time", self.server_time),
            web.get("/api/v3/exchangeInfo", self.exchange_info),
            web.get("/api/v3/klines", self.klines),
            web.get("/api/v3/aggTrades", self.agg_trades),
            web.get("/api/v3/trades", self.recent_trades),
            web.get("/api/v3/historicalTrades", self.historical_trades),
            web.get("/api/v3/depth", self.depth),
            web.get("/api/v3/ticker/24hr", self.ticker_24hr),
            # ccxt asks for linear/inverse markets unless options.fetchMarkets.types
            # says otherwise; answer with no symbols so default ccxt still loads.
            web.get("/fapi/v1/exchangeInfo", self.empty_exchange_info),
            web.get("/dapi/v1/exchangeInfo", self.empty_exchange_info),
        ]

    def _spec(self, binance_id: str) -> SymbolSpec:
        try:
            spec = self.state.model.spec(binance_id)
        except UnknownSymbolError:
            spec = None
        if spec is None or spec.binance_id != binance_id:
            raise _ParamError(binance_error(400, -1121, "Invalid symbol."))
        return spec

    def _symbols_param(self, request: web.Request) -> list[SymbolSpec] | None:
        """The markets of ``symbol`` or ``symbols`` (a JSON list of ids); None: neither."""
        if "symbol" in request.query:
            return [self._spec(request.query["symbol"])]
        if "symbols" not in request.query:
            return None
        try:
            ids = json.loads(request.query["symbols"])
        except json.JSONDecodeError:
            raise _ParamError(
                binance_error(400, -1100, "Illegal characters found in parameter 'symbols'.")
            ) from None
        return [self._spec(str(i)) for i in ids]

    async def ping(self, request: web.Request) -> web.Response:
        return web.json_response({})

    async def server_time(self, request: web.Request) -> web.Response:
        return web.json_response({"serverTime": self.state.clock.now_ms()})

    async def empty_exchange_info(self, request: web.Request) -> web.Response:
        now = self.state.clock.now_ms()
        return web.json_response(
            {
                "timezone": "UTC",
                "serverTime": now,
                "rateLimits": [],
                "exchangeFilters": [],
                "assets": [],
                "symbols": [],
            }
        )

    async def exchange_info(self, request: web.Request) -> web.Response:
        now = self.state.clock.now_ms()
        try:
            asked = self._symbols_param(request)
        except _ParamError as exc:
            return exc.response
        specs: Iterable[SymbolSpec] = self.state.model.specs.values() if asked is None else asked
        return web.json_response(
            {
                "timezone": "UTC",
                "serverTime": now,
                "rateLimits": [
                    {
                        "rateLimitType": "REQUEST_WEIGHT",
                        "interval": "MINUTE",
                        "intervalNum": 1,
                        "limit": self.weights.limit or DEFAULT_WEIGHT_LIMIT,
                    },
                    {
                        "rateLimitType": "ORDERS",
                        "interval": "SECOND",
                        "intervalNum": 10,
                        "limit": 100,
                    },
                    {
                        "rateLimitType": "ORDERS",
                        "interval": "DAY",
                        "intervalNum": 1,
                        "limit": 200000,
                    },
                    {
                        "rateLimitType": "RAW_REQUESTS",
                        "interval": "MINUTE",
                        "intervalNum": 5,
                        "limit": 61000,
                    },
                ],
                "exchangeFilters": [],
                "symbols": [_symbol_info(s, now) for s in specs],
            }
        )

    async def klines(self, request: web.Request) -> web.Response:
        try:
            spec = self._spec(_mandatory(request, "symbol"))
            interval = _mandatory(request, "interval")
            start = _int_param(request, "startTime")
            end = _int_param(request, "endTime")
            limit = _limit(request, 500, 1000)
        except _ParamError as exc:
            return exc.response
        if interval not in INTERVAL_MS:
            return binance_error(400, -1120, "Invalid interval.")
        if start is not None and end is not None and start > end:
            return binance_error(400, -1023, "Start time is greater than end time.")
        now = self.state.clock.now_ms()
        rows = await asyncio.to_thread(
            self.state.model.select_klines,
            spec.symbol,
            interval,
            start_ms=start,
            end_ms=end,
            limit=limit,
            now_ms=now,
        )
        return web.json_response([k.binance_row() for k in rows])

    async def ticker_24hr(self, request: web.Request) -> web.Response:
        """``GET /api/v3/ticker/24hr``: every market's 24 h statistics (a list), or
        ``symbol``'s (one object) or ``symbols``' (a JSON list of ids)."""
        try:
            specs = self._symbols_param(request)
        except _ParamError as exc:
            return exc.response
        rows = [ticker_row(t) for t in await day_tickers(self.state, specs, ids=True)]
        return web.json_response(rows[0] if "symbol" in request.query else rows)

    def _trades_window(self, request: web.Request, spec: SymbolSpec, limit: int) -> list[Trade]:
        """aggTrades selection: by ``fromId``, by time window (<= 1h), or the latest."""
        now = self.state.clock.now_ms()
        from_id = _int_param(request, "fromId")
        start = _int_param(request, "startTime")
        end = _int_param(request, "endTime")
        model = self.state.model
        if start is not None and end is not None and end - start > 3_600_000:
            raise _ParamError(
                binance_error(400, -1127, "More than 1 hours between startTime and endTime.")
            )
        if from_id is not None and (start is not None or end is not None):
            raise _ParamError(
                binance_error(400, -1128, "Combination of optional parameters invalid.")
            )
        if from_id is not None:
            return list(
                itertools.islice(model.iter_trades(spec.symbol, 0, now, from_id=from_id), limit)
            )
        if start is not None or end is not None:
            lo = start if start is not None else (end or 0) - 3_600_000
            hi = min(end if end is not None else lo + 3_600_000, now)
            return list(itertools.islice(model.iter_trades(spec.symbol, lo, hi), limit))
        latest = list(itertools.islice(model.iter_trades_backward(spec.symbol, now), limit))
        latest.reverse()
        return latest

    async def agg_trades(self, request: web.Request) -> web.Response:
        try:
            spec = self._spec(_mandatory(request, "symbol"))
            limit = _limit(request, 500, 1000)
            trades = await asyncio.to_thread(self._trades_window, request, spec, limit)
        except _ParamError as exc:
            return exc.response
        return web.json_response([agg_trade_payload(t) for t in trades])

    async def recent_trades(self, request: web.Request) -> web.Response:
        """``GET /api/v3/trades``: the latest ``limit`` trades, oldest first."""
        try:
            spec = self._spec(_mandatory(request, "symbol"))
            limit = _limit(request, 500, 1000)
        except _ParamError as exc:
            return exc.response
        trades = await asyncio.to_thread(self._latest, spec.symbol, limit)
        return web.json_response([trade_row(t) for t in trades])

    async def historical_trades(self, request: web.Request) -> web.Response:
        """``GET /api/v3/historicalTrades``: ``limit`` trades from ``fromId`` on (inclusive),
        oldest first; without it the latest. The ids of the ``<symbol>@trade`` stream, so
        a gap of stream ids is paged exactly (1000 a call). Security type MARKET_DATA, as
        on Binance: an ``X-MBX-APIKEY`` header is required (any key; ccxt sends it only
        when it has one), else 401 ``-2014``."""
        if not request.headers.get("X-MBX-APIKEY"):
            return binance_error(401, -2014, "API-key format invalid.")
        try:
            spec = self._spec(_mandatory(request, "symbol"))
            limit = _limit(request, 500, 1000)
            from_id = _int_param(request, "fromId")
        except _ParamError as exc:
            return exc.response
        if from_id is None:
            trades = await asyncio.to_thread(self._latest, spec.symbol, limit)
        else:
            now, model = self.state.clock.now_ms(), self.state.model
            trades = await asyncio.to_thread(
                lambda: list(
                    itertools.islice(model.iter_trades(spec.symbol, 0, now, from_id=from_id), limit)
                )
            )
        return web.json_response([trade_row(t) for t in trades])

    def _latest(self, symbol: str, limit: int) -> list[Trade]:
        now = self.state.clock.now_ms()
        model = self.state.model
        trades = list(itertools.islice(model.iter_trades_backward(symbol, now), limit))
        trades.reverse()
        return trades

    async def depth(self, request: web.Request) -> web.Response:
        """The book at the stream's last event (its `lastUpdateId`), so a client that
        buffered the diff stream continues with the very next event, as on Binance."""
        try:
            spec = self._spec(_mandatory(request, "symbol"))
            limit = _limit(request, 100, MAX_DEPTH_LIMIT)
        except _ParamError as exc:
            return exc.response
        book = self.state.books.current(spec.symbol, self.state.clock.now_ms())
        return web.json_response(books.binance_depth_snapshot(book, limit))


def ticker_row(ticker: DayTicker) -> dict[str, Any]:
    """A ``ticker/24hr`` row (FULL). Bid, ask and the last trade's size are not
    modelled: bid = ask = the last price, sizes 0. ``prevClosePrice`` is the window's
    open. Without trades in the window: prices and volumes 0, ids -1 (as Binance)."""
    day = ticker.day
    close_ms = day.close_time if day is not None else ticker.now_ms
    first = ticker.first_id if ticker.first_id is not None else -1
    last_price = ticker.text("close")
    return {
        "symbol": ticker.spec.binance_id,
        "priceChange": fmt8(ticker.change),
        "priceChangePercent": f"{ticker.change_ratio * 100:.3f}",
        "weightedAvgPrice": fmt8(ticker.vwap),
        "prevClosePrice": ticker.text("open"),
        "lastPrice": last_price,
        "lastQty": fmt8(Decimal(0)),
        "bidPrice": last_price,
        "bidQty": fmt8(Decimal(0)),
        "askPrice": last_price,
        "askQty": fmt8(Decimal(0)),
        "openPrice": ticker.text("open"),
        "highPrice": ticker.text("high"),
        "lowPrice": ticker.text("low"),
        "volume": ticker.text("volume"),
        "quoteVolume": ticker.text("quote_volume"),
        "openTime": close_ms + 1 - DAY_MS,
        "closeTime": close_ms,
        "firstId": first,
        "lastId": first + ticker.trades - 1 if ticker.trades else -1,
        "count": ticker.trades,
    }


def trade_row(trade: Trade) -> dict[str, Any]:
    """A row of ``GET /api/v3/trades`` and ``/api/v3/historicalTrades``."""
    return {
        "id": trade.id,
        "price": fmt8(trade.price),
        "qty": fmt8(trade.qty),
        "quoteQty": fmt8(trade.price * trade.qty),
        "time": trade.time_ms,
        "isBuyerMaker": trade.buyer_is_maker,
        "isBestMatch": True,
    }


def agg_trade_payload(trade: Trade) -> dict[str, Any]:
    """REST ``aggTrades`` row (each model trade is its own aggregate)."""
    return {
        "a": trade.id,
        "p": fmt8(trade.price),
        "q": fmt8(trade.qty),
        "f": trade.id,
        "l": trade.id,
        "T": trade.time_ms,
        "m": trade.buyer_is_maker,
        "M": True,
    }


def injected_id_start(now_s: float | None = None) -> int:
    """First default id of injected trades: the wall-clock second x 10 000 (+1), below
    ``MODEL_ID_FLOOR`` until the year 2286; a restarted simulator starts past the last
    one's ids unless it injected more than 10 000 trades per second it ran."""
    second = int(time.time() if now_s is None else now_s)
    return second * 10_000 + 1


def trade_event(stream_kind: str, binance_id: str, trade: Trade, event_ms: int) -> dict[str, Any]:
    """Payload of a ``<symbol>@trade`` or ``<symbol>@aggTrade`` stream message."""
    if stream_kind == "aggTrade":
        return {"e": "aggTrade", "E": event_ms, "s": binance_id, **agg_trade_payload(trade)}
    return {
        "e": "trade",
        "E": event_ms,
        "s": binance_id,
        "t": trade.id,
        "p": fmt8(trade.price),
        "q": fmt8(trade.qty),
        "T": trade.time_ms,
        "m": trade.buyer_is_maker,
        "M": True,
    }


#: A trade as the streams print it: id, time, price and quantity with eight decimals
#: (every trade stream's numbers), buyer-is-maker. Built once per trade, whatever the
#: number of connections and dialects it goes to.
Fill = tuple[int, int, str, str, bool]


def fill_of(trade: Trade) -> Fill:
    return (trade.id, trade.time_ms, fmt8(trade.price), fmt8(trade.qty), trade.buyer_is_maker)


def fills_of_columns(columns: Sequence[TradeColumns], spec: SymbolSpec) -> list[Fill]:
    """Model trades (``MarketModel.trade_columns``) as fills, printed exactly as ``fmt8``
    prints their decimals: column by column, at C speed
    (``map`` over memoised printers), never a Python object per trade but the fill."""
    price, qty = units_text(spec.price_decimals), units_text(spec.qty_decimals)
    fills: list[Fill] = []
    for c in columns:
        fills.extend(
            zip(
                range(c.first_id, c.first_id + len(c.times)),
                map(c.minute_ms.__add__, c.times),
                map(price, c.prices),
                map(qty, c.qtys),
                map(operator.not_, c.taker_buy),  # buyer is maker: not a taker buy
                strict=True,
            )
        )
    return fills


def trade_text(kind: str, market_id: str, fill: Fill, event_ms: int) -> str:
    """``json.dumps(trade_event(...))`` without the dict: the hot path of a busy stream."""
    t, at, price, qty, maker = fill
    m = "true" if maker else "false"
    if kind == "aggTrade":
        return (
            f'{{"e":"aggTrade","E":{event_ms},"s":"{market_id}","a":{t},"p":"{price}",'
            f'"q":"{qty}","f":{t},"l":{t},"T":{at},"m":{m},"M":true}}'
        )
    return (
        f'{{"e":"trade","E":{event_ms},"s":"{market_id}","t":{t},"p":"{price}",'
        f'"q":"{qty}","T":{at},"m":{m},"M":true}}'
    )


def okx_trade_text(inst_id: str, fill: Fill) -> str:
    """``json.dumps(okx.trades_push(...))``, printed directly."""
    t, at, price, qty, maker = fill
    side = "sell" if maker else "buy"
    return (
        f'{{"arg":{{"channel":"{okx.TRADES_CHANNEL}","instId":"{inst_id}"}},"data":[{{'
        f'"instId":"{inst_id}","tradeId":"{t}","px":"{price}","sz":"{qty}","side":"{side}",'
        f'"source":"0","ts":"{at}","count":"1"}}]}}'
    )


def bybit_trades_text(market_id: str, fills: Sequence[Fill], event_ms: int) -> str:
    """``json.dumps(bybit.trade_message(...))``, printed directly."""
    rows = ",".join(
        f'{{"T":{at},"s":"{market_id}","S":"{"Sell" if maker else "Buy"}","v":"{qty}",'
        f'"p":"{price}","L":"ZeroPlusTick","i":"{t}","BT":false,"RPI":false}}'
        for t, at, price, qty, maker in fills
    )
    return (
        f'{{"topic":"{bybit.TOPIC}{market_id}","type":"snapshot","ts":{event_ms},"data":[{rows}]}}'
    )


_HEAD_SHORT = struct.Struct("!BB")
_HEAD_MID = struct.Struct("!BBH")
_HEAD_LONG = struct.Struct("!BBQ")


def _whole_milliseconds(fills: list[Fill], limit: int) -> list[Fill]:
    """The first ``limit`` fills, less those of the millisecond it cuts into (the next
    pump starts after the last one kept); all of the first millisecond if it is longer."""
    cut = fills[limit][1]
    keep = bisect.bisect_left([f[1] for f in fills], cut)
    if keep == 0:
        keep = bisect.bisect_right([f[1] for f in fills], cut)
    return fills[:keep]


def text_frame(text: str) -> bytes:
    """One unmasked, uncompressed websocket text frame (RFC 6455: what a server sends)."""
    payload = text.encode()
    size = len(payload)
    if size < 126:
        return _HEAD_SHORT.pack(0x81, size) + payload
    if size < 65536:
        return _HEAD_MID.pack(0x81, 126, size) + payload
    return _HEAD_LONG.pack(0x81, 127, size) + payload


def text_frames(texts: Sequence[str]) -> bytes:
    """``text_frame`` of each text, joined. ASCII texts (all the simulator prints:
    ``json.dumps`` escapes the rest) are framed in one str, encoded once (latin-1 maps
    the header bytes to themselves): ~20 % cheaper a message than frame by frame."""
    if not all(text.isascii() for text in texts):
        return b"".join([text_frame(text) for text in texts])
    parts: list[str] = []
    for text in texts:
        size = len(text)
        if size < 126:
            parts.append(f"\x81{chr(size)}{text}")
        elif size < 65536:
            parts.append(f"\x81~{chr(size >> 8)}{chr(size & 255)}{text}")
        else:
            parts.append(text_frame(text).decode("latin-1"))
    return "".join(parts).encode("latin-1")


@dataclass(eq=False)
class _Conn:
    id: int
    ws: web.WebSocketResponse
    request: web.Request
    combined: bool
    streams: set[str] = field(default_factory=set)
    dialect: str = "binance"  # "bybit", "okx": how messages are read and events written
    # Messages to send (None: the connection ended); a deque, not an asyncio.Queue: a
    # busy stream queues thousands a pump and the sender takes them all at once.
    outbox: deque[str | None] = field(default_factory=deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)


def _stream_symbol(stream: str) -> str:
    """``btcusdt@trade`` (Binance), ``publicTrade.BTCUSDT``, ``orderbook.50.BTCUSDT``
    (Bybit) -> ``BTCUSDT``; ``books:BTC-USDT``, ``trades:BTC-USDT`` (OKX) -> ``BTC-USDT``;
    ``kraken.book.10.BTC/USDT`` -> ``BTC/USDT``; ``coinbase.level2.BTC-USDT`` -> ``BTC-USDT``."""
    if stream.startswith((bybit.TOPIC, bybit.BOOK_TOPIC)):
        return bybit.topic_symbol(stream)
    kraken_book = kraken.key_book(stream)
    if kraken_book is not None:
        return kraken_book[0]
    name = okx.key_inst_id(stream) or okx.key_trades_inst_id(stream) or coinbase.key_product(stream)
    if name is not None:
        return name
    return stream.split("@", 1)[0].upper()


def _is_depth(stream: str) -> bool:
    """``btcusdt@depth`` or ``btcusdt@depth@100ms`` (the diff depth stream)."""
    return stream.split("@")[1:2] == ["depth"]


def _is_book(stream: str) -> bool:
    """A book subscription of any dialect."""
    return (
        _is_depth(stream)
        or okx.key_inst_id(stream) is not None
        or bybit.book_depth(stream) is not None
        or kraken.key_book(stream) is not None
        or coinbase.key_product(stream) is not None
    )


class BinanceStreams:
    """Market-stream websocket endpoint, subscription bookkeeping and trade fan-out.

    Real Binance semantics: ``/ws/...`` sends raw event payloads, ``/stream...``
    wraps them as ``{"stream": name, "data": payload}``; subscriptions come from
    the URL (``/ws/btcusdt@trade``, ``/stream?streams=a/b``) or from
    ``{"method": "SUBSCRIBE", "params": [...], "id": n}`` messages.
    Bybit's spot stream (``handle_bybit``, protocol in ``bybit.py``) shares the
    bookkeeping: subscribers, model-trade pump, injection and drops; so does OKX's
    public stream (``handle_okx``, its `books` and `trades` channels), Kraken's v2
    (``handle_kraken``, `book`) and Coinbase's feed (``handle_coinbase``,
    `level2`/`level2_batch`). Order books (``books.py``) are pumped with the trades:
    Binance ``<symbol>@depth[@100ms]``,
    OKX `books`, Bybit ``orderbook.{depth}.{symbol}``, Kraken `book`, Coinbase `level2`.
    Trade-stream faults act here too: `trade_drop` (model trades not sent) and
    `ws_outage` (connections closed, then refused until it ends).
    """

    def __init__(
        self, state: SimState, *, stream_model_trades: bool = True, pump_interval: float = 0.1
    ) -> None:
        self.state = state
        self.stream_model_trades = stream_model_trades
        self.pump_interval = pump_interval
        self._conns: set[_Conn] = set()
        self._conn_ids = itertools.count(1)
        self._cursor: dict[str, int] = {}  # unified symbol -> last model-trade time emitted
        # Injected trades without an id: consecutive per symbol, below the model's ids,
        # from a start that differs at each simulator start (stored trades stay unique).
        self._injected_first = injected_id_start()
        self._injected_next: dict[str, int] = {}  # unified symbol -> its next injected id
        self._book_ids: dict[str, int] = {}  # unified symbol -> Bybit `u` of its last event
        self._warming: dict[str, asyncio.Future[None]] = {}  # symbol -> ids being counted
        self._outages: dict[int, dict[str, Any]] = {}  # fault id -> its faults_triggered entry
        self._tasks: set[asyncio.Future[Any]] = set()  # closes scheduled from sync code
        # Who watches what, by unified symbol: connection -> its stream keys of that
        # symbol (trades: Binance trade/aggTrade, Bybit publicTrade, OKX trades; books:
        # any dialect's). Kept as subscriptions change, so a pump costs the watched
        # markets, not every connection's every stream.
        self._trade_subs: dict[str, dict[_Conn, set[str]]] = {}
        self._book_subs: dict[str, dict[_Conn, set[str]]] = {}
        self._key_symbols: dict[str, str] = {}  # stream key -> unified symbol
        # Minutes being generated in worker threads: (minute index, markets, task); and
        # the markets whose next minute the prefetch covered (minute index, markets).
        self._preparing: list[tuple[int, frozenset[str], asyncio.Future[None]]] = []
        self._prefetched: tuple[int, frozenset[str]] = (-1, frozenset())
        self._generator = ThreadPoolExecutor(GENERATOR_THREADS, "exchange-sim-generator")
        self._stopping = False
        self._changed = asyncio.Event()
        self._pump_task: asyncio.Task[None] | None = None

    # ----------------------------------------------------------- lifecycle
    def start(self) -> None:
        self._pump_task = asyncio.create_task(self._pump_loop())

    async def stop(self) -> None:
        self._stopping = True  # ends `prepare` threads at their next market
        if self._pump_task is not None:
            self._pump_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump_task
            self._pump_task = None
        pending = [*self._warming.values(), *self._tasks]
        for task in pending:  # a counting thread finishes on its own; its result is dropped
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        self._generator.shutdown(wait=False, cancel_futures=True)
        await self.drop(None, mode="close", count_as_drop=False)

    # ------------------------------------------------------------ handler
    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Binance: ``/ws/...`` and ``/stream...``."""
        # Binance pings every 20 s; ccxt answers, so dead clients get noticed.
        refused = self.refused("binance")
        if refused is not None:
            return refused
        ws = web.WebSocketResponse(autoping=True, heartbeat=20.0)
        # ...and allows a minute for the pong (aiohttp's default, half the heartbeat,
        # would drop a reader still working through a busy universe's backlog).
        ws._pong_heartbeat = BINANCE_PONG_S
        if not ws.can_prepare(request).ok:
            return binance_error(400, -1100, "Websocket upgrade required.")
        await ws.prepare(request)
        segments = [s for s in request.path.split("/") if s]
        combined = "ws" not in segments and "stream" in segments
        conn = _Conn(next(self._conn_ids), ws, request, combined)
        initial = [s for s in segments if "@" in s]  # /ws/btcusdt@trade
        if "streams" in request.query:
            initial.extend(request.query["streams"].split("/"))
        return await self._serve(conn, [s for s in initial if _STREAM_RE.match(s)])

    async def handle_bybit(self, request: web.Request) -> web.StreamResponse:
        """Bybit's public spot stream: subscriptions by ``op`` messages only."""
        # Bybit expects the client's {"op": "ping"} every 20 s; ccxt sends it.
        refused = self.refused("bybit")
        if refused is not None:
            return refused
        ws = web.WebSocketResponse(autoping=True, heartbeat=20.0)
        if not ws.can_prepare(request).ok:
            return web.json_response({"retCode": 10001, "retMsg": "websocket upgrade required"})
        await ws.prepare(request)
        conn = _Conn(next(self._conn_ids), ws, request, combined=False, dialect="bybit")
        return await self._serve(conn, [])

    async def handle_okx(self, request: web.Request) -> web.StreamResponse:
        """OKX's public stream: `op` messages, text `ping`/`pong` (no protocol pings)."""
        refused = self.refused("okx")
        if refused is not None:
            return refused
        ws = web.WebSocketResponse(autoping=True)
        if not ws.can_prepare(request).ok:
            return okx.okx_error("60012", "websocket upgrade required")
        await ws.prepare(request)
        conn = _Conn(next(self._conn_ids), ws, request, combined=False, dialect="okx")
        return await self._serve(conn, [])

    async def handle_kraken(self, request: web.Request) -> web.StreamResponse:
        """Kraken's public v2 stream: `method` messages; a status message first."""
        refused = self.refused("kraken")
        if refused is not None:
            return refused
        ws = web.WebSocketResponse(autoping=True)
        if not ws.can_prepare(request).ok:
            return kraken.kraken_error("EGeneral:Invalid arguments")
        await ws.prepare(request)
        conn = _Conn(next(self._conn_ids), ws, request, combined=False, dialect="kraken")
        self._send(conn, kraken.status_message(conn.id))
        return await self._serve(conn, [])

    async def handle_coinbase(self, request: web.Request) -> web.StreamResponse:
        """Coinbase Exchange's websocket feed: `type` messages."""
        refused = self.refused("coinbase")
        if refused is not None:
            return refused
        ws = web.WebSocketResponse(autoping=True, heartbeat=30.0)
        if not ws.can_prepare(request).ok:
            return coinbase.coinbase_error(400, "websocket upgrade required")
        await ws.prepare(request)
        conn = _Conn(next(self._conn_ids), ws, request, combined=False, dialect="coinbase")
        return await self._serve(conn, [])

    async def _serve(self, conn: _Conn, initial: Sequence[str]) -> web.WebSocketResponse:
        ws = conn.ws
        self.state.stats.ws_connections_total += 1
        self._conns.add(conn)
        sender = asyncio.create_task(self._sender(conn))
        self._subscribe(conn, initial)
        try:
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    self._on_text(conn, msg.data)
                elif msg.type == WSMsgType.ERROR:
                    break
        finally:
            self._conns.discard(conn)
            self._unsubscribe(conn, list(conn.streams))
            conn.outbox.append(None)
            conn.wake.set()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
        return ws

    async def _sender(self, conn: _Conn) -> None:
        """One writer per connection keeps acks and events in order; it writes what
        is queued in one go (one socket write per batch, not per message)."""
        outbox = conn.outbox
        while True:
            if not outbox:
                conn.wake.clear()
                await conn.wake.wait()
                continue
            batch: list[str] = []
            ended = False
            while outbox and len(batch) < WRITE_BATCH:
                item = outbox.popleft()
                if item is None:
                    ended = True
                    break
                batch.append(item)
            if conn.ws.closed or (batch and not await self._write(conn, batch)) or ended:
                return

    async def _write(self, conn: _Conn, texts: list[str]) -> bool:
        """Send ``texts`` as websocket text frames; False once the connection is gone.

        Uncompressed (ccxt never offers permessage-deflate), the frames are built here
        and handed to the transport in one write: aiohttp's ``send_str`` writes each
        frame on its own (a system call per message). A reader that falls behind
        makes its sender wait (its outbox fills, then discards and counts)."""
        ws, transport = conn.ws, conn.request.transport
        try:
            if ws.compress or transport is None:
                for text in texts:
                    await ws.send_str(text)
            else:
                if transport.is_closing():
                    return False
                transport.write(text_frames(texts))
                while transport.get_write_buffer_size() > HIGH_WATER:
                    if transport.is_closing():
                        return False
                    await asyncio.sleep(0.01)
        except (ConnectionError, RuntimeError):
            return False
        self.state.stats.ws_messages_sent += len(texts)
        return True

    def _send(self, conn: _Conn, payload: object) -> None:
        text = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
        if len(conn.outbox) >= OUTBOX_LIMIT:
            self.state.stats.ws_messages_discarded += 1
            return
        conn.outbox.append(text)
        conn.wake.set()

    def _send_many(self, conn: _Conn, texts: Sequence[str]) -> None:
        room = OUTBOX_LIMIT - len(conn.outbox)
        if room < len(texts):
            self.state.stats.ws_messages_discarded += len(texts) - max(room, 0)
            texts = texts[: max(room, 0)]
        if texts:
            conn.outbox.extend(texts)
            conn.wake.set()

    def _on_text(self, conn: _Conn, text: str) -> None:
        if conn.dialect == "okx":
            self._on_okx_text(conn, text)
            return
        if conn.dialect in ("kraken", "coinbase"):
            self._on_book_text(conn, text)
            return
        if conn.dialect == "bybit":
            reply, op, topics = bybit.on_message(text, conn.id)
            self._send(conn, reply)  # ack before any event
            if op == "subscribe":
                self._subscribe(conn, topics)
            elif op == "unsubscribe":
                self._unsubscribe(conn, topics)
            return
        try:
            msg = json.loads(text)
        except json.JSONDecodeError as exc:
            self._send(conn, {"code": 3, "msg": f"Invalid JSON: {exc}"})
            return
        if not isinstance(msg, dict):
            self._send(conn, {"code": 2, "msg": "Invalid request: request must be an object"})
            return
        method, req_id, params = msg.get("method"), msg.get("id"), msg.get("params", [])
        if not isinstance(params, list):
            self._send(
                conn, {"code": 2, "msg": "Invalid request: params must be a list", "id": req_id}
            )
            return
        if method in ("SUBSCRIBE", "UNSUBSCRIBE"):
            bad = [p for p in params if not isinstance(p, str) or not _STREAM_RE.match(p)]
            if bad:
                self._send(
                    conn,
                    {"code": 2, "msg": f"Invalid request: invalid stream {bad[0]}", "id": req_id},
                )
                return
            self._send(conn, {"result": None, "id": req_id})  # ack before any event
            if method == "SUBSCRIBE":
                self._subscribe(conn, params)
            else:
                self._unsubscribe(conn, params)
        elif method == "LIST_SUBSCRIPTIONS":
            self._send(conn, {"result": sorted(conn.streams), "id": req_id})
        elif method == "SET_PROPERTY":
            if len(params) == 2 and params[0] == "combined":
                conn.combined = bool(params[1])
            self._send(conn, {"result": None, "id": req_id})
        elif method == "GET_PROPERTY":
            self._send(conn, {"result": conn.combined, "id": req_id})
        else:
            self._send(
                conn, {"code": 2, "msg": f"Invalid request: unknown method {method}", "id": req_id}
            )

    def _on_okx_text(self, conn: _Conn, text: str) -> None:
        replies, op, keys = okx.on_message(text, conn.id)
        for reply in replies:
            self._send(conn, reply)  # acks before the snapshots
        if op == "subscribe":
            self._subscribe(conn, keys)
        elif op == "unsubscribe":
            self._unsubscribe(conn, keys)

    def _on_book_text(self, conn: _Conn, text: str) -> None:
        """Kraken's and Coinbase's messages (their streams serve books only)."""
        if conn.dialect == "kraken":
            replies, op, keys = kraken.on_message(text, self._listed(lambda s: s.symbol))
        else:
            replies, op, keys = coinbase.on_message(text, self._listed(lambda s: s.coinbase_id))
        for reply in replies:
            self._send(conn, reply)  # acks before the snapshots
        if op == "subscribe":
            if conn.dialect == "coinbase":
                self._send(conn, coinbase.subscriptions(conn.streams.union(keys)))
            self._subscribe(conn, keys)
        elif op == "unsubscribe":
            conn.streams.difference_update(keys)
            if conn.dialect == "coinbase":
                self._send(conn, coinbase.subscriptions(conn.streams))
            self._unsubscribe(conn, keys)

    def _listed(self, name: Callable[[SymbolSpec], str]) -> Callable[[str], bool]:
        def known(market: str) -> bool:
            try:
                return name(self.state.model.spec(market)) == market
            except UnknownSymbolError:
                return False

        return known

    def _key_symbol(self, stream: str) -> str | None:
        """The unified symbol of a stream key (None: a market nobody lists)."""
        symbol = self._key_symbols.get(stream)
        if symbol is None:
            try:
                symbol = self.state.model.spec(_stream_symbol(stream)).symbol
            except UnknownSymbolError:
                return None  # not cached: a client may send any number of these
            self._key_symbols[stream] = symbol
        return symbol

    def _index(self, stream: str, symbol: str) -> dict[str, dict[_Conn, set[str]]] | None:
        """The index a key of ``symbol`` belongs in (None: neither trades nor a book)."""
        if _is_book(stream):
            return self._book_subs
        return self._trade_subs if stream in self._symbol_streams(symbol) else None

    def _subscribe(self, conn: _Conn, streams: Sequence[str]) -> None:
        now = self.state.clock.now_ms()
        for stream in streams:
            symbol = self._key_symbol(stream)
            if symbol is None:
                conn.streams.add(stream)
                continue  # Binance acks unknown symbols and then stays silent
            spec = self.state.model.spec(symbol)
            if self._refuse(conn.dialect, spec.symbol):  # `ws_outage` of this market
                self.background(self.close([conn], "close", b"simulated outage"))
                return
            conn.streams.add(stream)
            index = self._index(stream, spec.symbol)
            if index is not None:
                index.setdefault(spec.symbol, {}).setdefault(conn, set()).add(stream)
            if _is_book(stream):
                book = self.state.books.current(spec.symbol, now)  # the stream starts here
                snapshot = self._book_snapshot(conn, stream, spec, book, now)
                if snapshot is not None:  # all but Binance answer with the whole book
                    self._send(conn, snapshot)
                continue
            self._cursor.setdefault(spec.symbol, now)  # live from now, never replay history
            self._warm(spec.symbol, now, now)
        self._notify()

    def _unsubscribe(self, conn: _Conn, streams: Iterable[str]) -> None:
        """Drop subscriptions (all of a closing connection's, too) and their index."""
        for stream in list(streams):
            conn.streams.discard(stream)
            symbol = self._key_symbol(stream)
            if symbol is None:
                continue
            index = self._index(stream, symbol)
            watchers = index.get(symbol) if index is not None else None
            if index is None or watchers is None or conn not in watchers:
                continue
            watchers[conn].discard(stream)
            if not watchers[conn]:
                del watchers[conn]
            if not watchers:
                del index[symbol]
        self._notify()

    # ------------------------------------------------------ subscriptions
    def _notify(self) -> None:
        """Wake subscriber waiters; forget stream cursors of symbols nobody watches."""
        for symbol in [s for s in self._cursor if not self._live(s)]:
            del self._cursor[symbol]
        self._changed.set()
        self._changed = asyncio.Event()

    def _live(self, symbol: str) -> int:
        """Open connections watching the trades of ``symbol`` (unified)."""
        watchers = self._trade_subs.get(symbol)
        return sum(1 for c in watchers if not c.ws.closed) if watchers else 0

    def _symbol_streams(self, symbol: str) -> tuple[str, str, str, str]:
        """Keys of ``symbol``'s trade streams: Binance trade, aggTrade, Bybit, OKX."""
        spec = self.state.model.spec(symbol)
        lower = spec.binance_id.lower()
        return (
            f"{lower}@trade",
            f"{lower}@aggTrade",
            bybit.TOPIC + spec.binance_id,
            okx.channel_key(okx.TRADES_CHANNEL, spec.coinbase_id),
        )

    def _trade_dialects(self, symbol: str) -> set[str]:
        """The exchanges (dialects) whose open connections watch ``symbol``'s trades."""
        watchers = self._trade_subs.get(self.state.model.spec(symbol).symbol, {})
        return {c.dialect for c in watchers if not c.ws.closed}

    def subscribers(self, symbol: str) -> int:
        """Open connections subscribed to ``symbol``'s trades (any stream of any dialect)."""
        return self._live(self.state.model.spec(symbol).symbol)

    def book_subscribers(self, symbol: str) -> int:
        """Open connections subscribed to ``symbol``'s book (any exchange's channel)."""
        try:
            watchers = self._book_subs.get(self.state.model.spec(symbol).symbol, {})
        except UnknownSymbolError:
            return 0
        return sum(1 for c in watchers if not c.ws.closed)

    def connections(self) -> int:
        return len(self._conns)

    async def wait_for_subscribers(
        self, symbol: str, count: int = 1, timeout_s: float = 10.0
    ) -> None:
        """Wait until exactly ``count`` connections subscribe to ``symbol`` (0: all gone)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.subscribers(symbol) != count:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(
                    f"{symbol}: {self.subscribers(symbol)} subscriber(s), wanted {count}"
                )
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                continue

    # -------------------------------------------------------------- fan-out
    def publish(
        self,
        symbol: str,
        fills: Sequence[Fill],
        hidden: Mapping[str | None, set[int]] | None = None,
    ) -> int:
        """Send trades to every connection subscribed to the symbol; returns connections
        reached. ``hidden``: ids not sent (key None: to anyone, an exchange: to its
        connections), the `trade_drop` faults' work. Each message is printed once per
        stream and shared by the connections that watch it."""
        if not fills:
            return 0
        spec = self.state.model.spec(symbol)
        watchers = self._trade_subs.get(spec.symbol)
        if not watchers:
            return 0
        event_ms = self.state.clock.now_ms()
        texts: dict[tuple[str, str, frozenset[int]], list[str]] = {}  # printed once
        reached = 0
        for conn, keys in list(watchers.items()):
            gone: frozenset[int] = frozenset()
            if hidden:
                gone = frozenset(hidden.get(None, set()) | hidden.get(conn.dialect, set()))
            streamed = [f for f in fills if f[0] not in gone] if gone else fills
            hit = False
            for key in sorted(keys, key=lambda k: k.endswith("@aggTrade")):  # trade first
                cache = (key, "combined" if conn.combined else "raw", gone)
                batch = texts.get(cache)
                if batch is None:
                    batch = texts[cache] = self._trade_texts(conn, key, spec, streamed, event_ms)
                hit = hit or bool(batch) or conn.dialect != "bybit"
                self._send_many(conn, batch)
            reached += hit
        return reached

    def _trade_texts(
        self, conn: _Conn, key: str, spec: SymbolSpec, fills: Sequence[Fill], event_ms: int
    ) -> list[str]:
        """The messages of ``fills`` on one trade stream, as ``conn``'s exchange prints them."""
        if conn.dialect == "bybit":
            return [bybit_trades_text(spec.binance_id, fills, event_ms)] if fills else []
        if conn.dialect == "okx":  # OKX pushes one fill per message
            return [okx_trade_text(spec.coinbase_id, f) for f in fills]
        kind, market = "aggTrade" if key.endswith("@aggTrade") else "trade", spec.binance_id
        payloads = [trade_text(kind, market, f, event_ms) for f in fills]
        if conn.combined:
            return [f'{{"stream":"{key}","data":{p}}}' for p in payloads]
        return payloads

    def inject(self, symbol: str, trades: Sequence[Mapping[str, Any]]) -> list[Trade]:
        """Push caller-defined trades now; ids default to a reserved per-minute range."""
        spec = self.state.model.spec(symbol)
        now = self.state.clock.now_ms()
        built: list[Trade] = []
        for raw in trades:
            try:
                price = Decimal(str(raw["price"]))
                qty = Decimal(str(raw.get("qty", raw.get("amount", "1"))))
            except (KeyError, InvalidOperation) as exc:
                raise ValueError(f"bad injected trade {raw!r}: {exc}") from None
            time_ms = int(raw.get("time_ms", raw.get("time", now)))
            trade_id = raw.get("id")
            if trade_id is None:
                trade_id = self._injected_next.get(spec.symbol, self._injected_first)
                self._injected_next[spec.symbol] = trade_id + 1
            elif not 0 < int(trade_id) < MODEL_ID_FLOOR:
                raise ValueError(f"injected trade id {trade_id} not in [1, {MODEL_ID_FLOOR})")
            built.append(
                Trade(
                    symbol=spec.symbol,
                    id=int(trade_id),
                    time_ms=time_ms,
                    price=price,
                    qty=qty,
                    buyer_is_maker=bool(raw.get("buyer_is_maker", raw.get("m", False))),
                )
            )
        self.state.stats.trades_injected += len(built)
        self.publish(spec.symbol, [fill_of(t) for t in built])
        return built

    def pump_books(self) -> int:
        """One book event per watched market, from its last event to now; returns events.

        Armed faults act here, per exchange (a dialect is its exchange's name):
        `book_drop` swallows the event (the next one's ids then skip it; Bybit's `u`
        counts it too), `book_checksum` sends OKX or Kraken a wrong checksum.
        """
        now = self.state.clock.now_ms()
        stream = self.state.books
        sent = 0
        for symbol in stream.symbols():
            watchers = self._book_subs.get(symbol, {})
            targets = [(c, k) for c, keys in watchers.items() for k in sorted(keys)]
            if not targets:
                stream.forget(symbol)
                continue
            update = stream.advance(symbol, now)
            if update is None:
                continue
            sent += 1
            self.state.stats.book_events += 1
            self._book_ids[symbol] = self._book_id(symbol, now) + 1
            spec = self.state.model.spec(symbol)
            for exchange in sorted({c.dialect for c, _ in targets}):
                if self._book_fault("book_drop", exchange, symbol):
                    continue
                corrupt = exchange in ("okx", "kraken") and self._book_fault(
                    "book_checksum", exchange, symbol
                )
                for conn, key in targets:
                    if conn.dialect == exchange:
                        message = self._book_event(conn, key, spec, update, now, corrupt)
                        if message is not None:
                            self._send(conn, message)
        return sent

    def _book_id(self, symbol: str, now: int) -> int:
        """Bybit's `u` of ``symbol``'s last event (unrelated to the step, as on Bybit)."""
        return self._book_ids.setdefault(symbol, books.step_of(now) % 10_000_000 + 1)

    def _book_snapshot(
        self, conn: _Conn, key: str, spec: SymbolSpec, book: books.SimBook, now: int
    ) -> object | None:
        """The book a new subscription gets first; None where none is sent (Binance)."""
        if conn.dialect == "okx":
            return books.okx_snapshot(spec.coinbase_id, book, now)
        if conn.dialect == "bybit":
            depth = bybit.book_depth(key) or 0
            return books.bybit_snapshot(
                spec.binance_id, book, depth, self._book_id(spec.symbol, now), now
            )
        kraken_book = kraken.key_book(key)
        if kraken_book is not None:
            places = (spec.price_decimals, spec.qty_decimals)
            message = books.kraken_snapshot(kraken_book[0], book, kraken_book[1], places)
            return books.kraken_text(message)
        if conn.dialect == "coinbase":
            return books.coinbase_snapshot(spec.coinbase_id, book, spec.price_decimals)
        return None

    def _book_event(
        self,
        conn: _Conn,
        key: str,
        spec: SymbolSpec,
        update: books.BookUpdate,
        now: int,
        corrupt: bool,
    ) -> object | None:
        """One book event as ``conn``'s exchange writes it; None when it has nothing to say."""
        if conn.dialect == "okx":
            return books.okx_update(spec.coinbase_id, update, now, corrupt=corrupt)
        if conn.dialect == "bybit":
            depth, update_id = bybit.book_depth(key) or 0, self._book_ids[spec.symbol]
            return books.bybit_delta(spec.binance_id, update, depth, update_id, now)
        kraken_book = kraken.key_book(key)
        if kraken_book is not None:
            symbol, depth = kraken_book
            places = (spec.price_decimals, spec.qty_decimals)
            message = books.kraken_update(symbol, update, depth, places, now, corrupt=corrupt)
            return None if message is None else books.kraken_text(message)
        if conn.dialect == "coinbase":
            return books.coinbase_update(spec.coinbase_id, update, spec.price_decimals, now)
        event = books.binance_depth_event(spec.binance_id, update, now)
        return {"stream": key, "data": event} if conn.combined else event

    def _book_fault(self, kind: str, exchange: str, symbol: str) -> bool:
        fault = self.state.faults.take_event(kind, exchange, symbol)
        if fault is not None:
            self.state.stats.faults_triggered.append(
                {
                    "id": fault.id,
                    "kind": kind,
                    "path": f"{exchange}:{symbol}",
                    "t_ms": self.state.clock.now_ms(),
                }
            )
        return fault is not None

    def pump(self, *, wait_for_ids: bool = False) -> int:
        """Emit the model trades that became due since the last pump, and the book events;
        returns the trades streamed (dropped ones not counted).

        A market whose trades are not ready (ids not counted: the first trades of a day
        far from the id epoch; or its minute not generated yet: a busy universe market)
        waits while a worker thread prepares them, unless ``wait_for_ids`` (the clock
        control: its caller wants the trades now). From ``PREFETCH_AFTER_MS`` into a
        minute, the next minute of every watched market is prepared ahead.
        """
        self.pump_books()
        if not self.stream_model_trades:
            return 0
        now = self.state.clock.now_ms()
        self._prefetch_next(now)
        sent = 0
        model = self.state.model
        for symbol in list(self._cursor):
            if not self._live(symbol):
                del self._cursor[symbol]
                continue
            cursor = self._cursor[symbol]
            if now <= cursor:
                self._cursor[symbol] = min(cursor, now)
                continue
            cursor = max(cursor, now - MAX_BACKLOG_MS)
            if not wait_for_ids and self._warm(symbol, cursor + 1, now):
                continue  # prepared off the loop; these trades go out once it is done
            room = self._room(symbol)
            if room <= 0:
                continue  # its readers are behind: the trades wait in the model, not here
            columns = model.trade_columns(symbol, cursor + 1, now)
            fills = fills_of_columns(columns, model.spec(symbol))
            self._cursor[symbol] = now
            if len(fills) > room:  # a backlog (a start, a clock jump): what fits, by the ms
                fills = _whole_milliseconds(fills, room)
                self._cursor[symbol] = fills[-1][1]
            sent += self._stream(symbol, fills)
        return sent

    def _room(self, symbol: str) -> int:
        """Trades the most available reader of ``symbol`` can still queue (its outbox
        below ``OUTBOX_LIMIT``; a Binance reader of trade and aggTrade takes two
        messages a trade, a Bybit one a message a push). Why: a backlog released at once
        (the first minutes of a busy universe, a clock jump) must not overflow it."""
        best = 0
        for conn, keys in self._trade_subs.get(symbol, {}).items():
            free = OUTBOX_LIMIT - len(conn.outbox)
            if conn.dialect == "bybit":
                free = OUTBOX_LIMIT if free > 0 else 0
            best = max(best, free // max(1, len(keys)))
        return best

    def _prefetch_next(self, now: int) -> None:
        """Once a minute, generate the next minute of every watched market (trades and
        books) in a worker thread, so the loop finds it ready when the minute starts."""
        if now % MINUTE_MS < PREFETCH_AFTER_MS:
            return
        minute = now // MINUTE_MS + 1
        covered = self._prefetched[1] if self._prefetched[0] == minute else frozenset()
        if any(not task.done() for _, _, task in self._preparing):
            return  # one prefetch at a time (a fast clock asks each 0.3 s); the rest next
        watched = frozenset([*self._cursor, *self._book_subs])
        if watched <= covered:
            return
        budget_s = 0.6 * (minute * MINUTE_MS - now) / 1000
        model = self.state.model
        # A universe market's book needs its bars only (it centres on the price path):
        # its trades are generated only if they are watched too.
        bars = {s for s in watched - covered - self._cursor.keys() if model.specs[s].pacing}
        self.prepare(watched - covered - bars, minute * MINUTE_MS, budget_s, bars)
        self._prefetched = (minute, watched | covered)

    def prepare(
        self,
        symbols: Iterable[str],
        start_ms: int,
        budget_s: float = 0.0,
        bars: Iterable[str] = (),
    ) -> asyncio.Future[None]:
        """Generate the minute from ``start_ms`` of ``symbols`` (and the day of bars of
        ``bars``) in a generator thread, paced to finish in about ``budget_s``: it
        sleeps while ahead of that schedule, leaving the GIL to the loop (a busy
        universe's minute is seconds of work). It stops once its minute is over: the
        pump warms what it still needs."""
        model = self.state.model
        end_ms = start_ms + MINUTE_MS - 1
        todo = sorted(s for s in symbols if not model.trades_ready(s, start_ms, end_ms))
        days = sorted(bars)

        def run() -> None:
            began = time.monotonic()
            for symbol in days:
                model.minute_bar(symbol, start_ms)  # the day, cached
            for done, symbol in enumerate(todo, 1):
                if self._stopping or self.state.clock.now_ms() > end_ms:
                    return
                model.prepare(symbol, start_ms, end_ms)
                self._pace(began + budget_s * done / len(todo), start_ms)

        task = self._off_loop(run)
        self._preparing = [p for p in self._preparing if not p[2].done()]
        self._preparing.append((start_ms // MINUTE_MS, frozenset(todo), task))
        return task

    def _pace(self, until: float, start_ms: int) -> None:
        """Sleep until ``until`` (monotonic seconds), but only while the minute from
        ``start_ms`` is still ahead on the simulator clock. Why: the budget assumes a
        clock at wall speed; one run faster (the live-candles e2e runs it 200x) reaches
        the minute in a fraction of the budget, and its trades are wanted then."""
        while not self._stopping and self.state.clock.now_ms() < start_ms:
            left = until - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, PACE_STEP_S))

    def _off_loop(self, work: Callable[[], None]) -> asyncio.Future[None]:
        """Run ``work`` in the generator's threads (``GENERATOR_THREADS``)."""
        return asyncio.get_running_loop().run_in_executor(self._generator, work)

    def _warm(self, symbol: str, first_ms: int, last_ms: int) -> bool:
        """Whether ``symbol``'s trades of these times are still being prepared (then a
        worker thread counts their ids and generates them: the loop must not stall).
        A default market's minute (a few hundred trades) is generated on the loop, as
        it always was: only a universe market's waits for its minute too."""
        model = self.state.model
        if model.specs[symbol].pacing is None:
            if model.ids_ready(symbol, first_ms) and model.ids_ready(symbol, last_ms):
                return False
        elif model.trades_ready(symbol, first_ms, last_ms):
            return False
        minutes = range(first_ms // MINUTE_MS, last_ms // MINUTE_MS + 1)
        if any(
            m in minutes and symbol in markets and not task.done()
            for m, markets, task in self._preparing
        ):
            return True  # a prefetch is on it
        task = self._warming.get(symbol)
        if task is None or task.done():

            def prepare() -> None:
                model.prepare(symbol, first_ms, last_ms)

            self._warming[symbol] = self._off_loop(prepare)
        return True

    def _stream(self, symbol: str, trades: list[Fill]) -> int:
        """Publish a batch of model trades, less those armed `trade_drop`s swallow
        (recorded with their ids in `faults_triggered`); returns the trades streamed."""
        counters = self.state.stats.model_trades.setdefault(
            symbol, {"last_id": 0, "sent": 0, "dropped": 0}
        )
        if not trades:
            return 0
        hidden: dict[str | None, set[int]] = {}
        faults = self.state.faults
        hits = (
            faults.take_trades(symbol, self._trade_dialects(symbol), len(trades))
            if faults.armed("trade_drop")
            else []
        )
        for fault, first, n in hits:
            ids = [t[0] for t in trades[first : first + n]]
            hidden.setdefault(fault.exchange, set()).update(ids)
            self.state.stats.faults_triggered.append(
                {
                    "id": fault.id,
                    "kind": "trade_drop",
                    "path": f"{fault.exchange or '*'}:{symbol}",
                    "symbol": symbol,
                    "exchange": fault.exchange,
                    "trade_ids": ids,
                    "t_ms": self.state.clock.now_ms(),
                }
            )
        self.publish(symbol, trades, hidden)
        dropped = len(hidden.get(None, ()))
        counters["last_id"] = trades[-1][0]
        counters["sent"] += len(trades) - dropped
        counters["dropped"] += len({i for ids in hidden.values() for i in ids})
        return len(trades) - dropped

    async def _pump_loop(self) -> None:
        while True:
            await asyncio.sleep(self.pump_interval)
            self.pump()

    async def drop(
        self,
        symbol: str | None,
        *,
        mode: str = "close",
        count_as_drop: bool = True,
        exchange: str | None = None,
    ) -> int:
        """Disconnect every stream connection (or those subscribed to ``symbol``; of
        ``exchange``'s dialect only, if given).

        ``close`` sends a websocket close frame (code 1001); ``abort`` cuts the
        TCP connection without one (the client sees 1006).
        """
        if mode not in ("close", "abort"):
            raise ValueError("mode must be 'close' or 'abort'")
        victims = self._victims(symbol, exchange)
        await self.close(victims, mode, b"simulated drop")
        if count_as_drop:
            self.state.stats.ws_dropped_by_sim += len(victims)
        return len(victims)

    def _victims(self, symbol: str | None, exchange: str | None) -> list[_Conn]:
        """Connections of ``exchange`` (None: all) subscribed to ``symbol`` (None: all)."""
        if symbol is None:
            conns: Iterable[_Conn] = self._conns
        else:
            unified = self.state.model.spec(symbol).symbol
            watching = {**self._trade_subs.get(unified, {}), **self._book_subs.get(unified, {})}
            conns = [c for c in self._conns if c in watching]
        return [c for c in conns if exchange is None or c.dialect == exchange]

    async def close(
        self, victims: Sequence[_Conn], mode: str = "close", reason: bytes = b"simulated outage"
    ) -> None:
        for conn in victims:
            if mode == "abort" and conn.request.transport is not None:
                conn.request.transport.abort()
        if mode == "close":
            await asyncio.gather(
                *(c.ws.close(code=1001, message=reason) for c in victims),
                return_exceptions=True,
            )

    def background(self, coro: Coroutine[Any, Any, Any] | asyncio.Future[Any]) -> None:
        """Run ``coro`` on the loop without awaiting it (kept referenced until done)."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -------------------------------------------------------------- outages
    def begin_outage(self, fault: Fault) -> list[_Conn]:
        """Start a `ws_outage`: from now until ``seconds`` later (simulator clock) its
        connections are refused; returns the open ones it closes. Recorded in
        `faults_triggered` with the last model trade id each market streamed before,
        and counts of the connections closed and refused."""
        now = self.state.clock.now_ms()
        if fault.symbol is not None:
            fault.symbol = self.state.model.spec(fault.symbol).symbol
        fault.until_ms = now + int(fault.seconds * 1000)
        victims = self._victims(fault.symbol, fault.exchange)
        symbols = [fault.symbol] if fault.symbol is not None else sorted(self._cursor)
        model_trades = self.state.stats.model_trades
        record = {
            "id": fault.id,
            "kind": "ws_outage",
            "path": f"{fault.exchange or '*'}:{fault.symbol or '*'}",
            "symbol": fault.symbol,
            "exchange": fault.exchange,
            "t_ms": now,
            "until_ms": fault.until_ms,
            "closed": len(victims),
            "refused": 0,
            "last_ids": {s: model_trades[s]["last_id"] for s in symbols if s in model_trades},
        }
        self._outages[fault.id] = record
        self.state.stats.faults_triggered.append(record)
        self.state.stats.ws_dropped_by_sim += len(victims)
        return victims

    async def outage(self, fault: Fault) -> int:
        """`begin_outage` and close its connections now; returns how many."""
        victims = self.begin_outage(fault)
        await self.close(victims, fault.mode, b"simulated outage")
        return len(victims)

    def _refuse(self, exchange: str, symbol: str | None) -> bool:
        """Whether a `ws_outage` refuses this connection (``symbol`` None) or this
        subscription now; counts the refusal in the outage's record."""
        fault = self.state.faults.outage(self.state.clock.now_ms(), exchange, symbol)
        if fault is None:
            return False
        record = self._outages.get(fault.id)
        if record is not None:
            record["refused"] += 1
        return True

    def refused(self, exchange: str) -> web.Response | None:
        """The answer to a websocket handshake during an outage: 503, as a load
        balancer in front of a dead stream service sends (ccxt: NetworkError)."""
        if not self._refuse(exchange, None):
            return None
        return web.Response(
            status=503,
            text="<html><body><h1>503 Service Unavailable</h1></body></html>",
            content_type="text/html",
        )
