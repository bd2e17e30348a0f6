"""A ticks or books batch over the record threshold is decoded and appended by Spark's
executors (ADR 0021): every trade, snapshot and delta stored once (the books as the
driver's decode makes them of the same records), the replay of the same batch stores
none, and a small batch after it still goes the driver's way."""

from __future__ import annotations

import re
from typing import Any

import pytest

from infra.testing import poll_until
from mdproto import envelope

pytestmark = [pytest.mark.stack, pytest.mark.spark, pytest.mark.heavy(seconds=160)]

TICKERS = ("BINANCE:BTC/USDT", "BINANCE:ETH/USDT", "KRAKEN:SOL/EUR")
B = 1_704_067_200_000  # 2024-01-01T00:00:00Z


def replaying_run(make_run: Any, fail_at: str, **env: str) -> Any:
    """A run whose batches of 100 records or more go to the executors; the first batch
    that reaches ``fail_at`` fails after its commits, and the restarted query replays it."""
    return make_run(
        PIPELINE_CEP__ENABLED="false",
        PIPELINE_HISTORY__ENABLED="false",
        PIPELINE_CATALOG__EXECUTOR_APPEND_MIN_RECORDS="100",
        PIPELINE_FAIL_AT=fail_at,
        PIPELINE_RESTART__BACKOFF_INITIAL_S="0.5",
        **env,
    )


def wait_replayed(run: Any, tools: Any, query: str, logged: str) -> None:
    """Until ``query`` restarted once and its replay logged ``logged``."""

    def replayed() -> bool:
        return run.metrics().get(f'pipeline_query_restarts_total{{query="{query}"}}') == 1.0

    poll_until(f"{query} restarted", replayed, tools.WAIT_S, interval_s=0.5)
    poll_until("the replay logged", lambda: logged in run.log_text(), tools.WAIT_S, interval_s=0.5)


def assert_executors_then_driver(run: Any, tables: tuple[str, ...]) -> None:
    """Each of ``tables`` written twice by the executors (the batch, its replay), then by
    the driver (the small batch), and never by the fallback."""
    writes = {k: v for k, v in run.metrics().items() if k.startswith("pipeline_iceberg_writes")}
    for table in tables:
        executor = f'pipeline_iceberg_writes_total{{path="executor-append",table="{table}"}}'
        assert writes[executor] == 2.0, writes
        assert writes[f'pipeline_iceberg_writes_total{{path="driver-append",table="{table}"}}'] >= 1
    assert not any('path="append-then-merge"' in k for k in writes), writes


def test_a_large_ticks_batch_is_written_by_the_executors_once_and_its_replay_adds_none(
    make_run: Any, tools: Any, build: Any
) -> None:
    run = replaying_run(make_run, "live-after-ticks-commit")
    kafka = tools.Kafka(run.endpoints.kafka_bootstrap)
    lake = tools.Lake(run.endpoints, run.namespace)

    def trades(ticker: str, first: int, last: int, ingested_at_ms: int = 0) -> list[bytes]:
        def tick(i: int) -> Any:
            at = B + i * 1000
            return build.tick(
                f"{ticker[:3]}-{i}", 100.0 + i % 7, at, ticker=ticker, ingested_at_ms=ingested_at_ms
            )

        return [envelope.encode_record(tick(i)) for i in range(first, last)]

    # One batch of 3 x 100 trades, 20 of them delivered again later (the later copy's
    # ingested_at wins) and a record that is no tick: 321 records >= 100.
    for ticker in TICKERS:
        kafka.send(run.ticks_topic, trades(ticker, 0, 100, B + 1), key=ticker)
    kafka.send(run.ticks_topic, trades(TICKERS[0], 0, 20, B + 2), key=TICKERS[0])
    kafka.send(run.ticks_topic, [b"not a tick"], key=TICKERS[0])

    run.start()
    run.wait_ready()

    wait_replayed(run, tools, "ticks-persist", "unique ticks stored (executor-append 0)")
    # Below the threshold: the driver's way.
    kafka.send(run.ticks_topic, trades(TICKERS[1], 100, 110), key=TICKERS[1])
    poll_until("the small batch stored", lambda: len(lake.rows("ticks")) >= 310, tools.WAIT_S)

    rows = lake.rows("ticks")
    keys = sorted((r["ticker"], r["trade_id"]) for r in rows)
    assert len(keys) == len(set(keys)) == 310  # every trade once
    again = {r["trade_id"]: r["ingested_at"] for r in rows if r["ticker"] == TICKERS[0]}
    assert {int(again[f"BIN-{i}"].timestamp() * 1000) for i in range(20)} == {B + 2}
    assert int(again["BIN-20"].timestamp() * 1000) == B + 1

    assert_executors_then_driver(run, ("ticks",))
    log = run.log_text()
    stored = re.findall(r"ticks-persist batch 0: (\d+) unique ticks stored \(([^)]*)\)", log)
    # The first run failed after its commit (before its log line); the replay found them.
    assert stored == [("300", "executor-append 0")], stored
    assert "ticks-persist on an executor: dropped" in log  # the worker logs the reject
    run.stop()
    assert run.process is not None and run.process.returncode == 0


def book_records(ticker: str, first: int, last: int, ingested_at_ms: int = 0) -> list[bytes]:
    """Per step i: a snapshot every 10th (a START reset first), else a delta."""
    from mdproto.book import levels_message
    from mdproto.messages import BookDelta, BookReset, BookSnapshot

    out = []
    for i in range(first, last):
        at = B + i * 1000
        levels = {"bids": levels_message([(100.0 - i % 3, 1.0 + i)]), "asks": levels_message([])}
        common = {"ticker": ticker, "exchange_sequence": i + 1, "exchange_time_ms": at}
        ingested = {"ingested_at_ms": ingested_at_ms or at + 5}
        record: Any
        if i % 10 == 0:
            reset = BookReset.BOOK_RESET_START if i == 0 else BookReset.BOOK_RESET_NONE
            record = BookSnapshot(**common, **levels, **ingested, depth=20, reset=reset)
        else:
            record = BookDelta(**common, **levels, **ingested, exchange_prev_sequence=i)
        out.append(envelope.encode_record(record))
    return out


def read_topic(bootstrap: str, topic: str, count: int) -> Any:
    """Every record of ``topic`` as the Kafka source hands a batch to the driver's decode."""
    import uuid

    import pyarrow as pa
    from confluent_kafka import Consumer

    from infra.testing import consume

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.subscribe([topic])
        messages = consume(consumer, count)
    finally:
        consumer.close()
    return pa.table(
        {
            "value": pa.array([m.value() for m in messages], pa.binary()),
            "partition": pa.array([m.partition() for m in messages], pa.int32()),
            "offset": pa.array([m.offset() for m in messages], pa.int64()),
            "timestamp": pa.array([m.timestamp()[1] * 1000 for m in messages], pa.int64()).cast(
                pa.timestamp("us", tz="UTC")
            ),
        }
    )


def test_a_large_books_batch_is_stored_by_the_executors_as_by_the_driver_and_its_replay_adds_none(
    make_run: Any, tools: Any
) -> None:
    from pipeline import records

    run = replaying_run(
        make_run,
        "live-after-books-commit",
        PIPELINE_MARKETS__ENABLED="false",
        PIPELINE_GAPS__ENABLED="false",
    )
    kafka = tools.Kafka(run.endpoints.kafka_bootstrap)
    lake = tools.Lake(run.endpoints, run.namespace)

    # One batch of 3 x (4 snapshots + 36 deltas), 2 snapshots delivered again later (the
    # later copy's ingested_at wins) and a record that is no book: 123 records >= 100.
    for ticker in TICKERS:
        kafka.send(run.book_topic, book_records(ticker, 0, 40), key=ticker)
    kafka.send(run.book_topic, book_records(TICKERS[0], 0, 11, B + 2)[::10], key=TICKERS[0])
    kafka.send(run.book_topic, [b"not a book"], key=TICKERS[0])
    expected = records.decode_book(read_topic(run.endpoints.kafka_bootstrap, run.book_topic, 123))
    assert (expected.snapshots.num_rows, expected.deltas.num_rows) == (12, 108)

    run.start()
    run.wait_ready()

    wait_replayed(run, tools, "book-store", "deltas (executor-append 0) stored")

    def stored(table: str, key: tuple[str, ...]) -> list[dict[str, Any]]:
        return sorted(lake.rows(table), key=lambda r: tuple(r[c] for c in key))

    def keyed(rows: Any, key: tuple[str, ...]) -> list[dict[str, Any]]:
        return sorted(rows.to_pylist(), key=lambda r: tuple(r[c] for c in key))

    snapshots = stored("book_snapshots", records.BOOK_SNAPSHOT_KEY)
    deltas = stored("book_deltas", records.BOOK_DELTA_KEY)
    # Every snapshot and delta once, as the driver's decode makes them of the same records.
    assert snapshots == keyed(expected.snapshots, records.BOOK_SNAPSHOT_KEY)
    assert deltas == keyed(expected.deltas, records.BOOK_DELTA_KEY)
    again = [r for r in snapshots if r["ticker"] == TICKERS[0]]
    assert [int(r["ingested_at"].timestamp() * 1000) for r in again[:2]] == [B + 2, B + 2]

    # Below the threshold: the driver's way.
    kafka.send(run.book_topic, book_records(TICKERS[1], 40, 43), key=TICKERS[1])
    poll_until(
        "the small batch stored",
        lambda: len(lake.rows("book_snapshots")) >= 13 and len(lake.rows("book_deltas")) >= 110,
        tools.WAIT_S,
    )
    assert len(lake.rows("book_snapshots")) == 13 and len(lake.rows("book_deltas")) == 110

    assert_executors_then_driver(run, ("book_snapshots", "book_deltas"))
    log = run.log_text()
    found = re.findall(
        r"book-store batch 0: (\d+) book snapshots \(([^)]*)\), (\d+) deltas \(([^)]*)\)", log
    )
    # The first run failed after its commits (before its log line); the replay found them.
    assert found == [("12", "executor-append 0", "108", "executor-append 0")], found
    assert "book-store on an executor: dropped" in log  # the worker logs the reject
    run.stop()
    assert run.process is not None and run.process.returncode == 0
