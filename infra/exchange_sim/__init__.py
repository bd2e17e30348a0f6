"""Offline exchange simulator: Binance, Bybit spot and OKX (REST + trade streams), Coinbase
Exchange and Kraken (REST), every exchange's order books and trade-history paging.

Unmodified ccxt talks to it once ``point_ccxt_at`` has rewritten the
exchange's URLs; data come from a deterministic model so tests can recompute
every candle with ``expected_klines``. ``Universe`` makes it a load generator (N more
markets, a Zipf law of trade rates, bursts). See README.md.
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
    Pacing,
    SymbolSpec,
    Trade,
    UnknownIntervalError,
    UnknownSymbolError,
    expected_klines,
    interval_open,
)
from .server import SimulatorServer, ThreadedSimulator, run_in_thread
from .universe import Universe

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_SPECS",
    "INTERVAL_MS",
    "MODEL_ID_FLOOR",
    "Fault",
    "Kline",
    "MarketModel",
    "Pacing",
    "SimulatorServer",
    "SymbolSpec",
    "ThreadedSimulator",
    "Trade",
    "Universe",
    "UnknownIntervalError",
    "UnknownSymbolError",
    "expected_klines",
    "interval_open",
    "point_ccxt_at",
    "rewrite_url",
    "run_in_thread",
]
