"""Book history on the real local stack: snapshots and deltas through Kafka into a real
pipeline, stored in book_snapshots and book_deltas, and the SDK's book of any instant
equal to the live book after the same deltas."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from infra.testing import poll_until
from mdproto import envelope
from mdproto.book import OrderBook, levels_message
from mdproto.messages import BookDelta, BookReset, BookSnapshot

pytestmark = [pytest.mark.stack, pytest.mark.spark, pytest.mark.heavy(seconds=130)]

TICKER = "BINANCE:HIST/USDT"
T0 = 1_704_153_600_000  # 2024-01-02T00:00:00Z


@pytest.fixture(scope="module")
def pipeline(make_run: Any, tools: Any) -> Iterator[Any]:
    run = make_run(  # the live path (book-store, PUB) alone: the others would only load cores
        PIPELINE_CEP__ENABLED="false",
        PIPELINE_MARKETS__ENABLED="false",
        PIPELINE_GAPS__ENABLED="false",
    )
    sub = tools.Subscriber(run.pub_endpoint)
    run.start()
    run.wait_ready()
    kafka = tools.Kafka(run.endpoints.kafka_bootstrap)
    tools.confirm_subscription(sub, kafka, run.ticks_topic)  # the live engine is reading
    yield tools.Harness(run, sub, kafka, tools.Lake(run.endpoints, run.namespace))
    sub.close()
    run.stop()


def snapshot(seq: int, at_ms: int, reset: int, bids: list[Any], asks: list[Any]) -> BookSnapshot:
    return BookSnapshot(
        ticker=TICKER,
        bids=levels_message(bids),
        asks=levels_message(asks),
        depth=3,
        exchange_sequence=seq,
        exchange_time_ms=at_ms,
        ingested_at_ms=at_ms + 5,
        reset=reset,  # type: ignore[arg-type]
    )


def delta(seq: int, at_ms: int, bids: list[Any], asks: list[Any], prev: int = 0) -> BookDelta:
    return BookDelta(
        ticker=TICKER,
        bids=levels_message(bids),
        asks=levels_message(asks),
        exchange_sequence=seq,
        exchange_prev_sequence=prev or seq - 1,
        exchange_time_ms=at_ms,
        ingested_at_ms=at_ms + 5,
    )


def test_the_book_of_any_instant_is_the_live_book_after_the_same_deltas(
    pipeline: Any, tools: Any
) -> None:
    from mdclient.book_history import read_book_at, read_book_samples, sample_range
    from mdclient.config import ClientSettings
    from mdclient.frames import IcebergReader

    first = snapshot(
        10,
        T0,
        BookReset.BOOK_RESET_START,
        [(99.0, 1.0), (98.0, 2.0), (97.0, 3.0)],
        [(101.0, 1.5), (102.0, 2.5), (103.0, 3.5)],
    )
    changes = [
        delta(11, T0 + 1_000, [(99.0, 0.0), (98.5, 4.0)], []),
        delta(12, T0 + 2_000, [], [(101.0, 0.75), (100.5, 1.0)]),
        delta(13, T0 + 3_000, [(99.5, 2.0)], [(103.0, 0.0)]),
    ]
    later = snapshot(20, T0 + 10_000, BookReset.BOOK_RESET_NONE, [(90.0, 1.0)], [(91.0, 1.0)])
    after_gap = delta(22, T0 + 11_000, [(90.0, 9.0)], [], prev=21)  # 21 never came

    def send(*records: BookSnapshot | BookDelta) -> None:
        values = [envelope.encode_record(r) for r in records]
        pipeline.kafka.send(pipeline.run.book_topic, values, key=TICKER)

    send(first, *changes)
    # The live book after the same messages: the pipeline's periodic snapshot of the
    # whole book at 13, what every subscriber holds (taken before the records below,
    # whose mismatched delta stops the periodic snapshots until the next stored one).
    topic = f"{TICKER}|book"
    [live] = pipeline.sub.wait_for(
        lambda m: (
            m.topic == topic
            and isinstance(m.message, BookSnapshot)
            and m.message.exchange_sequence == 13
        )
    )
    live_book = OrderBook(TICKER)
    live_book.replace(live.message)
    send(changes[1], later, after_gap)  # delta 12 delivered twice

    def stored(table: str, n: int) -> list[dict[str, Any]]:
        def rows() -> list[dict[str, Any]]:  # the tables exist once it is ready
            found: list[dict[str, Any]] = pipeline.lake.rows(table, f"ticker = '{TICKER}'")
            return found if len(found) >= n else []

        return poll_until(f"{n} rows in {table}", rows, tools.WAIT_S, interval_s=1.0)

    deltas = stored("book_deltas", 5)
    assert len(stored("book_snapshots", 2)) == 2
    assert len(deltas) == 5  # the twice-delivered delta is two records: two rows
    by_seq = sorted((r["exchange_sequence"], r["exchange_prev_sequence"]) for r in deltas)
    assert by_seq == [(11, 10), (12, 11), (12, 11), (13, 12), (22, 21)]
    row = next(r for r in deltas if r["exchange_sequence"] == 13)
    assert (row["exchange"], row["symbol"]) == ("BINANCE", "HIST/USDT")
    assert row["delta_time"].timestamp() * 1000 == T0 + 3_000
    assert row["asks"] == [{"price": 103.0, "amount": 0.0}]

    e = pipeline.run.endpoints
    reader = IcebergReader(e.pyiceberg_catalog_properties(), catalog_name=e.catalog_name)
    ns = pipeline.run.namespace
    settings = ClientSettings(
        book_snapshots_table=f"{ns}.book_snapshots", book_deltas_table=f"{ns}.book_deltas"
    )
    between = read_book_at(reader, settings, TICKER, T0 + 9_999)
    assert between == live_book  # not the snapshot of T0: its three deltas applied
    assert between != _book(first)
    assert (between.exact, between.deltas_applied, between.exchange_sequence) == (True, 3, 13)
    partway = read_book_at(reader, settings, TICKER, T0 + 2_500)
    expected = _book(first)
    for d in changes[:2]:
        expected.apply(d)
    assert partway == expected and partway.exact

    gapped = read_book_at(reader, settings, TICKER, T0 + 12_000)
    assert gapped == _book(later) and not gapped.exact
    assert "does not follow the book at 20" in gapped.gap

    query = sample_range(TICKER, T0, T0 + 12_000, 1_000, 3, now_ms=T0 + 60_000)
    samples = read_book_samples(reader, settings, query)
    assert samples.num_rows == 12
    assert samples["exact"].to_pylist() == [True] * 11 + [False]
    assert samples["exchange_sequence"].to_pylist() == [10, 11, 12, *[13] * 7, 20, 20]
    assert samples["bid_price_0"][3].as_py() == between.best_bid()[0]  # type: ignore[index]


def _book(message: BookSnapshot) -> OrderBook:
    book = OrderBook(message.ticker)
    book.replace(message)
    return book
