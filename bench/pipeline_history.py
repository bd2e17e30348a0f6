"""History path: OHLCBatch records in Kafka -> Iceberg -> HistoryReadyNotification.

For each size (default 43,200 = 30 days of 1-minute candles, and 525,600 = a
year), the records of one request are pre-encoded, produced and flushed; the
clock starts when Kafka has acknowledged the last one and stops when the
notification arrives on a SUB of the pipeline's PUB.

Baseline, side by side in the same run: pyiceberg appends the same rows to an
unpartitioned table of the same schema, i.e. the raw cost of one Iceberg commit
of that data on this machine at this moment (`--no-baseline` skips it). Each size
alternates pipeline and baseline `--reps` times; medians are reported.

`--overlap` also re-sends every request (a second ingestor, or a replay): the
range is no longer empty, so the pipeline MERGEs instead of appending.

`--stored` also answers every request again from storage, as the ingestor does
when `market.requests` shows the range complete: a final marker alone
(``source = SOURCE_STORAGE``), whose row count the pipeline finds in Iceberg.
The clock runs as above; this is the pipeline's fixed cost per answer.

`--variant NAME=DIR` (repeatable) runs the pipeline package from ``DIR``
(PYTHONPATH) under ``NAME``, e.g. main's ``services/spark-pipeline/src`` against
a branch's: the variants run side by side on one stack and take each request
in turn (the order alternating per rep), so a before/after comparison shares
the load of the moment. Load averages are printed with each measurement.

The pipeline's own per-step timings (fetch, decode, append/merge, lookup, count,
record) are printed from its log.

    .venv/bin/python bench/pipeline_history.py [--reps 3] [--sizes 43200 525600]
        [--trigger 0.5] [--overlap] [--stored] [--variant NAME=DIR ...]
        [--stack-dir .data]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from confluent_kafka import Producer
from pipeline_common import WAIT_S, PipelineProcess, median, stack, workdir

from infra.localstack import StackEndpoints
from infra.testing import Subscriber
from mdproto import envelope, topics
from mdproto.messages import (
    OHLC,
    BatchMetadata,
    HistoryReadyNotification,
    HistorySource,
    OHLCBatch,
    Status,
)

TICKER = "BINANCE:BTC/USDT"
BASELINE_TICKER = "BINANCE:BASE/LINE"
CLIENT = "bench"
MINUTE = 60_000
PER_RECORD = 1000
T0 = 946_684_800_000  # 2000-01-01: every request gets its own range after this


def _metadata(request_id: str, n: int, t0: int) -> BatchMetadata:
    return BatchMetadata(
        request_id=request_id,
        client_id=CLIENT,
        ticker=TICKER,
        period_seconds=60,
        start_time_ms=t0,
        end_time_ms=t0 + n * MINUTE,
        notification_topic=topics.response_topic(CLIENT),
        ingestor_id="bench",
    )


def request_records(request_id: str, n: int, t0: int) -> list[bytes]:
    meta = _metadata(request_id, n, t0)
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


def stored_answer(request_id: str, n: int, t0: int) -> list[bytes]:
    """The ingestor's answer to a request whose range is stored complete: no data records."""
    final = _metadata(request_id, n, t0)
    final.status = Status.OK
    final.source = HistorySource.SOURCE_STORAGE
    final.expected_candles = n
    marker = OHLCBatch(request_id=request_id, sequence=0, metadata=final, is_final=True)
    return [envelope.encode_record(marker)]


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
    columns = {
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
    # Columns a history candle leaves empty (extra volumes, live notes): null.
    full = {f.name: columns.get(f.name, pa.nulls(n, f.type)) for f in OHLC_SCHEMA}
    return pa.table(full).cast(OHLC_SCHEMA)


def baseline_append(endpoints: StackEndpoints, namespace: str, rows: pa.Table) -> float:
    """One pyiceberg append of ``rows`` to an unpartitioned table with the ohlc schema
    (partitioned writes would need the pyiceberg-core extra)."""
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog(endpoints.catalog_name, **endpoints.pyiceberg_catalog_properties())
    table = catalog.create_table_if_not_exists(f"{namespace}.baseline", schema=rows.schema)
    started = time.perf_counter()
    table.append(rows)
    return time.perf_counter() - started


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


@dataclass
class Variant:
    """One pipeline under test, its SUB and its results."""

    name: str
    pipeline: PipelineProcess
    collector: Subscriber
    producer: Producer
    results: dict[str, list[float]] = field(default_factory=dict)

    def answer(self, request_id: str, values: Sequence[bytes], rows: int) -> float:
        """Seconds from Kafka's acknowledgement of ``values`` to the OK notification."""
        landed = produce(self.producer, self.pipeline.batches_topic, values)
        got = self.collector.wait_for(
            lambda r: (
                isinstance(r.message, HistoryReadyNotification)
                and r.message.request_id == request_id
            )
        )[0]
        message = got.message
        assert isinstance(message, HistoryReadyNotification)
        assert message.status == Status.OK, message
        assert message.row_count == rows, message
        return got.at - landed

    def add(self, case: str, seconds: float) -> str:
        self.results.setdefault(case, []).append(seconds)
        return f"{case.removeprefix('pipeline ')} {seconds:.2f} s"


def start_variant(
    name: str,
    endpoints: StackEndpoints,
    tmp: Path,
    args: argparse.Namespace,
    overrides: dict[str, str],
    cleanup: contextlib.ExitStack,
) -> Variant:
    pipeline = PipelineProcess(
        endpoints,
        tmp,
        {
            "PIPELINE_LIVE__ENABLED": "false",
            "PIPELINE_CEP__ENABLED": "false",
            "PIPELINE_HISTORY__TRIGGER_S": str(args.trigger),
            **overrides,
        },
    )
    collector = Subscriber(
        pipeline.pub_endpoint, [topics.response_topic(CLIENT).encode()], wait_s=WAIT_S
    )
    cleanup.callback(collector.close)
    cleanup.callback(pipeline.stop)  # also when a measurement fails
    started = time.perf_counter()
    pipeline.start()
    print(f"[{name}] pipeline ready in {time.perf_counter() - started:.1f} s", flush=True)
    producer = Producer({"bootstrap.servers": endpoints.kafka_bootstrap, "linger.ms": 5})
    variant = Variant(name, pipeline, collector, producer)
    cold = variant.answer("bench-cold", request_records("bench-cold", 1000, T0 - 86_400_000), 1000)
    print(f"[{name}] cold first request (1,000 candles): {cold:.2f} s", flush=True)
    return variant


def measure(variant: Variant, n: int, k: int, args: argparse.Namespace) -> str:
    """Every case of one size for one variant; the line that reports it."""
    request_id, t0 = f"bench-{k}", T0 + k * 600 * 86_400_000
    line = [
        variant.add(
            f"pipeline {n}", variant.answer(request_id, request_records(request_id, n, t0), n)
        )
    ]
    if args.stored:
        again = f"{request_id}-stored"
        line.append(
            variant.add(
                f"pipeline {n} stored", variant.answer(again, stored_answer(again, n, t0), n)
            )
        )
    if args.overlap:
        again = f"{request_id}-again"
        line.append(
            variant.add(
                f"pipeline {n} overlap", variant.answer(again, request_records(again, n, t0), n)
            )
        )
    if args.baseline:
        rows = baseline_rows(n, T0 + k * 600 * 86_400_000)
        seconds = baseline_append(variant.pipeline.endpoints, variant.pipeline.namespace, rows)
        line.append(variant.add(f"baseline {n}", seconds))
    return f"[{variant.name}] n={n} (load {_load()}): " + ", ".join(line)


def _variants(specs: Sequence[str]) -> dict[str, dict[str, str]]:
    """NAME=DIR -> the PYTHONPATH override that runs the pipeline package from DIR."""
    variants: dict[str, dict[str, str]] = {}
    for spec in specs:
        name, _, src = spec.partition("=")
        path = Path(src).resolve()
        if not (path / "pipeline" / "__init__.py").is_file():
            raise SystemExit(f"--variant {spec}: no pipeline/__init__.py under {path}")
        inherited = os.environ.get("PYTHONPATH")
        pythonpath = f"{path}{os.pathsep}{inherited}" if inherited else str(path)
        variants[name] = {"PYTHONPATH": pythonpath}
    return variants or {"pipeline": {}}


def run(args: argparse.Namespace) -> None:
    specs = _variants(args.variant)
    with (
        stack(args.stack_dir) as endpoints,
        workdir(args.workdir) as tmp,
        contextlib.ExitStack() as cleanup,
    ):
        print(f"load {_load()}", flush=True)
        variants = [
            start_variant(name, endpoints, Path(tmp), args, overrides, cleanup)
            for name, overrides in specs.items()
        ]
        counter = iter(range(1_000_000))
        for rep in range(args.reps):
            for n in args.sizes:
                # Each variant in turn, the order alternating: paired under the same load.
                for variant in variants[:: 1 if rep % 2 == 0 else -1]:
                    print(measure(variant, n, next(counter), args), flush=True)
        for variant in variants:
            print(f"[{variant.name}] pipeline steps (per micro-batch, from its log):")
            for line in variant.pipeline.log_lines("history batch"):
                print("  " + line.split("pipeline.history: ", 1)[-1][:400])
        results = {v.name: v.results for v in variants}
        del variants, variant  # their Kafka producers go before the stack does
    print()
    names = list(results)
    print(f"{'case':<28} " + " ".join(f"{name + ' s':>12}" for name in names), end="")
    print(f" {names[-1] + ' / ' + names[0]:>16}" if len(names) > 1 else "")
    for case in results[names[0]]:
        medians = [median(results[name][case]) for name in names]
        row = f"{case:<28} " + " ".join(f"{m:12.2f}" for m in medians)
        print(row + (f" {medians[-1] / medians[0]:16.2f}" if len(names) > 1 else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[43_200, 525_600])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--trigger", type=float, default=0.5, help="history trigger, seconds")
    parser.add_argument("--overlap", action="store_true", help="also re-send each request")
    parser.add_argument(
        "--stored", action="store_true", help="also answer each request again from storage"
    )
    parser.add_argument(
        "--no-baseline", dest="baseline", action="store_false", help="skip the pyiceberg append"
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="run the pipeline package from DIR under NAME (repeat to compare)",
    )
    parser.add_argument("--stack-dir", type=Path, help="use the stack started with this dir")
    parser.add_argument("--workdir", type=Path, help="keep the pipeline's logs here")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
