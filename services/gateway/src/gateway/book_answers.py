"""`GET /book` and `GET /book/samples`: the queries and the answers (pure: no I/O).

- `GET /book?ticker=&at=&depth=`: the SDK's exact `Client.book_at` as JSON:
  ``{"ticker", "at_ms", "exact", "gap", "snapshot_time_ms", "book_time_ms",
  "exchange_sequence", "deltas_applied", "bids": [[price, amount], ...], "asks"}``
  (times and sequences as decimal strings, as every platform JSON; best first).
- `GET /book/samples?ticker=&start=&end=&every=&depth=&format=`: the SDK's
  `Client.book_samples` table as JSON ``{"ticker", "every_ms", "depth", "samples":
  [...], "row_count"}`` (one object per sample, times as ``*_ms`` strings), an Arrow
  IPC stream or Parquet (the table as the SDK returns it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.messages import GatewayError, HistoryFormat, dumps, int64, table_bytes
from mdproto.error_codes import BAD_REQUEST

if TYPE_CHECKING:
    import pyarrow as pa

    from mdclient.book_history import StoredBook

#: Levels per side `GET /book` sends unless `depth=` says (0: the whole book).
DEFAULT_DEPTH = 0


@dataclass(frozen=True, slots=True)
class BookAtParams:
    ticker: str
    at: int | str
    depth: int = DEFAULT_DEPTH


@dataclass(frozen=True, slots=True)
class SamplesParams:
    ticker: str
    start: int | str
    end: int | str
    every_ms: int
    depth: int


def _check(query: Mapping[str, str], allowed: set[str], required: tuple[str, ...]) -> None:
    unknown = set(query) - allowed - {"token"}  # token: the auth middleware's
    if unknown:
        raise GatewayError(BAD_REQUEST, f"unknown parameter(s): {', '.join(sorted(unknown))}")
    for name in required:
        if not query.get(name, "").strip():
            raise GatewayError(BAD_REQUEST, f"missing parameter {name!r}")


def _time(text: str) -> int | str:
    value = text.strip()
    return int(value) if value.isdigit() else value


def _depth(query: Mapping[str, str], default: int) -> int:
    text = query.get("depth", "").strip()
    if not text:
        return default
    if not text.isdigit():
        raise GatewayError(BAD_REQUEST, f"depth must be a whole number of levels, not {text!r}")
    return int(text)


def parse_book_query(query: Mapping[str, str]) -> BookAtParams:
    """`GET /book?ticker=&at=&depth=`: `at` as the SDK takes times (epoch ms, `-2h`, ISO)."""
    _check(query, {"ticker", "at", "depth"}, ("ticker", "at"))
    return BookAtParams(
        query["ticker"].strip().upper(), _time(query["at"]), _depth(query, DEFAULT_DEPTH)
    )


def parse_samples_query(query: Mapping[str, str]) -> SamplesParams:
    """`GET /book/samples?ticker=&start=&end=&every=&depth=&format=`: `every` as the CLI's
    `--every` (100ms, 250, 1s; default 1s), `depth` levels per side (default 10, at most
    the SDK's `MAX_DEPTH`); the range is the SDK's to check."""
    from mdclient.book_history import MAX_DEPTH
    from mdclient.timeparse import TimeFormatError, parse_step_ms

    _check(query, {"ticker", "start", "end", "every", "depth", "format"}, ("ticker", "start"))
    try:
        every_ms = parse_step_ms(query.get("every", "1s"))
    except TimeFormatError as exc:
        raise GatewayError(BAD_REQUEST, str(exc)) from None
    depth = _depth(query, 10)
    if not 1 <= depth <= MAX_DEPTH:
        raise GatewayError(BAD_REQUEST, f"depth must be 1..{MAX_DEPTH}, not {depth}")
    return SamplesParams(
        query["ticker"].strip().upper(),
        _time(query["start"]),
        _time(query.get("end", "now")),
        every_ms,
        depth,
    )


def book_dict(book: StoredBook, at_ms: int, depth: int) -> dict[str, Any]:
    """The stored book as `GET /book` sends it."""
    return {
        "ticker": book.ticker,
        "at_ms": str(at_ms),
        "exact": book.exact,
        "gap": book.gap or None,
        "snapshot_time_ms": int64(book.snapshot_time_ms),
        "book_time_ms": int64(book.exchange_time_ms),
        "exchange_sequence": int64(book.exchange_sequence),
        "deltas_applied": book.deltas_applied,
        "bids": [list(level) for level in book.bids.top(depth)],
        "asks": [list(level) for level in book.asks.top(depth)],
    }


def encode_samples(
    table: pa.Table, fmt: HistoryFormat, *, ticker: str, every_ms: int, depth: int
) -> bytes:
    """The samples in the format asked; JSON times as ``time_ms``/``book_time_ms``
    decimal strings, 64-bit sequences as strings."""
    import pyarrow as pa

    if fmt != "json":
        return table_bytes(table, fmt)
    columns: dict[str, list[Any]] = {}
    for name in table.column_names:
        column = table[name]
        if pa.types.is_timestamp(column.type):
            micros = column.cast(pa.int64()).to_pylist()
            columns[f"{name}_ms"] = [None if us is None else str(us // 1000) for us in micros]
        elif pa.types.is_int64(column.type):
            columns[name] = [int64(v) for v in column.to_pylist()]
        else:
            columns[name] = column.to_pylist()
    keys = list(columns)
    samples = [dict(zip(keys, row, strict=True)) for row in zip(*columns.values(), strict=True)]
    body = {
        "ticker": ticker,
        "every_ms": str(every_ms),
        "depth": depth,
        "samples": samples,
        "row_count": str(len(samples)),
    }
    return dumps(body).encode()
