"""Gap repair: the time to fill a recorded market's outage from the exchange's trade
history, against a bare ccxt page loop over the same trades, side by side.

    .venv/bin/python bench/gap_repair.py [--minutes 10] [--rate 20] [--repeat 3]
        [--kafka HOST:PORT]

Starts the exchange simulator as its own process (weight limit off, BTC/USDT trading
`--rate` trades a second) and a local Kafka (infra.localstack) unless --kafka is
given. The gap is `--minutes` of BTC/USDT's trades ending a minute ago; its two ends
are model trades, as a recorder would have seen them.

- `ccxt_loop`: ccxt's `fetch_trades` by `fromId` (Binance historicalTrades, 1000 a
  page) one page after another until the gap's end, trades parsed, nothing sent:
  what any script that backfills a gap does;
- `repair`: the ingestor's `repair_gap` (ingestor.repair): the same pages through
  the venue's RepairPlan, each trade a `Tick{repaired}` produced to Kafka, the last
  one's delivery awaited before the gap is REPAIRED.

The ccxt rate limiter is off in both, so the figures measure the platform, not
Binance's weight limit (6,000 a minute: a 10-minute gap at 20 trades/s is 12 pages
of weight 25, far inside it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import ccxt.async_support as ccxt_async
from pipeline_common import start_simulator
from pydantic import SecretStr

from infra.exchange_sim import point_ccxt_at
from infra.exchange_sim.model import MarketModel
from ingestor.config import Credentials, ExchangeSettings, KafkaSettings
from ingestor.exchange_calls import FetchEnv
from ingestor.exchanges import ExchangeAdapter
from ingestor.kafka_sink import KafkaSink
from ingestor.live import GapFound, TradePoint
from ingestor.repair import repair_gap
from mdproto.messages import TradeGap
from mdproto.runtime.kafka import TopicSpec

SYMBOL = "BTC/USDT"
MINUTE_MS = 60_000


def the_gap(rate: float, minutes: int) -> tuple[GapFound, int]:
    """A gap of `minutes` ending a minute ago, and how many trades it lacks."""
    model = MarketModel().with_trade_rate({SYMBOL: rate})
    end = (int(time.time() * 1000) // MINUTE_MS - 1) * MINUTE_MS
    trades = list(model.iter_trades(SYMBOL, end - minutes * MINUTE_MS, end))
    first, last = trades[0], trades[-1]
    gap = GapFound(
        f"BINANCE:{SYMBOL}",
        TradePoint(str(first.id), first.time_ms),
        TradePoint(str(last.id), last.time_ms),
        TradeGap.RECONNECT,
        len(trades) - 2,
    )
    return gap, len(trades) - 2


async def ccxt_loop(base_url: str, gap: GapFound) -> int:
    exchange = ccxt_async.binance(
        {
            "apiKey": "bench",
            "enableRateLimit": False,
            "options": {"fetchMarkets": {"types": ["spot"]}},
        }
    )
    point_ccxt_at(exchange, base_url)
    try:
        await exchange.load_markets()
        cursor, last, got = int(gap.before.trade_id) + 1, int(gap.after.trade_id), 0
        while cursor < last:
            params = {"fetchTradesMethod": "publicGetHistoricalTrades", "fromId": cursor}
            page = await exchange.fetch_trades(SYMBOL, None, 1000, params)
            if not page:
                break
            got += sum(1 for t in page if int(t["id"]) < last)
            cursor = int(page[-1]["id"]) + 1
        return got
    finally:
        await exchange.close()


async def repair(base_url: str, bootstrap: str, topic: str, gap: GapFound) -> int:
    adapter = ExchangeAdapter(
        "binance",
        ExchangeSettings(api_base_url=base_url, enable_rate_limit=False),
        Credentials(api_key=SecretStr("bench")),  # historicalTrades needs a key
    )
    sink = KafkaSink(KafkaSettings(bootstrap_servers=bootstrap, topic_ticks=topic), "bench")
    await sink.start([TopicSpec(topic, partitions=3)])
    try:
        await adapter.load_markets()

        async def progress(_state: int, _reason: str) -> None:
            return None

        outcome = await repair_gap(
            gap,
            adapter,
            sink,
            FetchEnv(venue=adapter.venue),
            page_limit=1000,
            max_pages=10_000,
            progress=progress,
        )
        assert outcome.state == TradeGap.REPAIRED, outcome
        return outcome.recovered
    finally:
        await sink.close()
        await adapter.close()


def timed(run: Coroutine[Any, Any, int]) -> tuple[float, int]:
    start = time.perf_counter()
    count = asyncio.run(run)
    return time.perf_counter() - start, count


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--minutes", type=int, default=10, help="the outage's length")
    parser.add_argument("--rate", type=float, default=20.0, help="BTC/USDT trades a second")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--kafka", default=None, help="bootstrap servers (default: start one)")
    args = parser.parse_args()

    results: dict[str, list[tuple[float, int]]] = {"ccxt_loop": [], "repair": []}
    with tempfile.TemporaryDirectory(prefix="gap-repair-bench-") as tmp_name:
        tmp = Path(tmp_name)
        stack = None
        if args.kafka is None:
            from infra.localstack import start_on_free_ports

            stack = start_on_free_ports(tmp / "stack", jvm_options=[])
            bootstrap = stack.endpoints.kafka_bootstrap
        else:
            bootstrap = args.kafka
        sim, base_url = start_simulator(tmp, "--trade-rate", f"{SYMBOL}={args.rate}")
        try:
            gap, missing = the_gap(args.rate, args.minutes)
            for _ in range(args.repeat):  # side by side, alternating
                results["ccxt_loop"].append(timed(ccxt_loop(base_url, gap)))
                topic = f"bench.repair.{uuid.uuid4().hex[:8]}"
                results["repair"].append(timed(repair(base_url, bootstrap, topic, gap)))
        finally:
            sim.terminate()
            sim.wait(10)
            if stack is not None:
                stack.down()

    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, median of {args.repeat}")
    print(f"gap: {args.minutes} min of {SYMBOL} at {args.rate:g} trades/s = {missing} trades")
    print("| stage | trades | seconds | trades/s | ratio |")
    print("|---|---:|---:|---:|---:|")
    base = statistics.median(s for s, _ in results["ccxt_loop"])
    for stage, runs in results.items():
        seconds = statistics.median(s for s, _ in runs)
        count = runs[0][1]
        assert all(n == missing for _, n in runs), (stage, [n for _, n in runs], missing)
        rate = count / seconds
        print(f"| {stage} | {count} | {seconds:.2f} | {rate:,.0f} | {seconds / base:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
