"""Offline exchange simulator: Binance, Bybit spot and OKX (REST + trade streams), Coinbase
Exchange and Kraken (REST), every exchange's order books and trade-history paging.

Unmodified ccxt talks to it once ``point_ccxt_at`` has rewritten the
exchange's URLs; data come from a deterministic model so tests can recompute
every candle with ``expected_klines``. See README.md.
"""

from .ccxt_glue import point_ccxt_at, rewrite_url
from .faults import Fault
from .model import (
    DEFAULT_MODEL,
    DEFAULT_SPECS,
    INTERVAL_MS,
    MODEL_ID_FLOOR,
    Kline,
    MarketModel,
    SymbolSpec,
    Trade,
    UnknownIntervalError,
    UnknownSymbolError,
    expected_klines,
    interval_open,
)
from .server import SimulatorServer, ThreadedSimulator, run_in_thread

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_SPECS",
    "INTERVAL_MS",
    "MODEL_ID_FLOOR",
    "Fault",
    "Kline",
    "MarketModel",
    "SimulatorServer",
    "SymbolSpec",
    "ThreadedSimulator",
    "Trade",
    "UnknownIntervalError",
    "UnknownSymbolError",
    "expected_klines",
    "interval_open",
    "point_ccxt_at",
    "rewrite_url",
    "run_in_thread",
]
