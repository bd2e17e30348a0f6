"""A history request's outcome, read from the pipeline's `market.requests` table.

The pipeline writes one row per notified request (its notification dedupe) in
the same commit that makes the rows visible. A client that missed its
notification (a dropped connection, a restarted process) asks the table
instead of submitting again: the row holds everything the notification held but
its `sequence` and `publisher_epoch` (left 0), which the PUB server gives when it
sends, after the row is committed (docs/protocol.md "Gateway").
No row means no outcome yet: the request is still running, or was never
accepted (the table cannot tell those apart; the SubmitResponse could).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from mdproto.messages import HistoryReadyNotification, HistorySource, Status

State = Literal["PENDING", "OK", "NOT_FOUND", "ERROR"]
_STATES: dict[str, State] = {"OK": "OK", "NOT_FOUND": "NOT_FOUND", "ERROR": "ERROR"}
_SOURCES = {HistorySource.Name(v): v for v in HistorySource.values()}


@dataclass(frozen=True, slots=True)
class RequestStatus:
    request_id: str
    state: State
    notification: HistoryReadyNotification | None = None  # the recorded outcome, if any

    @property
    def done(self) -> bool:
        return self.notification is not None


def status_from_row(request_id: str, row: Mapping[str, Any] | None) -> RequestStatus:
    """PENDING without a row; else the row as the notification it was published as."""
    if row is None:
        return RequestStatus(request_id, "PENDING")
    state = _STATES.get(str(row.get("status") or ""), "ERROR")
    return RequestStatus(request_id, state, notification_from_row(row))


def notification_from_row(row: Mapping[str, Any]) -> HistoryReadyNotification:
    """The HistoryReadyNotification a `market.requests` row records (docs/protocol.md)."""
    status_name = str(row.get("status") or "")
    completed = row.get("completed_at")
    return HistoryReadyNotification(
        request_id=str(row["request_id"]),
        client_id=_text(row, "client_id"),
        status=Status.Value(status_name) if status_name in _STATES else Status.ERROR,
        reason=_text(row, "reason")
        or ("" if status_name in _STATES else f"unknown status {status_name!r}"),
        error_code=_text(row, "error_code"),
        ticker=_text(row, "ticker"),
        period_seconds=int(row.get("period_seconds") or 0),
        start_time_ms=int(row.get("start_time_ms") or 0),
        end_time_ms=int(row.get("end_time_ms") or 0),
        row_count=int(row.get("row_count") or 0),
        iceberg_table=_text(row, "iceberg_table"),
        snapshot_id=int(row.get("snapshot_id") or 0),
        completed_at_ms=int(completed.timestamp() * 1000) if isinstance(completed, datetime) else 0,
        expected_candles=int(row.get("expected_candles") or 0),
        exchange_gaps=int(row.get("exchange_gaps") or 0),
        missing_candles=int(row.get("missing_candles") or 0),
        source=_SOURCES.get(str(row.get("source")), HistorySource.SOURCE_UNSPECIFIED),
    )


def _text(row: Mapping[str, Any], key: str) -> str:
    value = row.get(key)
    return "" if value is None else str(value)
