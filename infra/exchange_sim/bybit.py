"""Bybit spot front-end (ccxt id ``bybit``): v5 REST markets, klines and trades, and the
public spot trade stream.

Why these shapes: unmodified ccxt (``bybit``, ``async_support.bybit``,
``pro.bybit``) must parse every response, so bodies follow Bybit's v5 wire
format: ``{"retCode": 0, "retMsg": "OK", "result": {...}, "time": ms}``, errors
with HTTP 200 and a non-zero ``retCode``. Candle pages hold the NEWEST
``limit`` klines of ``[start, end]`` (both inclusive), newest first, at most
1000, as the real Bybit does. Rows carry no trade count (Bybit reports none).
Same deterministic model as the other front-ends.

The stream (``wss://stream.bybit.com/v5/public/spot``, served at
``/stream/v5/public/spot`` by ``point_ccxt_at``'s rule) speaks ``{"op":
"subscribe", "args": ["publicTrade.BTCUSDT"], "req_id": n}`` and pushes
``{"topic": "publicTrade.BTCUSDT", "type": "snapshot", "ts": ms, "data":
[trades]}``; the connection bookkeeping is shared with Binance's streams. The
order book topic ``orderbook.{depth}.{symbol}`` (spot depths 1, 50, 200, 1000) sends a
snapshot, then deltas (``books.bybit_snapshot``/``bybit_delta``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from .model import SymbolSpec, Trade, UnknownSymbolError, fmt8
from .state import SimState
from .tickers import DayTicker, day_tickers
from .windows import newest_first

#: Bybit `interval` values -> the model's intervals.
INTERVALS = {
    "1": "1m",
    "3": "3m",
    "5": "5m",
    "15": "15m",
    "30": "30m",
    "60": "1h",
    "120": "2h",
    "240": "4h",
    "360": "6h",
    "720": "12h",
    "D": "1d",
    "W": "1w",
}
MAX_LIMIT = 1000
DEFAULT_LIMIT = 200
MAX_TRADES_LIMIT = 60  # spot recent-trade
PREFIX = "/v5/"
WS_PATH = "/stream/v5/public/spot"
TOPIC = "publicTrade."
BOOK_TOPIC = "orderbook."
BOOK_DEPTHS = (1, 50, 200, 1000)  # spot


def bybit_error(code: int, message: str, now_ms: int, status: int = 200) -> web.Response:
    """Bybit's error body; most errors come with HTTP 200 and a non-zero retCode."""
    body = {"retCode": code, "retMsg": message, "result": {}, "retExtInfo": {}, "time": now_ms}
    return web.json_response(body, status=status)


def _ok(result: dict[str, Any], now_ms: int) -> web.Response:
    body = {"retCode": 0, "retMsg": "OK", "result": result, "retExtInfo": {}, "time": now_ms}
    return web.json_response(body)


class BybitRest:
    """Handlers of the Bybit v5 public REST endpoints ccxt uses."""

    def __init__(self, state: SimState) -> None:
        self.state = state

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/v5/market/time", self.server_time),
            web.get("/v5/market/instruments-info", self.instruments),
            web.get("/v5/market/kline", self.klines),
            web.get("/v5/market/recent-trade", self.recent_trades),
            web.get("/v5/market/tickers", self.tickers),
        ]

    def _spec(self, market_id: str) -> SymbolSpec | None:
        """The market of a Bybit id (``BTCUSDT``, as Binance's), if listed."""
        try:
            spec = self.state.model.spec(market_id)
        except UnknownSymbolError:
            return None
        return spec if spec.binance_id == market_id else None

    def _instrument(self, spec: SymbolSpec) -> dict[str, Any]:
        online = spec.trading_at(self.state.clock.now_ms())
        return {
            "symbol": spec.binance_id,
            "baseCoin": spec.base,
            "quoteCoin": spec.quote,
            "innovation": "0",
            "status": "Trading" if online else "Closed",
            "marginTrading": "none",
            "stTag": "0",
            "lotSizeFilter": {
                "basePrecision": spec.step,
                "quotePrecision": "0.00000001",
                "minOrderQty": spec.step,
                "maxOrderQty": spec.max_qty,
                "minOrderAmt": spec.min_notional,
                "maxOrderAmt": "2000000",
            },
            "priceFilter": {"tickSize": spec.tick},
            "riskParameters": {"priceLimitRatioX": "0.05", "priceLimitRatioY": "0.05"},
        }

    async def server_time(self, request: web.Request) -> web.Response:
        now = self.state.clock.now_ms()
        return _ok({"timeSecond": str(now // 1000), "timeNano": str(now * 1_000_000)}, now)

    def _listed(self, request: web.Request) -> tuple[str, list[SymbolSpec]] | web.Response:
        """``category`` and its markets (``symbol``'s only if given; spot lists all the
        simulator's, the other categories none), or Bybit's error."""
        category = request.query.get("category", "")
        if category not in ("spot", "linear", "inverse", "option"):
            return bybit_error(
                10001, "params error: category is invalid", self.state.clock.now_ms()
            )
        wanted = request.query.get("symbol")
        specs = [
            s
            for s in (self.state.model.specs.values() if category == "spot" else ())
            if wanted is None or s.binance_id == wanted
        ]
        return category, specs

    async def instruments(self, request: web.Request) -> web.Response:
        listed = self._listed(request)
        if isinstance(listed, web.Response):
            return listed
        category, specs = listed
        result = {"category": category, "list": [self._instrument(s) for s in specs]}
        return _ok({**result, "nextPageCursor": ""}, self.state.clock.now_ms())

    async def tickers(self, request: web.Request) -> web.Response:
        """``/v5/market/tickers?category=spot[&symbol=]``: 24 h statistics; the other
        categories list nothing (the simulator has spot markets only)."""
        listed = self._listed(request)
        if isinstance(listed, web.Response):
            return listed
        category, specs = listed
        rows = [ticker_row(t) for t in await day_tickers(self.state, specs)] if specs else []
        return _ok({"category": category, "list": rows}, self.state.clock.now_ms())

    def _market(self, request: web.Request) -> SymbolSpec | web.Response:
        now = self.state.clock.now_ms()
        if request.query.get("category") != "spot":
            return bybit_error(10001, "params error: the simulator serves category=spot", now)
        spec = self._spec(request.query.get("symbol", ""))
        return spec if spec is not None else bybit_error(10001, "Not supported symbols", now)

    async def klines(self, request: web.Request) -> web.Response:
        """``[[start, o, h, l, c, volume, turnover], ...]`` newest first."""
        now = self.state.clock.now_ms()
        spec = self._market(request)
        if isinstance(spec, web.Response):
            return spec
        query = request.query
        interval = INTERVALS.get(query.get("interval", ""))
        if interval is None:
            return bybit_error(10001, "Invalid period!", now)
        try:
            limit = int(query.get("limit", str(DEFAULT_LIMIT)))
            start = int(query["start"]) if "start" in query else None
            end = int(query["end"]) if "end" in query else None
        except ValueError:
            return bybit_error(10001, "params error", now)
        if not 1 <= limit <= MAX_LIMIT:
            limit = min(max(limit, 1), MAX_LIMIT)  # Bybit clamps the limit
        rows = await newest_first(self.state, spec.symbol, interval, start, end, limit)
        return _ok(
            {
                "symbol": spec.binance_id,
                "category": "spot",
                "list": [
                    [
                        str(k.open_time),
                        fmt8(k.open),
                        fmt8(k.high),
                        fmt8(k.low),
                        fmt8(k.close),
                        fmt8(k.volume),
                        fmt8(k.quote_volume),
                    ]
                    for k in rows
                ],
            },
            now,
        )

    async def recent_trades(self, request: web.Request) -> web.Response:
        """The latest trades, newest first (spot: at most 60)."""
        now = self.state.clock.now_ms()
        spec = self._market(request)
        if isinstance(spec, web.Response):
            return spec
        try:
            limit = min(max(int(request.query.get("limit", "60")), 1), MAX_TRADES_LIMIT)
        except ValueError:
            return bybit_error(10001, "params error", now)
        model, symbol = self.state.model, spec.symbol
        trades = await asyncio.to_thread(
            lambda: list(itertools.islice(model.iter_trades_backward(symbol, now), limit))
        )
        rows = [
            {
                "execId": str(t.id),
                "symbol": spec.binance_id,
                "price": fmt8(t.price),
                "size": fmt8(t.qty),
                "side": taker_side(t),
                "time": str(t.time_ms),
                "isBlockTrade": False,
                "isRPITrade": False,
            }
            for t in trades
        ]
        return _ok({"category": "spot", "list": rows}, now)


def ticker_row(ticker: DayTicker) -> dict[str, Any]:
    """A spot ``tickers`` row: ``volume24h`` base, ``turnover24h`` quote volume. Not
    modelled: bid = ask = last, sizes 0; ``usdIndexPrice`` = last (USDT markets)."""
    last = ticker.text("close")
    return {
        "symbol": ticker.spec.binance_id,
        "bid1Price": last,
        "bid1Size": "0",
        "ask1Price": last,
        "ask1Size": "0",
        "lastPrice": last,
        "prevPrice24h": ticker.text("open"),
        "price24hPcnt": f"{ticker.change_ratio:.4f}",
        "highPrice24h": ticker.text("high"),
        "lowPrice24h": ticker.text("low"),
        "turnover24h": ticker.text("quote_volume"),
        "volume24h": ticker.text("volume"),
        "usdIndexPrice": last,
    }


def taker_side(trade: Trade) -> str:
    """Bybit's ``Buy``/``Sell`` is the taker's side; a maker buyer means a selling taker."""
    return "Sell" if trade.buyer_is_maker else "Buy"


def topic_symbol(topic: str) -> str:
    """``publicTrade.BTCUSDT``, ``orderbook.50.BTCUSDT`` -> ``BTCUSDT``."""
    return topic.rsplit(".", 1)[-1]


def book_depth(topic: str) -> int | None:
    """``orderbook.50.BTCUSDT`` -> 50; None for another topic or depth."""
    parts = topic.split(".")
    if len(parts) != 3 or parts[0] + "." != BOOK_TOPIC or not parts[1].isdigit():
        return None
    depth = int(parts[1])
    return depth if depth in BOOK_DEPTHS else None


def trade_message(market_id: str, trades: Sequence[Trade], event_ms: int) -> dict[str, Any]:
    """One push of the ``publicTrade`` stream (Bybit batches the trades of a moment)."""
    return {
        "topic": TOPIC + market_id,
        "type": "snapshot",
        "ts": event_ms,
        "data": [
            {
                "T": t.time_ms,
                "s": market_id,
                "S": taker_side(t),
                "v": fmt8(t.qty),
                "p": fmt8(t.price),
                "L": "ZeroPlusTick",
                "i": str(t.id),
                "BT": False,
                "RPI": False,
            }
            for t in trades
        ],
    }


def on_message(text: str, conn_id: int) -> tuple[dict[str, Any], str, list[str]]:
    """A client message -> (the reply, ``subscribe``/``unsubscribe``/"" , its topics).

    Replies as Bybit does: ``{"success": true, "ret_msg": "", "op": ..., "req_id":
    ..., "conn_id": ...}``; a ping gets ``ret_msg: "pong"``; bad requests get
    ``success: false`` with a reason.
    """
    reply: dict[str, Any] = {"success": True, "ret_msg": "", "conn_id": f"sim-{conn_id}"}
    try:
        msg = json.loads(text)
    except json.JSONDecodeError as exc:
        return {**reply, "success": False, "ret_msg": f"invalid JSON: {exc}"}, "", []
    if not isinstance(msg, dict):
        return {**reply, "success": False, "ret_msg": "request must be an object"}, "", []
    op, req_id = msg.get("op"), msg.get("req_id")
    if req_id is not None:
        reply["req_id"] = str(req_id)
    reply["op"] = op
    if op == "ping":
        return {**reply, "ret_msg": "pong"}, "", []
    if op in ("subscribe", "unsubscribe"):
        args = msg.get("args")
        if not isinstance(args, list) or not args:
            return {**reply, "success": False, "ret_msg": "args must be a non-empty list"}, "", []
        bad = [
            a
            for a in args
            if not isinstance(a, str) or not (a.startswith(TOPIC) or book_depth(a) is not None)
        ]
        if bad:
            return {**reply, "success": False, "ret_msg": f"handler not found:{bad[0]}"}, "", []
        ack = {**reply, "ret_msg": "subscribe"} if op == "subscribe" else reply
        return ack, str(op), [str(a) for a in args]
    return {**reply, "success": False, "ret_msg": f"unknown op {op!r}"}, "", []
