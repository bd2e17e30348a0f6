"""What the soaks of a running `make run` share (bench/soak.py, bench/chaos_soak.py).

They attach to the platform as a user's second shell does: its pid files tell
which component restarted, its logs what went wrong beside them, its markets
table which tickers deliver live data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from infra.exchange_sim import DEFAULT_MODEL, UnknownSymbolError
from mdclient import Client


@dataclass
class LogWatch:
    """The part of a log file written after the soak started."""

    path: Path
    offset: int = field(init=False)

    def __post_init__(self) -> None:
        self.offset = self.path.stat().st_size if self.path.exists() else 0

    def matches(self, pattern: re.Pattern[str]) -> list[str]:
        if not self.path.exists():
            return []
        with self.path.open(errors="replace") as handle:
            handle.seek(self.offset)
            return [line.rstrip() for line in handle if pattern.search(line)]


def pids(data_dir: Path) -> dict[str, str]:
    """Component name -> pid, from the platform's pid files."""
    found: dict[str, str] = {}
    for path in data_dir.glob("**/run/*.pid"):
        text = path.read_text(errors="replace")
        match = re.search(r'"pid":\s*(\d+)', text)
        if match:
            found[path.stem] = match[1]
    return found


def trades_per_minute(ticker: str) -> float:
    """How often the exchange simulator's market trades (0: not a simulator market)."""
    try:
        spec = DEFAULT_MODEL.spec(ticker.partition(":")[2])
    except UnknownSymbolError:
        return 0.0
    return spec.trades_per_minute * spec.active_fraction


def pick_tickers(rows: list[dict[str, object]], exchange: str, count: int) -> list[str]:
    """`count` distinct active markets of `rows` (the markets table), most liquid first.

    Alphabetical among equals, so a run picks the same tickers every time.
    """
    active = {str(r["ticker"]) for r in rows if r.get("active", True)}
    tickers = sorted(active, key=lambda t: (-trades_per_minute(t), t))
    if len(tickers) < count:
        raise SystemExit(f"only {len(tickers)} active markets on {exchange}; asked for {count}")
    return tickers[:count]


def live_tickers(client: Client, exchange: str, count: int) -> list[str]:
    """`count` active markets the platform knows on `exchange` (`pick_tickers`)."""
    return pick_tickers(client.markets(exchange).to_pylist(), exchange, count)


def say(line: str) -> None:
    print(line, flush=True)  # progress shows as it happens, also into a file
