"""A history request's state: its outcome from the pipeline's `market.requests` table,
else what the relays remember of its acknowledgement (docs/protocol.md "Request status").

The pipeline writes one row per notified request (its notification dedupe) in
the same commit that makes the rows visible. A client that missed its
notification (a dropped connection, a restarted process) asks the table
instead of submitting again: the row holds everything the notification held but
its `sequence` and `publisher_epoch` (left 0), which the PUB server gives when it
sends, after the row is committed (docs/protocol.md "Gateway").

No row means no outcome yet, and the table cannot tell a request still running
from one never accepted; the relay that acknowledged it can. Each relay remembers
the ids it accepted (RequestStatusQuery: its newest `accepted_ids`, each for
`accepted_ids_s`, 24 h, in memory): PENDING when one of them does, UNKNOWN when
none does (never submitted, refused, or accepted so long ago, or by a relay that
restarted since, that it was forgotten; its outcome, once written, never is).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from mdproto.messages import HistoryReadyNotification, HistorySource, RequestStatusReply, Status
from mdproto.tables import Requests

#: UNKNOWN: no outcome and no relay remembers accepting it; PENDING: accepted, no outcome
#: yet; OK, NOT_FOUND, ERROR: the outcome (docs/protocol.md "Request status").
State = Literal["UNKNOWN", "PENDING", "OK", "NOT_FOUND", "ERROR"]
_STATES: dict[str, State] = {"OK": "OK", "NOT_FOUND": "NOT_FOUND", "ERROR": "ERROR"}
_SOURCES = {HistorySource.Name(v): v for v in HistorySource.values()}


@dataclass(frozen=True, slots=True)
class RequestStatus:
    request_id: str
    state: State
    notification: HistoryReadyNotification | None = None  # the recorded outcome, if any
    accepted_at_ms: int = 0  # PENDING: when a relay acknowledged the submit
    remembered_s: int = 0  # no outcome: how long the relays asked remember accepted ids

    @property
    def done(self) -> bool:
        return self.notification is not None


def status_from_row(request_id: str, row: Mapping[str, Any] | None) -> RequestStatus | None:
    """The row as the notification it was published as; None without a row (ask the
    relays: `status_from_relays`)."""
    if row is None:
        return None
    state = _STATES.get(str(row.get(Requests.STATUS) or ""), "ERROR")
    return RequestStatus(request_id, state, notification_from_row(row))


def status_from_relays(request_id: str, replies: Sequence[RequestStatusReply]) -> RequestStatus:
    """No outcome recorded: PENDING when a relay accepted the id (running, or its row a
    micro-batch away), else UNKNOWN. `replies`: one per relay asked, every relay the
    client lists (a request goes to any one of them)."""
    remembered = min((r.remembered_s for r in replies), default=0)
    for reply in replies:
        if reply.status == Status.OK:
            return RequestStatus(
                request_id, "PENDING", accepted_at_ms=reply.accepted_at_ms, remembered_s=remembered
            )
    return RequestStatus(request_id, "UNKNOWN", remembered_s=remembered)


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
        bars=_text(row, Requests.BARS),
    )


def _int(row: Mapping[str, Any], key: str) -> int:
    return int(row.get(key) or 0)


def _text(row: Mapping[str, Any], key: str) -> str:
    value = row.get(key)
    return "" if value is None else str(value)
