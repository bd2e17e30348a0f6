"""Coinbase Exchange front-end (ccxt id ``coinbaseexchange``): REST, and the websocket
feed's order-book channels `level2` / `level2_batch` (snapshot, then `l2update`s).

Why Coinbase as the second format: ccxt loads its markets from two plain
endpoints (``/currencies``, ``/products``) with no asset-code aliasing, and
its candles endpoint takes arbitrary ``start``/``end`` windows (300 buckets,
newest first, empty buckets omitted), so historical backfill works the same
way as on Binance while every payload shape differs. Kraken's OHLC only
serves the latest 720 candles. Same deterministic model as Binance.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from .model import SymbolSpec, Trade, UnknownSymbolError, fmt8, interval_open
from .state import SimState

GRANULARITY_TO_INTERVAL = {60: "1m", 300: "5m", 900: "15m", 3600: "1h", 21600: "6h", 86400: "1d"}
MAX_CANDLES = 300


def coinbase_error(status: int, message: str) -> web.Response:
    """Coinbase's error body ``{"message": "..."}``."""
    return web.json_response({"message": message}, status=status)


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "Z"


def _parse_time(raw: str) -> int:
    """ISO 8601 (what ccxt sends) or unix seconds, to ms."""
    try:
        return int(float(raw) * 1000)
    except ValueError:
        pass
    parsed = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1000)


class _BadRequestError(Exception):
    def __init__(self, response: web.Response) -> None:
        super().__init__(response.text)
        self.response = response


class CoinbaseRest:
    """Handlers of the Coinbase Exchange public REST endpoints."""

    def __init__(self, state: SimState) -> None:
        self.state = state

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/time", self.server_time),
            web.get("/currencies", self.currencies),
            web.get("/products", self.products),
            web.get("/products/{id}", self.product),
            web.get("/products/{id}/candles", self.candles),
            web.get("/products/{id}/trades", self.trades),
        ]

    def _spec(self, product_id: str) -> SymbolSpec:
        try:
            spec = self.state.model.spec(product_id)
        except UnknownSymbolError:
            spec = None
        if spec is None or spec.coinbase_id != product_id:
            raise _BadRequestError(coinbase_error(404, "NotFound"))
        return spec

    def _product(self, spec: SymbolSpec) -> dict[str, Any]:
        online = spec.trading_at(self.state.clock.now_ms())
        return {
            "id": spec.coinbase_id,
            "base_currency": spec.base,
            "quote_currency": spec.quote,
            "quote_increment": spec.tick,
            "base_increment": spec.step,
            "display_name": f"{spec.base}-{spec.quote}",
            "min_market_funds": spec.min_notional,
            "margin_enabled": False,
            "post_only": False,
            "limit_only": False,
            "cancel_only": False,
            "status": "online" if online else "delisted",
            "status_message": "",
            "trading_disabled": not online,
            "fx_stablecoin": False,
            "max_slippage_percentage": "0.03000000",
            "auction_mode": False,
            "high_bid_limit_percentage": "",
        }

    async def server_time(self, request: web.Request) -> web.Response:
        now = self.state.clock.now_ms()
        return web.json_response({"iso": _iso(now), "epoch": now / 1000})

    async def currencies(self, request: web.Request) -> web.Response:
        codes: dict[str, str] = {}
        for spec in self.state.model.specs.values():
            codes.setdefault(spec.base, spec.step)
            codes.setdefault(spec.quote, "0.00000001")
        return web.json_response(
            [
                {
                    "id": code,
                    "name": code,
                    "min_size": step,
                    "status": "online",
                    "message": "",
                    "max_precision": step,
                    "convertible_to": [],
                    "details": {
                        "type": "crypto",
                        "symbol": None,
                        "network_confirmations": 6,
                        "sort_order": 0,
                        "push_payment_methods": [],
                        "group_types": [],
                        "display_name": None,
                        "processing_time_seconds": None,
                        "min_withdrawal_amount": float(step),
                        "max_withdrawal_amount": 10_000_000,
                    },
                    "default_network": code.lower(),
                    "supported_networks": [],
                    "display_name": code,
                }
                for code, step in sorted(codes.items())
            ]
        )

    async def products(self, request: web.Request) -> web.Response:
        return web.json_response([self._product(s) for s in self.state.model.specs.values()])

    async def product(self, request: web.Request) -> web.Response:
        try:
            return web.json_response(self._product(self._spec(request.match_info["id"])))
        except _BadRequestError as exc:
            return exc.response

    async def candles(self, request: web.Request) -> web.Response:
        """``[[time_s, low, high, open, close, volume], ...]`` newest first."""
        try:
            spec = self._spec(request.match_info["id"])
        except _BadRequestError as exc:
            return exc.response
        try:
            granularity = int(request.query.get("granularity", "60"))
            interval = GRANULARITY_TO_INTERVAL[granularity]
        except (ValueError, KeyError):
            return coinbase_error(400, "Unsupported granularity")
        length = granularity * 1000
        now = self.state.clock.now_ms()
        try:
            start = _parse_time(request.query["start"]) if "start" in request.query else None
            end = _parse_time(request.query["end"]) if "end" in request.query else None
        except ValueError:
            return coinbase_error(400, "Invalid start or end")
        if start is None and end is None:
            end = now
        if end is None:
            assert start is not None
            end = start + MAX_CANDLES * length
        if start is None:
            start = end - (MAX_CANDLES - 1) * length
        if start > end:
            return coinbase_error(400, "start must be before end")
        first = interval_open(interval, start)
        first = first if first == start else first + length
        if (end - first) // length + 1 > MAX_CANDLES:
            return coinbase_error(
                400,
                "granularity too small for the requested time range. "
                "Count of aggregations requested exceeds 300",
            )
        rows = await asyncio.to_thread(
            self.state.model.klines, spec.symbol, interval, start, end, now
        )
        return web.json_response(
            [
                [
                    k.open_time // 1000,
                    float(k.low),
                    float(k.high),
                    float(k.open),
                    float(k.close),
                    float(k.volume),
                ]
                for k in reversed(rows)
            ]
        )

    def _trade_page(
        self, spec: SymbolSpec, limit: int, before: int | None, after: int | None
    ) -> list[Trade]:
        now = self.state.clock.now_ms()
        model = self.state.model
        if before is not None:  # newer than the cursor
            newer = list(
                itertools.islice(model.iter_trades(spec.symbol, 0, now, from_id=before + 1), limit)
            )
            newer.reverse()
            return newer
        return list(
            itertools.islice(model.iter_trades_backward(spec.symbol, now, before_id=after), limit)
        )

    async def trades(self, request: web.Request) -> web.Response:
        """Newest first; ``after``/``before`` are trade-id cursors as on Coinbase."""
        try:
            spec = self._spec(request.match_info["id"])
            limit = max(1, min(1000, int(request.query.get("limit", "100"))))
            before = int(request.query["before"]) if "before" in request.query else None
            after = int(request.query["after"]) if "after" in request.query else None
        except _BadRequestError as exc:
            return exc.response
        except ValueError:
            return coinbase_error(400, "Invalid pagination parameter")
        page = await asyncio.to_thread(self._trade_page, spec, limit, before, after)
        headers = {}
        if page:
            headers = {"cb-before": str(page[0].id), "cb-after": str(page[-1].id)}
        return web.json_response(
            [
                {
                    "time": _iso(t.time_ms),
                    "trade_id": t.id,
                    "price": fmt8(t.price),
                    "size": fmt8(t.qty),
                    # Coinbase reports the maker's side.
                    "side": "buy" if t.buyer_is_maker else "sell",
                }
                for t in page
            ],
            headers=headers,
        )


# ----------------------------------------------------------------- websocket

#: `wss://ws-feed.exchange.coinbase.com` as `point_ccxt_at` rewrites it.
WS_PATH = "/ws-feed"
BOOK_CHANNELS = ("level2", "level2_batch")
_BOOK_KEY = "coinbase."


def book_key(channel: str, product_id: str) -> str:
    """How a connection records a book subscription (`coinbase.level2_batch.BTC-USDT`)."""
    return f"{_BOOK_KEY}{channel}.{product_id}"


def key_product(key: str) -> str | None:
    """`coinbase.level2.BTC-USDT` -> `BTC-USDT`; None for another key."""
    return key.rsplit(".", 1)[-1] if key.startswith(_BOOK_KEY) else None


def on_message(text: str, known: Callable[[str], bool]) -> tuple[list[Any], str, list[str]]:
    """A client message -> (the replies, `subscribe`/`unsubscribe`/"", its book keys).

    As Coinbase answers: `{"type": "subscriptions", "channels": [...]}` listing what
    the connection now holds, or `{"type": "error", "message", "reason"}`. `level2`
    needs a signed request (Coinbase requires authentication for it since 2023);
    `level2_batch`, the same messages batched every 50 ms, is public.
    """
    try:
        msg = json.loads(text)
    except json.JSONDecodeError:
        return [_error("Failed to parse request")], "", []
    kind = msg.get("type") if isinstance(msg, dict) else None
    if kind not in ("subscribe", "unsubscribe"):
        return [_error(f"Invalid type {kind!r}")], "", []
    assert isinstance(msg, dict)
    products = msg.get("product_ids") or []
    keys: list[str] = []
    for channel in msg.get("channels") or []:
        name = channel.get("name") if isinstance(channel, dict) else channel
        ids = channel.get("product_ids", products) if isinstance(channel, dict) else products
        ids = ids if isinstance(ids, list) else []
        if name not in BOOK_CHANNELS:
            return [_error("Failed to subscribe", f"{name} is not a valid channel")], "", []
        if name == "level2" and kind == "subscribe" and "signature" not in msg:
            return [_error("Failed to subscribe", "level2 requires authentication")], "", []
        for product_id in ids:
            if not known(product_id):
                return (
                    [_error("Failed to subscribe", f"{product_id} is not a valid product")],
                    "",
                    [],
                )
            keys.append(book_key(str(name), str(product_id)))
    return [], str(kind), keys


def subscriptions(keys: Iterable[str]) -> dict[str, Any]:
    """The `subscriptions` reply: every channel of the connection with its products."""
    channels: dict[str, list[str]] = {}
    for key in sorted(keys):
        if key.startswith(_BOOK_KEY):
            channel, _, product_id = key.removeprefix(_BOOK_KEY).partition(".")
            channels.setdefault(channel, []).append(product_id)
    return {
        "type": "subscriptions",
        "channels": [{"name": n, "product_ids": ids} for n, ids in channels.items()],
    }


def _error(message: str, reason: str = "") -> dict[str, Any]:
    return {"type": "error", "message": message, "reason": reason}
