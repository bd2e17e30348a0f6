"""Kraken spot front-end (ccxt id ``kraken``): REST assets, pairs, time, OHLC, trades, and
the websocket v2 `book` channel (the one ccxt 4.5.90's ``watch_order_book`` uses).

Why these shapes: unmodified ccxt ``kraken`` must load markets (``load_markets``
calls ``/0/public/Assets``, then ``/0/public/AssetPairs``) and parse candles, so
bodies follow Kraken's wire format ``{"error": [], "result": {...}}``; errors
come with HTTP 200 and ``error: ["EQuery:Unknown asset pair"]``. BTC is ``XBT``
on Kraken (asset ``XXBT``, pair ``XBTUSDT``) and DOGE ``XDG`` (``XXDG``,
``XDGUSDT``), as for real.

Paging as the real OHLC endpoint: it serves only the latest 720 entries of an
interval (the last one still open), oldest first; ``since`` (seconds) keeps the
entries opening after it; there is no end and no limit (ccxt applies its limit
itself); ``last`` is the open time of the last committed (closed) entry. Rows
are ``[time s, open, high, low, close, vwap, volume, count]``: Kraken reports
each candle's trade count. Same deterministic model as the other front-ends.
Trades page forward by ``since``: unix seconds, or the nanosecond cursor ``last`` the
previous page returned (``trade_ns``: unique per trade, so a page never splits a
millisecond's trades wrongly).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from aiohttp import web

from .model import MarketModel, SymbolSpec, Trade, fmt8, interval_ms, interval_open
from .state import SimState
from .tickers import DayTicker, day_tickers

#: Kraken `interval` (minutes) -> the model's intervals.
INTERVALS = {
    "1": "1m",
    "5": "5m",
    "15": "15m",
    "30": "30m",
    "60": "1h",
    "240": "4h",
    "1440": "1d",
    "10080": "1w",
}
#: Entries of an interval the OHLC endpoint serves (the newest ones).
MAX_ENTRIES = 720
MAX_TRADES = 1000  # Trades: a page
#: A Trades ``since`` at least this is a nanosecond cursor (``last``); below, unix seconds.
NS_CURSOR_MIN = 10**12
PREFIX = "/0/public/"
#: Kraken's asset ids and altnames where they differ from the unified code, as
#: listed by the real ``/0/public/Assets`` (the older assets carry an ``X`` prefix;
#: DOGE is ``XDG``). ccxt maps them back (``commonCurrencies``); ADA, AVAX, DOT,
#: LINK, SOL and USDT are their own ids.
ASSETS = {
    "BTC": ("XXBT", "XBT"),
    "ETH": ("XETH", "ETH"),
    "DOGE": ("XXDG", "XDG"),
    "LTC": ("XLTC", "LTC"),
    "XRP": ("XXRP", "XRP"),
}


def asset_id(code: str) -> str:
    return ASSETS.get(code, (code, code))[0]


def altname(code: str) -> str:
    return ASSETS.get(code, (code, code))[1]


def pair_id(spec: SymbolSpec) -> str:
    """``BTC/USDT`` -> ``XBTUSDT`` (Kraken's pair key and altname)."""
    return altname(spec.base) + altname(spec.quote)


def kraken_error(message: str) -> web.Response:
    """Kraken's error body: HTTP 200, a list of ``Ecategory:Reason`` strings."""
    return web.json_response({"error": [message]})


def _ok(result: Any) -> web.Response:
    return web.json_response({"error": [], "result": result})


class KrakenRest:
    """Handlers of the Kraken public REST endpoints ccxt uses for markets and candles."""

    def __init__(self, state: SimState) -> None:
        self.state = state
        self._pairs: dict[str, SymbolSpec] | None = None  # pair id -> market

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/0/public/Time", self.server_time),
            web.get("/0/public/Assets", self.assets),
            web.get("/0/public/AssetPairs", self.asset_pairs),
            web.get("/0/public/OHLC", self.ohlc),
            web.get("/0/public/Trades", self.trades),
            web.get("/0/public/Ticker", self.ticker),
        ]

    def _spec(self, pair: str) -> SymbolSpec | None:
        if self._pairs is None:  # the model never changes: index its pairs once
            self._pairs = {pair_id(s): s for s in self.state.model.specs.values()}
        return self._pairs.get(pair)

    def _pair(self, spec: SymbolSpec) -> dict[str, Any]:
        online = spec.trading_at(self.state.clock.now_ms())
        return {
            "altname": pair_id(spec),
            "wsname": f"{altname(spec.base)}/{altname(spec.quote)}",
            "aclass_base": "currency",
            "base": asset_id(spec.base),
            "aclass_quote": "currency",
            "quote": asset_id(spec.quote),
            "lot": "unit",
            "cost_decimals": 8,
            "pair_decimals": spec.price_decimals,
            "lot_decimals": spec.qty_decimals,
            "lot_multiplier": 1,
            "leverage_buy": [],
            "leverage_sell": [],
            "fees": [[0, 0.4], [10000, 0.35]],
            "fees_maker": [[0, 0.25], [10000, 0.2]],
            "fee_volume_currency": "ZUSD",
            "margin_call": 80,
            "margin_stop": 40,
            "ordermin": spec.step,
            "costmin": spec.min_notional,
            "tick_size": spec.tick,
            "status": "online" if online else "delisted",
        }

    async def server_time(self, request: web.Request) -> web.Response:
        now = self.state.clock.now_ms()
        rfc1123 = datetime.fromtimestamp(now / 1000, UTC).strftime("%a, %d %b %y %H:%M:%S +0000")
        return _ok({"unixtime": now // 1000, "rfc1123": rfc1123})

    async def assets(self, request: web.Request) -> web.Response:
        codes = {c for s in self.state.model.specs.values() for c in (s.base, s.quote)}
        return _ok(
            {
                asset_id(code): {
                    "aclass": "currency",
                    "altname": altname(code),
                    "decimals": 8,
                    "display_decimals": 8,
                    "status": "enabled",
                }
                for code in sorted(codes)
            }
        )

    async def ticker(self, request: web.Request) -> web.Response:
        """``Ticker[?pair=A,B]``: by pair id, every pair without ``pair``."""
        specs: list[SymbolSpec] | None = None
        if "pair" in request.query:
            specs = []
            for pair in request.query["pair"].split(","):
                spec = self._spec(pair)
                if spec is None:
                    return kraken_error("EQuery:Unknown asset pair")
                specs.append(spec)
        return _ok({pair_id(t.spec): ticker_entry(t) for t in await day_tickers(self.state, specs)})

    async def asset_pairs(self, request: web.Request) -> web.Response:
        wanted = request.query.get("pair")
        specs = [
            s
            for s in self.state.model.specs.values()
            if wanted is None or pair_id(s) in wanted.split(",")
        ]
        if wanted is not None and not specs:
            return kraken_error("EQuery:Unknown asset pair")
        return _ok({pair_id(s): self._pair(s) for s in specs})

    async def ohlc(self, request: web.Request) -> web.Response:
        """The latest 720 entries opening after ``since``, oldest first, and ``last``."""
        query = request.query
        spec = self._spec(query.get("pair", ""))
        if spec is None:
            return kraken_error("EQuery:Unknown asset pair")
        interval = INTERVALS.get(query.get("interval", "1"))
        if interval is None:
            return kraken_error("EGeneral:Invalid arguments:interval")
        try:
            since_ms = int(float(query["since"]) * 1000) if "since" in query else None
        except ValueError:
            return kraken_error("EGeneral:Invalid arguments:since")
        now = self.state.clock.now_ms()
        length = interval_ms(interval)
        current = interval_open(interval, now)
        oldest = current - (MAX_ENTRIES - 1) * length
        low = oldest if since_ms is None else max(oldest, since_ms + 1)
        rows = await asyncio.to_thread(
            self.state.model.klines, spec.symbol, interval, low, now, now
        )
        # The last committed entry of the served window (Kraken's polling cursor).
        last = max(oldest, current - length) // 1000
        return _ok(
            {
                pair_id(spec): [
                    [
                        k.open_time // 1000,
                        fmt8(k.open),
                        fmt8(k.high),
                        fmt8(k.low),
                        fmt8(k.close),
                        fmt8(k.quote_volume / k.volume if k.volume else k.close),
                        fmt8(k.volume),
                        k.trades,
                    ]
                    for k in rows
                ],
                "last": str(last),  # a string, as in the recorded payloads
            }
        )

    async def trades(self, request: web.Request) -> web.Response:
        """Trades after ``since`` (exclusive), oldest first, at most ``count`` (default
        and maximum 1000), and ``last``: the nanosecond cursor of the last one, to pass
        as the next ``since``. Without ``since``: the latest ``count`` trades."""
        query = request.query
        spec = self._spec(query.get("pair", ""))
        if spec is None:
            return kraken_error("EQuery:Unknown asset pair")
        try:
            count = int(query.get("count", str(MAX_TRADES)))
            since_ns = parse_since(query["since"]) if query.get("since") else None
        except (ValueError, ArithmeticError):
            return kraken_error("EGeneral:Invalid arguments")
        if not 1 <= count <= MAX_TRADES:
            return kraken_error("EGeneral:Invalid arguments:count")
        now, model, symbol = self.state.clock.now_ms(), self.state.model, spec.symbol

        def page() -> list[tuple[Trade, int]]:
            if since_ns is None:
                latest = list(itertools.islice(model.iter_trades_backward(symbol, now), count))
                return [(t, trade_ns(model, t)) for t in reversed(latest)]
            later = model.iter_trades(symbol, since_ns // 10**6, now)
            stamped = ((t, trade_ns(model, t)) for t in later)
            return list(itertools.islice(((t, ns) for t, ns in stamped if ns > since_ns), count))

        rows = await asyncio.to_thread(page)
        # Nothing new: the cursor stays (as a poll of Kraken with no new trade).
        last = rows[-1][1] if rows else (since_ns if since_ns is not None else now * 10**6)
        return _ok(
            {
                pair_id(spec): [
                    [
                        fmt8(t.price),
                        fmt8(t.qty),
                        ns / 1e9,
                        "s" if t.buyer_is_maker else "b",  # the taker's side
                        "l",
                        "",
                        t.id,
                    ]
                    for t, ns in rows
                ],
                "last": str(last),
            }
        )


def ticker_entry(ticker: DayTicker) -> dict[str, Any]:
    """A ``Ticker`` entry: ``[today, last 24 h]`` pairs of volume (``v``), vwap (``p``),
    trade count (``t``), low, high; ccxt reads the 24 h slot (quote volume = v x p).
    Not modelled: "today" repeats the 24 h figures; bid = ask = last, sizes 0; ``o``
    is the window's open."""
    last, volume, vwap = ticker.text("close"), ticker.text("volume"), fmt8(ticker.vwap)
    low, high = ticker.text("low"), ticker.text("high")
    return {
        "a": [last, "0", "0.000"],
        "b": [last, "0", "0.000"],
        "c": [last, "0.00000000"],
        "v": [volume, volume],
        "p": [vwap, vwap],
        "t": [ticker.trades, ticker.trades],
        "l": [low, low],
        "h": [high, high],
        "o": ticker.text("open"),
    }


def parse_since(raw: str) -> int:
    """Kraken's ``since``, in nanoseconds: a ``last`` cursor (nanoseconds) or unix
    seconds, possibly fractional (what ccxt sends)."""
    value = Decimal(raw)
    if value < 0:
        raise ValueError(raw)
    return int(value) if value >= NS_CURSOR_MIN else int(value * 10**9)


def trade_ns(model: MarketModel, trade: Trade) -> int:
    """A model trade's Kraken time in nanoseconds: its millisecond plus 100 us plus
    10 ns per earlier trade of its minute. Unique and increasing, so ``last`` pages
    trades of one millisecond exactly; and the seconds float (``ns / 1e9``) stays
    inside the millisecond, so ccxt's truncating ``int(time * 1000)`` gives it back.
    A minute of 90,000 trades or more (a busy universe market: 10 ns each would
    leave the millisecond) counts 10 ns per earlier trade of its millisecond instead."""
    position, count, in_ms = model.trade_position(trade.symbol, trade.id, trade.time_ms)
    return trade.time_ms * 10**6 + 100_000 + 10 * (position if count < 90_000 else in_ms)


# ------------------------------------------------------- public websocket v2

#: `wss://ws.kraken.com/v2` as `point_ccxt_at` rewrites it (host label `ws`).
WS_PATH = "/ws/v2"
BOOK_DEPTHS = (10, 25, 100, 500, 1000)
_BOOK_KEY = "kraken.book."


def book_key(symbol: str, depth: int) -> str:
    """How a connection records its `book` subscription (`kraken.book.100.BTC/USDT`)."""
    return f"{_BOOK_KEY}{depth}.{symbol}"


def key_book(key: str) -> tuple[str, int] | None:
    """`kraken.book.100.BTC/USDT` -> ("BTC/USDT", 100); None for another key."""
    if not key.startswith(_BOOK_KEY):
        return None
    depth, _, symbol = key.removeprefix(_BOOK_KEY).partition(".")
    return symbol, int(depth)


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def on_message(text: str, known: Callable[[str], bool]) -> tuple[list[Any], str, list[str]]:
    """A client message -> (the replies, `subscribe`/`unsubscribe`/"", its book keys).

    As Kraken's v2 answers: `{"method": "ping"}` gets `pong`; each symbol of a `book`
    (un)subscription gets `{"method": ..., "result": {...}, "success": true}`, or
    `success: false` with an `error` (an unknown pair, another channel, a depth
    Kraken does not serve); `known` says whether a pair is listed.
    """
    try:
        msg = json.loads(text)
    except json.JSONDecodeError:
        return [_failed("", None, "Malformed request", None)], "", []
    if not isinstance(msg, dict):
        return [_failed("", None, "Malformed request", None)], "", []
    method, req_id = str(msg.get("method", "")), msg.get("req_id")
    if method == "ping":
        return [_result("pong", req_id, None)], "", []
    if method not in ("subscribe", "unsubscribe"):
        return [_failed(method, req_id, "Method not found", None)], "", []
    params = msg.get("params") if isinstance(msg.get("params"), dict) else {}
    assert isinstance(params, dict)
    if params.get("channel") != "book":
        return [_failed(method, req_id, "Channel not supported by the simulator", None)], "", []
    depth = params.get("depth", 10)
    symbols = params.get("symbol")
    if not isinstance(symbols, list) or not symbols:
        return [_failed(method, req_id, "Pair field must be an array", None)], "", []
    if depth not in BOOK_DEPTHS:
        return [_failed(method, req_id, "Subscription depth not supported", None)], "", []
    replies: list[Any] = []
    keys: list[str] = []
    for symbol in symbols:
        if not isinstance(symbol, str) or not known(symbol):
            replies.append(_failed(method, req_id, f"Currency pair not supported {symbol}", symbol))
            continue
        result = {"channel": "book", "depth": depth, "symbol": symbol}
        if method == "subscribe":
            result["snapshot"] = True
        replies.append(_result(method, req_id, result))
        keys.append(book_key(symbol, depth))
    return replies, method, keys


def _result(method: str, req_id: Any, result: dict[str, Any] | None) -> dict[str, Any]:
    reply: dict[str, Any] = {"method": method}
    if result is not None:
        reply.update(result=result, success=True)
    if req_id is not None:
        reply["req_id"] = req_id
    return {**reply, "time_in": _stamp(), "time_out": _stamp()}


def _failed(method: str, req_id: Any, error: str, symbol: str | None) -> dict[str, Any]:
    reply: dict[str, Any] = {"error": error, "method": method, "success": False}
    if symbol is not None:
        reply["symbol"] = symbol
    if req_id is not None:
        reply["req_id"] = req_id
    return {**reply, "time_in": _stamp(), "time_out": _stamp()}


def status_message(conn_id: int) -> dict[str, Any]:
    """What Kraken's v2 sends first on every connection."""
    return {
        "channel": "status",
        "type": "update",
        "data": [
            {
                "api_version": "v2",
                "connection_id": conn_id,
                "system": "online",
                "version": "2.0.0",
            }
        ],
    }
