"""Datasets: a range of stored trades, candles or book samples written to Parquet or CSV,
one file per ticker and UTC day, resumable (`mdclient export`, docs/client-guide.md).

    export_range(source, tickers, start_ms, end_ms, fmt, out)
      for each ticker, for each UTC day of the range (day_windows):
        day_path: OUT/<channel>/<exchange>/<symbol>/<YYYY-MM-DD>.<ext>
        is_done: the file is there and its sidecar covers the day -> skipped
        source.read(ticker, lo, hi) -> DayRows (schema, record batches, report)
        write_day: batches -> a hidden `.partial` file -> fsync -> rename
        beside it <YYYY-MM-DD>.report.json: the day's integrity report

A file appears under its final name only once complete (the rename is the commit), so a
rerun after a crash or Ctrl-C skips the days already written and redoes the rest; a
`.partial` left behind is overwritten. The sidecar is renamed into place before the data
file: a data file never lacks its report. A day with nothing recorded gets a sidecar and
no data file (a rerun tries it again), never an empty file that looks like a quiet day.
One day of one ticker is in memory at most (trades: one record batch group at a time).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from mdclient import timeparse
from mdclient.errors import InvalidRequest, NotRecorded, StorageError
from mdproto import rules
from mdproto.error_codes import BAD_TIME, BAD_TIME_RANGE, NO_BOOK
from mdproto.tables import Ohlc

if TYPE_CHECKING:
    from mdclient.config import ClientSettings
    from mdclient.frames import IcebergReader

Format = Literal["parquet", "csv"]
FORMATS: tuple[Format, ...] = ("parquet", "csv")
#: written: the day's file is new; skipped: a complete file was already there (resume);
#: not_recorded: nothing of the day is stored, only the sidecar is written.
Outcome = Literal["reading", "written", "skipped", "not_recorded"]
#: Sidecar states after which a rerun exports the day again: its rows may still change.
REDO_STATES = frozenset({"repairing"})
DAY_MS = 86_400_000
SIDECAR_SUFFIX = ".report.json"
PARTIAL_SUFFIX = ".partial"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


# --- pure: channels, days, paths ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Channel:
    """What is exported: ``trades``, ``candles`` of `period_s`, or ``book`` samples (the
    best `depth` levels every `every_ms`, as `Client.book_samples`)."""

    kind: Literal["trades", "candles", "book"]
    period_s: int = 0
    every_ms: int = 1000
    depth: int = 10

    @property
    def folder(self) -> str:
        """The channel's folder: ``trades``, ``candles-1m``, ``book-1000ms-top10``. The
        parameters are in the name so two exports with different ones never mix."""
        if self.kind == "candles":
            return f"candles-{timeparse.format_period(self.period_s)}"
        if self.kind == "book":
            return f"book-{self.every_ms}ms-top{self.depth}"
        return "trades"

    def as_dict(self) -> dict[str, Any]:
        return {"channel": self.folder, "kind": self.kind}


def parse_channel(text: str, *, every_ms: int = 1000, depth: int = 10) -> Channel:
    """``trades``, ``candles:1m`` (any period `timeparse.parse_period` reads), ``book``;
    InvalidRequest otherwise."""
    kind, _, arg = text.strip().lower().partition(":")
    if kind == "trades" and not arg:
        return Channel("trades")
    if kind == "candles" and arg:
        try:
            return Channel("candles", period_s=timeparse.parse_period(arg))
        except timeparse.TimeFormatError as exc:
            raise InvalidRequest(str(exc)) from None
    if kind == "book" and not arg:
        if every_ms < 1 or not 1 <= depth <= 1000:
            raise InvalidRequest(
                f"book samples need a step of 1 ms or more and 1..1000 levels, not "
                f"{every_ms} ms and {depth}"
            )
        return Channel("book", every_ms=every_ms, depth=depth)
    raise InvalidRequest(
        f"channel {text!r} is not trades, candles:PERIOD (e.g. candles:1m) or book"
    )


@dataclass(frozen=True, slots=True)
class DayWindow:
    """One UTC day of the range, clipped to it: [lo_ms, hi_ms)."""

    day: date
    lo_ms: int
    hi_ms: int


def day_windows(start_ms: int, end_ms: int) -> list[DayWindow]:
    """[start, end) cut at UTC midnights; the first and last day clipped to the range."""
    if start_ms < 0 or end_ms <= start_ms:
        raise InvalidRequest(
            f"need 0 <= start < end, got [{start_ms}, {end_ms}) in epoch ms",
            error_code=BAD_TIME_RANGE,
        )
    out: list[DayWindow] = []
    midnight = start_ms - start_ms % DAY_MS
    while midnight < end_ms:
        day = datetime.fromtimestamp(midnight / 1000, UTC).date()
        out.append(DayWindow(day, max(start_ms, midnight), min(end_ms, midnight + DAY_MS)))
        midnight += DAY_MS
    return out


def path_part(text: str) -> str:
    """A ticker part as one safe path segment: ``BTC/USDT`` -> ``BTC-USDT``; any other
    character outside letters, digits, ``._-`` becomes ``_``."""
    safe = _UNSAFE.sub("_", text.replace("/", "-"))
    return safe if safe.strip(".") else safe.replace(".", "_")  # never "." or ".."


def day_path(out: Path, channel: Channel, ticker: str, day: date, fmt: Format) -> Path:
    """OUT/<channel>/<exchange>/<symbol>/<YYYY-MM-DD>.<ext>."""
    exchange, _, symbol = ticker.partition(":")
    folder = out / channel.folder / path_part(exchange) / path_part(symbol)
    return folder / f"{day.isoformat()}.{fmt}"


def sidecar_path(path: Path) -> Path:
    """``2026-11-20.parquet`` -> ``2026-11-20.report.json``."""
    return path.with_name(path.stem + SIDECAR_SUFFIX)


def partial_path(path: Path) -> Path:
    """A hidden name no reader takes for the file: ``.2026-11-20.parquet.partial``."""
    return path.with_name(f".{path.name}{PARTIAL_SUFFIX}")


def read_sidecar(path: Path) -> dict[str, Any] | None:
    """The sidecar of a data file, or None when missing or unreadable."""
    try:
        data = json.loads(sidecar_path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_done(path: Path, window: DayWindow) -> bool:
    """The day needs no export: its data file is there (renamed, hence complete), its
    sidecar covers the window (an earlier, shorter range does not) and says the rows
    will not change (`REDO_STATES`)."""
    if not path.is_file():
        return False
    side = read_sidecar(path)
    if side is None:
        return False
    try:
        covers = int(side["start_ms"]) <= window.lo_ms and int(side["end_ms"]) >= window.hi_ms
    except (KeyError, TypeError, ValueError):
        return False
    return covers and side.get("state") not in REDO_STATES


def write_atomic_text(path: Path, text: str) -> None:
    """`text` to `path` through a `.partial` name and a rename."""
    tmp = partial_path(path)
    with tmp.open("w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_day(path: Path, schema: pa.Schema, batches: Iterable[pa.RecordBatch], fmt: Format) -> int:
    """The batches into `partial_path(path)`, fsynced; the row count. `commit` renames it
    to `path` once the sidecar is in place; an error leaves neither file behind."""
    tmp = partial_path(path)
    rows = 0
    try:
        with tmp.open("wb") as sink:
            if fmt == "parquet":
                import pyarrow.parquet as pq

                with pq.ParquetWriter(sink, schema) as writer:
                    for batch in batches:
                        writer.write_batch(batch)
                        rows += batch.num_rows
            else:
                import pyarrow.csv as pacsv

                with pacsv.CSVWriter(sink, schema) as writer:
                    for batch in batches:
                        writer.write_batch(batch)
                        rows += batch.num_rows
            sink.flush()
            os.fsync(sink.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return rows


def commit(path: Path) -> None:
    """The written `partial_path(path)` under its final name: from now on it is done."""
    os.replace(partial_path(path), path)


# --- the sources --------------------------------------------------------------------------


@dataclass(slots=True)
class DayRows:
    """One day's rows of one ticker: the schema, the batches (read as iterated) and the
    integrity report (known before the first batch); `state` ``not_recorded``: no rows."""

    schema: pa.Schema
    batches: Iterator[pa.RecordBatch]
    state: str
    report: dict[str, Any]


class DaySource(Protocol):
    """Reads one ticker's rows of [lo_ms, hi_ms) for `export_range` (Iceberg, or a fake)."""

    channel: Channel

    def read(self, ticker: str, lo_ms: int, hi_ms: int) -> DayRows: ...


def candle_report(table: pa.Table, period_s: int, lo_ms: int, hi_ms: int) -> dict[str, Any]:
    """The candles expected in [lo, hi) (open times on the period's grid) against those
    stored: count and the first 100 missing open times (epoch ms, decimal strings)."""
    step = period_s * 1000
    first = -(-lo_ms // step) * step
    have = set(pc.divide(table[Ohlc.OPEN_TIME].cast(pa.int64()), 1000).to_pylist())
    expected = range(first, hi_ms, step)
    missing = [t for t in expected if t not in have]
    state = "not_recorded" if not have else "incomplete" if missing else "complete"
    return {
        "state": state,
        "expected": len(expected),
        "stored": len(have),
        "missing": len(missing),
        "missing_open_ms": [str(t) for t in missing[:100]],
        "note": "candles stored by earlier history requests (mdclient history fetches them)",
    }


@dataclass(slots=True)
class IcebergSource:
    """The stored rows of a channel from Iceberg: ``market.ticks`` (with the trade
    integrity report of mdclient.trades), ``market.ohlc``, or the book tables sampled
    (mdclient.book_history)."""

    reader: IcebergReader
    settings: ClientSettings
    channel: Channel

    def read(self, ticker: str, lo_ms: int, hi_ms: int) -> DayRows:
        if self.channel.kind == "trades":
            return self._trades(ticker, lo_ms, hi_ms)
        if self.channel.kind == "candles":
            return self._candles(ticker, lo_ms, hi_ms)
        return self._book(ticker, lo_ms, hi_ms)

    def _trades(self, ticker: str, lo_ms: int, hi_ms: int) -> DayRows:
        from mdclient.trades import COLUMNS, TradeQuery, open_trade_batches
        from mdproto.tables import Ticks, arrow_schema

        try:
            batches = open_trade_batches(
                self.reader, self.settings, TradeQuery(ticker, lo_ms, hi_ms)
            )
        except NotRecorded as exc:
            schema = arrow_schema(Ticks.SCHEMA, COLUMNS)
            return DayRows(schema, iter(()), "not_recorded", exc.report.as_dict())
        report = batches.report
        return DayRows(batches.schema, batches, report.state, report.as_dict())

    def _candles(self, ticker: str, lo_ms: int, hi_ms: int) -> DayRows:
        from mdclient.frames import SCHEMA

        period = self.channel.period_s
        table = self.reader.read_ohlc(self.settings.ohlc_table, ticker, period, lo_ms, hi_ms)
        report = candle_report(table, period, lo_ms, hi_ms)
        batches = iter(table.cast(SCHEMA).to_batches()) if table.num_rows else iter(())
        return DayRows(SCHEMA, batches, str(report["state"]), report)

    def _book(self, ticker: str, lo_ms: int, hi_ms: int) -> DayRows:
        from mdclient.book_history import SampleQuery, read_book_samples, sample_schema

        ch = self.channel
        schema = sample_schema(ch.depth)
        try:
            table = read_book_samples(
                self.reader, self.settings, SampleQuery(ticker, lo_ms, hi_ms, ch.every_ms, ch.depth)
            )
        except StorageError as exc:
            if exc.error_code != NO_BOOK:
                raise
            report = {"state": "not_recorded", "reason": exc.reason}
            return DayRows(schema, iter(()), "not_recorded", report)
        inexact = table.num_rows - int(pc.sum(table["exact"]).as_py() or 0)
        state = "incomplete" if inexact else "complete"
        report = {
            "state": state,
            "samples": table.num_rows,
            "inexact_samples": inexact,
            "note": "inexact: a stored delta is missing before the sample (book as before it)",
        }
        return DayRows(schema, iter(table.to_batches()), state, report)


# --- the export ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DayResult:
    """One file of the export: `progress` gets it with outcome ``reading`` before the
    read, then with the outcome."""

    index: int  # 1-based, of `total`
    total: int
    ticker: str
    day: date
    path: Path
    outcome: Outcome
    rows: int = 0
    state: str = ""


@dataclass(slots=True)
class ExportSummary:
    """What `export_range` did, a `DayResult` per ticker and day in order."""

    days: list[DayResult] = field(default_factory=list)

    def count(self, outcome: Outcome) -> int:
        return sum(d.outcome == outcome for d in self.days)

    @property
    def complete(self) -> bool:
        """Every day exported (now or before) with a ``complete`` report."""
        return all(d.outcome != "not_recorded" and d.state == "complete" for d in self.days)


def export_range(
    source: DaySource,
    tickers: Sequence[str],
    start_ms: int,
    end_ms: int,
    fmt: Format,
    out: Path,
    *,
    progress: Callable[[DayResult], None] | None = None,
    now: Callable[[], float] = time.time,
) -> ExportSummary:
    """Each ticker's days of [start_ms, end_ms) to `out` (module doc): days already done
    are skipped, so a rerun of the same command finishes an interrupted export."""
    if fmt not in FORMATS:
        raise InvalidRequest(f"format {fmt!r} is not one of {list(FORMATS)}")
    for ticker in tickers:
        try:
            rules.ticker(ticker)
        except rules.RuleViolation as bad:
            raise InvalidRequest(bad.reason, error_code=bad.error_code) from None
    windows = day_windows(start_ms, end_ms)
    total = len(windows) * len(tickers)
    summary = ExportSummary()
    index = 0
    for ticker in tickers:
        for window in windows:
            index += 1
            path = day_path(out, source.channel, ticker, window.day, fmt)
            result = _export_day(source, ticker, window, path, fmt, index, total, progress, now)
            summary.days.append(result)
            if progress is not None:
                progress(result)
    return summary


def export_dataset(
    reader: IcebergReader,
    settings: ClientSettings,
    tickers: Sequence[str],
    start: int | datetime | str,
    end: int | datetime | str,
    out: Path,
    *,
    channel: str = "trades",
    fmt: Format = "parquet",
    every_ms: int = 1000,
    depth: int = 10,
    progress: Callable[[DayResult], None] | None = None,
) -> ExportSummary:
    """`export_range` from Iceberg with the SDK's time and channel forms: from a client,
    ``export_dataset(client.reader(), client.settings, ["BINANCE:BTC/USDT"], "2026-11-01",
    "2026-11-08", Path("data"))``. InvalidRequest before any read for bad input."""
    now_ms = int(time.time() * 1000)
    try:
        start_ms = timeparse.to_ms(start, now_ms=now_ms)
        end_ms = timeparse.to_ms(end, now_ms=now_ms)
    except timeparse.TimeFormatError as exc:
        raise InvalidRequest(str(exc), error_code=BAD_TIME) from None
    source = IcebergSource(reader, settings, parse_channel(channel, every_ms=every_ms, depth=depth))
    return export_range(source, tickers, start_ms, end_ms, fmt, out, progress=progress)


def _export_day(
    source: DaySource,
    ticker: str,
    window: DayWindow,
    path: Path,
    fmt: Format,
    index: int,
    total: int,
    progress: Callable[[DayResult], None] | None,
    now: Callable[[], float],
) -> DayResult:
    def result(outcome: Outcome, rows: int = 0, state: str = "") -> DayResult:
        return DayResult(index, total, ticker, window.day, path, outcome, rows, state)

    if is_done(path, window):
        side = read_sidecar(path) or {}
        return result("skipped", int(side.get("rows", 0)), str(side.get("state", "")))
    if progress is not None:
        progress(result("reading"))
    day = source.read(ticker, window.lo_ms, window.hi_ms)
    path.parent.mkdir(parents=True, exist_ok=True)
    # An older file (a shorter range, or rows still being repaired) goes first: a new
    # sidecar must never sit beside old rows.
    path.unlink(missing_ok=True)
    sidecar: dict[str, Any] = {
        "ticker": ticker,
        **source.channel.as_dict(),
        "day": window.day.isoformat(),
        "start_ms": str(window.lo_ms),
        "end_ms": str(window.hi_ms),
        "format": fmt,
        "file": path.name,
        "state": day.state,
        "report": day.report,
    }
    if day.state == "not_recorded":
        sidecar |= {"rows": 0, "file": None, "exported_at": _iso(now())}
        write_atomic_text(sidecar_path(path), json.dumps(sidecar, indent=2) + "\n")
        return result("not_recorded", 0, day.state)
    rows = write_day(path, day.schema, day.batches, fmt)
    sidecar |= {"rows": rows, "exported_at": _iso(now())}
    write_atomic_text(sidecar_path(path), json.dumps(sidecar, indent=2) + "\n")
    commit(path)
    return result("written", rows, day.state)


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
