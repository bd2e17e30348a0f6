"""History path: OHLCBatch records in Kafka -> Iceberg -> HistoryReadyNotification.

For each size (default 43,200 = 30 days of 1-minute candles, and 525,600 = a
year), the records of one request are pre-encoded, produced and flushed; the
clock starts when Kafka has acknowledged the last one and stops when the
notification arrives on a SUB of the pipeline's PUB. rows/s = candles / that time.

Baseline, side by side in the same run: pyiceberg appends the same rows to an
unpartitioned table of the same schema, i.e. the raw cost of one Iceberg commit
of that data on this machine at this moment. Each size alternates pipeline and
baseline `--reps` times; medians are reported with their ratio.

`--overlap` also re-sends every request (a second ingestor, or a replay): the
range is no longer empty, so the pipeline MERGEs instead of appending.

The pipeline's own per-step timings (fetch, decode, append/merge, lookup, count,
record) are printed from its log.

    .venv/bin/python bench/pipeline_history.py [--reps 3] [--sizes 43200 525600]
        [--trigger 0.5] [--overlap] [--stack-dir .data]
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
from confluent_kafka import Producer
from pipeline_common import WAIT_S, PipelineProcess, median, stack, workdir

from infra.localstack import StackEndpoints
from infra.testing import Subscriber
from mdproto import envelope, topics
from mdproto.messages import OHLC, BatchMetadata, HistoryReadyNotification, OHLCBatch, Status

TICKER = "BINANCE:BTC/USDT"
BASELINE_TICKER = "BINANCE:BASE/LINE"
CLIENT = "bench"
MINUTE = 60_000
PER_RECORD = 1000
T0 = 946_684_800_000  # 2000-01-01: every request gets its own range after this


def request_records(request_id: str, n: int, t0: int) -> list[bytes]:
    meta = BatchMetadata(
        request_id=request_id,
        client_id=CLIENT,
        ticker=TICKER,
        period_seconds=60,
        start_time_ms=t0,
        end_time_ms=t0 + n * MINUTE,
        notification_topic=topics.response_topic(CLIENT),
        ingestor_id="bench",
    )
    values = []
    for seq, first in enumerate(range(0, n, PER_RECORD)):
        batch = OHLCBatch(request_id=request_id, sequence=seq)
        if seq == 0:
            batch.metadata.CopyFrom(meta)
        batch.rows.extend(
            OHLC(
                ticker=TICKER,
                period_seconds=60,
                open_time_ms=t0 + i * MINUTE,
                open=100.0 + i % 50,
                high=101.0 + i % 50,
                low=99.0 + i % 50,
                close=100.5 + i % 50,
                volume=1.0 + i % 7,
                trade_count=10 + i % 13,
            )
            for i in range(first, min(n, first + PER_RECORD))
        )
        values.append(envelope.encode_record(batch))
    final = BatchMetadata()
    final.CopyFrom(meta)
    final.status = Status.OK
    final.total_rows = n
    final.total_batches = len(values)
    marker = OHLCBatch(request_id=request_id, sequence=len(values), metadata=final, is_final=True)
    values.append(envelope.encode_record(marker))
    return values


def produce(producer: Producer, topic: str, values: Sequence[bytes]) -> float:
    """Produce and flush; returns the time Kafka had acknowledged every record."""
    for value in values:
        producer.produce(topic, key=TICKER.encode(), value=value)
        producer.poll(0)
    if producer.flush(60) != 0:
        raise RuntimeError("Kafka did not acknowledge every record")
    return time.time()


def baseline_rows(n: int, t0: int) -> pa.Table:
    from pipeline.records import OHLC_SCHEMA, UTC_US

    opens = pa.array([(t0 + i * MINUTE) * 1000 for i in range(n)], pa.int64()).cast(UTC_US)
    prices = pa.array([100.0 + i % 50 for i in range(n)], pa.float64())
    return pa.table(
        {
            "ticker": [BASELINE_TICKER] * n,
            "exchange": ["BINANCE"] * n,
            "symbol": ["BASE/LINE"] * n,
            "period_seconds": pa.array([60] * n, pa.int32()),
            "open_time": opens,
            "open": prices,
            "high": prices,
            "low": prices,
            "close": prices,
            "volume": prices,
            "trade_count": pa.array([10] * n, pa.int64()),
            "source": ["history"] * n,
            "request_id": ["baseline"] * n,
            "ingested_at": opens,
        }
    ).cast(OHLC_SCHEMA)


def baseline_append(endpoints: StackEndpoints, namespace: str, rows: pa.Table) -> float:
    """One pyiceberg append of ``rows`` to an unpartitioned table with the ohlc schema
    (partitioned writes would need the pyiceberg-core extra)."""
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog(endpoints.catalog_name, **endpoints.pyiceberg_catalog_properties())
    table = catalog.create_table_if_not_exists(f"{namespace}.baseline", schema=rows.schema)
    started = time.perf_counter()
    table.append(rows)
    return time.perf_counter() - started


def run(args: argparse.Namespace) -> None:
    with (
        stack(args.stack_dir) as endpoints,
        workdir(args.workdir) as tmp,
        contextlib.ExitStack() as cleanup,
    ):
        pipeline = PipelineProcess(
            endpoints,
            Path(tmp),
            {
                "PIPELINE_LIVE__ENABLED": "false",
                "PIPELINE_CEP__ENABLED": "false",
                "PIPELINE_HISTORY__TRIGGER_S": str(args.trigger),
            },
        )
        collector = Subscriber(
            pipeline.pub_endpoint, [topics.response_topic(CLIENT).encode()], wait_s=WAIT_S
        )
        cleanup.callback(pipeline.stop)  # also when a measurement fails
        started = time.perf_counter()
        pipeline.start()
        print(f"pipeline ready in {time.perf_counter() - started:.1f} s", flush=True)
        producer = Producer({"bootstrap.servers": endpoints.kafka_bootstrap, "linger.ms": 5})
        counter = iter(range(1_000_000))

        def request(n: int, overlap_of: tuple[str, int] | None = None) -> tuple[float, Any]:
            k = next(counter)
            request_id, t0 = overlap_of or (f"bench-{k}", T0 + k * 600 * 86_400_000)
            if overlap_of is not None:
                request_id = f"{request_id}-again-{k}"
            values = request_records(request_id, n, t0)
            landed = produce(producer, pipeline.batches_topic, values)
            got = collector.wait_for(
                lambda r: (
                    isinstance(r.message, HistoryReadyNotification)
                    and r.message.request_id == request_id
                )
            )[0]
            message = got.message
            assert isinstance(message, HistoryReadyNotification)
            assert message.status == Status.OK, message
            return got.at - landed, (request_id, t0)

        cold, _ = request(1000)
        print(f"cold first request (1,000 candles): {cold:.2f} s", flush=True)
        results: dict[str, list[float]] = {}
        base_counter = iter(range(1_000_000))
        for _ in range(args.reps):
            for n in args.sizes:
                seconds, ident = request(n)
                results.setdefault(f"pipeline {n}", []).append(seconds)
                if args.overlap:
                    again, _ = request(n, overlap_of=ident)
                    results.setdefault(f"pipeline {n} overlap", []).append(again)
                b = next(base_counter)
                rows = baseline_rows(n, T0 + b * 600 * 86_400_000)
                results.setdefault(f"baseline {n}", []).append(
                    baseline_append(endpoints, pipeline.namespace, rows)
                )
                print(
                    f"  n={n}: pipeline {seconds:.2f} s, baseline "
                    f"{results[f'baseline {n}'][-1]:.2f} s",
                    flush=True,
                )
        print()
        print(f"{'case':<28} {'median s':>9} {'rows/s':>9} {'x baseline':>11}")
        for n in args.sizes:
            base = median(results[f"baseline {n}"])
            for case in (f"pipeline {n}", f"pipeline {n} overlap", f"baseline {n}"):
                if case not in results:
                    continue
                m = median(results[case])
                print(f"{case:<28} {m:9.2f} {n / m:9.0f} {m / base:11.2f}")
        print()
        print("pipeline steps (per micro-batch, from its log):")
        for line in pipeline.log_lines("history batch"):
            print("  " + line.split("pipeline.history: ", 1)[-1][:400])
        collector.close()
        pipeline.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[43_200, 525_600])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--trigger", type=float, default=0.5, help="history trigger, seconds")
    parser.add_argument("--overlap", action="store_true", help="also re-send each request")
    parser.add_argument("--stack-dir", type=Path, help="use the stack started with this dir")
    parser.add_argument("--workdir", type=Path, help="keep the pipeline's logs here")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
