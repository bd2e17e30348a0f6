"""Final markers -> completed requests -> HistoryReadyNotifications (pure).

A request is notified once. `plan` decides, for the final markers of one
micro-batch and the rows already in the ``requests`` table, which requests are
new (record, then publish), which were recorded by this very micro-batch before
it failed (publish the stored notification again, unchanged, unless this process
sent it already: the batch failed after its publish, e.g. at Spark's checkpoint
commit), and which are duplicates (a second ingestor, or a replay of an older
batch: skip).

The notification is always rebuilt from the stored `CompletedRequest`, so a
re-publication after a crash carries exactly the bytes of the first one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from mdproto import topics
from mdproto.contracts import FROM_STORAGE, FROM_TRADES
from mdproto.error_codes import INCOMPLETE, INGESTOR_ERROR
from mdproto.messages import (
    BatchMetadata,
    HistoryReadyNotification,
    HistorySource,
    NotifyPattern,
    Status,
)
from mdproto.tables import Requests, arrow_schema
from pipeline.records import FinalMarker
from pipeline.trade_bars import BarReport

_RANK: dict[int, int] = {Status.OK: 0, Status.NOT_FOUND: 1, Status.ERROR: 2}

#: Row layout of Iceberg ``market.requests`` (mdproto.tables.Requests), one row per
#: notified request: `CompletedRequest`'s fields, times as timestamps.
REQUESTS_SCHEMA = arrow_schema(Requests.SCHEMA)
_TIME_FIELDS = {Requests.COMPLETED_AT: "completed_at_ms"}


@dataclass(frozen=True, slots=True)
class CompletedRequest:
    """One row of the ``requests`` table: what was (or will be) notified for a request."""

    request_id: str
    client_id: str
    status: int
    reason: str
    error_code: str
    ticker: str
    period_seconds: int
    start_time_ms: int
    end_time_ms: int
    row_count: int
    iceberg_table: str
    snapshot_id: int
    notification_topic: str
    ingestor_id: str
    completed_at_ms: int
    query_id: str
    batch_id: int
    kafka_partition: int
    kafka_offset: int
    expected_candles: int = 0  # integrity report: closed slots in the range (0 = unknown)
    exchange_gaps: int = 0  # slots the exchange has no candle for (no trades)
    missing_candles: int = 0  # slots neither stored nor exchange gaps: a failed fetch
    source: int = HistorySource.SOURCE_UNSPECIFIED
    bars: str = ""  # tick or volume bars ("" = candles): what iceberg_table holds

    def notification(self) -> HistoryReadyNotification:
        return HistoryReadyNotification(
            request_id=self.request_id,
            client_id=self.client_id,
            status=self.status,  # type: ignore[arg-type]
            reason=self.reason,
            error_code=self.error_code,
            ticker=self.ticker,
            period_seconds=self.period_seconds,
            start_time_ms=self.start_time_ms,
            end_time_ms=self.end_time_ms,
            row_count=self.row_count,
            iceberg_table=self.iceberg_table,
            snapshot_id=self.snapshot_id,
            completed_at_ms=self.completed_at_ms,
            expected_candles=self.expected_candles,
            exchange_gaps=self.exchange_gaps,
            missing_candles=self.missing_candles,
            source=self.source,  # type: ignore[arg-type]
            bars=self.bars,
        )


@dataclass(slots=True)
class Plan:
    record: list[CompletedRequest] = field(default_factory=list)
    publish: list[CompletedRequest] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    republished: list[str] = field(default_factory=list)
    #: published ahead of the history query (`notifier`): recorded, not published
    notified_early: list[str] = field(default_factory=list)
    #: recorded and published by this batch before it failed (its checkpoint commit, say),
    #: in this process: not published again
    sent_before: list[str] = field(default_factory=list)


def outcome(meta: BatchMetadata | None) -> tuple[int, str, str, int]:
    """(status, reason, error_code, row_count) announced for a final marker."""
    if meta is None:
        return Status.ERROR, "final marker carries no metadata", "bad_marker", 0
    if meta.status == Status.OK:
        # Stored or built from trades: the pipeline knows the rows, the marker does not.
        if meta.total_rows == 0 and meta.source not in (*FROM_STORAGE, FROM_TRADES):
            return Status.NOT_FOUND, meta.reason or "no candles in the range", "", 0
        return Status.OK, meta.reason, "", meta.total_rows
    if meta.status == Status.NOT_FOUND:
        return Status.NOT_FOUND, meta.reason or "no candles in the range", meta.error_code, 0
    if meta.status == Status.ERROR:
        return (
            Status.ERROR,
            meta.reason or "the ingestor reported an error",
            meta.error_code or INGESTOR_ERROR,
            0,
        )
    name = Status.Name(meta.status) if meta.status in Status.values() else str(meta.status)
    return Status.ERROR, f"final marker has status {name}", "bad_marker", 0


def topic_for(request_id: str, meta: BatchMetadata | None) -> str:
    """The marker's notification topic if it is one, else the one the client computed."""
    if meta is not None and meta.notification_topic.startswith(
        (topics.RESPONSE_PREFIX, topics.HISTORY_READY_PREFIX)
    ):
        return meta.notification_topic
    client_id = meta.client_id if meta is not None else ""
    return topics.notification_topic(NotifyPattern.NOTIFY_AUTO, request_id, client_id)


def choose(markers: Iterable[FinalMarker]) -> list[FinalMarker]:
    """One marker per request: the best status (OK > NOT_FOUND > ERROR), first in Kafka order."""
    best: dict[str, FinalMarker] = {}
    for marker in sorted(markers, key=lambda m: (m.partition, m.offset)):
        current = best.get(marker.request_id)
        if current is None or _rank(marker) < _rank(current):
            best[marker.request_id] = marker
    return sorted(best.values(), key=lambda m: (m.partition, m.offset))


def _rank(marker: FinalMarker) -> int:
    return _RANK.get(outcome(marker.metadata)[0], 3)


def complete(
    marker: FinalMarker,
    *,
    iceberg_table: str,
    snapshot_id: int,
    completed_at_ms: int,
    query_id: str,
    batch_id: int,
) -> CompletedRequest:
    meta = marker.metadata
    status, reason, error_code, row_count = outcome(meta)
    expected = meta.expected_candles if meta else 0
    gaps = meta.expected_gaps if meta else 0
    return CompletedRequest(
        request_id=marker.request_id,
        client_id=meta.client_id if meta else "",
        status=status,
        reason=reason,
        error_code=error_code,
        ticker=meta.ticker if meta else "",
        period_seconds=meta.period_seconds if meta else 0,
        start_time_ms=meta.start_time_ms if meta else 0,
        end_time_ms=meta.end_time_ms if meta else 0,
        row_count=row_count,
        iceberg_table=iceberg_table,
        snapshot_id=snapshot_id if status == Status.OK else 0,
        notification_topic=topic_for(marker.request_id, meta),
        ingestor_id=meta.ingestor_id if meta else "",
        completed_at_ms=completed_at_ms,
        query_id=query_id,
        batch_id=batch_id,
        kafka_partition=marker.partition,
        kafka_offset=marker.offset,
        expected_candles=expected,
        exchange_gaps=gaps,
        missing_candles=missing(expected, meta.total_rows if meta else 0, gaps),
        source=(meta.source or HistorySource.SOURCE_EXCHANGE)
        if meta
        else HistorySource.SOURCE_UNSPECIFIED,
        bars=meta.bars if meta else "",
    )


def missing(expected: int, present: int, exchange_gaps: int) -> int:
    """Slots neither stored nor known to be empty at the exchange (0 when not known)."""
    return max(0, expected - present - exchange_gaps)


def plan(
    markers: Sequence[FinalMarker],
    existing: Mapping[str, CompletedRequest],
    *,
    iceberg_table: str,
    snapshot_id: int,
    completed_at_ms: int,
    query_id: str,
    batch_id: int,
    sent: Collection[str] = frozenset(),
) -> Plan:
    """``sent``: the markers' request ids this process has published (`HistoryNotifier.sent`)."""
    result = Plan()
    for marker in choose(markers):
        done = existing.get(marker.request_id)
        if done is None:
            request = complete(
                marker,
                iceberg_table=iceberg_table,
                snapshot_id=snapshot_id,
                completed_at_ms=completed_at_ms,
                query_id=query_id,
                batch_id=batch_id,
            )
            result.record.append(request)
            result.publish.append(request)
        elif done.query_id == query_id and done.batch_id == batch_id:
            if done.request_id in sent:
                # Gone out before the batch failed (a failed checkpoint commit replays it).
                result.sent_before.append(done.request_id)
            else:
                # Recorded by this micro-batch before a crash: it may not have gone out.
                result.publish.append(done)
                result.republished.append(done.request_id)
        else:
            result.duplicates.append(marker.request_id)
    return result


def needs_count(request: CompletedRequest) -> bool:
    """OK requests with a range: their row count is checked against Iceberg."""
    return request.status == Status.OK and request.end_time_ms > request.start_time_ms


def reconcile(request: CompletedRequest, found: int) -> CompletedRequest:
    """Announce what the client will actually read.

    ``found`` is the number of candles in the request's range at the notified
    snapshot. Fewer than the ingestor sent means rows were dropped as invalid:
    the request failed (``incomplete``). More (overlapping requests, live
    candles) is fine: the client reads them all.
    """
    if not needs_count(request):
        return request
    if request.source in FROM_STORAGE:
        # Stored spans were complete when stored: what is not there had no trades.
        if found == 0:
            reason = "no candles in the range"
            return replace(request, status=Status.NOT_FOUND, reason=reason, snapshot_id=0)
        gaps = max(0, request.expected_candles - found)
        return replace(request, row_count=found, exchange_gaps=gaps, missing_candles=0)
    announced = request.row_count
    if found < announced:
        return replace(
            request,
            status=Status.ERROR,
            reason=(
                f"only {found} of the {announced} candles sent by the ingestor are in "
                f"{request.iceberg_table}: invalid rows were dropped (see the pipeline log)"
            ),
            error_code=INCOMPLETE,
            row_count=found,
            missing_candles=missing(request.expected_candles, found, request.exchange_gaps),
        )
    return replace(
        request,
        row_count=found,
        missing_candles=missing(request.expected_candles, found, request.exchange_gaps),
    )


def apply_counts(plan: Plan, found: Mapping[str, int]) -> Plan:
    """`reconcile` every new request of ``plan`` that was counted."""
    fixed = {
        r.request_id: reconcile(r, found[r.request_id])
        for r in plan.record
        if r.request_id in found
    }
    return replace(
        plan,
        record=[fixed.get(r.request_id, r) for r in plan.record],
        publish=[fixed.get(r.request_id, r) for r in plan.publish],
    )


def from_trades(markers: Iterable[FinalMarker]) -> list[FinalMarker]:
    """The OK final markers (one per request) that ask for bars built from trades."""
    return [
        m
        for m in choose(markers)
        if m.metadata is not None
        and m.metadata.source == FROM_TRADES
        and outcome(m.metadata)[0] == Status.OK
    ]


def with_bars(request: CompletedRequest, bars: BarReport) -> CompletedRequest:
    """A request answered from trades: the outcome and integrity report of its bars
    (`trade_bars.report`), the snapshot only when there are rows to read."""
    return replace(
        request,
        status=bars.status,
        reason=bars.reason,
        error_code=bars.error_code,
        row_count=bars.row_count,
        snapshot_id=(bars.snapshot_id or request.snapshot_id) if bars.status == Status.OK else 0,
        iceberg_table=bars.iceberg_table or request.iceberg_table,
        expected_candles=bars.expected_candles,
        exchange_gaps=bars.exchange_gaps,
        missing_candles=bars.missing_candles,
        source=FROM_TRADES,
    )


def apply_bars(plan: Plan, bars: Mapping[str, BarReport]) -> Plan:
    """`with_bars` for every new request of ``plan`` answered from trades."""
    fixed = {
        r.request_id: with_bars(r, bars[r.request_id]) for r in plan.record if r.request_id in bars
    }
    return replace(
        plan,
        record=[fixed.get(r.request_id, r) for r in plan.record],
        publish=[fixed.get(r.request_id, r) for r in plan.publish],
    )


class AcceptedRows:
    """Valid rows the pipeline took in per request and record sequence, since it started.

    Why: a request's row count is then known when its final marker arrives, so
    it needs no count in Iceberg after the commit. Records of one request share
    a Kafka partition, so they arrive before its final marker; a request some of
    whose records this process did not see (it started after them) has no
    known total and is counted in Iceberg as before. Keyed by sequence, so a
    replayed batch or a second ingestor's copy of a record is not added twice.
    """

    def __init__(self, capacity: int = 10_000) -> None:
        self._rows: OrderedDict[str, dict[int, int]] = OrderedDict()
        self._capacity = capacity

    def add(self, accepted: Iterable[tuple[str, int, int]]) -> None:
        for request_id, sequence, rows in accepted:
            per_record = self._rows.get(request_id)
            if per_record is None:
                per_record = self._rows[request_id] = {}
                while len(self._rows) > self._capacity:  # unfinished requests must not pile up
                    self._rows.popitem(last=False)
            per_record[sequence] = rows

    def total(self, marker: FinalMarker) -> int | None:
        """Rows of the request's data records 0..total_batches-1, or None if one was not seen."""
        meta = marker.metadata
        per_record = self._rows.get(marker.request_id)
        if meta is None or per_record is None:
            return None
        rows = [per_record.get(seq) for seq in range(meta.total_batches)]
        # Only its own data records: a dead holder's extra records of a takeover do not count.
        return None if None in rows else sum(r for r in rows if r is not None)

    def forget(self, request_ids: Iterable[str]) -> None:
        for request_id in request_ids:
            self._rows.pop(request_id, None)


def known_counts(markers: Iterable[FinalMarker], accepted: AcceptedRows) -> dict[str, int]:
    """Row counts known without counting in Iceberg: exchange answers whose records were all seen.

    An answer from storage (even partly) holds rows no record of it carried: counted.
    """
    known: dict[str, int] = {}
    for marker in markers:
        meta = marker.metadata
        if meta is None or meta.source in FROM_STORAGE or meta.source == FROM_TRADES:
            continue
        total = accepted.total(marker)
        if total is not None:
            known[marker.request_id] = total
    return known


def to_table(requests: Sequence[CompletedRequest]) -> pa.Table:
    columns: dict[str, list[Any]] = {name: [] for name in REQUESTS_SCHEMA.names}
    for request in requests:
        row = asdict(request)
        row[Requests.STATUS] = Status.Name(request.status)  # type: ignore[arg-type]
        row[Requests.SOURCE] = HistorySource.Name(request.source)  # type: ignore[arg-type]
        for column, ms in _TIME_FIELDS.items():
            row[column] = row.pop(ms) * 1000
        for name in REQUESTS_SCHEMA.names:
            columns[name].append(row[name])
    arrays = []
    for f in REQUESTS_SCHEMA:
        if pa.types.is_timestamp(f.type):
            arrays.append(pa.array(columns[f.name], pa.int64()).cast(f.type))
        else:
            arrays.append(pa.array(columns[f.name], f.type))
    return pa.Table.from_arrays(arrays, schema=REQUESTS_SCHEMA)


def from_table(table: pa.Table) -> dict[str, CompletedRequest]:
    """``requests`` rows (e.g. from ``DataFrame.toArrow()``) keyed by request_id."""
    if table.num_rows == 0:
        return {}
    cols: dict[str, list[Any]] = {}
    for name in REQUESTS_SCHEMA.names:
        col = table.column(name)
        if pa.types.is_timestamp(col.type):
            col = pc.cast(col, pa.timestamp("us", tz="UTC")).cast(pa.int64())
            cols[_TIME_FIELDS[name]] = [(v or 0) // 1000 for v in col.to_pylist()]
        else:
            cols[name] = col.to_pylist()
    out: dict[str, CompletedRequest] = {}
    for i in range(table.num_rows):
        row = {k: v[i] for k, v in cols.items()}
        row["status"] = Status.Value(row["status"]) if row["status"] else Status.ERROR
        row["source"] = HistorySource.Value(row["source"] or "SOURCE_UNSPECIFIED")
        row["bars"] = row["bars"] or ""
        for key in ("client_id", "reason", "error_code", "ticker", "notification_topic"):
            row[key] = row[key] or ""
        for key in ("iceberg_table", "ingestor_id", "query_id"):
            row[key] = row[key] or ""
        for key in (
            "period_seconds",
            "start_time_ms",
            "end_time_ms",
            "row_count",
            "snapshot_id",
            "batch_id",
            "expected_candles",
            "exchange_gaps",
            "missing_candles",
        ):
            row[key] = row[key] or 0
        for key in ("kafka_partition", "kafka_offset"):
            row[key] = row[key] if row[key] is not None else -1
        request = CompletedRequest(**row)
        out[request.request_id] = request
    return out
