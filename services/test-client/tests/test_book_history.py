"""Book history without Iceberg: stored snapshots + deltas -> the book at a time, samples."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from mdclient.book_history import (
    DELTA_COLUMNS,
    SNAPSHOT_COLUMNS,
    book_at_from,
    read_book_at,
    read_book_samples,
    sample,
    sample_range,
    sample_schema,
)
from mdclient.config import ClientSettings
from mdclient.errors import InvalidRequest, StorageError
from mdproto.book import OrderBook, book_from_levels, levels_message
from mdproto.markets import Precision
from mdproto.messages import BookDelta
from mdproto.tables import BookDeltas, BookSnapshots, arrow_schema

T = "BINANCE:BTC/USDT"
T0 = 1_700_000_000_000
Levels = list[tuple[float, float]]


def _levels(levels: Levels) -> list[dict[str, float]]:
    return [{"price": p, "amount": a} for p, a in levels]


def snapshots(*rows: tuple[int, int, Levels, Levels]) -> pa.Table:
    """(time ms, exchange sequence, bids, asks) -> ``book_snapshots`` rows."""
    return pa.Table.from_pylist(
        [
            {
                "snapshot_time": at * 1000,
                "exchange_sequence": seq,
                "depth": 10,
                "bids": _levels(bids),
                "asks": _levels(asks),
            }
            for at, seq, bids, asks in rows
        ],
        schema=arrow_schema(BookSnapshots.SCHEMA, SNAPSHOT_COLUMNS),
    )


def deltas(*rows: tuple[int, int, int, Levels, Levels]) -> pa.Table:
    """(time ms, exchange sequence, previous sequence, bids, asks) -> ``book_deltas`` rows,
    at increasing Kafka offsets."""
    return pa.Table.from_pylist(
        [
            {
                "delta_time": at * 1000,
                "exchange_sequence": seq,
                "exchange_prev_sequence": prev,
                "bids": _levels(bids),
                "asks": _levels(asks),
                "kafka_offset": i,
            }
            for i, (at, seq, prev, bids, asks) in enumerate(rows)
        ],
        schema=arrow_schema(BookDeltas.SCHEMA, DELTA_COLUMNS),
    )


BIDS = [(100.0, 1.0), (99.0, 2.0)]
ASKS = [(101.0, 1.5), (102.0, 2.5)]


def live_book(snapshot: tuple[Levels, Levels], *changes: tuple[Levels, Levels]) -> OrderBook:
    """What a live subscriber's OrderBook holds after the same snapshot and deltas."""
    book = book_from_levels(T, *snapshot)
    for bids, asks in changes:
        book.apply(BookDelta(ticker=T, bids=levels_message(bids), asks=levels_message(asks)))
    return book


def test_the_book_at_a_time_is_its_snapshot_with_the_deltas_after_it_applied() -> None:
    snaps = snapshots((T0, 10, BIDS, ASKS))
    changes = deltas(
        (T0 + 100, 11, 10, [(100.0, 0.0), (99.5, 4.0)], []),
        (T0 + 200, 12, 11, [], [(101.0, 0.75)]),
        (T0 + 300, 13, 12, [(98.0, 1.0)], []),  # after the time asked: not applied
    )
    book = book_at_from(T, snaps, changes, T0 + 250)
    assert book == live_book((BIDS, ASKS), ([(100.0, 0.0), (99.5, 4.0)], []), ([], [(101.0, 0.75)]))
    assert book.best_bid() == (99.5, 4.0)
    assert (book.exact, book.gap, book.deltas_applied) == (True, "", 2)
    assert (book.snapshot_time_ms, book.exchange_time_ms, book.exchange_sequence) == (
        T0,
        T0 + 200,
        12,
    )


def test_deltas_apply_in_sequence_order_and_the_delta_a_snapshot_holds_is_skipped() -> None:
    snaps = snapshots((T0, 10, BIDS, ASKS))
    changes = deltas(
        (T0 + 100, 12, 11, [(100.0, 3.0)], []),  # stored first, same time as the next
        (T0, 10, 9, [(100.0, 7.0)], []),  # the update the snapshot was taken at
        (T0 + 100, 11, 10, [(100.0, 2.0)], []),
        (T0 + 150, 11, 10, [(100.0, 2.0)], []),  # 11 again (sent twice): already in the book
    )
    book = book_at_from(T, snaps, changes, T0 + 200)
    assert book.best_bid() == (100.0, 3.0)  # 11 then 12; 10 already in the snapshot
    assert (book.exact, book.deltas_applied) == (True, 2)


def test_a_sequence_gap_leaves_the_book_before_it_and_says_so() -> None:
    snaps = snapshots((T0, 10, BIDS, ASKS))
    changes = deltas(
        (T0 + 100, 11, 10, [(100.0, 5.0)], []),
        (T0 + 200, 13, 12, [(100.0, 9.0)], []),  # 12 never stored
        (T0 + 300, 14, 13, [(99.0, 0.0)], []),  # dropped: the book is out of sync
    )
    book = book_at_from(T, snaps, changes, T0 + 400)
    assert book == live_book((BIDS, ASKS), ([(100.0, 5.0)], []))
    assert not book.exact
    assert "does not follow the book at 11" in book.gap
    assert book.exchange_time_ms == T0 + 100


def test_without_exchange_sequences_deltas_apply_in_kafka_order() -> None:
    snaps = snapshots((T0, 0, BIDS, ASKS))
    changes = deltas(
        (T0 + 100, 0, 0, [(100.0, 5.0)], []),
        (T0 + 100, 0, 0, [(100.0, 0.0)], []),  # same time: the later offset wins
    )
    book = book_at_from(T, snaps, changes, T0 + 100)
    assert book.best_bid() == (99.0, 2.0) and book.exact


def test_samples_step_through_snapshots_and_deltas_once() -> None:
    snaps = snapshots((T0, 10, BIDS, ASKS), (T0 + 3_000, 20, [(90.0, 1.0)], [(91.0, 1.0)]))
    changes = deltas(
        (T0 + 500, 11, 10, [(100.0, 5.0)], []),
        (T0 + 1_500, 13, 12, [(100.0, 6.0)], []),  # a gap: exact false until the snapshot
    )
    table = sample(T, snaps, changes, [T0 - 1_000, T0, T0 + 1_000, T0 + 2_000, T0 + 3_000], 2)
    assert table.schema == sample_schema(2)
    rows = table.to_pylist()
    assert [r["exact"] for r in rows] == [False, True, True, False, True]
    assert rows[0]["bid_price_0"] is None and rows[0]["book_time"] is None  # no book yet
    assert [(r["bid_price_0"], r["bid_amount_0"]) for r in rows[1:]] == [
        (100.0, 1.0),
        (100.0, 5.0),
        (100.0, 5.0),  # as of the last delta before the gap
        (90.0, 1.0),
    ]
    assert rows[4]["bid_price_1"] is None  # the side has one level
    assert [r["exchange_sequence"] for r in rows[1:]] == [10, 11, 11, 20]
    assert rows[2]["book_time"].timestamp() * 1000 == T0 + 500


def test_sample_ranges_are_checked() -> None:
    now = T0 + 3_600_000
    q = sample_range(T, T0, T0 + 10_000, 1_000, 5, now_ms=now)
    assert (q.start_ms, q.end_ms, q.every_ms, q.depth) == (T0, T0 + 10_000, 1_000, 5)
    with pytest.raises(InvalidRequest, match="empty range") as empty:
        sample_range(T, T0, T0, 1_000, 5, now_ms=now)
    assert empty.value.error_code == "bad_time_range"
    with pytest.raises(InvalidRequest) as inverted:
        sample_range(T, T0 + 1, T0, 1_000, 5, now_ms=now)
    assert inverted.value.error_code == "bad_time_range"
    with pytest.raises(InvalidRequest, match="every_ms"):
        sample_range(T, T0, T0 + 1, 0, 5, now_ms=now)
    with pytest.raises(InvalidRequest, match="depth"):
        sample_range(T, T0, T0 + 1, 1, 0, now_ms=now)
    with pytest.raises(InvalidRequest) as large:
        sample_range(T, T0, T0 + 86_400_000, 1, 5, now_ms=now)
    assert large.value.error_code == "range_too_large"
    with pytest.raises(InvalidRequest) as ticker:
        sample_range("nope", T0, T0 + 1, 1, 5, now_ms=now)
    assert ticker.value.error_code == "bad_ticker"


class _Reader:
    """The two book tables in memory, filtered as the Iceberg scan filters them."""

    def __init__(self, snaps: pa.Table, changes: pa.Table) -> None:
        self.tables = {"market.book_snapshots": snaps, "market.book_deltas": changes}
        self.reads: list[tuple[str, int, int]] = []

    def read_book_rows(
        self, table: str, ticker: str, column: str, lo_ms: int, hi_ms: int, columns: Any
    ) -> pa.Table:
        import pyarrow.compute as pc

        self.reads.append((table, lo_ms, hi_ms))
        rows = self.tables[table]
        micros = rows[column].cast(pa.int64())
        inside = pc.and_(
            pc.greater_equal(micros, lo_ms * 1000), pc.less_equal(micros, hi_ms * 1000)
        )
        return rows.filter(inside).select(list(columns))


def test_the_reads_take_the_newest_snapshot_and_the_deltas_from_it() -> None:
    old = [(50.0, 1.0)]
    snaps = snapshots((T0 - 5_000, 5, old, ASKS), (T0, 10, BIDS, ASKS))
    changes = deltas((T0 - 1_000, 6, 5, old, []), (T0 + 100, 11, 10, [(100.0, 2.0)], []))
    reader: Any = _Reader(snaps, changes)
    settings = ClientSettings()
    book = read_book_at(reader, settings, T, T0 + 100)
    assert book.best_bid() == (100.0, 2.0) and book.exact and book.snapshot_time_ms == T0
    assert reader.reads[1] == ("market.book_deltas", T0, T0 + 100)  # from the snapshot on
    with pytest.raises(StorageError) as none:
        read_book_at(reader, settings, T, T0 - 3_600_001 - 5_000)
    assert none.value.error_code == "no_book"

    samples = read_book_samples(reader, settings, sample_range(T, T0, T0 + 200, 100, 1, now_ms=T0))
    assert samples["bid_amount_0"].to_pylist() == [1.0, 2.0]
    with pytest.raises(StorageError, match="no BINANCE:BTC/USDT book") as empty:
        read_book_samples(
            reader, settings, sample_range(T, T0 - 7_200_000, T0 - 7_000_000, 1_000, 1, now_ms=T0)
        )
    assert empty.value.error_code == "no_book"  # never an empty OK


def _cli_with(monkeypatch: pytest.MonkeyPatch, reader: _Reader) -> None:
    from mdclient import frames

    monkeypatch.delenv("CONFIG_PATH", raising=False)
    monkeypatch.setattr(frames, "IcebergReader", lambda *a, **k: reader)


def test_the_cli_prints_the_exact_book_and_exits_11_when_a_delta_is_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    from mdclient.cli import main

    snaps = snapshots((T0, 10, BIDS, ASKS))
    changes = deltas((T0 + 100, 11, 10, [(100.0, 5.0)], []), (T0 + 200, 13, 12, [], []))
    _cli_with(monkeypatch, _Reader(snaps, changes))
    monkeypatch.setattr("mdclient.book.read_precision", lambda *a: Precision())
    assert main(["book", T, "--at", str(T0 + 150), "--depth", "1"]) == 0
    captured = capsys.readouterr()
    assert [line.split() for line in captured.out.splitlines()] == [
        ["ask", "101", "1.5"],
        ["---", "spread", "1"],
        ["bid", "100", "5"],  # the snapshot's 1.0, changed by the delta
    ]
    assert "and 1 deltas" in captured.err
    assert main(["book", T, "--at", str(T0 + 250), "--depth", "1"]) == 11
    assert "not exact: a delta after exchange sequence 12" in capsys.readouterr().err


def test_the_cli_writes_samples_as_csv_and_parquet_and_refuses_an_empty_range(
    monkeypatch: pytest.MonkeyPatch, capsys: Any, tmp_path: Any
) -> None:
    import pyarrow.parquet as pq

    from mdclient.cli import main

    snaps = snapshots((T0, 10, BIDS, ASKS))
    reader = _Reader(snaps, deltas((T0 + 1_500, 11, 10, [(100.0, 5.0)], [])))
    _cli_with(monkeypatch, reader)
    csv, parquet = tmp_path / "s.csv", tmp_path / "s.parquet"
    span = ["--start", str(T0), "--end", str(T0 + 3_000), "--every", "1s", "--depth", "2"]
    argv = ["book-samples", T, *span, "--csv", str(csv), "--parquet", str(parquet)]
    assert main(argv) == 0
    assert "3 samples" in capsys.readouterr().err
    assert pq.read_table(parquet)["bid_amount_0"].to_pylist() == [1.0, 1.0, 5.0]
    lines = csv.read_text().splitlines()
    assert lines[0].startswith("time,time_ms,exact,book_time,book_time_ms,exchange_sequence,")
    assert lines[1].startswith(f"2023-11-14T22:13:20.000000Z,{T0},true,")
    early = ["--start", str(T0 - 7_200_000), "--end", str(T0 - 7_100_000)]
    assert main(["book-samples", T, *early, "--no-table"]) == 6
    assert "no BINANCE:BTC/USDT book stored" in capsys.readouterr().err
    assert main(["book-samples", T, "--start", str(T0), "--end", str(T0), "--no-table"]) == 2
    assert "empty range" in capsys.readouterr().err
