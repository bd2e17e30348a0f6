"""ticks-persist's (``--table ticks``) or book-store's (``--table books``) two ways to
store one Kafka batch, by batch size: the driver's and the executors' (issue 44 item 5,
ADR 0021).

- **driver**: `TickPersister.on_driver`, today's way: every record to the driver as
  Arrow (`toArrow`), decoded by `records.kafka_ticks_table` in the driver's Python,
  the stored keys of the batch's tickers and time range read with pyiceberg, the new
  ticks appended by pyiceberg (`Lake.write_ticks`), at every size here;
- **driver-spark** (``--ways``): the same decode, the append a Spark job from the
  driver's Arrow (``spark-append``: today's rule above 600,000 rows);
- **executors**: `TickPersister.on_executors` (`Lake.write_kafka_ticks`): decoded by
  the same `records` function in the executors' Python workers (mapInArrow), one row
  per key after a shuffle, a LEFT ANTI JOIN with the stored keys, Spark's Iceberg
  append; the driver plans and commits.

Books (``--table books``): the same two ways, `BookStore.on_driver` (`records.decode_book`,
then each table's stored keys and pyiceberg append, snapshots first) and
`Lake.write_kafka_books` (`records.kafka_book_rows` in the Python workers, cached, split
into the two tables by `executor_writes.book_part`, each table's anti join and append),
into new, empty ``book_snapshots`` and ``book_deltas`` tables. The batch is a live
book's mix: per ticker, a BookSnapshot of ``--depth`` levels a side (the ingestor's
``book.depth``, reset NONE), then ``--deltas-per-snapshot`` BookDeltas of 1-3 changed
levels a side, 100 ms apart (a snapshot each 10 s as ``book.store_interval_s``, 10
updates a second). Steps are each table's, prefixed by it; the executors' "snapshots
decode" is the batch's fetch and decode (job 1 of the first table), the driver's
collect and decode are the whole batch's.

For each size one topic of 6 partitions holds the batch (``--tickers`` tickers, keyed
by ticker, produced once); both ways read the same records from it as a Kafka batch
DataFrame (what a micro-batch is, with ticks-persist's fetch options) into a new,
empty ``ticks`` table of the same catalog and S3 store each run, the order of the
two alternating. Spark runs as the pipeline's session (``local[2]``, driver 2 GiB):
its executors are threads of the driver's JVM on the same 2 cores.

Per run: seconds and rows/s (the rows stored, checked equal to the batch); CPU
seconds of the driver's Python process, of the JVM split by thread name into
executor tasks ("Executor task launch worker") and the rest (the driver's planning,
commit and Arrow collection, GC, JIT, Netty), and of the Python workers; peak RSS of
the driver's Python process and of the JVM during the run (``VmHWM``, reset first
through ``/proc/<pid>/clear_refs``). Each way's steps (ms) as the pipeline logs them.

    nice -n 10 .venv/bin/python bench/write_paths.py [--table ticks|books]
        [--sizes 10000 100000 500000 2000000] [--reps 3] [--tickers 100]
        [--deltas-per-snapshot 100] [--depth 100] [--json FILE] [--stack-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline_common import TICK_S, local_session, stack

from mdproto import contracts, envelope
from mdproto.messages import BookDelta, BookLevel, BookReset, BookSnapshot, TakerSide, Tick
from pipeline.arrow_appends import ArrowAppends
from pipeline.executor_writes import Stored
from pipeline.lake import (
    Lake,
    TableNames,
    create_book_deltas,
    create_book_snapshots,
    create_namespace,
    create_ticks,
)
from pipeline.live import KAFKA_COLUMNS, BookStore, TickPersister
from pipeline.session import jvm_pid
from pipeline.streams import FETCH_MAX_WAIT_MS
from pipeline.write_paths import WriteRule

if TYPE_CHECKING:
    from google.protobuf.message import Message
    from pyspark.sql import DataFrame, SparkSession

    from infra.localstack import StackEndpoints

#: Each way: where the batch is decoded and the write rule's driver-append limit.
WAYS = {
    "driver": ("driver", 10**9),  # pyiceberg at every size
    "executors": ("executors", 10**9),
    "driver-spark": ("driver", 0),  # decoded on the driver, Spark append from its Arrow
}
PARTITIONS = 6
WARM_UP = 10_000  # rows of each way's first, unrecorded run
BASE_MS = 1_764_460_800_000  # 2025-11-30T00:00:00Z: one day's partition per ticker
PAGE = os.sysconf("SC_PAGE_SIZE")
BOOK_STEP_MS = 100  # a book's updates, 10 a second


@dataclass(frozen=True, slots=True)
class Stores:
    """What ``--table`` stores: its topic (the registry's name), and each Iceberg table a
    run writes (its `TableNames` field, how it is created, the record type it holds)."""

    topic: str
    tables: tuple[tuple[str, Callable[[TableNames], str], str], ...]


STORES = {
    "ticks": Stores(contracts.KAFKA_TICKS, (("ticks_table", create_ticks, "Tick"),)),
    "books": Stores(
        contracts.KAFKA_BOOK,
        (
            ("book_snapshots_table", create_book_snapshots, "BookSnapshot"),
            ("book_deltas_table", create_book_deltas, "BookDelta"),
        ),
    ),
}


# -- the batch --------------------------------------------------------------------------


def ticker_names(tickers: int) -> list[str]:
    return [f"BENCH:T{i:04d}/USDT" for i in range(tickers)]


def tick_records(size: int, tickers: int) -> Iterator[tuple[str, Message]]:
    """``size`` ticks round-robin over ``tickers`` tickers, trade times 1 ms apart (a
    batch within one day), each trade id once."""
    names = ticker_names(tickers)
    for i in range(size):
        ticker = names[i % tickers]
        yield (
            ticker,
            Tick(
                ticker=ticker,
                trade_id=f"t{i}",
                price=100.0 + i % 17,
                amount=0.5,
                timestamp_ms=BASE_MS + i,
                side=TakerSide.SELL if i % 3 else TakerSide.BUY,
                ingested_at_ms=BASE_MS + i + 5,
            ),
        )


def levels(mid: float, side: int, count: int, seed: int) -> list[BookLevel]:
    """``count`` levels a cent apart from ``mid`` (``side`` -1: bids down, 1: asks up),
    amounts varying with ``seed`` and the level."""
    return [
        BookLevel(price=mid + side * 0.01 * (k + 1), amount=0.1 + (seed * 7 + k * 13) % 97 * 0.01)
        for k in range(count)
    ]


def book_records(
    size: int, tickers: int, deltas_per_snapshot: int, depth: int
) -> Iterator[tuple[str, Message]]:
    """``size`` book records round-robin over ``tickers`` tickers: each ticker's first
    record and every ``deltas_per_snapshot + 1``-th after it a BookSnapshot of ``depth``
    levels a side (reset NONE: the ingestor's periodic one), the others BookDeltas of
    1-3 changed levels a side; a ticker's records `BOOK_STEP_MS` apart, its exchange
    sequence counting up (a batch within one day)."""
    names = ticker_names(tickers)
    for i in range(size):
        ticker, j = names[i % tickers], i // tickers  # the ticker's j-th record
        at, mid = BASE_MS + j * BOOK_STEP_MS, 100.0 + j % 50 * 0.01
        if j % (deltas_per_snapshot + 1) == 0:
            yield (
                ticker,
                BookSnapshot(
                    ticker=ticker,
                    bids=levels(mid, -1, depth, j),
                    asks=levels(mid, 1, depth, j + 1),
                    depth=depth,
                    exchange_sequence=j + 1,
                    exchange_time_ms=at,
                    ingested_at_ms=at + 5,
                    reset=BookReset.BOOK_RESET_NONE,
                ),
            )
        else:
            yield (
                ticker,
                BookDelta(
                    ticker=ticker,
                    bids=levels(mid, -1, 1 + j % 3, j),
                    asks=levels(mid, 1, 1 + (j + 1) % 3, j + 1),
                    exchange_sequence=j + 1,
                    exchange_prev_sequence=j,
                    exchange_time_ms=at,
                    ingested_at_ms=at + 5,
                ),
            )


def produce(
    bootstrap: str, contract: str, topic: str, batch: Iterator[tuple[str, Message]]
) -> Counter[str]:
    """The ``batch``'s records, keyed by ticker, to a new ``topic`` of `PARTITIONS`
    partitions laid out as the registry's ``contract`` topic; returns how many of each
    record type."""
    from confluent_kafka import Producer

    from mdproto.runtime.kafka import ensure_topics, spec

    ensure_topics(
        bootstrap, [spec(contract, topic)], partitions=PARTITIONS, replication=1, timeout_s=30
    )
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    kinds: Counter[str] = Counter()
    for i, (ticker, record) in enumerate(batch):
        kinds[record.DESCRIPTOR.name] += 1
        value = envelope.encode_record(record)
        while True:
            try:
                producer.produce(topic, key=ticker.encode(), value=value)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(120) != 0:
        raise RuntimeError(f"{topic}: Kafka did not acknowledge every record")
    return kinds


def kafka_batch(spark: SparkSession, bootstrap: str, topic: str) -> DataFrame:
    """The whole topic as one batch, read the way ticks-persist's source reads
    (`streams.kafka_source`: short fetch waits, large fetches)."""
    return (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .option("kafka.fetch.max.wait.ms", str(FETCH_MAX_WAIT_MS))
        .option("kafka.max.partition.fetch.bytes", str(16 * 2**20))
        .option("kafka.fetch.max.bytes", str(64 * 2**20))
        .load()
        .select(*KAFKA_COLUMNS)
    )


# -- what each run costs ----------------------------------------------------------------


def _stat(path: Path) -> list[str]:
    return path.read_text().rsplit(")", 1)[1].split()


def process_cpu(pid: int, *, children: bool = False) -> float:
    """User + system CPU-s of a process (``children``: plus its reaped children's)."""
    f = _stat(Path(f"/proc/{pid}/stat"))
    ticks = int(f[11]) + int(f[12]) + ((int(f[13]) + int(f[14])) if children else 0)
    return ticks / TICK_S


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (the JVM's: pyspark.daemon and its workers)."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent[int(entry.name)] = int(_stat(entry / "stat")[1])
            except (FileNotFoundError, ProcessLookupError):
                continue
    found, frontier = [], [root]
    while frontier:
        kids = [pid for pid, ppid in parent.items() if ppid in frontier]
        found += kids
        frontier = kids
    return found


def jvm_threads(pid: int) -> dict[int, tuple[str, float]]:
    """The JVM's threads: tid -> (name as the kernel has it, CPU-s)."""
    threads = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            f = _stat(task / "stat")
        except (FileNotFoundError, ProcessLookupError):
            continue
        threads[int(task.name)] = (name, (int(f[11]) + int(f[12])) / TICK_S)
    return threads


def thread_kind(name: str) -> str:
    """Executor task threads (15 characters of "Executor task launch worker ...") or the
    rest of the JVM: the driver's threads, GC, JIT, Netty."""
    return "jvm_executor_tasks" if name.startswith("Executor task") else "jvm_rest"


def reset_peak_rss(pids: list[int]) -> None:
    """Start each process's ``VmHWM`` over from its current RSS."""
    for pid in pids:
        try:
            Path(f"/proc/{pid}/clear_refs").write_text("5")
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue


def rss_mb(pid: int, field: str = "VmHWM") -> float:
    """``VmHWM`` (the peak since the last reset) or ``VmRSS`` of a process, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@dataclass
class Snapshot:
    """The CPU counters a run's cost is the difference of."""

    driver_python: float
    threads: dict[int, tuple[str, float]]
    jvm: float
    workers: float

    @classmethod
    def take(cls, jvm: int) -> Snapshot:
        return cls(
            driver_python=process_cpu(os.getpid()),
            threads=jvm_threads(jvm),
            jvm=process_cpu(jvm),
            # Live workers with their reaped children, and the JVM's reaped children (a
            # pyspark.daemon that ended).
            workers=sum(process_cpu(p, children=True) for p in descendants(jvm))
            + process_cpu(jvm, children=True)
            - process_cpu(jvm),
        )

    def by_thread_name(self, before: Snapshot) -> dict[str, float]:
        """The JVM's CPU-s by thread name, numbers dropped (where "jvm_rest" went)."""
        names: dict[str, float] = {}
        for tid, (name, seconds) in self.threads.items():
            group = re.sub(r"[\d#-]+", "", name).strip()
            used = seconds - before.threads.get(tid, (name, 0.0))[1]
            names[group] = names.get(group, 0.0) + used
        return {k: round(v, 2) for k, v in sorted(names.items(), key=lambda kv: -kv[1]) if v > 0}

    def since(self, before: Snapshot) -> dict[str, float]:
        cpu = {"driver_python": self.driver_python - before.driver_python}
        kinds = {"jvm_executor_tasks": 0.0, "jvm_rest": 0.0}
        for tid, (name, seconds) in self.threads.items():
            kinds[thread_kind(name)] += seconds - before.threads.get(tid, (name, 0.0))[1]
        jvm = self.jvm - before.jvm
        kinds["jvm_rest"] += max(0.0, jvm - sum(kinds.values()))  # threads that ended
        cpu.update(kinds)
        cpu["jvm"] = jvm
        # A lower bound: a worker that exits unreaped takes its CPU with it, and the
        # workers alive at ``before`` may be gone (the difference is then below 0).
        cpu["python_workers"] = max(0.0, self.workers - before.workers)
        cpu["total"] = cpu["driver_python"] + jvm + cpu["python_workers"]
        return cpu


@dataclass
class Run:
    size: int
    path: str
    rep: int
    seconds: float
    rows: int
    how: str
    steps_ms: dict[str, float]
    cpu_s: dict[str, float]
    peak_rss_mb: dict[str, float]
    load1: tuple[float, float]
    jvm_threads_cpu_s: dict[str, float]
    files: int
    file_bytes: int
    warm_up: bool = False

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds


def both(snapshots: Stored, deltas: Stored) -> Stored:
    """book-store's two tables' `Stored` as one: rows added, each table's how and steps
    prefixed by it."""
    return Stored(
        snapshots.unique + deltas.unique,
        f"snapshots {snapshots.how}, deltas {deltas.how}",
        tuple((f"snapshots {k}", ms) for k, ms in snapshots.steps_ms)
        + tuple((f"deltas {k}", ms) for k, ms in deltas.steps_ms),
    )


@dataclass
class Bench:
    spark: SparkSession
    endpoints: StackEndpoints
    tables: ArrowAppends
    namespace: str
    jvm: int
    store: str = "ticks"  # a key of STORES
    runs: list[Run] = field(default_factory=list)

    def table(self, label: str) -> TableNames:
        """New, empty tables of `STORES`' ``store``, named after ``label``."""
        tables = STORES[self.store].tables
        names = TableNames(
            self.endpoints.catalog_name,
            self.namespace,
            **{name: f"{label}_{name.removesuffix('_table')}" for name, _, _ in tables},
        )
        for _, create, _ in tables:
            self.spark.sql(create(names))
        return names

    def stored(self, names: TableNames) -> tuple[Counter[str], int, int]:
        """Rows by record type, data files and their bytes in the run's tables."""
        rows: Counter[str] = Counter()
        files = []
        for name, _, kind in STORES[self.store].tables:
            table = self.tables.load(f"{names.namespace}.{getattr(names, name)}")
            found = [task.file for task in table.scan().plan_files()]
            rows[kind] += sum(f.record_count for f in found)
            files += found
        return rows, len(files), sum(f.file_size_in_bytes for f in files)

    def way(self, names: TableNames, path: str, kafka: DataFrame, rep: int) -> Callable[[], Stored]:
        """One run's write: ``path``'s way of ``store``, into ``names``' tables."""
        where, driver_max = WAYS[path]
        rule = WriteRule(driver_append_max_rows=driver_max)
        lake = Lake(self.spark, names, self.tables, rule=rule)
        if self.store == "ticks":
            persister = TickPersister(lake, lambda _: None)
            if where == "driver":
                return lambda: persister.on_driver(kafka, rep)
            return lambda: persister.on_executors(kafka)
        if where == "driver":
            books = BookStore(lake, lambda _: None)
            return lambda: both(*books.on_driver(kafka, rep))
        return lambda: both(*lake.write_kafka_books(self.spark, kafka))

    def run(
        self,
        size: int,
        path: str,
        topic: str,
        kinds: Counter[str],
        rep: int,
        *,
        warm_up: bool = False,
    ) -> Run:
        """One way's write of the ``size`` records of ``topic`` (``kinds`` of them by
        record type, what the tables must hold after)."""
        label = f"{self.store}_{path}_{size}_{rep}{'_warm' if warm_up else ''}".replace("-", "_")
        names = self.table(label)
        kafka = kafka_batch(self.spark, self.endpoints.kafka_bootstrap, topic)
        call = self.way(names, path, kafka, rep)
        workers = descendants(self.jvm)
        reset_peak_rss([os.getpid(), self.jvm, *workers])
        rss_before = {
            "driver_python": rss_mb(os.getpid(), "VmRSS"),
            "jvm": rss_mb(self.jvm, "VmRSS"),
        }
        load = os.getloadavg()[0]
        before = Snapshot.take(self.jvm)
        started = time.perf_counter()
        stored = call()
        took = time.perf_counter() - started
        after = Snapshot.take(self.jvm)
        cpu = after.since(before)
        peaks = {
            "driver_python": rss_mb(os.getpid()),
            "jvm": rss_mb(self.jvm),
            "python_workers": sum(rss_mb(p) for p in descendants(self.jvm)),
        }
        # What the run added on top of what each process held before it.
        peaks.update({f"{k}_growth": peaks[k] - rss_before[k] for k in rss_before})
        kept, files, size_bytes = self.stored(names)
        rows = sum(kept.values())
        if kept != kinds or stored.unique != size:
            raise RuntimeError(f"{path} {size}: stored {dict(kept)}, unique {stored.unique}")
        for name, _, _ in STORES[self.store].tables:
            self.spark.sql(f"DROP TABLE {names.namespace_id}.{getattr(names, name)} PURGE")
        run = Run(
            size, path, rep, took, rows, stored.how, dict(stored.steps_ms), cpu, peaks,
            (load, os.getloadavg()[0]), after.by_thread_name(before), files, size_bytes,
            warm_up,
        )  # fmt: skip
        self.runs.append(run)
        print(
            f"  {'warm-up ' if warm_up else ''}{path:<9} {size:>9,}: {took:7.2f} s "
            f"{run.rows_per_s:>10,.0f} rows/s, CPU driver py {cpu['driver_python']:.1f} "
            f"jvm {cpu['jvm']:.1f} (tasks {cpu['jvm_executor_tasks']:.1f}) workers "
            f"{cpu['python_workers']:.1f} total {cpu['total']:.1f}, driver peak "
            f"{peaks['driver_python']:.0f} MB (+{peaks['driver_python_growth']:.0f}), "
            f"{files} files {size_bytes / rows:.1f} B/row ({stored.how}; {stored.steps()}) "
            f"load {load:.1f}",
            flush=True,
        )
        return run


# -- the report -------------------------------------------------------------------------


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summary(runs: list[Run], sizes: list[int], ways: list[str]) -> tuple[str, dict[str, Any]]:
    """A markdown table of medians per size and way, and the crossover."""
    lines = [
        "| rows | way | rows/s, median (min-max) | s | driver Python CPU-s | JVM CPU-s "
        "(executor tasks) | Python workers CPU-s | total CPU-s | driver Python peak RSS MB "
        "(+ over the run's start) "
        "| JVM peak RSS MB (+ over the run's start) | steps, ms (median) |",
        "|---:|---|---|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    rates: dict[int, dict[str, float]] = {}
    for size in sizes:
        for path in ways:
            rs = [r for r in runs if r.size == size and r.path == path and not r.warm_up]
            if not rs:
                continue
            rate = [r.rows_per_s for r in rs]
            rates.setdefault(size, {})[path] = med(rate)

            def m(key: str, group: str, rs: list[Run] = rs) -> float:
                return med([getattr(r, group)[key] for r in rs])

            steps = ", ".join(
                f"{k} {med([r.steps_ms[k] for r in rs]):,.0f}" for k in rs[0].steps_ms
            )
            lines.append(
                f"| {size:,} | {path} | {med(rate):,.0f} ({min(rate):,.0f}-{max(rate):,.0f}) "
                f"| {med([r.seconds for r in rs]):.2f} | {m('driver_python', 'cpu_s'):.1f} "
                f"| {m('jvm', 'cpu_s'):.1f} ({m('jvm_executor_tasks', 'cpu_s'):.1f}) "
                f"| {m('python_workers', 'cpu_s'):.1f} | {m('total', 'cpu_s'):.1f} "
                f"| {m('driver_python', 'peak_rss_mb'):,.0f} "
                f"(+{m('driver_python_growth', 'peak_rss_mb'):,.0f}) "
                f"| {m('jvm', 'peak_rss_mb'):,.0f} (+{m('jvm_growth', 'peak_rss_mb'):,.0f}) "
                f"| {steps} |"
            )
    crossover = next(
        (
            s
            for s in sizes
            if rates.get(s, {}).get("executors", 0) >= rates.get(s, {}).get("driver", 1)
        ),
        None,
    )
    lines.append("")
    lines.append(
        "executors / driver rows/s: "
        + ", ".join(
            f"{s:,}: {r['executors'] / r['driver']:.2f}"
            for s, r in rates.items()
            if "executors" in r and "driver" in r
        )
    )
    lines.append(
        f"crossover: the smallest size measured where the executors store as fast: {crossover:,}"
        if crossover
        else "crossover: none at the sizes measured"
    )
    return "\n".join(lines), {"rates": rates, "crossover": crossover}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[10_000, 100_000, 500_000, 2_000_000]
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--ways", nargs="+", choices=list(WAYS), default=["driver", "executors"])
    parser.add_argument("--table", choices=list(STORES), default="ticks")
    parser.add_argument("--tickers", type=int, default=100)
    parser.add_argument(
        "--deltas-per-snapshot", type=int, default=100, help="books: BookDeltas between snapshots"
    )
    parser.add_argument("--depth", type=int, default=100, help="books: a snapshot's levels a side")
    parser.add_argument("--json", type=Path, help="every run, for plots")
    parser.add_argument("--stack-dir", type=Path, help="use the stack started with this dir")
    args = parser.parse_args()
    tag = uuid.uuid4().hex[:6]
    with stack(args.stack_dir) as endpoints, tempfile.TemporaryDirectory(prefix="bench-w-") as tmp:
        topics = {size: f"bench-writes-{tag}-{size}" for size in {*args.sizes, WARM_UP}}
        kinds: dict[int, Counter[str]] = {}
        for size, topic in topics.items():
            started = time.perf_counter()
            batch = (
                tick_records(size, args.tickers)
                if args.table == "ticks"
                else book_records(size, args.tickers, args.deltas_per_snapshot, args.depth)
            )
            kinds[size] = produce(endpoints.kafka_bootstrap, STORES[args.table].topic, topic, batch)
            print(
                f"{topic}: {dict(kinds[size])} in {time.perf_counter() - started:.1f} s",
                flush=True,
            )
        namespace = f"bench_writes_{tag}"
        settings, spark = local_session(endpoints, namespace, Path(tmp))
        jvm = jvm_pid(spark)
        assert jvm is not None
        c = settings.catalog
        bench = Bench(
            spark,
            endpoints,
            ArrowAppends(c.name, c.pyiceberg_properties()),
            namespace,
            jvm,
            args.table,
        )
        spark.sql(create_namespace(TableNames(c.name, namespace)))
        try:
            for path in args.ways:  # Python workers, JIT, S3 clients: warm before anything counts
                bench.run(WARM_UP, path, topics[WARM_UP], kinds[WARM_UP], 0, warm_up=True)
            for rep in range(args.reps):
                for i, size in enumerate(args.sizes):
                    order = args.ways if (rep + i) % 2 == 0 else list(reversed(args.ways))
                    for path in order:
                        bench.run(size, path, topics[size], kinds[size], rep)
        finally:
            text, derived = summary(bench.runs, args.sizes, args.ways)
            print()
            mix = (
                f", a snapshot of {args.depth} levels a side per {args.deltas_per_snapshot} deltas"
                if args.table == "books"
                else ""
            )
            print(
                f"{args.table}: {args.tickers} tickers{mix}, {PARTITIONS} partitions, local[2] on "
                f"{os.cpu_count()} cores, load1 {min(r.load1[0] for r in bench.runs):.1f}-"
                f"{max(r.load1[1] for r in bench.runs):.1f}"
            )
            print(text)
            if args.json:
                args.json.write_text(
                    json.dumps(
                        {
                            "table": args.table,
                            "tickers": args.tickers,
                            "deltas_per_snapshot": args.deltas_per_snapshot,
                            "depth": args.depth,
                            "partitions": PARTITIONS,
                            "master": "local[2]",
                            "cores": os.cpu_count(),
                            **derived,
                            "runs": [{**asdict(r), "rows_per_s": r.rows_per_s} for r in bench.runs],
                        },
                        indent=1,
                    )
                )
            spark.stop()


if __name__ == "__main__":
    main()
