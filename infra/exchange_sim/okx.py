"""OKX front-end (ccxt id ``okx``): REST markets, candles and trades (the latest, and the
history paged by trade id), and the public stream's `books` and `trades` channels.

The third wire format, and the first whose candle pages hold the NEWEST
``limit`` candles of a window (``before < ts < after``, both exclusive, newest
first, at most 300), as the real OKX does: an ingestor paging it like Binance
loses the oldest candles of every long range. Same deterministic model as
Binance and Coinbase. ``/api/v5/public/time`` answers the platform's probe.
Trade history pages the same way: ``history-trades`` returns the NEWEST ``limit``
records older than ``after`` and newer than ``before`` (trade ids), newest first.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from .model import SymbolSpec, Trade, UnknownSymbolError, fmt8
from .state import SimState
from .tickers import DayTicker, day_tickers
from .windows import newest_first

#: OKX `bar` values -> the model's intervals (ccxt appends "utc" from 6 h up).
BAR_TO_INTERVAL = {
    "1m": "1m",
    "3m": "3m",
    "5m": "5m",
    "15m": "15m",
    "30m": "30m",
    "1H": "1h",
    "2H": "2h",
    "4H": "4h",
    "6Hutc": "6h",
    "12Hutc": "12h",
    "1Dutc": "1d",
}
MAX_LIMIT = 300
MAX_TRADES = 500  # market/trades: the latest 500
MAX_HISTORY_TRADES = 100  # market/history-trades: a page
PREFIX = "/api/v5/"


def okx_error(code: str, message: str, status: int = 200) -> web.Response:
    """OKX's error body; most errors come with HTTP 200 and a non-zero code."""
    return web.json_response({"code": code, "msg": message, "data": []}, status=status)


def _ok(data: list[Any]) -> web.Response:
    return web.json_response({"code": "0", "msg": "", "data": data})


class OkxRest:
    """Handlers of the OKX public REST endpoints ccxt uses for markets and candles."""

    def __init__(self, state: SimState) -> None:
        self.state = state

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/api/v5/public/time", self.server_time),
            web.get("/api/v5/public/instruments", self.instruments),
            web.get("/api/v5/market/candles", self.candles),
            web.get("/api/v5/market/history-candles", self.candles),
            web.get("/api/v5/market/trades", self.trades),
            web.get("/api/v5/market/history-trades", self.history_trades),
            web.get("/api/v5/market/tickers", self.tickers),
        ]

    def _spec(self, inst_id: str) -> SymbolSpec | None:
        try:
            spec = self.state.model.spec(inst_id)
        except UnknownSymbolError:
            return None
        return spec if spec.coinbase_id == inst_id else None  # OKX ids are BASE-QUOTE too

    def _instrument(self, spec: SymbolSpec) -> dict[str, Any]:
        online = spec.trading_at(self.state.clock.now_ms())
        return {
            "instType": "SPOT",
            "instId": spec.coinbase_id,
            "instFamily": "",
            "uly": "",
            "baseCcy": spec.base,
            "quoteCcy": spec.quote,
            "settleCcy": "",
            "ctVal": "",
            "ctMult": "",
            "ctValCcy": "",
            "ctType": "",
            "listTime": str(spec.listed_ms),
            "expTime": "",
            "lever": "",
            "tickSz": spec.tick,
            "lotSz": spec.step,
            "minSz": spec.step,
            "maxLmtSz": "9999999999",
            "maxMktSz": "1000000",
            "state": "live" if online else "suspend",
        }

    async def server_time(self, request: web.Request) -> web.Response:
        return _ok([{"ts": str(self.state.clock.now_ms())}])

    async def instruments(self, request: web.Request) -> web.Response:
        if request.query.get("instType") != "SPOT":
            return _ok([])  # the simulator lists spot markets only
        return _ok([self._instrument(s) for s in self.state.model.specs.values()])

    async def candles(self, request: web.Request) -> web.Response:
        """``[[ts, o, h, l, c, vol, volCcy, volCcyQuote, confirm], ...]`` newest first."""
        query = request.query
        spec = self._spec(query.get("instId", ""))
        if spec is None:
            return okx_error("51001", "Instrument ID does not exist")
        interval = BAR_TO_INTERVAL.get(query.get("bar", "1m"))
        if interval is None:
            return okx_error("51000", "Parameter bar error")
        try:
            limit = int(query.get("limit", "100"))
            after = int(query["after"]) if "after" in query else None
            before = int(query["before"]) if "before" in query else None
        except ValueError:
            return okx_error("51000", "Parameter error")
        if not 1 <= limit <= MAX_LIMIT:
            return okx_error("51000", "Parameter limit error")
        high = after - 1 if after is not None else None  # OKX's bounds are exclusive
        low = before + 1 if before is not None else None
        rows = await newest_first(self.state, spec.symbol, interval, low, high, limit)
        return _ok(
            [
                [
                    str(k.open_time),
                    fmt8(k.open),
                    fmt8(k.high),
                    fmt8(k.low),
                    fmt8(k.close),
                    fmt8(k.volume),
                    fmt8(k.quote_volume),
                    fmt8(k.quote_volume),
                    "1" if k.closed else "0",
                ]
                for k in rows
            ]
        )

    async def trades(self, request: web.Request) -> web.Response:
        """``market/trades``: the latest ``limit`` trades (default 100, at most 500),
        newest first; no cursor."""
        spec = self._spec(request.query.get("instId", ""))
        if spec is None:
            return okx_error("51001", "Instrument ID does not exist")
        limit = _int(request.query, "limit", 100)
        if limit is None or not 1 <= limit <= MAX_TRADES:
            return okx_error("51000", "Parameter limit error")
        now, model, symbol = self.state.clock.now_ms(), self.state.model, spec.symbol
        rows = await asyncio.to_thread(
            lambda: list(itertools.islice(model.iter_trades_backward(symbol, now), limit))
        )
        return _ok([trade_row(spec.coinbase_id, t) for t in rows])

    async def tickers(self, request: web.Request) -> web.Response:
        """``market/tickers?instType=SPOT``: every spot market's 24 h (other types:
        none listed, an empty list; no ``instType``: OKX's parameter error)."""
        inst_type = request.query.get("instType")
        if inst_type is None:
            return okx_error("51000", "Parameter instType error")
        if inst_type != "SPOT":
            return _ok([])
        return _ok([ticker_row(t) for t in await day_tickers(self.state)])

    async def history_trades(self, request: web.Request) -> web.Response:
        """``market/history-trades``, newest first, at most 100 a page. ``type=1``
        (default): ``after``/``before`` are trade ids, records older than ``after`` and
        newer than ``before`` (both exclusive), the NEWEST ``limit`` of them: with only
        ``before`` the latest trades, not those right after it. ``type=2``: ``after`` is
        a time (ms), records before it; ``before`` is not supported for times (ignored)."""
        query = request.query
        spec = self._spec(query.get("instId", ""))
        if spec is None:
            return okx_error("51001", "Instrument ID does not exist")
        kind = query.get("type", "1")
        limit = _int(query, "limit", MAX_HISTORY_TRADES)
        after, before = _int(query, "after", 0), _int(query, "before", 0)
        if kind not in ("1", "2"):
            return okx_error("51000", "Parameter type error")
        if limit is None or not 1 <= limit <= MAX_HISTORY_TRADES:
            return okx_error("51000", "Parameter limit error")
        if after is None or before is None:
            return okx_error("51000", "Parameter after or before error")
        model, symbol = self.state.model, spec.symbol
        end = self.state.clock.now_ms()
        before_id: int | None = None
        newer_than = 0
        if kind == "2":
            end = min(end, after - 1) if "after" in query else end
        else:
            before_id = after if "after" in query else None
            newer_than = before

        def page() -> list[Trade]:
            older = model.iter_trades_backward(symbol, end, before_id=before_id)
            window = itertools.takewhile(lambda t: t.id > newer_than, older)
            return list(itertools.islice(window, limit))

        rows = await asyncio.to_thread(page)
        return _ok([trade_row(spec.coinbase_id, t) for t in rows])


def _int(query: Mapping[str, str], name: str, default: int) -> int | None:
    """An integer parameter (its default if absent); None if it is not one."""
    try:
        return int(query[name]) if name in query else default
    except ValueError:
        return None


# ----------------------------------------------------------- public websocket

#: `wss://ws.okx.com:8443/ws/v5/public` as `point_ccxt_at` rewrites it (host label `ws`).
WS_PATH = "/ws/ws/v5/public"
BOOK_CHANNEL = "books"
TRADES_CHANNEL = "trades"
CHANNELS = (BOOK_CHANNEL, TRADES_CHANNEL)


def channel_key(channel: str, inst_id: str) -> str:
    """How a connection records a subscription (`books:BTC-USDT`, `trades:BTC-USDT`)."""
    return f"{channel}:{inst_id}"


def key_inst_id(key: str) -> str | None:
    """The instId of a `books` key; None for another key."""
    channel, _, inst_id = key.partition(":")
    return inst_id if channel == BOOK_CHANNEL else None


def key_trades_inst_id(key: str) -> str | None:
    """The instId of a `trades` key; None for another key."""
    channel, _, inst_id = key.partition(":")
    return inst_id if channel == TRADES_CHANNEL else None


def on_message(text: str, conn_id: int) -> tuple[list[Any], str, list[str]]:
    """A client message -> (the replies, `subscribe`/`unsubscribe`/"", its channel keys).

    As OKX answers: the text `ping` gets `pong`; each subscribed argument gets
    `{"event": "subscribe", "arg": {...}, "connId": ...}` (then a `books` snapshot); a
    channel the simulator does not serve gets `{"event": "error", "code": "60018"}`.
    """
    if text == "ping":
        return ["pong"], "", []
    conn = f"sim{conn_id:06d}"
    try:
        msg = json.loads(text)
    except json.JSONDecodeError:
        return [_ws_error("60012", f"Illegal request: {text}", conn)], "", []
    if not isinstance(msg, dict) or msg.get("op") not in ("subscribe", "unsubscribe"):
        return [_ws_error("60012", f"Illegal request: {text}", conn)], "", []
    op, args = str(msg["op"]), msg.get("args")
    if not isinstance(args, list) or not all(isinstance(a, dict) for a in args):
        return [_ws_error("60012", f"Illegal request: {text}", conn)], "", []
    replies: list[Any] = []
    keys: list[str] = []
    for arg in args:
        channel, inst_id = arg.get("channel"), arg.get("instId")
        if channel not in CHANNELS or not isinstance(inst_id, str):
            replies.append(
                _ws_error(
                    "60018", f"Wrong URL or channel:{channel},instId:{inst_id} doesn't exist", conn
                )
            )
            continue
        replies.append(
            {"event": op, "arg": {"channel": channel, "instId": inst_id}, "connId": conn}
        )
        keys.append(channel_key(str(channel), inst_id))
    return replies, op, keys


def ticker_row(ticker: DayTicker) -> dict[str, Any]:
    """A ``market/tickers`` row: ``vol24h`` base, ``volCcy24h`` quote volume (spot).
    Not modelled: bid = ask = last, sizes 0; ``sodUtc0``/``sodUtc8`` = ``open24h``."""
    last, open_ = ticker.text("close"), ticker.text("open")
    return {
        "instType": "SPOT",
        "instId": ticker.spec.coinbase_id,
        "last": last,
        "lastSz": "0",
        "askPx": last,
        "askSz": "0",
        "bidPx": last,
        "bidSz": "0",
        "open24h": open_,
        "high24h": ticker.text("high"),
        "low24h": ticker.text("low"),
        "volCcy24h": ticker.text("quote_volume"),
        "vol24h": ticker.text("volume"),
        "ts": str(ticker.now_ms),
        "sodUtc0": open_,
        "sodUtc8": open_,
    }


def trade_row(inst_id: str, trade: Trade) -> dict[str, Any]:
    """A trade as OKX writes it (REST `market/trades`, `history-trades`, the `trades`
    channel): strings; `side` is the taker's; every model trade is its own fill."""
    return {
        "instId": inst_id,
        "tradeId": str(trade.id),
        "px": fmt8(trade.price),
        "sz": fmt8(trade.qty),
        "side": "sell" if trade.buyer_is_maker else "buy",
        "source": "0",
        "ts": str(trade.time_ms),
    }


def trades_push(inst_id: str, trade: Trade) -> dict[str, Any]:
    """One push of the public `trades` channel (OKX sends a fill per push; `count`:
    the fills aggregated into it, always 1 here)."""
    return {
        "arg": {"channel": TRADES_CHANNEL, "instId": inst_id},
        "data": [{**trade_row(inst_id, trade), "count": "1"}],
    }


def _ws_error(code: str, message: str, conn: str) -> dict[str, Any]:
    return {"event": "error", "code": code, "msg": message, "connId": conn}
