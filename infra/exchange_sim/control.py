"""HTTP client for the simulator's control API, for a simulator in another process.

`make run` and the e2e tests run the simulator as its own process; this is the
synchronous counterpart of the in-process methods on `ThreadedSimulator`.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from typing import Any

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class SimulatorControl:
    def __init__(self, base_url: str, timeout_s: float = 120.0) -> None:
        self.base_url = base_url.rstrip("/")  # the exchanges' base URL too
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, body: object | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.base_url}/_sim/{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with _NO_PROXY.open(request, timeout=self.timeout_s) as resp:
            return json.loads(resp.read() or b"null")

    def add_fault(self, kind: str, **options: object) -> None:
        """Arm a fault (see README "Faults"), e.g. `add_fault("slow", delay=5, count=1)`."""
        self._call("POST", "faults", {"kind": kind, **options})

    def clear_faults(self, kind: str | None = None) -> None:
        """Disarm every fault, or those of `kind` (`"ws_outage"`: end an outage early)."""
        self._call("DELETE", "faults" + ("" if kind is None else f"?kind={kind}"))

    def pending_faults(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "faults")["faults"])

    def trade_drop(self, symbol: str, count: int = 1, exchange: str | None = None) -> None:
        """The trade streams of `symbol` (of `exchange` only, if given) skip its next
        `count` model trades; the ids they skipped are in `stats()["faults_triggered"]`."""
        self.add_fault("trade_drop", symbol=symbol, count=count, exchange=exchange)

    def ws_outage(
        self,
        symbol: str | None = None,
        exchange: str | None = None,
        seconds: float = 120.0,
        mode: str = "close",
    ) -> int:
        """Close the stream connections (of `symbol`, of `exchange`: None = all) and refuse
        new ones for `seconds` of the simulator clock; returns the connections closed."""
        body = {
            "kind": "ws_outage",
            "symbol": symbol,
            "exchange": exchange,
            "seconds": seconds,
            "mode": mode,
        }
        return int(self._call("POST", "faults", body)["ws_dropped"])

    def wait_for_subscribers(self, symbol: str, count: int = 1, timeout_s: float = 60) -> None:
        """Block until exactly `count` stream connections watch `symbol`'s trades."""
        query = urllib.parse.urlencode({"symbol": symbol, "wait": count, "timeout": timeout_s})
        self._call("GET", f"subscribers?{query}")

    def inject_trades(self, symbol: str, trades: list[dict[str, object]]) -> list[dict[str, Any]]:
        """Push trades to the symbol's subscribers now; returns them with ids and times."""
        answer = self._call("POST", "trades", {"symbol": symbol, "trades": trades})
        return list(answer["trades"])

    def trades(self, symbol: str, from_ms: int, to_ms: int) -> list[dict[str, Any]]:
        """The market's model trades with ``from_ms <= time <= to_ms`` (at most 6 h),
        oldest first: ``{"id", "symbol", "time_ms", "price", "qty", "buyer_is_maker"}``."""
        query = urllib.parse.urlencode({"symbol": symbol, "from_ms": from_ms, "to_ms": to_ms})
        return list(self._call("GET", f"trades?{query}")["trades"])

    def replay(self, exchange_id: str, period_ms: int, rows: list[list[Any]]) -> None:
        """Serve these raw candle rows (infra.exchange_sim.replay.series) for the exchange's
        BTC/USDT at `period_ms`, with its window semantics, until `clear_replays`."""
        self._call(
            "POST", "replay", {"exchange": exchange_id, "period_ms": period_ms, "rows": rows}
        )

    def clear_replays(self) -> None:
        self._call("DELETE", "replay")

    def stats(self, *, include_log: bool = False) -> dict[str, Any]:
        """Request counters; with `include_log`, every request served (path, query)."""
        return dict(self._call("GET", f"stats?log={int(include_log)}"))

    def now_ms(self) -> int:
        return int(self._call("GET", "health")["now_ms"])

    def universe(self) -> dict[str, Any]:
        """The load generator's markets (`--universe`): settings, `symbols` hottest first,
        their `rates` in trades/s outside bursts; `{"markets": 0, ...}` without one."""
        return dict(self._call("GET", "universe"))

    def book(self, symbol: str, step: int | None = None) -> dict[str, Any]:
        """The exchange's book of `symbol` at update id `step` (None: where its stream
        is): `{"step", "bids", "asks", "subscribers"}`, levels as [price, amount] strings."""
        query = f"book?symbol={symbol}" + ("" if step is None else f"&step={step}")
        return dict(self._call("GET", query))

    def advance_time(self, delta_ms: int) -> int:
        """Move the simulator's clock on and stream the model trades now due; returns
        how many were streamed (its REST answers follow the same clock)."""
        answer = self._call("POST", "clock", {"advance_ms": delta_ms})
        return int(answer["trades_streamed"])
