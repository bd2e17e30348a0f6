"""What the history query's decode costs the driver per candle (docs/pipeline-benchmarks.md).

A year of one market's 1-minute candles as the ingestor sends them from Binance: 526
``OHLCBatch`` records of 1,000 rows, every optional volume reported (Binance's klines
carry them), Kafka rows as Spark hands them over. Each timed ``--reps`` times, CPU
seconds, in one process:

- **parse**: ``envelope.decode_record`` of every record alone, the floor: protobuf's
  own work, which any decode pays;
- **decode**: `records.decode_history` as the history query runs it (parse, columns,
  checks, Arrow table, duplicates dropped).

Reported: the median CPU seconds of each, per 100,000 candles, and decode / parse.

    .venv/bin/python bench/history_decode.py [--days 365] [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from mdproto import envelope
from mdproto.messages import OHLC, OHLCBatch
from pipeline import records

MINUTE_MS = 60_000
PAGE = 1_000


def median_cpu_s(work: Callable[[], Any], reps: int) -> float:
    times = []
    for _ in range(reps):
        started = time.process_time()
        work()
        times.append(time.process_time() - started)
    return statistics.median(times)


def kafka_rows(days: int) -> pa.Table:
    """Kafka rows (value, key, partition, offset, timestamp) of `days` of candles."""
    t0 = 1_600_000_000_000
    candles = [
        OHLC(
            ticker="BINANCE:BTC/USDT",
            period_seconds=60,
            open_time_ms=t0 + i * MINUTE_MS,
            open=50_000 + i % 97,
            high=50_100 + i % 89,
            low=49_900 + i % 83,
            close=50_010 + i % 79,
            volume=12.5 + i % 7,
            trade_count=100 + i % 50,
            quote_volume=625_000.0 + i % 11,
            taker_buy_volume=6.25 + i % 5,
            taker_buy_quote_volume=312_500.0 + i % 13,
        )
        for i in range(days * 1440)
    ]
    pages = [candles[i : i + PAGE] for i in range(0, len(candles), PAGE)]
    values = [
        envelope.encode_record(OHLCBatch(request_id="r" * 32, sequence=n, rows=page))
        for n, page in enumerate(pages)
    ]
    return pa.table(
        {
            "key": pa.array([b"BINANCE:BTC/USDT"] * len(values), pa.binary()),
            "value": pa.array(values, pa.binary()),
            "partition": pa.array([0] * len(values), pa.int32()),
            "offset": pa.array(range(len(values)), pa.int64()),
            "timestamp": pa.array([t0 * 1000] * len(values), pa.timestamp("us")),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()

    kafka = kafka_rows(args.days)
    values = kafka.column("value").to_pylist()
    candles = args.days * 1440
    batch = records.decode_history(kafka)
    assert batch.candles.num_rows == candles and not batch.rejects, batch.rejects

    def parse() -> None:
        for value in values:
            envelope.decode_record(value, OHLCBatch)

    per = 100_000 / candles
    floor = median_cpu_s(parse, args.reps) * per
    decode = median_cpu_s(lambda: records.decode_history(kafka), args.reps) * per
    print(f"{candles:,} candles in {len(values)} records, {args.reps} reps, CPU s per 100,000:")
    print(f"  parse  {floor:.3f}")
    print(f"  decode {decode:.3f}  = {decode / floor:.1f}x parse")


if __name__ == "__main__":
    main()
