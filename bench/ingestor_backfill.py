"""Ingestor throughput: candles/s (REST backfill -> Kafka) and ticks/s (websocket -> Kafka).

    .venv/bin/python bench/ingestor_backfill.py [--candles 43200] [--ticks 20000]
        [--repeat 3] [--kafka HOST:PORT] [--profile]

Starts the exchange simulator as a separate process (its own interpreter, so
it does not share the GIL with the ingestor) with the weight limit off, and a
local Kafka (infra.localstack) unless --kafka is given. The ccxt rate limiter
is off, so the numbers measure the ingestor, not the exchange's limits.

Stages are measured side by side, each against the same simulator:

- `http_baseline`: aiohttp GET of the same kline pages + json.loads (the floor
  set by the simulator and HTTP);
- `ccxt_parse`: ccxt's `parse_ohlcvs` of the same raw pages (CPU only);
- `ccxt_fetch`: the ingestor's page loop through ccxt, no Kafka;
- `batch_encode`: OHLCBatch building + envelope encoding only (CPU);
- `kafka_produce`: producing the pre-encoded records, until delivered;
- `end_to_end`: `run_history_job` (ccxt -> OHLCBatch -> Kafka, final marker delivered),
  one page after another (`page_concurrency` 1);
- `end_to_end xN`: the same with N pages in flight (`--page-concurrency`, the
  ingestor's default 4), in the same run as the one-by-one loop.

`--ticks 0` skips the live part.

Ticks: `ws_baseline` is a bare aiohttp websocket client counting the trade
messages of the same stream; `feed_to_kafka` is the ingestor's live feed
(ccxt.pro watch_trades -> dedupe -> Tick -> Kafka) until every tick is delivered;
`recorded` is the same feed as a recorded market runs it (each batch's delivery
tracked for the checkpoint, gaps reported); `ccxt.pro bare` is ccxt.pro's
`watch_trades` in a loop that only counts: what the feeds add to ccxt.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
from pipeline_common import start_simulator

from infra.exchange_sim import point_ccxt_at
from ingestor.candles import BatchBuilder, metadata_for
from ingestor.config import ExchangeSettings, KafkaSettings
from ingestor.exchange_calls import FetchEnv
from ingestor.exchanges import ExchangeAdapter
from ingestor.history import run_history_job
from ingestor.kafka_sink import KafkaSink
from ingestor.live import FeedStats, Recording, TradePoint, run_feed
from ingestor.model import Candle
from ingestor.pages import iter_pages, plan_request
from ingestor.retry import RetryPolicy
from mdproto import envelope
from mdproto.messages import DataRequest, Status
from mdproto.recent import RecentKeys

MIN = 60_000
SYMBOL = "BTC/USDT"
TICKER = "BINANCE:BTC/USDT"


def history_request(now_ms: int, candles: int) -> DataRequest:
    start = (now_ms // MIN - candles - 10) * MIN
    return DataRequest(
        request_id=f"bench-{uuid.uuid4().hex[:8]}",
        kind=DataRequest.HISTORICAL,
        ticker=TICKER,
        period_seconds=60,
        start_time_ms=start,
        end_time_ms=start + candles * MIN,
    )


async def timed(fn: Callable[[], Awaitable[int]], repeat: int) -> tuple[float, int, float]:
    """Median wall seconds over `repeat` runs (after a warm-up), item count, median CPU seconds.

    CPU is this process's (the ingestor side's) CPU time: the simulator runs in
    its own process, so wall minus CPU is mostly waiting for the exchange.
    """
    print(f"bench: {getattr(fn, '__name__', fn)}", file=sys.stderr, flush=True)
    count = await fn()
    runs, cpus = [], []
    for _ in range(repeat):
        started, cpu = time.perf_counter(), time.process_time()
        count = await fn()
        runs.append(time.perf_counter() - started)
        cpus.append(time.process_time() - cpu)
    return statistics.median(runs), count, statistics.median(cpus)


async def backfill(
    base_url: str, bootstrap: str, candles: int, repeat: int, profile: bool, concurrency: int
) -> dict[str, Any]:
    adapter = ExchangeAdapter(
        "binance",
        ExchangeSettings(prefix="BINANCE", api_base_url=base_url, enable_rate_limit=False),
    )
    await adapter.load_markets()
    env = FetchEnv(policy=RetryPolicy(), page_limit=1000)
    topic = f"bench.ohlc.{uuid.uuid4().hex[:6]}"
    sink = KafkaSink(KafkaSettings(bootstrap_servers=bootstrap, topic_ohlc_batches=topic), "bench")
    await sink.start()
    now_ms = int(time.time() * 1000)
    request = history_request(now_ms, candles)
    symbol, plan = plan_request(request, adapter, env)
    results: dict[str, Any] = {}

    async with aiohttp.ClientSession() as session:

        async def http_baseline() -> int:
            n, since = 0, plan.start_ms
            while since < plan.end_ms:
                params = {
                    "symbol": "BTCUSDT",
                    "interval": "1m",
                    "startTime": str(since),
                    "endTime": str(plan.until_ms),
                    "limit": "1000",
                }
                async with session.get(f"{base_url}/api/v3/klines", params=params) as resp:
                    rows = json.loads(await resp.text())
                if not rows:
                    break
                n += len(rows)
                since = rows[-1][0] + MIN
            return n

        results["http_baseline"] = await timed(http_baseline, repeat)

        # The same pages' raw rows, parsed by ccxt alone (CPU only, no I/O).
        raw_pages: list[list[Any]] = []
        since = plan.start_ms
        while since < plan.end_ms:
            params = {
                "symbol": "BTCUSDT",
                "interval": "1m",
                "startTime": str(since),
                "endTime": str(plan.until_ms),
                "limit": "1000",
            }
            async with session.get(f"{base_url}/api/v3/klines", params=params) as resp:
                page = json.loads(await resp.text())
            if not page:
                break
            raw_pages.append(page)
            since = page[-1][0] + MIN
        exchange: Any = adapter._exchange
        market = exchange.market(SYMBOL)

        async def ccxt_parse() -> int:
            n = 0
            for page in raw_pages:
                n += len(exchange.parse_ohlcvs(page, market, "1m", None, None))
            return n

        results["ccxt_parse"] = await timed(ccxt_parse, repeat)

    async def ccxt_fetch() -> int:
        n = 0
        async for page in iter_pages(adapter, symbol, plan, env):
            n += len(page)
        return n

    results["ccxt_fetch"] = await timed(ccxt_fetch, repeat)

    rows: list[Candle] = []
    async for page in iter_pages(adapter, symbol, plan, env):
        rows.extend(page)

    def encode_all() -> list[bytes]:
        builder = BatchBuilder(metadata_for(request, "bench"), 500)
        records = builder.add(rows) + builder.flush()
        return [envelope.encode_record(r) for r in records]

    async def batch_encode() -> int:
        encode_all()
        return len(rows)

    results["batch_encode"] = await timed(batch_encode, repeat)
    encoded = encode_all()

    async def kafka_produce() -> int:
        futures = [await sink.enqueue(topic, TICKER, value) for value in encoded]
        await asyncio.gather(*futures)
        return len(rows)

    results["kafka_produce"] = await timed(kafka_produce, repeat)

    async def end_to_end() -> int:
        outcome = await run_history_job(
            request, adapter, sink, ingestor_id="bench", batch_size=500, env=env
        )
        assert outcome.status == Status.OK and outcome.delivered, outcome
        return outcome.rows

    results["end_to_end"] = await timed(end_to_end, repeat)

    async def end_to_end_concurrent() -> int:
        outcome = await run_history_job(
            request,
            adapter,
            sink,
            ingestor_id="bench",
            batch_size=500,
            env=replace(env, page_concurrency=concurrency),
        )
        assert outcome.status == Status.OK and outcome.delivered, outcome
        return outcome.rows

    results[f"end_to_end x{concurrency}"] = await timed(end_to_end_concurrent, repeat)
    results["rest_pages"] = (candles + 999) // 1000

    if profile:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0005, async_mode="enabled")
        profiler.start()
        await end_to_end()
        profiler.stop()
        results["profile"] = library_shares(profiler)
        results["profile_text"] = profiler.output_text(unicode=False, color=False, show_all=False)

    await sink.close()
    await adapter.close()
    return results


def library_shares(profiler: Any) -> dict[str, float]:
    """Share of the sampled CPU (waits excluded) per library.

    A frame without a file of its own (C builtins, dataclass __init__) counts
    for the library that called it, except protobuf's C containers.
    """
    buckets: dict[str, float] = defaultdict(float)
    rules = [
        ("ccxt", "ccxt"),
        ("google/protobuf", "protobuf"),
        ("mdproto", "protobuf"),
        ("confluent_kafka", "kafka client"),
        ("aiohttp", "aiohttp (HTTP/ws)"),
        ("yarl", "aiohttp (HTTP/ws)"),
        ("multidict", "aiohttp (HTTP/ws)"),
        ("/json/", "json"),
        ("/ingestor/", "ingestor"),
        ("asyncio", "asyncio loop"),
    ]
    root = profiler.last_session.root_frame()

    def label_of(frame: Any, inherited: str) -> str:
        ident = frame.identifier or ""
        if "Container" in ident or "SerializeToString" in ident or "FromString" in ident:
            return "protobuf"
        path = frame.file_path or ""
        for needle, label in rules:
            if needle in path:
                return label
        return inherited

    def walk(frame: Any, inherited: str) -> None:
        ident = frame.identifier or ""
        label = label_of(frame, inherited)
        if ident.startswith("[await]") or ident.startswith("[out-of-context]"):
            label = "waiting"
        buckets[label] += frame.total_self_time
        for child in frame.children:
            walk(child, label)

    walk(root, "other")
    buckets.pop("waiting", None)
    total = sum(buckets.values()) or 1.0
    return {k: v / total for k, v in sorted(buckets.items(), key=lambda kv: -kv[1])}


async def ticks(base_url: str, bootstrap: str, count: int, profile: bool) -> dict[str, Any]:
    """Push `count` trades through the simulator's stream; time them to a counter and to Kafka."""
    ws_url = base_url.replace("http://", "ws://") + "/stream/ws"
    results: dict[str, Any] = {}
    next_id = [1]

    async def inject(session: aiohttp.ClientSession, n: int) -> None:
        now = int(time.time() * 1000)
        for offset in range(0, n, 1000):
            chunk = [
                {"id": next_id[0] + i, "price": "60000.5", "qty": "0.01", "time_ms": now}
                for i in range(min(1000, n - offset))
            ]
            next_id[0] += len(chunk)
            body = {"symbol": SYMBOL, "trades": chunk}
            async with session.post(f"{base_url}/_sim/trades", json=body) as resp:
                resp.raise_for_status()

    async with aiohttp.ClientSession() as session:
        # Baseline: a bare websocket client that only counts trade messages.
        async with session.ws_connect(f"{ws_url}/0") as ws:
            await ws.send_json({"method": "SUBSCRIBE", "params": ["btcusdt@trade"], "id": 1})
            await ws.receive()  # subscription ack
            started = time.perf_counter()
            injector = asyncio.create_task(inject(session, count))
            seen = 0
            while seen < count:
                msg = await ws.receive()
                if msg.type == aiohttp.WSMsgType.TEXT and "trade" in msg.data:
                    seen += 1
            results["ws_baseline"] = (time.perf_counter() - started, seen)
            await injector

        results["ccxt_pro_baseline"] = await ccxt_pro_run(session, inject, base_url, count)
        for cache in (10_000, 1000):  # ours, then ccxt's default tradesLimit
            results[f"feed_cache_{cache}"] = await feed_run(
                session, inject, base_url, bootstrap, count, cache, profile and cache == 10_000
            )
        # A recorded market's feed: the same, plus each batch's delivery tracked for
        # its checkpoint and gaps reported (ingestor.recorder).
        results["recorded"] = await feed_run(
            session, inject, base_url, bootstrap, count, 10_000, recorded=True
        )
    return results


async def ccxt_pro_run(
    session: aiohttp.ClientSession,
    inject: Callable[[aiohttp.ClientSession, int], Awaitable[None]],
    base_url: str,
    count: int,
) -> tuple[float, int]:
    """A bare ccxt.pro client: `watch_trades` in a loop, counting, nothing else."""
    import ccxt.pro as ccxt_pro

    exchange = ccxt_pro.binance(
        {
            "enableRateLimit": False,
            "options": {"tradesLimit": 50_000, "fetchMarkets": {"types": ["spot"]}},
        }
    )
    point_ccxt_at(exchange, base_url)
    try:
        await exchange.load_markets()
        first = asyncio.create_task(exchange.watch_trades(SYMBOL))
        async with session.get(
            f"{base_url}/_sim/subscribers", params={"symbol": SYMBOL, "wait": "1"}
        ) as resp:
            resp.raise_for_status()
        started = time.perf_counter()
        injector = asyncio.ensure_future(inject(session, count))
        seen = len(await first)
        while seen < count:
            seen += len(await exchange.watch_trades(SYMBOL))
        elapsed = time.perf_counter() - started
        await injector
        return elapsed, seen
    finally:
        await exchange.close()


async def feed_run(
    session: aiohttp.ClientSession,
    inject: Callable[[aiohttp.ClientSession, int], Awaitable[None]],
    base_url: str,
    bootstrap: str,
    count: int,
    trades_cache: int,
    profile: bool = False,
    *,
    recorded: bool = False,
) -> dict[str, Any]:
    """Seconds until every tick is delivered (or the stream went quiet), ticks, id gaps, CPU."""
    adapter = ExchangeAdapter(
        "binance",
        ExchangeSettings(
            prefix="BINANCE",
            api_base_url=base_url,
            enable_rate_limit=False,
            trades_cache=trades_cache,
        ),
    )
    await adapter.load_markets()
    topic = f"bench.ticks.{uuid.uuid4().hex[:6]}"
    sink = KafkaSink(KafkaSettings(bootstrap_servers=bootstrap, topic_ticks=topic), "bench")
    await sink.start()
    await sink.deliver(topic, TICKER, b"warm-up")  # topic created, connection up
    stats = FeedStats()
    checkpoints: list[TradePoint] = []
    recording = Recording(
        resume_from=lambda: None,
        on_gap=lambda found: None,
        on_sent=lambda point, _delivery, _count: checkpoints.append(point),
    )
    feed = asyncio.create_task(
        run_feed(
            TICKER,
            adapter,
            sink,
            stats,
            dedupe=RecentKeys(50_000),
            reconnect=RetryPolicy(),
            recording=recording if recorded else None,
        )
    )
    async with session.get(
        f"{base_url}/_sim/subscribers", params={"symbol": SYMBOL, "wait": "1"}
    ) as resp:
        resp.raise_for_status()
    delivered0 = sink.stats.delivered
    profiler = None
    if profile:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0005, async_mode="enabled")
        profiler.start()
    started, cpu = time.perf_counter(), time.process_time()
    await inject(session, count)
    # Counters advance in librdkafka delivery callbacks: poll them. Stop when all
    # ticks arrived, or when nothing moved for a second (trades were lost).
    last, last_change = -1, time.perf_counter()
    while sink.stats.delivered - delivered0 < count:
        now = time.perf_counter()
        if sink.stats.delivered != last:
            last, last_change = sink.stats.delivered, now
        elif now - last_change > 1.0:
            break
        await asyncio.sleep(0.005)
    elapsed = last_change if sink.stats.delivered - delivered0 < count else time.perf_counter()
    result: dict[str, Any] = {
        "seconds": elapsed - started,
        "ticks": stats.ticks,
        "gaps": stats.id_gaps,
        "cpu": time.process_time() - cpu,
    }
    if profiler is not None:
        profiler.stop()
        result["profile"] = library_shares(profiler)
    feed.cancel()
    await asyncio.gather(feed, return_exceptions=True)
    await sink.close()
    await adapter.close()
    return result


def report(name: str, seconds: float, items: int, baseline: float | None, unit: str) -> str:
    rate = items / seconds if seconds else float("inf")
    ratio = f"{baseline / seconds:6.2f}" if baseline else "  1.00"
    return f"| {name:<14} | {items:>7} | {seconds:8.3f} | {rate:>9,.0f} {unit}/s | {ratio} |"


def main() -> int:
    # SIGTERM (e.g. `timeout`) unwinds like Ctrl-C, so the stack and simulator are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--candles", type=int, default=43_200, help="30 days of 1m candles")
    parser.add_argument("--ticks", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--kafka", default=None, help="bootstrap servers (default: start one)")
    parser.add_argument("--profile", action="store_true", help="pyinstrument the end-to-end run")
    parser.add_argument("--page-concurrency", type=int, default=4)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="ingestor-bench-") as tmp_name:
        tmp = Path(tmp_name)
        stack = None
        if args.kafka is None:
            from infra.localstack import start_on_free_ports

            stack = start_on_free_ports(tmp / "stack", jvm_options=[])
            bootstrap = stack.endpoints.kafka_bootstrap
        else:
            bootstrap = args.kafka
        sim, base_url = start_simulator(tmp, "--no-model-trades")
        try:
            hist = asyncio.run(
                backfill(
                    base_url,
                    bootstrap,
                    args.candles,
                    args.repeat,
                    args.profile,
                    args.page_concurrency,
                )
            )
            live = (
                asyncio.run(ticks(base_url, bootstrap, args.ticks, args.profile))
                if args.ticks > 0
                else None
            )
        finally:
            sim.terminate()
            sim.wait(10)
            if stack is not None:
                stack.down()

    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, median of {args.repeat}")
    print("\nBackfill (candles; ratio = stage rate / http_baseline rate)")
    print("| stage | candles | seconds | rate | ratio | CPU us/candle |")
    print("|---|---:|---:|---:|---:|---:|")
    base_s = hist["http_baseline"][0]
    stages = ("http_baseline", "ccxt_parse", "ccxt_fetch", "batch_encode", "kafka_produce")
    for stage in (*stages, "end_to_end", f"end_to_end x{args.page_concurrency}"):
        seconds, items, cpu = hist[stage]
        baseline = None if stage == "http_baseline" else base_s
        print(f"{report(stage, seconds, items, baseline, 'candles')} {cpu / items * 1e6:13.1f} |")
    if live is not None:
        print("\nTicks (ratio = stage rate / ws_baseline rate)")
        print("| stage | ticks | seconds | rate | ratio | CPU us/tick | id gaps |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        ws_s, ws_n = live["ws_baseline"]
        print(report("ws_baseline", ws_s, ws_n, None, "ticks") + "             |       0 |")
        pro_s, pro_n = live["ccxt_pro_baseline"]
        line = report("ccxt.pro bare", pro_s, pro_n, ws_s * pro_n / ws_n, "ticks")
        print(line + "             |       0 |")
        for name, key in (
            ("feed tl=10000", "feed_cache_10000"),
            ("feed tl=1000", "feed_cache_1000"),
            ("recorded tl=10000", "recorded"),
        ):
            r = live[key]
            line = report(name, r["seconds"], r["ticks"], ws_s * r["ticks"] / ws_n, "ticks")
            print(f"{line} {r['cpu'] / max(r['ticks'], 1) * 1e6:11.1f} | {r['gaps']:7} |")
        if "profile" in live["feed_cache_10000"]:
            print("\nLive feed profile (tl=10000): share of sampled CPU by library")
            for name, share in live["feed_cache_10000"]["profile"].items():
                print(f"  {name:<18} {share:6.1%}")
    if "profile" in hist:
        print("\nEnd-to-end backfill profile: share of sampled CPU by library")
        for name, share in hist["profile"].items():
            print(f"  {name:<18} {share:6.1%}")
        print("\n" + hist["profile_text"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
