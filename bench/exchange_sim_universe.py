"""The exchange simulator as a load generator: what its universe costs and how much it
pushes (issue 44, item 1).

    .venv/bin/python bench/exchange_sim_universe.py [--markets 200]
        [--rates 10000,20000,40000] [--seconds 60] [--warmup 20]
        [--exchange binance|bybit|okx] [--clients 2] [--bursts 0 --burst-factor 5]
        [--generator]

For each rate the simulator runs as its own process (`python -m infra.exchange_sim
--universe N --universe-rate R`), and `--clients` reader processes share the
universe's markets: each opens one websocket of the exchange's dialect, subscribes to
the trade streams of its markets (Binance `<m>@trade`: one trade a message, as on the
real exchange; Bybit `publicTrade`: the trades of a push in one message; OKX `trades`:
one a message), and reads. The window is the `--seconds` from the first of five
seconds in a row in which every reader is live (its worst lag under a second: after a
start the first minute of every market is generated, then the streams catch up), at
most `--warmup` seconds after the start. Over the window:

- delivered trades/s (every message parsed, ids checked consecutive per market:
  `gaps` counts skips, over the whole run);
- lag: receive wall time - trade time `T` (the simulator runs on the wall clock), p50
  and p99: a simulator that cannot keep up shows a growing lag;
- simulator CPU (user + system of its process, /proc) in cores and per 10k trades/s;
  the readers' CPU beside it (on a 2-core machine they compete for the same cores).

The highest rate whose lag p99 stays under a second is what it sustains; above it the
delivered rate is what it can push at all (or what the readers can read: see their CPU).

`--generator` measures the generator alone, in this process, without a socket: a
minute of the universe's trades generated, cut into 100 ms slices and printed as
Binance messages, in CPU seconds and cores per 10k trades/s; and a minute of every
market's order book (Binance depth events at 100 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from pipeline_common import cpu_seconds

from infra.exchange_sim import Universe, bybit, okx
from infra.exchange_sim.binance import fills_of_columns, trade_text
from infra.exchange_sim.books import BookModel, BookStream, binance_depth_event
from infra.exchange_sim.control import SimulatorControl
from infra.exchange_sim.model import MINUTE_MS, MODEL_ID_FLOOR, TradeColumns


def start_simulator(
    tmp: Path, args: argparse.Namespace, rate: float, now_ms: int | None = None
) -> tuple[Any, str]:
    ready = tmp / f"sim-{rate:g}.url"
    frozen = [] if now_ms is None else ["--now-ms", str(now_ms)]
    command = [
        sys.executable,
        "-m",
        "infra.exchange_sim",
        *frozen,
        "--port",
        "0",
        "--ready-file",
        str(ready),
        "--weight-limit",
        "0",
        "--universe",
        str(args.markets),
        "--universe-rate",
        str(rate),
        "--universe-bursts",
        str(args.bursts),
        "--universe-burst-factor",
        str(args.burst_factor),
    ]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not ready.exists() or not ready.read_text().strip():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("simulator did not start")
        time.sleep(0.1)
    return proc, ready.read_text().strip()


# ------------------------------------------------------------------ the reader
def subscription(exchange: str, symbols: list[str]) -> tuple[str, list[dict[str, Any]]]:
    """The websocket path and the subscribe messages for these markets' trades."""
    if exchange == "binance":
        streams = [s.replace("/", "").lower() + "@trade" for s in symbols]
        return "/stream/ws", [{"method": "SUBSCRIBE", "params": streams, "id": 1}]
    if exchange == "bybit":  # Bybit takes at most 10 topics a request
        topics = [f"publicTrade.{s.replace('/', '')}" for s in symbols]
        return bybit.WS_PATH, [
            {"op": "subscribe", "args": topics[i : i + 10], "req_id": str(i)}
            for i in range(0, len(topics), 10)
        ]
    args = [{"channel": "trades", "instId": s.replace("/", "-")} for s in symbols]
    return okx.WS_PATH, [{"op": "subscribe", "args": args}]


def trades_of(exchange: str, message: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(market, id, time ms) of each trade in a stream message (none: an ack)."""
    if exchange == "binance":
        data = message.get("data", message)
        return [(data["s"], data["t"], data["T"])] if data.get("e") == "trade" else []
    if exchange == "bybit":
        return [(t["s"], int(t["i"]), t["T"]) for t in message.get("data", ())]
    return [(t["instId"], int(t["tradeId"]), int(t["ts"])) for t in message.get("data", ())]


async def read(base_url: str, exchange: str, symbols: list[str], end: float) -> dict[str, Any]:
    """Read until ``end``; per wall-clock second: trades, messages, max lag, lag
    samples (every 50th trade), this process's CPU so far. Every id is checked."""
    path, requests = subscription(exchange, symbols)
    last: dict[str, int] = {}
    gaps = 0
    seconds: dict[int, list[Any]] = {}
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(base_url.replace("http", "ws", 1) + path, max_msg_size=0) as ws,
    ):
        for request in requests:
            await ws.send_json(request)
        while True:
            msg = await ws.receive(timeout=120)  # the first minute may take a while
            now = time.time()
            if now >= end:
                break
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise RuntimeError(f"stream ended: {msg.type}")
            trades = trades_of(exchange, json.loads(msg.data))
            if not trades:
                continue
            bucket = seconds.get(int(now))
            if bucket is None:
                bucket = seconds[int(now)] = [0, 0, 0.0, [], time.process_time()]
            bucket[1] += 1
            for market, trade_id, at in trades:
                previous = last.get(market)
                if previous is not None and trade_id != previous + 1:
                    gaps += 1
                last[market] = trade_id
                bucket[0] += 1
                lag = now * 1000 - at
                bucket[2] = max(bucket[2], lag)
                if bucket[0] % 50 == 0:
                    bucket[3].append(lag)
    return {"gaps": gaps, "seconds": seconds, "cpu_end": time.process_time()}


def reader_main(argv: list[str]) -> None:
    base_url, exchange, end, symbols = argv[0], argv[1], float(argv[2]), argv[3].split(",")
    print(json.dumps(asyncio.run(read(base_url, exchange, symbols, end))))


# ------------------------------------------------------------------- one rate
def run_rate(args: argparse.Namespace, rate: float, tmp: Path) -> dict[str, Any]:
    """One simulator at ``rate``; the window: the ``--seconds`` from the first of five
    seconds in a row in which every reader is live (max lag under a second)."""
    proc, base_url = start_simulator(tmp, args, rate)
    sim_cpu: dict[int, float] = {}
    try:
        symbols = SimulatorControl(base_url).universe()["symbols"]
        end = time.time() + args.warmup + args.seconds + 1
        shares = [symbols[i :: args.clients] for i in range(args.clients)]
        readers = [
            subprocess.Popen(
                [
                    *(sys.executable, __file__, "--reader", base_url, args.exchange, str(end)),
                    ",".join(share),
                ],
                stdout=subprocess.PIPE,
            )
            for share in shares
        ]
        while time.time() < end + 1:
            sim_cpu[int(time.time())] = cpu_seconds(proc.pid)
            time.sleep(1.0 - time.time() % 1.0)
        results = []
        for reader in readers:
            out, _ = reader.communicate(timeout=180)
            if reader.returncode != 0:
                raise RuntimeError(f"reader failed ({reader.returncode})")
            results.append(json.loads(out))
    finally:
        proc.terminate()
        proc.wait(30)
    per_reader = [{int(k): v for k, v in r["seconds"].items()} for r in results]
    common = sorted(set.intersection(*(set(b) for b in per_reader)))
    present = set(common)

    def steady(t: int) -> bool:  # five seconds in a row with every lag under a second
        span = range(t, t + 5)
        return all(u in present and all(b[u][2] < 1000 for b in per_reader) for u in span)

    live = next((t for t in common if steady(t)), None)
    if live is None:
        return {"rate": rate, "live": False}
    window = range(live, min(live + int(args.seconds), max(common)))
    span = len(window)
    trades = sum(b[t][0] for b in per_reader for t in window if t in b)
    lags = sorted(x for b in per_reader for t in window if t in b for x in b[t][3]) or [0.0]
    cpu_at = [t for t in window if t in sim_cpu]
    sim = (sim_cpu[cpu_at[-1]] - sim_cpu[cpu_at[0]]) / max(1, cpu_at[-1] - cpu_at[0])
    reader_cpu = 0.0
    for b in per_reader:
        marks = [t for t in window if t in b]
        reader_cpu += (b[marks[-1]][4] - b[marks[0]][4]) / max(1, marks[-1] - marks[0])
    delivered = trades / span
    return {
        "rate": rate,
        "live": True,
        "live_after_s": live - min(common),
        "span": span,
        "delivered": delivered,
        "messages_s": sum(b[t][1] for b in per_reader for t in window if t in b) / span,
        "gaps": sum(r["gaps"] for r in results),
        "lag_p50_ms": statistics.median(lags),
        "lag_p99_ms": lags[min(len(lags) - 1, int(0.99 * len(lags)))],
        "sim_cores": sim,
        "sim_cores_per_10k": sim / max(delivered, 1.0) * 10_000,
        "reader_cores": reader_cpu,
    }


# ---------------------------------------------------------- the generator alone
def bare_loop(count: int, names: list[str], minute: int) -> None:
    """The baseline: ``count`` trades from a bare random walk (``random``, no model, no
    ids to keep consistent with history, no candles), printed by the same ``trade_text``."""
    rng = random.Random(1)
    prices = [100.0] * len(names)
    ids = [MODEL_ID_FLOOR] * len(names)
    for i in range(count):
        m = i % len(names)
        prices[m] *= 1.0 + rng.gauss(0.0, 1e-4)
        ids[m] += 1
        at = minute + i * MINUTE_MS // count
        fill = (ids[m], at, f"{prices[m]:.8f}", f"{rng.random() * 10:.8f}", rng.random() < 0.5)
        trade_text("trade", names[m], fill, at)


def generator_cost(args: argparse.Namespace, rate: float) -> None:
    """CPU of the generator alone, in this process, no socket: a day of bars for every
    market (once a day), a minute of trades (the prefetch), then that minute cut in
    100 ms slices as the pump does, printed as Binance `@trade` messages; side by side
    with ``bare_loop`` printing as many trades (the ratio: what the model costs)."""
    universe = Universe(args.markets, rate=rate)
    model = universe.model()
    symbols = universe.symbols()
    specs = {s: model.spec(s) for s in symbols}
    minute = (int(time.time() * 1000) // MINUTE_MS) * MINUTE_MS
    slices: list[tuple[str, list[TradeColumns]]] = []

    def bars() -> None:
        for symbol in symbols:
            model.minute_bar(symbol, minute)

    def draws() -> None:
        for symbol in symbols:
            model.prepare(symbol, minute, minute + MINUTE_MS - 1)

    def cut() -> None:
        for t in range(minute, minute + MINUTE_MS, 100):
            slices.extend((s, model.trade_columns(s, t, t + 99)) for s in symbols)

    def print_all() -> None:
        for symbol, batch in slices:
            if batch:
                market = specs[symbol]
                for fill in fills_of_columns(batch, market):
                    trade_text("trade", market.binance_id, fill, minute)

    def timed(work: Callable[[], None]) -> float:
        began = time.process_time()
        work()
        return time.process_time() - began

    per = {"bars (a day, once)": timed(bars), "trades (a minute)": timed(draws)}
    per["slices"] = timed(cut)
    per["print"] = timed(print_all)
    count = sum(len(c.times) for _, batch in slices for c in batch)
    bare = timed(lambda: bare_loop(count, [specs[s].binance_id for s in symbols], minute))
    print(f"generator at {rate:g}/s ({count} trades a minute, {args.markets} markets):")
    for name, seconds in per.items():
        cores = seconds / 60 / max(rate, 1) * 10_000  # a minute's work spread over it
        print(
            f"  {name:<20} {seconds:6.2f} s  {seconds / count * 1e6:5.2f} us/trade  "
            f"{cores:.3f} cores/10k"
        )
    total = per["trades (a minute)"] + per["slices"] + per["print"]
    stream = BookStream(BookModel(model))
    events = 0

    def book_minute() -> None:
        nonlocal events
        for t in range(minute, minute + MINUTE_MS, 100):
            for symbol in symbols:
                update = stream.advance(symbol, t)
                if update is not None:
                    events += 1
                    json.dumps(binance_depth_event(specs[symbol].binance_id, update, t))

    book = timed(book_minute)
    print(
        f"  {'books (a minute)':<20} {book:6.2f} s  {events} Binance depth events, "
        f"{book / 60:.3f} cores for {args.markets} books watched"
    )
    print(
        f"  {'trades per core':<20} generator {count / total:,.0f}/s (a minute: {total:.2f} s, "
        f"{total / 60:.3f} cores at {rate:g}/s) vs bare loop {count / bare:,.0f}/s: "
        f"{bare / total:.2f}x"
    )


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--reader":
        reader_main(sys.argv[2:])
        return 0
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--markets", type=int, default=200)
    parser.add_argument("--rates", default="10000,20000,40000", help="trades/s, comma-separated")
    parser.add_argument("--seconds", type=float, default=60.0, help="measured window")
    parser.add_argument("--warmup", type=float, default=60.0, help="at most this long to get live")
    parser.add_argument("--exchange", choices=("binance", "bybit", "okx"), default="binance")
    parser.add_argument("--clients", type=int, default=2, help="reader processes")
    parser.add_argument("--bursts", type=float, default=0.0, help="--universe-bursts")
    parser.add_argument("--burst-factor", type=float, default=5.0)
    parser.add_argument(
        "--generator", action="store_true", help="the generator's CPU alone, no socket"
    )
    args = parser.parse_args()
    if args.generator:
        for rate in (float(r) for r in args.rates.split(",")):
            generator_cost(args, rate)
        return 0
    print(
        f"# {args.markets} markets, {args.exchange}, {args.clients} reader(s), "
        f"{args.seconds:g} s window once live (at most {args.warmup:g} s after the start), "
        f"load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    header = (
        "rate/s  delivered/s  msgs/s  gaps  lag p50/p99 ms  sim cores  sim cores/10k  "
        "reader cores  (live after s, window s)"
    )
    print(header, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for rate in (float(r) for r in args.rates.split(",")):
            row = run_rate(args, rate, Path(tmp))
            if not row["live"]:
                print(f"{rate:>6.0f}  never live within {args.warmup:g} s", flush=True)
                continue
            print(
                f"{row['rate']:>6.0f}  {row['delivered']:>11.0f}  {row['messages_s']:>6.0f}  "
                f"{row['gaps']:>4}  {row['lag_p50_ms']:>6.0f}/{row['lag_p99_ms']:<7.0f}  "
                f"{row['sim_cores']:>9.2f}  {row['sim_cores_per_10k']:>13.3f}  "
                f"{row['reader_cores']:>12.2f}  ({row['live_after_s']}, {row['span']})",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
