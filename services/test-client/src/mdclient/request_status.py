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
from mdproto.tables import Requests

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
    state = _STATES.get(str(row.get(Requests.STATUS) or ""), "ERROR")
    return RequestStatus(request_id, state, notification_from_row(row))


def status_from_notification(note: HistoryReadyNotification) -> RequestStatus:
    """A received notification as the request's status (its row may not be written yet)."""
    state = _STATES.get(Status.Name(note.status), "ERROR")
    return RequestStatus(note.request_id, state, note)


def notification_from_row(row: Mapping[str, Any]) -> HistoryReadyNotification:
    """The HistoryReadyNotification a `market.requests` row records (docs/protocol.md)."""
    status_name = str(row.get(Requests.STATUS) or "")
    completed = row.get(Requests.COMPLETED_AT)
    return HistoryReadyNotification(
        request_id=str(row[Requests.REQUEST_ID]),
        client_id=_text(row, Requests.CLIENT_ID),
        status=Status.Value(status_name) if status_name in _STATES else Status.ERROR,
        reason=_text(row, Requests.REASON)
        or ("" if status_name in _STATES else f"unknown status {status_name!r}"),
        error_code=_text(row, Requests.ERROR_CODE),
        ticker=_text(row, Requests.TICKER),
        period_seconds=_int(row, Requests.PERIOD_SECONDS),
        start_time_ms=_int(row, Requests.START_TIME_MS),
        end_time_ms=_int(row, Requests.END_TIME_MS),
        row_count=_int(row, Requests.ROW_COUNT),
        iceberg_table=_text(row, Requests.ICEBERG_TABLE),
        snapshot_id=_int(row, Requests.SNAPSHOT_ID),
        completed_at_ms=int(completed.timestamp() * 1000) if isinstance(completed, datetime) else 0,
        expected_candles=_int(row, Requests.EXPECTED_CANDLES),
        exchange_gaps=_int(row, Requests.EXCHANGE_GAPS),
        missing_candles=_int(row, Requests.MISSING_CANDLES),
        source=_SOURCES.get(str(row.get(Requests.SOURCE)), HistorySource.SOURCE_UNSPECIFIED),
    )


def _int(row: Mapping[str, Any], key: str) -> int:
    return int(row.get(key) or 0)


def _text(row: Mapping[str, Any], key: str) -> str:
    value = row.get(key)
    return "" if value is None else str(value)
