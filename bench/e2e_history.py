"""End-to-end history benchmark: submit -> rows in hand, with a stage breakdown.

Starts the whole platform locally (like `make run`, on free ports, with the
exchange simulator and its rate limiter off), then asks for 1, 30 and 365 days
of 1-minute candles and splits each request's wall time into stages, using
timestamps the platform records anyway:

    ingest        submit ack -> last OHLCBatch record in Kafka (Kafka record timestamp)
    spark commit  last record in Kafka -> Iceberg snapshot holding the rows (snapshot timestamp)
    notification  snapshot -> HistoryReadyNotification received by the client
    iceberg read  notification -> rows in hand (pyiceberg filtered scan)

Each range is then asked again: stored, it is answered from Iceberg without
the exchange (docs/protocol.md, "Coverage"), the "stored" rows of the table.
The baseline, measured in the same run: a bare ccxt script fetching the same
range from the same simulator into memory (its own page loop, no Kafka, no
Spark) -- what "just ask the exchange" costs.

    .venv/bin/python bench/e2e_history.py [--days 1 30 365] [--reps 1] [--exchange-nice -10]
        [--history-trigger-s 0.1] [--aged 150] [--exchange-rtt-ms 20] [--out docs/e2e-benchmarks.md]

With ``--reps N`` each range is asked N times (N different ranges of that length, each
from the exchange, each followed by the bare loop over the same range) and the median
of the N ratios is printed: one short request moves by the micro-batch's timing.

The simulator shares this machine's cores and answers at once; ``--exchange-rtt-ms R``
gives every klines page a round trip of R ms as a remote exchange would (its CPU stays
here): the platform's pages in flight wait side by side, the bare loop's one by one.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from confluent_kafka import Consumer, TopicPartition

from infra.exchange_sim.control import SimulatorControl
from infra.localstack import Ports, StackConfig
from infra.platform import Platform, PlatformConfig, ServicePorts
from mdclient import Client, ClientSettings
from mdproto import contracts, envelope
from mdproto.messages import OHLCBatch
from pipeline.config import load_settings

DAY_MS = 86_400_000
KLINES_PATH = "/api/v3/klines"  # the page both the ingestor and the bare loop ask


@dataclass
class Stages:
    label: str
    rows: int
    submit_ms: int
    last_record_ms: int
    snapshot_ms: int
    notified_ms: int
    rows_ms: int

    @property
    def total_s(self) -> float:
        return (self.rows_ms - self.submit_ms) / 1000

    def row(self) -> str:
        ingest = (self.last_record_ms - self.submit_ms) / 1000
        if self.snapshot_ms < self.last_record_ms:  # answered from storage: no new commit
            commit_text = "-"
            notify = (self.notified_ms - self.last_record_ms) / 1000
        else:
            commit_text = f"{(self.snapshot_ms - self.last_record_ms) / 1000:.1f}"
            notify = (self.notified_ms - self.snapshot_ms) / 1000
        read = (self.rows_ms - self.notified_ms) / 1000
        rate = self.rows / self.total_s if self.total_s else 0.0
        return (
            f"| {self.label} | {self.rows:,} | {ingest:.1f} | {commit_text} | {notify:.2f} "
            f"| {read:.1f} | **{self.total_s:.1f}** | {rate:,.0f} |"
        )


def last_record_time(bootstrap: str, request_id: str) -> int:
    """Kafka timestamp of the request's final OHLCBatch marker."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{request_id}",
            "enable.auto.commit": False,
        }
    )
    try:
        meta = consumer.list_topics(contracts.KAFKA_OHLC_BATCHES, timeout=10)
        partitions = meta.topics[contracts.KAFKA_OHLC_BATCHES].partitions
        consumer.assign([TopicPartition(contracts.KAFKA_OHLC_BATCHES, p, 0) for p in partitions])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=1000, timeout=1.0):
                value = msg.value()
                if msg.error() or value is None:
                    continue
                batch = envelope.decode_record(value, OHLCBatch)
                if batch.request_id == request_id and batch.is_final:
                    return int(msg.timestamp()[1])
        raise RuntimeError(f"final marker of {request_id} not found in Kafka")
    finally:
        consumer.close()


def day_range(days: int, offset_days: int = 1) -> tuple[int, int]:
    """`days` whole days (0: one hour) ending `offset_days` ago: every candle closed."""
    now = int(time.time() * 1000)
    end = now // DAY_MS * DAY_MS - offset_days * DAY_MS
    return end - (days * DAY_MS if days else DAY_MS // 24), end


def run_one(
    client: Client, bootstrap: str, days: int, offset_days: int = 1, label: str = ""
) -> Stages:
    """One request for `days` whole days (0: one hour) ending `offset_days` ago."""
    start, end = day_range(days, offset_days)
    query = client.query("BINANCE:BTC/USDT", "1m", start, end)
    submit_ms = int(time.time() * 1000)
    outcome = client.wait_history(query, timeout_s=1800, attempts=1)
    notified_ms = int(time.time() * 1000)
    note = outcome.notification
    table = client.reader().read_ohlc(
        note.iceberg_table, query.ticker, 60, start, end, snapshot_id=note.snapshot_id
    )
    rows_ms = int(time.time() * 1000)
    snapshot = (
        client.reader().catalog().load_table(note.iceberg_table).snapshot_by_id(note.snapshot_id)
    )
    return Stages(
        label=label or str(days),
        rows=table.num_rows,
        submit_ms=submit_ms,
        last_record_ms=last_record_time(bootstrap, note.request_id),
        snapshot_ms=int(snapshot.timestamp_ms) if snapshot else notified_ms,
        notified_ms=notified_ms,
        rows_ms=rows_ms,
    )


def bare_ccxt_s(base_url: str, days: int, offset_days: int = 1) -> float:
    """Seconds for plain ccxt to page the same range from the same simulator into memory."""
    import asyncio

    import ccxt.async_support as ccxt

    from infra.exchange_sim.ccxt_glue import point_ccxt_at

    async def fetch() -> int:
        exchange = ccxt.binance({"enableRateLimit": False})
        point_ccxt_at(exchange, base_url)
        try:
            start, end = day_range(days, offset_days)
            rows: list[list[float]] = []
            since = start
            while since < end:
                page = await exchange.fetch_ohlcv("BTC/USDT", "1m", since=since, limit=1000)
                page = [c for c in page if c[0] < end]
                if not page:
                    break
                rows += page
                since = int(page[-1][0]) + 60_000
            return len(rows)
        finally:
            await exchange.close()

    started = time.monotonic()
    asyncio.run(fetch())
    return time.monotonic() - started


def age_tables(client: Client, namespace: str, commits: int) -> str:
    """Give ``ohlc`` and ``requests`` ``commits`` more snapshots each, as an hour of a
    running platform does (upkeep keeps an hour of them): one-row appends of a stored
    row under a ticker no request asks for. What the two tables then hold."""
    catalog = client.reader().catalog()
    held = []
    for name in ("ohlc", "requests"):
        table = catalog.load_table(f"{namespace}.{name}")
        row = table.scan(limit=1).to_arrow().slice(0, 1)
        if "ticker" in row.column_names:
            aged = pa.array(["BENCH:AGED/USDT"], row.schema.field("ticker").type)
            row = row.set_column(row.column_names.index("ticker"), "ticker", aged)
        row = row.cast(table.schema().as_arrow())  # the table's nullability
        for _ in range(commits):
            table.append(row)
        held.append(f"{name} {len(table.metadata.snapshots)}")
    return ", ".join(held)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--days", type=int, nargs="+", default=[1, 30, 365])
    parser.add_argument("--out", type=Path, default=None, help="append the table here")
    parser.add_argument(
        "--reps", type=int, default=1, help="ranges of each length asked (median ratio)"
    )
    parser.add_argument(
        "--no-early",
        action="store_true",
        help="stored answers through the history query only (history.stored_answers_early off)",
    )
    parser.add_argument(
        "--history-trigger-s",
        type=float,
        default=None,
        help="the history query's trigger interval (history.trigger_s; config.yaml's if unset)",
    )
    parser.add_argument(
        "--exchange-nice",
        type=int,
        default=None,
        help="the simulator's nice value (e.g. -10): a remote exchange does not share "
        "the platform's cores; both the platform and the bare loop ask the same simulator",
    )
    parser.add_argument(
        "--exchange-rtt-ms",
        type=float,
        default=0.0,
        help="each klines page answered this much later (the simulator's `slow` fault, "
        "pages in flight wait side by side): a remote exchange's round trip, for both the "
        "platform and the bare loop",
    )
    parser.add_argument(
        "--aged",
        type=int,
        default=0,
        help="one-row commits added to ohlc and requests after the warm-up, as a running "
        "platform's hour of snapshots (e.g. 150)",
    )
    args = parser.parse_args()
    data_dir = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
    service_env = {"INGESTOR_EXCHANGES__BINANCE__ENABLE_RATE_LIMIT": "false"}
    if args.no_early:
        service_env["PIPELINE_HISTORY__STORED_ANSWERS_EARLY"] = "false"
    if args.history_trigger_s is not None:
        service_env["PIPELINE_HISTORY__TRIGGER_S"] = str(args.history_trigger_s)
    config = PlatformConfig(data_dir=data_dir, ports=ServicePorts.free(), service_env=service_env)
    stack_config = StackConfig(data_dir=data_dir, ports=Ports.free())
    with Platform(config, stack_config=stack_config, use_simulator=True) as platform:
        if args.exchange_nice is not None:
            os.setpriority(os.PRIO_PGRP, platform.pid("exchange-sim"), args.exchange_nice)
            print(f"exchange simulator at nice {args.exchange_nice}", flush=True)
        if args.exchange_rtt_ms:
            assert platform.endpoints.exchange_url is not None
            SimulatorControl(platform.endpoints.exchange_url).add_fault(
                "slow", path=KLINES_PATH, delay=args.exchange_rtt_ms / 1000, count=2**62
            )
            print(f"each klines page {args.exchange_rtt_ms:g} ms later", flush=True)
        env = platform.endpoints.client_env()
        settings = ClientSettings.model_validate(
            {k.removeprefix("MDCLIENT_").lower(): v for k, v in env.items()}
        )
        lines = [
            "| days | rows | ingest s | spark commit s | notify s | iceberg read s "
            "| total s | rows/s |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        bootstrap = platform.endpoints.stack.kafka_bootstrap
        baselines: list[str] = []
        with Client(settings=settings) as client:
            # The first request after the start pays for table creation and JIT-cold
            # Spark code; the same hour of another day, asked next, is a warm one.
            # Days before every range the runs below ask (each on its own, never merged).
            far = 1 + args.reps * max(max(args.days), 1) + 10
            for label, offset in (("1 h, first after start", far), ("1 h, warm", far + 1)):
                lines.append(run_one(client, bootstrap, 0, offset_days=offset, label=label).row())
                print(lines[-1], flush=True)
            if args.aged:
                namespace = load_settings().catalog.namespace
                print(f"snapshots: {age_tables(client, namespace, args.aged)}", flush=True)
            assert platform.endpoints.exchange_url is not None
            for days in args.days:
                ratios: list[float] = []
                for rep in range(args.reps):
                    offset = 1 + rep * max(days, 1)  # a range not asked before
                    label = str(days) if args.reps == 1 else f"{days} (range {rep + 1})"
                    asked = run_one(client, bootstrap, days, offset_days=offset, label=label)
                    lines.append(asked.row())
                    print(lines[-1], flush=True)
                    if rep == 0:  # the repeat is answered from Iceberg
                        stored = run_one(client, bootstrap, days, label=f"{days} stored")
                        lines.append(stored.row())
                        print(lines[-1], flush=True)
                    bare = bare_ccxt_s(platform.endpoints.exchange_url, days, offset)
                    ratios.append(asked.total_s / bare)
                    baselines.append(
                        f"| {label} | bare ccxt fetch into memory | {bare:.2f} "
                        f"| {asked.total_s:.2f} | {ratios[-1]:.2f}x |"
                    )
                    print(baselines[-1], flush=True)
                if args.reps > 1:
                    baselines.append(
                        f"| {days}, median of {args.reps} | | | | "
                        f"**{statistics.median(ratios):.2f}x** |"
                    )
                    print(baselines[-1], flush=True)
        lines += [
            "",
            "| days | baseline | baseline s | platform s | ratio |",
            "|---:|---|---:|---:|---:|",
            *baselines,
        ]
    table = "\n".join(lines)
    print(table)
    if args.out is not None:
        with args.out.open("a") as fh:
            fh.write(table + "\n")


if __name__ == "__main__":
    main()
