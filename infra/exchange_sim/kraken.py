"""Kraken spot front-end (ccxt id ``kraken``), REST only: assets, pairs, time, OHLC.

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
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from .model import SymbolSpec, fmt8, interval_ms, interval_open
from .state import SimState

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

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/0/public/Time", self.server_time),
            web.get("/0/public/Assets", self.assets),
            web.get("/0/public/AssetPairs", self.asset_pairs),
            web.get("/0/public/OHLC", self.ohlc),
        ]

    def _spec(self, pair: str) -> SymbolSpec | None:
        specs = self.state.model.specs.values()
        return next((s for s in specs if pair_id(s) == pair), None)

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
