"""Recorded exchange candles served with each exchange's real window semantics.

ccxt keeps candle responses recorded from the real APIs as static test data
(services/ingestor/tests/fixtures/exchanges, provenance in SOURCE.md). They
hold 3 to 6 candles, too few for multi-page requests, so `series` cycles the
recorded raw rows over consecutive periods (some left empty, as an exchange
does when nothing traded), re-stamped and otherwise verbatim. `Windows`
answers a candle request over such rows the way the exchange does (which
rows, in what order, which bounds are exclusive, which limits are refused).

Two users: the ingestor's wire tests serve it to ccxt through the adapter's
injected transport; the simulator serves it over HTTP (`POST /_sim/replay`)
so that recorded candles go through the whole platform, ingestor to Iceberg.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

MIN = 60_000
HOUR = 3_600_000

RECORDINGS = Path(__file__).resolve().parents[2] / "services/ingestor/tests/fixtures/exchanges"

#: (open time ms, open, high, low, close, volume): what every exchange reports.
Ohlcv = tuple[int, float, float, float, float, float]


class RefusedError(Exception):
    """The exchange's answer to a request it does not take (HTTP 400)."""


class Windows:
    """One exchange's candle endpoint over a list of raw rows (ascending by open)."""

    exchange_id: ClassVar[str] = ""
    market_id: ClassVar[str] = ""
    max_limit: ClassVar[int] = 0
    paths: ClassVar[tuple[str, ...]] = ()
    timeframes: ClassVar[Mapping[int, str]] = {}  # period ms -> the exchange's interval
    #: The query parameters naming the market and the interval ("" = in the path).
    market_param: ClassVar[str] = "symbol"
    interval_param: ClassVar[str] = "interval"

    # per exchange (defaults: rows [ms as text, open, high, low, close, volume, ...])
    @staticmethod
    def open_ms(row: list[Any]) -> int:
        return int(row[0])

    @staticmethod
    def stamp(row: list[Any], open_ms: int, period_ms: int) -> list[Any]:
        """The row re-stamped to open at `open_ms`."""
        return [str(open_ms), *row[1:]]

    @staticmethod
    def ohlcv(row: list[Any]) -> Ohlcv:
        """The exchange's documented row layout, read without ccxt (the oracle)."""
        return (int(row[0]), *(float(v) for v in row[1:6]))  # type: ignore[return-value]

    @classmethod
    def rows_of(cls, body: Any) -> list[list[Any]]:
        """The raw rows of a recorded response body."""
        return list(body)

    def answer(
        self, rows: list[list[Any]], period_ms: int, now_ms: int, path: str, query: dict[str, str]
    ) -> Any:
        raise NotImplementedError

    # shared ---------------------------------------------------------------
    def expect(self, keys: set[str], query: dict[str, str], required: set[str]) -> None:
        unknown = set(query) - keys
        if unknown:
            raise RefusedError(f"{self.exchange_id}: unknown parameters {sorted(unknown)}")
        missing = required - set(query)
        if missing:
            raise RefusedError(f"{self.exchange_id}: missing parameters {sorted(missing)}")

    def check(self, name: str, got: str, want: str) -> None:
        if got != want:
            raise RefusedError(f"{self.exchange_id}: {name} {got!r} is not the replayed {want!r}")

    def limit(self, query: dict[str, str], default: int) -> int:
        limit = int(query.get("limit", default))
        if not 1 <= limit <= self.max_limit:
            raise RefusedError(f"{self.exchange_id}: limit {limit} out of range")
        return limit

    def between(self, rows: list[list[Any]], low: int, high: int) -> list[list[Any]]:
        """Rows opening in [low, high], ascending."""
        return [r for r in rows if low <= self.open_ms(r) <= high]


class BinanceWindows(Windows):
    """GET /api/v3/klines: startTime/endTime inclusive; the OLDEST `limit` (max 1000)."""

    exchange_id, market_id, max_limit = "binance", "BTCUSDT", 1000
    paths = ("/api/v3/klines",)
    timeframes = {MIN: "1m", HOUR: "1h"}

    @staticmethod
    def stamp(row: list[Any], open_ms: int, period_ms: int) -> list[Any]:
        return [open_ms, *row[1:6], open_ms + period_ms - 1, *row[7:]]

    def answer(
        self, rows: list[list[Any]], period_ms: int, now_ms: int, path: str, query: dict[str, str]
    ) -> Any:
        keys = {"symbol", "interval", "startTime", "endTime", "limit"}
        self.expect(keys, query, {"symbol", "interval", "startTime"})
        self.check("symbol", query["symbol"], self.market_id)
        self.check("interval", query["interval"], self.timeframes[period_ms])
        limit = self.limit(query, 500)
        end = int(query.get("endTime", 2**62))
        return self.between(rows, int(query["startTime"]), end)[:limit]


class OkxWindows(Windows):
    """GET /api/v5/market/(history-)candles: rows with before < ts < after (both
    exclusive), the NEWEST `limit` (max 300), newest first."""

    exchange_id, market_id, max_limit = "okx", "BTC-USDT", 300
    paths = ("/api/v5/market/candles", "/api/v5/market/history-candles")
    timeframes = {MIN: "1m", HOUR: "1H"}
    market_param, interval_param = "instId", "bar"

    @classmethod
    def rows_of(cls, body: Any) -> list[list[Any]]:
        return list(body["data"])

    def answer(
        self, rows: list[list[Any]], period_ms: int, now_ms: int, path: str, query: dict[str, str]
    ) -> Any:
        self.expect({"instId", "bar", "limit", "before", "after"}, query, {"instId", "bar"})
        self.check("instId", query["instId"], self.market_id)
        self.check("bar", query["bar"], self.timeframes[period_ms])
        limit = self.limit(query, 100)
        low = int(query.get("before", -1)) + 1
        high = int(query.get("after", 2**62)) - 1
        newest_first = self.between(rows, low, high)[::-1]
        return {"code": "0", "msg": "", "data": newest_first[:limit]}


class BybitWindows(Windows):
    """GET /v5/market/kline: start/end inclusive; the NEWEST `limit` (max 1000),
    newest first."""

    exchange_id, market_id, max_limit = "bybit", "BTCUSDT", 1000
    paths = ("/v5/market/kline",)
    timeframes = {MIN: "1", HOUR: "60"}

    @classmethod
    def rows_of(cls, body: Any) -> list[list[Any]]:
        return list(body["result"]["list"])

    def answer(
        self, rows: list[list[Any]], period_ms: int, now_ms: int, path: str, query: dict[str, str]
    ) -> Any:
        keys = {"category", "symbol", "interval", "start", "end", "limit"}
        self.expect(keys, query, {"category", "symbol", "interval"})
        self.check("category", query["category"], "spot")
        self.check("symbol", query["symbol"], self.market_id)
        self.check("interval", query["interval"], self.timeframes[period_ms])
        limit = self.limit(query, 200)
        window = self.between(rows, int(query.get("start", 0)), int(query.get("end", 2**62)))
        return {
            "retCode": 0,
            "retMsg": "OK",
            "result": {"category": "spot", "symbol": self.market_id, "list": window[::-1][:limit]},
            "retExtInfo": {},
            "time": now_ms,
        }


class SecondsWindows(Windows):
    """Rows stamped with the open time in seconds, as a number."""

    @staticmethod
    def open_ms(row: list[Any]) -> int:
        return int(row[0]) * 1000

    @staticmethod
    def stamp(row: list[Any], open_ms: int, period_ms: int) -> list[Any]:
        return [open_ms // 1000, *row[1:]]


class KrakenWindows(SecondsWindows):
    """GET /0/public/OHLC: entries opening after `since` (seconds) among the latest
    720 (the last one still open), oldest first; no end, no limit. Rows
    [time s, open, high, low, close, vwap, volume, count]."""

    exchange_id, market_id, max_limit = "kraken", "XBTUSDT", 720
    paths = ("/0/public/OHLC",)
    timeframes = {MIN: "1", HOUR: "60"}
    market_param = "pair"

    @staticmethod
    def ohlcv(row: list[Any]) -> Ohlcv:
        return (int(row[0]) * 1000, *(float(row[i]) for i in (1, 2, 3, 4, 6)))  # type: ignore[return-value]

    @classmethod
    def rows_of(cls, body: Any) -> list[list[Any]]:
        return list(body["result"][cls.market_id])

    def answer(
        self, rows: list[list[Any]], period_ms: int, now_ms: int, path: str, query: dict[str, str]
    ) -> Any:
        self.expect({"pair", "interval", "since"}, query, {"pair", "interval"})
        self.check("pair", query["pair"], self.market_id)
        self.check("interval", query["interval"], self.timeframes[period_ms])
        current = now_ms - now_ms % period_ms
        oldest = current - 719 * period_ms
        after = int(query.get("since", 0)) * 1000
        window = [r for r in self.between(rows, oldest, current) if self.open_ms(r) > after]
        closed = [self.open_ms(r) for r in window if self.open_ms(r) < current]
        last = (max(closed) if closed else oldest) // 1000
        return {"error": [], "result": {self.market_id: window, "last": last}}


def _iso_ms(value: str) -> int:
    return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)


class CoinbaseWindows(SecondsWindows):
    """GET /products/{id}/candles: start/end (ISO 8601) inclusive, at most 300
    candles' span or HTTP 400; the whole window, newest first, rows
    [time s, low, high, open, close, volume]."""

    exchange_id, market_id, max_limit = "coinbaseexchange", "BTC-USDT", 300
    paths = ("/products/BTC-USDT/candles",)
    timeframes = {MIN: "60", HOUR: "3600"}
    market_param, interval_param = "", "granularity"

    @staticmethod
    def ohlcv(row: list[Any]) -> Ohlcv:
        return (int(row[0]) * 1000, *(float(row[i]) for i in (3, 2, 1, 4, 5)))  # type: ignore[return-value]

    def answer(
        self, rows: list[list[Any]], period_ms: int, now_ms: int, path: str, query: dict[str, str]
    ) -> Any:
        keys = {"granularity", "start", "end"}
        self.expect(keys, query, keys)
        self.check("granularity", query["granularity"], self.timeframes[period_ms])
        start, end = _iso_ms(query["start"]), _iso_ms(query["end"])
        if (end - start) // period_ms + 1 > self.max_limit:
            raise RefusedError(
                "granularity too small for the requested time range."
                " Count of aggregations requested exceeds 300"
            )
        return self.between(rows, start, end)[::-1]


@dataclass(frozen=True, slots=True)
class Replay:
    """Rows one exchange serves for its replayed market and period (the simulator's
    `POST /_sim/replay`); every other request still goes to the model."""

    exchange_id: str
    period_ms: int
    rows: list[list[Any]]

    @property
    def windows(self) -> Windows:
        return WINDOWS[self.exchange_id]()

    def serves(self, path: str, query: Mapping[str, str]) -> bool:
        w = WINDOWS[self.exchange_id]
        market = query.get(w.market_param) if w.market_param else w.market_id
        interval = query.get(w.interval_param)
        return (
            path in w.paths and market == w.market_id and interval == w.timeframes[self.period_ms]
        )

    def answer(self, now_ms: int, path: str, query: dict[str, str]) -> Any:
        """The exchange's JSON body; RefusedError for what it would refuse (HTTP 400)."""
        return self.windows.answer(self.rows, self.period_ms, now_ms, path, query)


WINDOWS: dict[str, type[Windows]] = {
    w.exchange_id: w
    for w in (BinanceWindows, OkxWindows, BybitWindows, KrakenWindows, CoinbaseWindows)
}


def recording(exchange_id: str) -> dict[str, Any]:
    """ccxt's recorded `fetchOHLCV` entry: `input`, `httpResponse`, `parsedResponse`."""
    return dict(json.loads((RECORDINGS / exchange_id / "fetch_ohlcv.json").read_text()))


def recorded_rows(exchange_id: str) -> list[list[Any]]:
    """The raw candle rows of the exchange's recorded response, ascending."""
    windows = WINDOWS[exchange_id]
    rows = windows.rows_of(recording(exchange_id)["httpResponse"])
    return sorted(rows, key=windows.open_ms)


def series(
    exchange_id: str, t0: int, slots: int, holes: set[int], period_ms: int
) -> list[list[Any]]:
    """`slots` periods from `t0` cycling the recorded raw rows, none at `holes`."""
    windows = WINDOWS[exchange_id]
    source = recorded_rows(exchange_id)
    return [
        windows.stamp(source[i % len(source)], t0 + i * period_ms, period_ms)
        for i in range(slots)
        if i not in holes
    ]
