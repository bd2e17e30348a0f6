"""The simulator's aiohttp application, its control API and embedding helpers.

Why one server for every exchange: their REST paths do not overlap
(``/api``, ``/fapi``, ``/dapi`` vs ``/products``, ``/currencies``, ``/time`` vs
OKX's ``/api/v5`` vs Bybit's ``/v5`` vs Kraken's ``/0/public``)
and websocket URLs are namespaced by ``point_ccxt_at``, so one port serves
both and tests need a single base URL.

Use ``async with SimulatorServer() as sim`` inside an event loop, or
``with run_in_thread() as sim`` from synchronous code; both expose the same
control methods. Everything that mutates state runs on the server's loop.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, TypeVar

from aiohttp import web

from .binance import DEFAULT_WEIGHT_LIMIT, WEIGHTS, BinanceRest, BinanceStreams, binance_error
from .books import DEFAULT_LEVELS, SimBook
from .bybit import PREFIX as BYBIT_PREFIX
from .bybit import WS_PATH as BYBIT_WS_PATH
from .bybit import BybitRest, bybit_error
from .coinbase import WS_PATH as COINBASE_WS_PATH
from .coinbase import CoinbaseRest, coinbase_error
from .faults import Fault, FaultError, parse_fault, truncate
from .kraken import PREFIX as KRAKEN_PREFIX
from .kraken import WS_PATH as KRAKEN_WS_PATH
from .kraken import KrakenRest, kraken_error
from .model import DEFAULT_MODEL, MINUTE_MS, MarketModel, Trade, UnknownSymbolError
from .okx import PREFIX as OKX_PREFIX
from .okx import WS_PATH as OKX_WS_PATH
from .okx import OkxRest, okx_error
from .replay import WINDOWS, RefusedError, Replay
from .state import SimClock, SimState, Stats
from .universe import Universe

T = TypeVar("T")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

COINBASE_PREFIXES = ("/products", "/currencies", "/time")


def exchange_of(path: str) -> str:
    """Which simulated exchange a request path belongs to."""
    if path.startswith(OKX_PREFIX) or path == OKX_WS_PATH:
        return "okx"
    if path.startswith(BYBIT_PREFIX) or path == BYBIT_WS_PATH:
        return "bybit"
    if path.startswith(KRAKEN_PREFIX) or path == KRAKEN_WS_PATH:
        return "kraken"
    if path == COINBASE_WS_PATH:
        return "coinbase"
    return "coinbase" if path.startswith(COINBASE_PREFIXES) else "binance"


#: The longest range `GET /_sim/trades` lists (a liquid market trades ~10^5 times a day).
TRADES_LIST_MAX_MS = 6 * 3_600_000


def _trade_json(trade: Trade) -> dict[str, Any]:
    return {
        "id": trade.id,
        "symbol": trade.symbol,
        "time_ms": trade.time_ms,
        "price": str(trade.price),
        "qty": str(trade.qty),
        "buyer_is_maker": trade.buyer_is_maker,
    }


class SimulatorServer:
    """Binance, Coinbase, OKX, Bybit and Kraken simulator on ``host:port`` (port 0: a free one).

    ``model`` is the deterministic world (default ``DEFAULT_MODEL``);
    ``trade_rate`` (trades/second, float or per-symbol mapping) derives a model
    with that activity; ``universe`` (a ``Universe``, or its number of markets) adds
    the load generator's markets (after ``trade_rate``: it sets their rates itself);
    ``now_ms`` freezes the clock at start;
    ``stream_model_trades=False`` leaves websocket streams silent except for
    injected trades; ``weight_limit`` enforces Binance's per-minute request
    weight (None: never 429 on its own); ``book_levels`` is how many price levels
    per side the simulated order books hold.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        model: MarketModel | None = None,
        trade_rate: float | Mapping[str, float] | None = None,
        universe: Universe | int | None = None,
        now_ms: int | None = None,
        stream_model_trades: bool = True,
        pump_interval: float = 0.1,
        weight_limit: int | None = DEFAULT_WEIGHT_LIMIT,
        log_size: int = 2000,
        book_levels: int = DEFAULT_LEVELS,
    ) -> None:
        world = model or DEFAULT_MODEL
        if trade_rate is not None:
            world = world.with_trade_rate(trade_rate)
        if isinstance(universe, int):
            universe = Universe(universe)
        if universe is not None:
            world = universe.model(world)
        self.universe = universe
        self.host = host
        self._requested_port = port
        self.state = SimState(
            model=world,
            clock=SimClock(now_ms),
            stats=Stats(log_size=log_size),
            book_levels=book_levels,
        )
        self.binance = BinanceRest(self.state, weight_limit=weight_limit)
        self.streams = BinanceStreams(
            self.state, stream_model_trades=stream_model_trades, pump_interval=pump_interval
        )
        self.coinbase = CoinbaseRest(self.state)
        self.okx = OkxRest(self.state)
        self.bybit = BybitRest(self.state)
        self.kraken = KrakenRest(self.state)
        self.replays: dict[str, Replay] = {}  # exchange id -> recorded candles it serves
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    # ------------------------------------------------------------ lifecycle
    @property
    def model(self) -> MarketModel:
        return self.state.model

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("simulator not started")
        return self._port

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``: what ``point_ccxt_at`` needs."""
        return f"http://{self.host}:{self.port}"

    def build_app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware])
        app.add_routes(self.binance.routes())
        app.add_routes(self.coinbase.routes())
        app.add_routes(self.okx.routes())
        app.add_routes(self.bybit.routes())
        app.add_routes(self.kraken.routes())
        app.router.add_get(BYBIT_WS_PATH, self.streams.handle_bybit)  # before /stream/{tail}
        app.router.add_get(OKX_WS_PATH, self.streams.handle_okx)  # before /ws/{tail}
        app.router.add_get(KRAKEN_WS_PATH, self.streams.handle_kraken)  # before /ws/{tail}
        app.router.add_get(COINBASE_WS_PATH, self.streams.handle_coinbase)
        for path in ("/ws", "/ws/{tail:.*}", "/stream", "/stream/{tail:.*}"):
            app.router.add_get(path, self.streams.handle)
        app.add_routes(
            [
                web.get("/_sim/health", self._h_health),
                web.get("/_sim/stats", self._h_stats),
                web.get("/_sim/universe", self._h_universe),
                web.post("/_sim/reset", self._h_reset),
                web.get("/_sim/faults", self._h_faults_list),
                web.post("/_sim/faults", self._h_faults_add),
                web.delete("/_sim/faults", self._h_faults_clear),
                web.get("/_sim/trades", self._h_trades_list),
                web.post("/_sim/trades", self._h_trades),
                web.post("/_sim/replay", self._h_replay),
                web.delete("/_sim/replay", self._h_replay_clear),
                web.post("/_sim/ws/drop", self._h_ws_drop),
                web.get("/_sim/subscribers", self._h_subscribers),
                web.get("/_sim/book", self._h_book),
                web.get("/_sim/clock", self._h_clock_get),
                web.post("/_sim/clock", self._h_clock_set),
            ]
        )
        return app

    async def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self._requested_port))
        self._port = sock.getsockname()[1]
        self._runner = web.AppRunner(self.build_app(), access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()
        self.streams.start()
        if self.universe is not None and not self.state.clock.frozen:
            # A load generator is subscribed to at once: have its markets' first
            # minutes ready (a day of bars and a minute of trades each; seconds of work).
            now = self.now_ms()
            minute = now - now % MINUTE_MS
            symbols = self.universe.symbols()
            self.streams.background(self.streams.prepare(symbols, minute))

    async def stop(self) -> None:
        await self.streams.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> SimulatorServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ----------------------------------------------------- Python control API
    def add_fault(self, kind: str, **options: Any) -> Fault:
        """Arm a fault (see README, "Faults"): e.g. ``add_fault("rate_limit", count=2)``.

        ``ws_outage`` starts at once (its connections close right after this returns;
        ``await ws_outage(...)`` waits for that).
        """
        fault = self._armed(parse_fault({"kind": kind, **options}))
        if fault.kind == "ws_outage":
            victims = self.streams.begin_outage(fault)
            self.streams.background(self.streams.close(victims, fault.mode))
        return fault

    def _armed(self, fault: Fault) -> Fault:
        """Add a parsed fault; the market of a trade or outage fault in its unified name."""
        if fault.symbol is not None and fault.kind in ("trade_drop", "ws_outage"):
            fault.symbol = self.model.spec(fault.symbol).symbol  # UnknownSymbolError
        return self.state.faults.add(fault)

    async def ws_outage(
        self,
        symbol: str | None = None,
        exchange: str | None = None,
        seconds: float = 120.0,
        mode: str = "close",
    ) -> Fault:
        """Close the stream connections of ``symbol`` (None: all) of ``exchange``'s
        dialect (None: every exchange) and refuse new ones for ``seconds`` of the
        simulator clock: a real outage; trades due meanwhile are never streamed."""
        fault = self._armed(
            parse_fault(
                {
                    "kind": "ws_outage",
                    "symbol": symbol,
                    "exchange": exchange,
                    "seconds": seconds,
                    "mode": mode,
                }
            )
        )
        await self.streams.outage(fault)
        return fault

    def clear_faults(self, kind: str | None = None) -> int:
        """Disarm every fault (or those of ``kind``, e.g. ``ws_outage`` to end an outage)."""
        if kind is None:
            count = len(self.state.faults.pending())
            self.state.faults.clear()
            return count
        return self.state.faults.clear_kind(kind)

    def pending_faults(self) -> list[Fault]:
        self.state.faults.expire(self.now_ms())
        return self.state.faults.pending()

    def inject_trades(self, symbol: str, trades: Sequence[Mapping[str, Any]]) -> list[Trade]:
        """Push trades (``price``, ``qty``, optional ``time_ms``, ``id``, ``buyer_is_maker``)
        to current subscribers of ``symbol``'s stream; returns them with their ids."""
        return self.streams.inject(symbol, trades)

    async def drop_websockets(self, symbol: str | None = None, mode: str = "close") -> int:
        """Disconnect all stream connections, or those subscribed to ``symbol``."""
        return await self.streams.drop(symbol, mode=mode)

    def subscribers(self, symbol: str) -> int:
        return self.streams.subscribers(symbol)

    async def wait_for_subscribers(
        self, symbol: str, count: int = 1, timeout_s: float = 10.0
    ) -> None:
        """Block until exactly ``count`` connections are subscribed to ``symbol``."""
        await self.streams.wait_for_subscribers(symbol, count, timeout_s)

    def book(self, symbol: str, step: int | None = None) -> SimBook:
        """The book at update id `step`; None: where its stream is (the last event sent)."""
        spec = self.model.spec(symbol)
        if step is not None:
            return self.state.books.books.book_at(spec.symbol, step)
        return self.state.books.current(spec.symbol, self.now_ms())

    def book_subscribers(self, symbol: str) -> int:
        return self.streams.book_subscribers(symbol)

    def now_ms(self) -> int:
        return self.state.clock.now_ms()

    def set_time(self, now_ms: int | None) -> None:
        """Freeze the clock at ``now_ms`` (None: back to wall time)."""
        self.state.clock.set(now_ms)

    def advance_time(self, delta_ms: int) -> int:
        """Move the clock forward and stream the model trades that became due now."""
        self.state.clock.advance(delta_ms)
        return self.streams.pump(wait_for_ids=True)

    def stats(self, *, include_log: bool = True) -> dict[str, Any]:
        self.state.faults.expire(self.now_ms())
        data = self.state.stats.snapshot(include_log=include_log)
        data["ws"]["open_connections"] = self.streams.connections()
        data["weight_used_1m"] = self.binance.weights.used
        data["now_ms"] = self.now_ms()
        return data

    def universe_info(self) -> dict[str, Any]:
        """The load generator's markets: its settings, ``symbols`` hottest first and
        their ``rates`` (trades/s outside bursts); ``{"markets": 0}`` without one."""
        universe = self.universe
        if universe is None:
            return {"markets": 0, "symbols": [], "rates": []}
        return {
            "markets": universe.markets,
            "rate": universe.rate,
            "skew": universe.skew,
            "burst_fraction": universe.burst_fraction,
            "burst_factor": universe.burst_factor,
            "jitter": universe.jitter,
            "book_ratio": universe.book_ratio,
            "symbols": universe.symbols(),
            "rates": universe.rates(),
        }

    def reset(self) -> None:
        """Clear faults, replays, counters and used weight (clock and connections stay)."""
        self.state.faults.clear()
        self.replays.clear()
        self.state.stats = Stats(log_size=self.state.stats.log_size)
        self.binance.weights.reset()

    # ----------------------------------------------------------- middleware
    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Counts every exchange request, applies armed faults and Binance weights."""
        path = request.path
        if path.startswith("/_sim/"):
            return await handler(request)
        exchange = exchange_of(path)
        started = time.perf_counter()
        fault = self.state.faults.take(exchange, path)
        status = 0
        try:
            response = await self._respond(request, handler, exchange, fault)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            resource = request.match_info.route.resource
            self.state.stats.record(
                {
                    "t_ms": self.state.clock.now_ms(),
                    "exchange": exchange,
                    "method": request.method,
                    "path": path,
                    "route": resource.canonical if resource is not None else path,
                    "query": dict(request.query),
                    "status": status,
                    "fault": fault.kind if fault is not None else None,
                    "ms": round((time.perf_counter() - started) * 1000, 3),
                }
            )

    async def _respond(
        self, request: web.Request, handler: Handler, exchange: str, fault: Fault | None
    ) -> web.StreamResponse:
        weight_headers: dict[str, str] = {}
        if exchange == "binance" and path_is_rest(request.path):
            used = self.binance.weights.add(WEIGHTS.get(request.path, 1))
            weight_headers = {"x-mbx-used-weight": str(used), "x-mbx-used-weight-1m": str(used)}
            if fault is None and self.binance.weights.exceeded():
                return binance_error(
                    429,
                    -1003,
                    "Too much request weight used; current limit is "
                    f"{self.binance.weights.limit} request weight per 1 MINUTE.",
                    headers={
                        **weight_headers,
                        "Retry-After": str(self.binance.weights.retry_after()),
                    },
                )
        if fault is not None:
            self.state.stats.faults_triggered.append(
                {
                    "id": fault.id,
                    "kind": fault.kind,
                    "path": request.path,
                    "t_ms": self.state.clock.now_ms(),
                }
            )
            if fault.kind == "slow":
                await asyncio.sleep(fault.delay)
            elif fault.kind != "truncate":
                return self._fault_response(fault, exchange, weight_headers)
        replay = self.replays.get("coinbaseexchange" if exchange == "coinbase" else exchange)
        if replay is not None and replay.serves(request.path, request.query):
            try:
                body = replay.answer(self.state.clock.now_ms(), request.path, dict(request.query))
            except RefusedError as exc:
                return web.json_response({"error": str(exc)}, status=400, headers=weight_headers)
            response: web.StreamResponse = web.json_response(body)
        else:
            response = await handler(request)
        if fault is not None and fault.kind == "truncate" and isinstance(response, web.Response):
            response = self._truncated(response, fault.keep)
        if weight_headers and not response.prepared:
            response.headers.update(weight_headers)
        return response

    @staticmethod
    def _truncated(response: web.Response, keep: float) -> web.Response:
        """A successful JSON candle answer cut short (fault `truncate`); others as they are."""
        if response.status != 200 or not isinstance(response.body, bytes):
            return response
        try:
            body = json.loads(response.body)
        except ValueError:
            return response
        return web.json_response(truncate(body, keep))

    def _fault_response(self, fault: Fault, exchange: str, headers: dict[str, str]) -> web.Response:
        binance = exchange == "binance"
        if fault.kind == "rate_limit":
            retry = {**headers, "Retry-After": str(fault.retry_after)}
            if binance:
                return binance_error(
                    429,
                    -1003,
                    "Too many requests; current limit of IP(127.0.0.1) is 6000 requests per "
                    "minute. "
                    "Please use the websocket for live updates to avoid polling the API.",
                    headers=retry,
                )
            return web.json_response(
                {"message": "Public rate limit exceeded"}, status=429, headers=retry
            )
        if fault.kind == "ban":
            until = self.state.clock.now_ms() + fault.retry_after * 1000
            retry = {**headers, "Retry-After": str(fault.retry_after)}
            if binance:
                return binance_error(
                    418,
                    -1003,
                    f"Way too many requests; IP(127.0.0.1) banned until {until}. "
                    "Please use the websocket for live updates to avoid bans.",
                    headers=retry,
                )
            return web.json_response({"message": "IP banned"}, status=418, headers=retry)
        if fault.kind == "unavailable":
            # Not JSON on purpose: ccxt then maps the status, 503 -> ExchangeNotAvailable.
            return web.Response(
                status=503,
                text="<html><body><h1>503 Service Unavailable</h1></body></html>",
                content_type="text/html",
                headers=headers,
            )
        if fault.kind == "unknown_symbol":
            if binance:
                return binance_error(400, -1121, "Invalid symbol.", headers=headers)
            if exchange == "okx":
                return okx_error("51001", "Instrument ID does not exist")
            if exchange == "bybit":
                return bybit_error(10001, "Not supported symbols", self.state.clock.now_ms())
            if exchange == "kraken":
                return kraken_error("EQuery:Unknown asset pair")
            return coinbase_error(404, "NotFound")
        # "error": arbitrary status and body
        if fault.body is not None:
            return web.Response(
                status=fault.status,
                text=fault.body,
                content_type="application/json",
                headers=headers,
            )
        if binance:
            return binance_error(
                fault.status,
                -1000,
                "An unknown error occurred while processing the request.",
                headers=headers,
            )
        return coinbase_error(fault.status, "Internal server error")

    # ------------------------------------------------------ control handlers
    async def _json_body(self, request: web.Request) -> dict[str, Any]:
        if not request.can_read_body:
            return {}
        try:
            data = await request.json()
        except json.JSONDecodeError as exc:
            raise web.HTTPBadRequest(
                text=json.dumps({"error": f"bad JSON: {exc}"}), content_type="application/json"
            ) from None
        if not isinstance(data, dict):
            raise web.HTTPBadRequest(
                text=json.dumps({"error": "expected a JSON object"}),
                content_type="application/json",
            )
        return data

    @staticmethod
    def _bad(message: str) -> web.Response:
        return web.json_response({"error": message}, status=400)

    async def _h_health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "now_ms": self.now_ms(), "base_url": self.base_url})

    async def _h_stats(self, request: web.Request) -> web.Response:
        include_log = request.query.get("log", "1") not in ("0", "false", "no")
        return web.json_response(self.stats(include_log=include_log))

    async def _h_universe(self, request: web.Request) -> web.Response:
        return web.json_response(self.universe_info())

    async def _h_reset(self, request: web.Request) -> web.Response:
        self.reset()
        return web.json_response({"ok": True})

    async def _h_faults_list(self, request: web.Request) -> web.Response:
        return web.json_response({"faults": [f.to_json() for f in self.pending_faults()]})

    async def _h_faults_add(self, request: web.Request) -> web.Response:
        """Body: one fault object, or ``{"faults": [...]}``; ``ws_drop`` acts immediately."""
        data = await self._json_body(request)
        items = data.get("faults", [data])
        if not isinstance(items, list):
            return self._bad("faults must be a list")
        added, dropped = [], 0
        for item in items:
            if not isinstance(item, dict):
                return self._bad("each fault must be an object")
            if item.get("kind") == "ws_drop":
                try:
                    dropped += await self.drop_websockets(
                        item.get("symbol"), str(item.get("mode", "close"))
                    )
                except (ValueError, UnknownSymbolError) as exc:
                    return self._bad(str(exc))
                continue
            try:
                fault = self._armed(parse_fault(item))
            except (FaultError, UnknownSymbolError) as exc:
                return self._bad(f"bad fault: {exc}")
            if fault.kind == "ws_outage":  # acts at once, as ws_drop
                dropped += await self.streams.outage(fault)
            added.append(fault)
        return web.json_response({"faults": [f.to_json() for f in added], "ws_dropped": dropped})

    async def _h_faults_clear(self, request: web.Request) -> web.Response:
        """``?kind=ws_outage`` disarms only that kind (ends an outage early)."""
        self.clear_faults(request.query.get("kind"))
        return web.json_response({"ok": True})

    async def _h_trades(self, request: web.Request) -> web.Response:
        """Body: ``{"symbol": "BTC/USDT", "trades": [{"price": "1", "qty": "2", ...}]}``."""
        data = await self._json_body(request)
        trades = data.get("trades")
        if not isinstance(trades, list) or not all(isinstance(t, dict) for t in trades):
            return self._bad("trades must be a list of objects")
        try:
            before = self.subscribers(str(data.get("symbol")))
            built = self.inject_trades(str(data.get("symbol")), trades)
        except (UnknownSymbolError, ValueError) as exc:
            return self._bad(f"cannot inject: {exc}")
        return web.json_response({"trades": [_trade_json(t) for t in built], "subscribers": before})

    async def _h_trades_list(self, request: web.Request) -> web.Response:
        """``?symbol=BTC/USDT&from_ms=A&to_ms=B``: the model trades of the market with
        ``A <= time <= B``, oldest first: what its exchanges traded (REST serves them;
        streams skip those a fault dropped), for a soak to check a recording against."""
        symbol = request.query.get("symbol", "")
        try:
            first, last = int(request.query["from_ms"]), int(request.query["to_ms"])
        except (KeyError, ValueError):
            return self._bad("from_ms and to_ms (epoch milliseconds) are required")
        if not 0 <= last - first <= TRADES_LIST_MAX_MS:
            return self._bad(f"to_ms - from_ms must be within 0..{TRADES_LIST_MAX_MS}")
        try:
            trades = [_trade_json(t) for t in self.model.iter_trades(symbol, first, last)]
        except UnknownSymbolError as exc:
            return self._bad(f"no trades: {exc}")
        return web.json_response({"symbol": symbol, "trades": trades})

    async def _h_replay(self, request: web.Request) -> web.Response:
        """Body: ``{"exchange": "okx", "period_ms": 60000, "rows": [[...], ...]}``: raw rows
        (infra.exchange_sim.replay.series) the exchange then serves for its BTC/USDT."""
        data = await self._json_body(request)
        exchange, rows = str(data.get("exchange")), data.get("rows")
        period = data.get("period_ms")
        windows = WINDOWS.get(exchange)
        if windows is None:
            return self._bad(f"no replay for exchange {exchange!r}: one of {sorted(WINDOWS)}")
        if not isinstance(period, int) or period not in windows.timeframes:
            return self._bad(f"period_ms must be one of {sorted(windows.timeframes)}")
        if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows):
            return self._bad("rows must be a list of raw candle rows")
        self.replays[exchange] = Replay(exchange, period, sorted(rows, key=windows.open_ms))
        return web.json_response({"exchange": exchange, "rows": len(rows)})

    async def _h_replay_clear(self, request: web.Request) -> web.Response:
        cleared = len(self.replays)
        self.replays.clear()
        return web.json_response({"cleared": cleared})

    async def _h_ws_drop(self, request: web.Request) -> web.Response:
        data = await self._json_body(request)
        try:
            count = await self.drop_websockets(data.get("symbol"), str(data.get("mode", "close")))
        except (ValueError, UnknownSymbolError) as exc:
            return self._bad(str(exc))
        return web.json_response({"dropped": count})

    async def _h_subscribers(self, request: web.Request) -> web.Response:
        """``?symbol=BTC/USDT`` -> count; add ``&wait=N&timeout=S`` to long-poll for N."""
        symbol = request.query.get("symbol", "")
        try:
            if "wait" in request.query:
                await self.wait_for_subscribers(
                    symbol, int(request.query["wait"]), float(request.query.get("timeout", "10"))
                )
            return web.json_response({"symbol": symbol, "count": self.subscribers(symbol)})
        except UnknownSymbolError:
            return self._bad(f"unknown symbol {symbol!r}")
        except TimeoutError as exc:
            return web.json_response(
                {"error": str(exc), "count": self.subscribers(symbol)}, status=408
            )

    async def _h_book(self, request: web.Request) -> web.Response:
        """``?symbol=BTC/USDT[&step=N]``: the book (its stream's position, or at update id N)."""
        symbol = request.query.get("symbol", "")
        try:
            step = int(request.query["step"]) if "step" in request.query else None
            book = self.book(symbol, step)
        except (UnknownSymbolError, ValueError) as exc:
            return self._bad(f"no book: {exc}")
        return web.json_response(
            {
                "step": book.step,
                "bids": [[str(p), str(a)] for p, a in book.bids],
                "asks": [[str(p), str(a)] for p, a in book.asks],
                "subscribers": self.book_subscribers(symbol),
            }
        )

    async def _h_clock_get(self, request: web.Request) -> web.Response:
        return web.json_response({"now_ms": self.now_ms(), "frozen": self.state.clock.frozen})

    async def _h_clock_set(self, request: web.Request) -> web.Response:
        """``{"now_ms": 1700000000000}`` freezes, ``{"now_ms": null}`` unfreezes,
        ``{"advance_ms": 60000}`` moves time and streams the trades now due."""
        data = await self._json_body(request)
        sent = 0
        try:
            if "now_ms" in data:
                self.set_time(None if data["now_ms"] is None else int(data["now_ms"]))
            if "advance_ms" in data:
                sent = self.advance_time(int(data["advance_ms"]))
        except (TypeError, ValueError) as exc:
            return self._bad(str(exc))
        return web.json_response(
            {"now_ms": self.now_ms(), "frozen": self.state.clock.frozen, "trades_streamed": sent}
        )


def path_is_rest(path: str) -> bool:
    return path.startswith(("/api/", "/fapi/", "/dapi/", "/sapi/", "/eapi/"))


class ThreadedSimulator:
    """A ``SimulatorServer`` on its own event loop thread, driven from sync code.

    Every method marshals onto the server's loop, so it is safe to call from
    the test thread (or from another event loop, e.g. inside ``asyncio.run``).
    """

    def __init__(self, **options: Any) -> None:
        self.server = SimulatorServer(**options)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> ThreadedSimulator:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            try:
                loop.run_until_complete(self.server.start())
            except BaseException as exc:  # report to the starting thread
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
                loop.run_until_complete(self.server.stop())
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name="exchange-sim", daemon=True)
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("exchange simulator did not start within 30 s")
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)
        self._thread = None

    def __enter__(self) -> ThreadedSimulator:
        return self if self._thread is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _await(self, coro: Coroutine[Any, Any, T], timeout: float | None = 60.0) -> T:
        if self._loop is None:
            raise RuntimeError("simulator not started")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _call(self, fn: Callable[[], T]) -> T:
        async def wrapper() -> T:
            return fn()

        return self._await(wrapper())

    # Same control surface as SimulatorServer, synchronous.
    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def model(self) -> MarketModel:
        return self.server.model

    def add_fault(self, kind: str, **options: Any) -> Fault:
        return self._call(lambda: self.server.add_fault(kind, **options))

    def ws_outage(
        self,
        symbol: str | None = None,
        exchange: str | None = None,
        seconds: float = 120.0,
        mode: str = "close",
    ) -> Fault:
        return self._await(self.server.ws_outage(symbol, exchange, seconds, mode))

    def clear_faults(self, kind: str | None = None) -> int:
        return self._call(lambda: self.server.clear_faults(kind))

    def pending_faults(self) -> list[Fault]:
        return self._call(self.server.pending_faults)

    def inject_trades(self, symbol: str, trades: Sequence[Mapping[str, Any]]) -> list[Trade]:
        return self._call(lambda: self.server.inject_trades(symbol, trades))

    def drop_websockets(self, symbol: str | None = None, mode: str = "close") -> int:
        return self._await(self.server.drop_websockets(symbol, mode))

    def subscribers(self, symbol: str) -> int:
        return self._call(lambda: self.server.subscribers(symbol))

    def wait_for_subscribers(self, symbol: str, count: int = 1, timeout: float = 10.0) -> None:
        self._await(self.server.wait_for_subscribers(symbol, count, timeout), timeout + 5)

    def book(self, symbol: str, step: int | None = None) -> SimBook:
        return self._call(lambda: self.server.book(symbol, step))

    def book_subscribers(self, symbol: str) -> int:
        return self._call(lambda: self.server.book_subscribers(symbol))

    def now_ms(self) -> int:
        return self._call(self.server.now_ms)

    def set_time(self, now_ms: int | None) -> None:
        self._call(lambda: self.server.set_time(now_ms))

    def advance_time(self, delta_ms: int) -> int:
        return self._call(lambda: self.server.advance_time(delta_ms))

    def stats(self, *, include_log: bool = True) -> dict[str, Any]:
        return self._call(lambda: self.server.stats(include_log=include_log))

    def reset(self) -> None:
        self._call(self.server.reset)

    def universe_info(self) -> dict[str, Any]:
        return self.server.universe_info()


def run_in_thread(**options: Any) -> ThreadedSimulator:
    """Start a simulator in a background thread; ``.base_url`` is ready on return.

    Use as a context manager (``with run_in_thread() as sim:``) or call ``stop()``.
    Options are those of ``SimulatorServer``.
    """
    return ThreadedSimulator(**options).start()
