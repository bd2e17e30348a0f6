"""kafka-python vs confluent-kafka: the ingestor's produce path and a pipeline-side read.

    producer process (one client, a fresh process per run)
        -> Kafka (infra.localstack, the broker alone, on free ports)
    consumer process (one client, a fresh process per run): a topic from the start

The records are the ingestor's own, built by its code and encoded with mdproto
as `KafkaSink` does (`envelope.encode_record`), before the clock starts: `Tick`
(`live.tick_record`, 10 tickers, keyed by ticker) and 500-row `OHLCBatch`
(`candles.BatchBuilder` at the default `history.batch_size`, keyed by the
request's ticker), on topics of 3 partitions (`kafka.topic_partitions` when the
figures were taken; 6 since ADR 0014). Both producers get `KafkaSink`'s settings:
idempotence, acks=all, linger 5 ms, lz4, a 30 s delivery timeout; everything else
stays at each client's default.

Cases, each client in its own process, alternated `--reps` times:

- `ticks max` / `batches max`: every record sent as fast as the client takes it;
  records/s from the first send to the last delivery report;
- `ticks paced`: `--rate` ticks/s for `--seconds` (a busy live feed): the latency
  of a record that does not queue behind a burst;
- `read ticks` / `read batches`: a consumer as the live engine configures it
  (no commits, librdkafka's fetch wait), assigned every partition at the start,
  reads the topic written by the first confluent run of the matching `max` case
  (lz4 batches, as the ingestor writes them), touching each key and value.

Latency is send -> delivery report: confluent-kafka's callback runs in `poll`,
called after every send (librdkafka's pattern; the ingestor polls every 20 ms,
which would add up to that); kafka-python's future callback runs on its I/O
thread. CPU is `time.process_time()` of the client's process (all its threads:
librdkafka's or kafka-python's I/O thread) over the measured window, divided by
the records. Ratios are kafka-python over confluent-kafka in the same
repetition (the machine's load moves both), reported as the median with the
spread (min-max).

kafka-python is a bench-only requirement:
    .venv/bin/pip install -c constraints.txt -r bench/requirements-kafka.txt
Run: .venv/bin/python bench/kafka_clients.py [--reps 5] [--ticks 20000] [--batches 100]
        [--rate 1000] [--seconds 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing as mp
import os
import queue
import signal
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, fields
from multiprocessing.queues import Queue
from typing import Any, Protocol

from pipeline_common import percentile, stack

from ingestor.candles import BatchBuilder, metadata_for
from ingestor.live import tick_record
from ingestor.model import Candle, Trade
from mdproto import envelope
from mdproto.messages import DataRequest
from mdproto.runtime.kafka import TopicSpec, ensure_topics

CLIENTS = ("confluent-kafka", "kafka-python")
PARTITIONS = 3  # kafka.topic_partitions when the recorded figures were taken (now 6)
BATCH_ROWS = 500  # the ingestor's history.batch_size
BASES = ["BTC", "ETH", "SOL", "XRP", "BNB", "ADA", "DOGE", "TRX", "AVAX", "LINK"]
TICKERS = [f"BINANCE:{base}/USDT" for base in BASES]
WARMUP = 50  # records delivered before the clock starts (connections, producer id)
MIN = 60_000

Record = tuple[bytes, bytes]  # key, value


def tick_records(count: int) -> list[Record]:
    """`count` Ticks round-robin over TICKERS, as the live feed builds them."""
    now = int(time.time() * 1000)
    out = []
    for i in range(count):
        ticker = TICKERS[i % len(TICKERS)]
        trade = Trade(
            trade_id=str(4_812_000_000 + i),
            price=64_000.0 + (i % 997) * 0.01,
            amount=0.001 * (1 + i % 50),
            timestamp_ms=now + i,
            side="buy" if i % 3 else "sell",
        )
        out.append((ticker.encode(), envelope.encode_record(tick_record(ticker, trade, now + i))))
    return out


def batch_records(count: int) -> list[Record]:
    """`count` full OHLCBatch records of one history request, as the ingestor cuts them."""
    ticker = TICKERS[0]
    start = (int(time.time() * 1000) // MIN - count * BATCH_ROWS) * MIN
    request = DataRequest(
        request_id=f"bench-{uuid.uuid4().hex[:8]}",
        kind=DataRequest.HISTORICAL,
        ticker=ticker,
        period_seconds=60,
        start_time_ms=start,
        end_time_ms=start + count * BATCH_ROWS * MIN,
    )
    candles = [  # Binance's klines: every optional field set
        Candle(
            start + i * MIN,
            64_000.0 + i % 89,
            64_100.0,
            63_900.0,
            64_050.0,
            12.5 + i % 7,
            trade_count=4_200 + i % 300,
            quote_volume=800_000.0 + i,
            taker_buy_volume=6.25,
            taker_buy_quote_volume=400_000.0 + i,
        )
        for i in range(count * BATCH_ROWS)
    ]
    builder = BatchBuilder(metadata_for(request, "bench"), BATCH_ROWS)
    records = builder.add(candles) + builder.flush()
    return [(ticker.encode(), envelope.encode_record(r)) for r in records]


# -- the two clients behind one small interface --------------------------------------------


class Producer(Protocol):
    def send(self, topic: str, record: Record, delivered: Callable[[bool], None]) -> None: ...
    def wait(self, seconds: float) -> None:
        """Idle until `seconds` pass, serving delivery reports if the client needs it."""

    def flush(self) -> None: ...


def _confluent_producer(bootstrap: str) -> Producer:
    from confluent_kafka import Producer as CkProducer

    from mdproto.runtime.kafka import quiet_logger

    producer = CkProducer(
        {  # KafkaSink's settings
            "bootstrap.servers": bootstrap,
            "client.id": "bench",
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "compression.type": "lz4",
            "message.timeout.ms": 30_000,
            "logger": quiet_logger("bench"),
        }
    )

    class Confluent:
        def send(self, topic: str, record: Record, delivered: Callable[[bool], None]) -> None:
            def report(err: Any, _msg: Any) -> None:
                delivered(err is None)

            while True:
                try:
                    producer.produce(topic, key=record[0], value=record[1], on_delivery=report)
                    break
                except BufferError:  # librdkafka's queue is full: KafkaSink waits the same way
                    producer.poll(0.005)
            producer.poll(0)

        def wait(self, seconds: float) -> None:
            end = time.perf_counter() + seconds
            # poll() waits whole milliseconds (less is 0: a busy loop); sleep the rest.
            while (left := end - time.perf_counter()) >= 0.001:
                producer.poll(left)
            time.sleep(max(0.0, end - time.perf_counter()))
            producer.poll(0)

        def flush(self) -> None:
            producer.flush(60)

    return Confluent()


def _kafka_python_producer(bootstrap: str) -> Producer:
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        client_id="bench",
        enable_idempotence=True,
        acks="all",
        linger_ms=5,
        compression_type="lz4",
        delivery_timeout_ms=30_000,
        # It requires delivery > linger + request timeout (30 s by default); error path only.
        request_timeout_ms=20_000,
    )

    class KafkaPython:
        def send(self, topic: str, record: Record, delivered: Callable[[bool], None]) -> None:
            future = producer.send(topic, key=record[0], value=record[1])
            future.add_callback(lambda _meta: delivered(True))
            future.add_errback(lambda _exc: delivered(False))

        def wait(self, seconds: float) -> None:
            time.sleep(seconds)  # its I/O thread runs the callbacks

        def flush(self) -> None:
            producer.flush(60)

    return KafkaPython()


PRODUCERS: dict[str, Callable[[str], Producer]] = {
    "confluent-kafka": _confluent_producer,
    "kafka-python": _kafka_python_producer,
}


def _read_confluent(bootstrap: str, topic: str, count: int) -> tuple[float, float]:
    """Seconds and CPU seconds to read `count` records of `topic` from its start."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from mdproto.runtime.kafka import quiet_logger

    consumer = Consumer(
        {  # the live engine's settings
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "logger": quiet_logger("bench"),
        }
    )
    partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
    started, cpu = time.perf_counter(), time.process_time()
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    read = size = 0
    while read < count:
        # consume() waits out its timeout until it has them all: never ask for more than is left.
        for msg in consumer.consume(min(10_000, count - read), timeout=1.0):
            if msg.error() is None:
                size += len(msg.key() or b"") + len(msg.value() or b"")
                read += 1
    result = time.perf_counter() - started, time.process_time() - cpu
    consumer.close()
    return result


def _read_kafka_python(bootstrap: str, topic: str, count: int) -> tuple[float, float]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        fetch_max_wait_ms=100,
        auto_offset_reset="earliest",
    )
    partitions = consumer.partitions_for_topic(topic)
    started, cpu = time.perf_counter(), time.process_time()
    assigned = [TopicPartition(topic, p) for p in sorted(partitions)]
    consumer.assign(assigned)
    consumer.seek_to_beginning(*assigned)
    read = size = 0
    while read < count:
        for batch in consumer.poll(timeout_ms=1000, max_records=10_000).values():
            for msg in batch:
                size += len(msg.key) + len(msg.value)  # touched, as a reader would
                read += 1
    result = time.perf_counter() - started, time.process_time() - cpu
    consumer.close()
    return result


READERS: dict[str, Callable[[str, str, int], tuple[float, float]]] = {
    "confluent-kafka": _read_confluent,
    "kafka-python": _read_kafka_python,
}


# -- one run, in its own process ----------------------------------------------------------


@dataclass
class Result:
    rate: float  # records/s
    p50_ms: float
    p99_ms: float
    cpu_us: float  # process CPU per record
    failed: int = 0  # delivery reports with an error (the run measured the wrong thing)


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # "ticks" or "batches"
    count: int
    rate: float | None = None  # paced: records/s; None: as fast as the client takes them
    read: bool = False


def records_for(case: Case) -> list[Record]:
    return tick_records(case.count) if case.kind == "ticks" else batch_records(case.count)


def produce(client: str, bootstrap: str, topic: str, case: Case) -> Result:
    records = records_for(case)
    producer = PRODUCERS[client](bootstrap)
    for record in records[:WARMUP]:
        producer.send(topic, record, lambda _ok: None)
    producer.flush()
    n = len(records)
    sent = [0.0] * n
    done = [0.0] * n
    failed = 0

    def reporter(i: int) -> Callable[[bool], None]:
        def delivered(ok: bool) -> None:
            nonlocal failed
            done[i] = time.perf_counter()
            failed += not ok

        return delivered

    callbacks = [reporter(i) for i in range(n)]  # made before the clock starts, for both
    cpu = time.process_time()
    started = time.perf_counter()
    interval = 1 / case.rate if case.rate else 0.0
    for i, record in enumerate(records):
        if interval:
            due = started + i * interval
            if (ahead := due - time.perf_counter()) > 0:
                producer.wait(ahead)
        sent[i] = time.perf_counter()
        producer.send(topic, record, callbacks[i])
    producer.flush()
    cpu = time.process_time() - cpu
    latencies = [(d - s) * 1000 for s, d in zip(sent, done, strict=True)]
    return Result(
        n / (max(done) - started),
        percentile(latencies, 50),
        percentile(latencies, 99),
        cpu / n * 1e6,
        failed,
    )


def read(client: str, bootstrap: str, topic: str, case: Case) -> Result:
    seconds, cpu = READERS[client](bootstrap, topic, case.count)
    nan = float("nan")
    return Result(case.count / seconds, nan, nan, cpu / case.count * 1e6)


def run_in_process(client: str, bootstrap: str, topic: str, case: Case, out: Queue[Any]) -> None:
    """multiprocessing target: one run, its Result on `out`."""
    out.put((read if case.read else produce)(client, bootstrap, topic, case))


def one_run(client: str, bootstrap: str, topic: str, case: Case) -> Result:
    spawn = mp.get_context("spawn")
    out: Queue[Any] = spawn.Queue()
    proc = spawn.Process(target=run_in_process, args=(client, bootstrap, topic, case, out))
    proc.start()
    try:
        while True:
            try:
                result: Result = out.get(timeout=1.0)
                return result
            except queue.Empty:
                if not proc.is_alive():
                    raise RuntimeError(f"{client} {case.name}: the run's process died") from None
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()


# -- the table ----------------------------------------------------------------------------


def _median(runs: list[Result]) -> Result:
    values = {f.name: statistics.median(getattr(r, f.name) for r in runs) for f in fields(Result)}
    return Result(**values)


def _ratio(runs: list[Result], baseline: list[Result], field: str) -> str:
    """Median of the per-repetition ratios, with their spread."""
    ratios = [getattr(r, field) / getattr(b, field) for r, b in zip(runs, baseline, strict=True)]
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"


def _latency(r: Result) -> str:
    return "-" if r.p50_ms != r.p50_ms else f"{r.p50_ms:.1f}/{r.p99_ms:.1f}"


def cases(ticks: int, batches: int, rate: float, seconds: float) -> list[Case]:
    return [
        Case("ticks max", "ticks", ticks),
        Case("batches max", "batches", batches),
        Case("ticks paced", "ticks", int(rate * seconds), rate=rate),
        Case("read ticks", "ticks", ticks, read=True),
        Case("read batches", "batches", batches, read=True),
    ]


def table(bootstrap: str, all_cases: list[Case], reps: int) -> None:
    """Every case, clients alternated `reps` times (the order flips each repetition)."""
    tag = uuid.uuid4().hex[:6]
    ck, kp = CLIENTS
    print(
        f"| case | {ck} rec/s | {kp} rec/s | ratio (min-max) | p50/p99 ms {ck} | {kp} "
        f"| CPU µs/rec {ck} | {kp} | CPU ratio (min-max) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    written: dict[str, str] = {}  # kind -> a topic holding `count` records of it
    for case in all_cases:
        runs: dict[str, list[Result]] = {c: [] for c in CLIENTS}
        for rep in range(reps):
            for client in CLIENTS if rep % 2 == 0 else CLIENTS[::-1]:
                if case.read:
                    topic = written[case.kind]
                else:
                    topic = f"bench-kc-{tag}-{case.name.replace(' ', '-')}-{client}-{rep}"
                    ensure_topics(
                        bootstrap,
                        [TopicSpec(topic)],
                        partitions=PARTITIONS,
                        replication=1,
                        timeout_s=30,
                    )
                runs[client].append(one_run(client, bootstrap, topic, case))
                if not case.read and case.rate is None and client == ck:
                    written.setdefault(case.kind, topic)
        print(_row(case, runs), flush=True)


def _row(case: Case, runs: dict[str, list[Result]]) -> str:
    """The case's table row: medians, ratios with their spread, and failed deliveries."""
    ck, kp = CLIENTS
    med = {c: _median(runs[c]) for c in CLIENTS}
    cells = [
        f"{case.name} ({case.count:,})",
        f"{med[ck].rate:,.0f}",
        f"{med[kp].rate:,.0f}",
        _ratio(runs[kp], runs[ck], "rate"),
        _latency(med[ck]),
        _latency(med[kp]),
        f"{med[ck].cpu_us:.1f}",
        f"{med[kp].cpu_us:.1f}",
        _ratio(runs[kp], runs[ck], "cpu_us"),
    ]
    row = f"| {' | '.join(cells)} |"
    if failed := sum(r.failed for c in CLIENTS for r in runs[c]):
        row += f"\n  ({failed} deliveries failed: this row measured failures too)"
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--ticks", type=int, default=20_000, help="ticks per max/read run")
    parser.add_argument("--batches", type=int, default=100, help="OHLCBatch records per run")
    parser.add_argument("--rate", type=float, default=1_000, help="paced ticks/s")
    parser.add_argument("--seconds", type=float, default=3.0, help="paced run length")
    parser.add_argument("--kafka", default=None, help="bootstrap servers (default: start one)")
    args = parser.parse_args()
    # SIGTERM (e.g. `timeout`) unwinds like Ctrl-C, so the broker is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # kafka-python, and the native codecs it would otherwise replace with pure Python.
    if not all(importlib.util.find_spec(name) for name in ("kafka", "crc32c", "lz4")):
        sys.exit(
            "kafka-python is a bench-only requirement: "
            ".venv/bin/pip install -c constraints.txt -r bench/requirements-kafka.txt"
        )
    all_cases = cases(args.ticks, args.batches, args.rate, args.seconds)
    sizes = {kind: len(records_for(Case("", kind, 1))[0][1]) for kind in ("ticks", "batches")}
    print(
        f"records: Tick {sizes['ticks']} B, OHLCBatch ({BATCH_ROWS} rows) {sizes['batches']:,} B; "
        f"load average at start {os.getloadavg()[0]:.1f}\n",
        flush=True,
    )
    if args.kafka:
        table(args.kafka, all_cases, args.reps)
    else:
        with stack(None, kafka_only=True) as endpoints:
            table(endpoints.kafka_bootstrap, all_cases, args.reps)
    print(f"\nload average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
