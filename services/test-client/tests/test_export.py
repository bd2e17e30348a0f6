"""Datasets without Iceberg: day splitting, paths, the atomic write, resume, the
not-recorded day and the CLI's arguments, against a fake source (mdclient.export)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from mdclient.cli import main
from mdclient.config import ClientSettings
from mdclient.errors import InvalidRequest
from mdclient.export import (
    Channel,
    DayResult,
    DayRows,
    DayWindow,
    candle_report,
    day_path,
    day_windows,
    export_dataset,
    export_range,
    is_done,
    parse_channel,
    partial_path,
    path_part,
    read_sidecar,
    sidecar_path,
    write_day,
)
from mdclient.frames import SCHEMA as CANDLES

DAY = 86_400_000
T0 = 1_763_596_800_000  # 2025-11-20T00:00:00Z
SCHEMA = pa.schema([("t", pa.int64()), ("price", pa.float64())])
BTC, ETH = "BINANCE:BTC/USDT", "BINANCE:ETH/USDT"


@dataclass
class FakeSource:
    """Rows 0..n-1 per read, 'not recorded' for the listed (ticker, lo) pairs; it can fail
    after the first batch of a chosen read, as a crash mid-file would."""

    channel: Channel = field(default_factory=lambda: Channel("trades"))
    rows: int = 3
    missing: set[tuple[str, int]] = field(default_factory=set)
    fail_at: tuple[str, int] | None = None
    state: str = "complete"
    reads: list[tuple[str, int, int]] = field(default_factory=list)

    def read(self, ticker: str, lo_ms: int, hi_ms: int) -> DayRows:
        self.reads.append((ticker, lo_ms, hi_ms))
        if (ticker, lo_ms) in self.missing:
            return DayRows(SCHEMA, iter(()), "not_recorded", {"reason": "none stored"})
        return DayRows(SCHEMA, self._batches(ticker, lo_ms), self.state, {"gaps": []})

    def _batches(self, ticker: str, lo_ms: int) -> Iterator[pa.RecordBatch]:
        for i in range(self.rows):
            yield pa.record_batch([pa.array([lo_ms + i]), pa.array([1.5 * i])], schema=SCHEMA)
            if self.fail_at == (ticker, lo_ms):
                raise OSError("disk gone")


def test_days_are_cut_at_utc_midnight_and_clipped_to_the_range() -> None:
    windows = day_windows(T0 + 5, T0 + 2 * DAY + 7)
    assert windows == [
        DayWindow(date(2025, 11, 20), T0 + 5, T0 + DAY),
        DayWindow(date(2025, 11, 21), T0 + DAY, T0 + 2 * DAY),
        DayWindow(date(2025, 11, 22), T0 + 2 * DAY, T0 + 2 * DAY + 7),
    ]
    assert day_windows(T0, T0 + DAY) == [DayWindow(date(2025, 11, 20), T0, T0 + DAY)]
    with pytest.raises(InvalidRequest):
        day_windows(T0, T0)


def test_paths_are_readable_and_a_slash_in_a_symbol_is_made_safe(tmp_path: Path) -> None:
    path = day_path(tmp_path, Channel("candles", period_s=60), BTC, date(2025, 11, 20), "csv")
    assert path == tmp_path / "candles-1m" / "BINANCE" / "BTC-USDT" / "2025-11-20.csv"
    assert sidecar_path(path).name == "2025-11-20.report.json"
    assert partial_path(path).name == ".2025-11-20.csv.partial"
    assert path_part("A B:C/D") == "A_B_C-D" and path_part("..") == "__"


@pytest.mark.parametrize(
    ("text", "folder"),
    [("trades", "trades"), ("candles:5m", "candles-5m"), ("BOOK", "book-1000ms-top10")],
)
def test_channels(text: str, folder: str) -> None:
    assert parse_channel(text).folder == folder


@pytest.mark.parametrize("text", ["trade", "candles", "candles:x", "book:1", "trades:1m"])
def test_a_bad_channel_is_refused(text: str) -> None:
    with pytest.raises(InvalidRequest):
        parse_channel(text)


def test_a_failed_write_leaves_no_file_under_either_name(tmp_path: Path) -> None:
    source = FakeSource(fail_at=(BTC, T0))
    path = tmp_path / "d.parquet"
    with pytest.raises(OSError, match="disk gone"):
        write_day(path, SCHEMA, source.read(BTC, T0, T0 + DAY).batches, "parquet")
    assert list(tmp_path.iterdir()) == []


def test_an_export_writes_a_file_and_a_report_per_ticker_and_day(tmp_path: Path) -> None:
    seen: list[DayResult] = []
    summary = export_range(
        FakeSource(), [BTC, ETH], T0, T0 + 2 * DAY, "parquet", tmp_path, progress=seen.append
    )
    assert [d.outcome for d in summary.days] == ["written"] * 4 and summary.complete
    assert [d.outcome for d in seen] == ["reading", "written"] * 4  # a line per file
    assert [(d.index, d.total) for d in summary.days] == [(1, 4), (2, 4), (3, 4), (4, 4)]
    path = tmp_path / "trades" / "BINANCE" / "ETH-USDT" / "2025-11-21.parquet"
    assert pq.read_table(path).column("t").to_pylist() == [T0 + DAY, T0 + DAY + 1, T0 + DAY + 2]
    side = read_sidecar(path)
    assert side is not None
    assert (side["ticker"], side["day"], side["rows"], side["state"]) == (
        ETH, "2025-11-21", 3, "complete",
    )  # fmt: skip
    assert (side["start_ms"], side["end_ms"]) == (str(T0 + DAY), str(T0 + 2 * DAY))
    assert not list(tmp_path.rglob("*.partial"))


def test_csv_has_a_header_and_the_rows(tmp_path: Path) -> None:
    export_range(FakeSource(rows=2), [BTC], T0, T0 + DAY, "csv", tmp_path)
    table = pacsv.read_csv(tmp_path / "trades" / "BINANCE" / "BTC-USDT" / "2025-11-20.csv")
    assert table.column_names == ["t", "price"] and table.num_rows == 2


def test_a_rerun_after_a_crash_skips_the_complete_days_and_redoes_the_rest(
    tmp_path: Path,
) -> None:
    crashing = FakeSource(fail_at=(BTC, T0 + DAY))
    with pytest.raises(OSError):
        export_range(crashing, [BTC], T0, T0 + 3 * DAY, "parquet", tmp_path)
    folder = tmp_path / "trades" / "BINANCE" / "BTC-USDT"
    assert sorted(p.name for p in folder.iterdir()) == [
        "2025-11-20.parquet",
        "2025-11-20.report.json",
    ]

    again = FakeSource()
    summary = export_range(again, [BTC], T0, T0 + 3 * DAY, "parquet", tmp_path)
    assert [d.outcome for d in summary.days] == ["skipped", "written", "written"]
    assert summary.days[0].rows == 3 and summary.days[0].state == "complete"
    assert [lo for _, lo, _ in again.reads] == [T0 + DAY, T0 + 2 * DAY]  # day 1 not read


def test_a_partial_file_never_counts_as_done(tmp_path: Path) -> None:
    path = day_path(tmp_path, Channel("trades"), BTC, date(2025, 11, 20), "parquet")
    window = DayWindow(date(2025, 11, 20), T0, T0 + DAY)
    path.parent.mkdir(parents=True)
    partial_path(path).write_bytes(b"PAR1 half")
    assert not is_done(path, window)
    summary = export_range(FakeSource(), [BTC], T0, T0 + DAY, "parquet", tmp_path)
    assert summary.days[0].outcome == "written" and pq.read_table(path).num_rows == 3
    assert not partial_path(path).exists()


def test_a_file_without_its_report_or_of_a_shorter_range_is_redone(tmp_path: Path) -> None:
    export_range(FakeSource(), [BTC], T0, T0 + DAY // 2, "parquet", tmp_path)  # half a day
    longer = export_range(FakeSource(), [BTC], T0, T0 + DAY, "parquet", tmp_path)
    assert longer.days[0].outcome == "written"
    path = longer.days[0].path
    sidecar_path(path).unlink()
    assert export_range(FakeSource(), [BTC], T0, T0 + DAY, "parquet", tmp_path).days[0].outcome == (
        "written"
    )


def test_a_day_still_being_repaired_is_exported_again(tmp_path: Path) -> None:
    export_range(FakeSource(state="repairing"), [BTC], T0, T0 + DAY, "parquet", tmp_path)
    summary = export_range(FakeSource(), [BTC], T0, T0 + DAY, "parquet", tmp_path)
    assert summary.days[0].outcome == "written" and summary.complete


def test_a_day_not_recorded_gets_a_report_and_no_data_file(tmp_path: Path) -> None:
    source = FakeSource(missing={(BTC, T0)})
    summary = export_range(source, [BTC], T0, T0 + 2 * DAY, "parquet", tmp_path)
    assert [d.outcome for d in summary.days] == ["not_recorded", "written"]
    assert not summary.complete
    path = summary.days[0].path
    assert not path.exists()
    side = json.loads(sidecar_path(path).read_text())
    assert side["state"] == "not_recorded" and side["file"] is None
    again = export_range(FakeSource(), [BTC], T0, T0 + 2 * DAY, "parquet", tmp_path)
    assert [d.outcome for d in again.days] == ["written", "skipped"]  # tried again


def test_the_candle_report_counts_the_missing_open_times() -> None:
    times = [T0 * 1000, (T0 + 120_000) * 1000]
    table = pa.table(
        {name: pa.nulls(2, CANDLES.field(name).type) for name in CANDLES.names}
    ).set_column(
        CANDLES.get_field_index("open_time"),
        "open_time",
        pa.array(times, CANDLES.field("open_time").type),
    )
    report = candle_report(table, 60, T0, T0 + 180_000)
    assert (report["state"], report["expected"], report["missing"]) == ("incomplete", 3, 1)
    assert report["missing_open_ms"] == [str(T0 + 60_000)]
    assert candle_report(table.slice(0, 0), 60, T0, T0 + 60_000)["state"] == "not_recorded"


@pytest.mark.parametrize(
    "argv",
    [
        ["export", BTC, "--start", "2025-11-20", "--end", "2025-11-19", "--out", "x"],
        ["export", BTC, "--start", "2025-11-20", "--channel", "ohlc", "--out", "x"],
        ["export", "BTCUSDT", "--start", "2025-11-20", "--out", "x"],
    ],
)
def test_bad_arguments_exit_2_before_any_read(argv: list[str], tmp_path: Path) -> None:
    assert main([*argv[:-1], str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()


class FakeReader:
    """The two IcebergReader reads the candle and book channels make: candles as given, no
    book stored."""

    def __init__(self, candles: pa.Table) -> None:
        self.candles = candles

    def read_ohlc(self, table: str, ticker: str, period: int, lo: int, hi: int) -> pa.Table:
        return self.candles

    def read_book_rows(self, table: str, ticker: str, column: str, lo: int, hi: int,
                       columns: Sequence[str]) -> pa.Table:  # fmt: skip
        return pa.table({column: pa.array([], pa.timestamp("us", tz="UTC"))})


def candles(open_ms: list[int]) -> pa.Table:
    rows = [{"ticker": BTC, "period_seconds": 60, "open_time": t * 1000, "open": 1.0,
             "high": 2.0, "low": 0.5, "close": 1.5, "volume": 3.0} for t in open_ms]  # fmt: skip
    return pa.Table.from_pylist(rows, schema=CANDLES)


def test_stored_candles_export_with_their_missing_slots(tmp_path: Path) -> None:
    reader = FakeReader(candles([T0, T0 + 120_000]))
    summary = export_dataset(
        reader, ClientSettings(), [BTC], T0, T0 + 180_000, tmp_path,  # type: ignore[arg-type]
        channel="candles:1m", fmt="csv",
    )  # fmt: skip
    day = summary.days[0]
    assert (day.outcome, day.rows, day.state) == ("written", 2, "incomplete")
    assert day.path == tmp_path / "candles-1m" / "BINANCE" / "BTC-USDT" / "2025-11-20.csv"
    side = read_sidecar(day.path)
    assert side is not None and side["report"]["missing_open_ms"] == [str(T0 + 60_000)]


def test_a_day_without_a_stored_book_is_not_recorded(tmp_path: Path) -> None:
    summary = export_dataset(
        FakeReader(candles([])), ClientSettings(), [BTC], T0, T0 + DAY, tmp_path,  # type: ignore[arg-type]
        channel="book", every_ms=60_000, depth=2,
    )  # fmt: skip
    day = summary.days[0]
    assert day.outcome == "not_recorded" and not day.path.exists()
    assert day.path.parent.name == "BTC-USDT" and "book-60000ms-top2" in str(day.path)
    side = read_sidecar(day.path)
    assert side is not None and side["report"]["state"] == "not_recorded"
