"""`GET /trades`: the query, and the answer encoded batch by batch (pure: no I/O).

The body streams: each Arrow record batch of the SDK's `Client.trade_batches` becomes
its bytes as it arrives, so a long range never sits in the gateway's memory.

- JSON: ``{"ticker", "integrity", "trades": [...], "row_count"}``: the integrity report
  first (known before any row), one object per trade (times in epoch ms and trade ids
  as strings; 64-bit integers as decimal strings, as every platform JSON), the count
  last.
- Arrow IPC stream and Parquet: the rows as stored, the report (JSON) in the schema
  metadata under ``mdp.integrity`` (`mdclient.trades.REPORT_KEY`); its summary in the
  headers of every format (`report_headers`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.messages import GatewayError, HistoryFormat, dumps
from mdproto.error_codes import BAD_REQUEST
from mdproto.tables import Ticks

if TYPE_CHECKING:
    import pyarrow as pa

    from mdclient.trades import TradeIntegrity


@dataclass(frozen=True, slots=True)
class TradesParams:
    ticker: str
    start: int | str
    end: int | str = "now"


def parse_trades_query(query: Mapping[str, str]) -> TradesParams:
    """`GET /trades?ticker=&start=&end=&format=`: times as the SDK takes them (epoch ms,
    `-2h`, `now`, ISO). `token` is the auth middleware's; anything else is refused."""
    unknown = set(query) - {"ticker", "start", "end", "format", "token"}
    if unknown:
        raise GatewayError(BAD_REQUEST, f"unknown parameter(s): {', '.join(sorted(unknown))}")
    for name in ("ticker", "start"):
        if not query.get(name, "").strip():
            raise GatewayError(BAD_REQUEST, f"missing parameter {name!r}")
    times = {name: query.get(name, "now").strip() for name in ("start", "end")}
    start, end = (int(t) if t.isdigit() else t for t in (times["start"], times["end"]))
    return TradesParams(query["ticker"].strip().upper(), start, end)


def report_headers(report: TradeIntegrity) -> dict[str, str]:
    """The report's summary as headers (the whole report is in the body or its schema)."""
    counts = report.counts
    headers = {
        "X-Integrity-State": report.state,
        "X-Recorded-Since-Ms": _text(report.recorded_since_ms),
        "X-Not-Recorded-Until-Ms": _text(report.not_recorded_until_ms),
    }
    for name in ("open", "repairing", "repaired", "unrepairable"):
        headers[f"X-Gaps-{name.title()}"] = "" if counts is None else str(getattr(counts, name))
    return headers


def _text(value: int | None) -> str:
    return "" if value is None else str(value)


class _Drain:
    """A file Arrow writers write to and the gateway empties after each batch; `tell`
    counts every byte, so Parquet's offsets stay right."""

    closed = False

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._written = 0

    def write(self, data: bytes) -> int:
        self._chunks.append(bytes(data))
        self._written += len(data)
        return len(data)

    def tell(self) -> int:
        return self._written

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def take(self) -> bytes:
        out, self._chunks = b"".join(self._chunks), []
        return out


class TradeEncoder:
    """One answer's bytes: `start()`, `batch()` per record batch, `finish()`."""

    def __init__(self, fmt: HistoryFormat, report: TradeIntegrity, schema: pa.Schema) -> None:
        from mdclient.trades import with_report

        self.format = fmt
        self.rows = 0
        self._report = report
        self._schema = with_report(schema, report)
        self._sink = _Drain()
        self._writer: Any = None

    def start(self) -> bytes:
        if self.format == "json":
            head = dumps({"ticker": self._report.ticker, "integrity": self._report.as_dict()})
            return f'{head[:-1]},"trades":['.encode()
        if self.format == "arrow":
            import pyarrow as pa

            self._writer = pa.ipc.new_stream(self._sink, self._schema)
        else:
            import pyarrow.parquet as pq

            self._writer = pq.ParquetWriter(self._sink, self._schema)
        return self._sink.take()

    def batch(self, batch: pa.RecordBatch) -> bytes:
        first = self.rows == 0
        self.rows += batch.num_rows
        if self.format == "json":
            text = ",".join(dumps(row) for row in json_rows(batch))
            return (text if first or not text else "," + text).encode()
        self._writer.write_batch(batch)
        return self._sink.take()

    def finish(self) -> bytes:
        if self.format == "json":
            return f'],"row_count":"{self.rows}"}}'.encode()
        self._writer.close()
        return self._sink.take()


#: Trade columns sent as epoch ms strings in JSON (`*_ms`).
_TIMES = (Ticks.TRADE_TIME, Ticks.INGESTED_AT)


def json_rows(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """A batch as JSON objects: the ticker's columns left out (the answer names it once),
    times as `trade_time_ms`/`ingested_at_ms` decimal strings."""
    import pyarrow as pa

    names = [n for n in batch.schema.names if n not in (Ticks.TICKER, Ticks.EXCHANGE, Ticks.SYMBOL)]
    columns: dict[str, list[Any]] = {}
    for name in names:
        column = batch.column(name)
        if name in _TIMES:
            micros = column.cast(pa.int64()).to_pylist()
            columns[f"{name}_ms"] = [None if us is None else str(us // 1000) for us in micros]
        else:
            columns[name] = column.to_pylist()
    keys = list(columns)
    return [dict(zip(keys, values, strict=True)) for values in zip(*columns.values(), strict=True)]
