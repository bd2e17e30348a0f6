"""Pending map of the legacy synchronous flow: the relay's only per-request state.

`OHLCRequest` -> `DataRequest{legacy_sync}` -> an ingestor's `DataResponse`
-> `Response` to the client that is still waiting on its REQ socket. The map
remembers, per request_id, the ROUTER route back to that client until the
answer arrives or `timeout` passes. It is bounded so a flood of requests that
nobody answers cannot grow it without limit. Pure: the caller passes `now`.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass

from mdproto.error_codes import DUPLICATE_REQUEST, PENDING_FULL, TIMEOUT
from mdproto.messages import DataResponse, Response, Status


@dataclass(frozen=True, slots=True)
class Pending:
    request_id: str
    route: list[bytes]  # ROUTER frames back to the client (identity [+ delimiter])
    deadline: float


class Admission(enum.Enum):
    ADDED = "added"
    FULL = PENDING_FULL
    DUPLICATE = DUPLICATE_REQUEST


class PendingRequests:
    """request_id -> Pending, in deadline order (one timeout for all)."""

    def __init__(self, capacity: int, timeout: float) -> None:
        self._capacity = capacity
        self._timeout = timeout
        self._pending: OrderedDict[str, Pending] = OrderedDict()

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, request_id: str, route: list[bytes], now: float) -> Admission:
        if request_id in self._pending:
            return Admission.DUPLICATE
        if len(self._pending) >= self._capacity:
            return Admission.FULL
        self._pending[request_id] = Pending(request_id, route, now + self._timeout)
        return Admission.ADDED

    def resolve(self, request_id: str) -> Pending | None:
        """The waiting client for a response, or None (late, duplicate or unknown)."""
        return self._pending.pop(request_id, None)

    def expire(self, now: float) -> list[Pending]:
        """Remove and return every request whose deadline has passed."""
        expired: list[Pending] = []
        while self._pending:
            first = next(iter(self._pending.values()))
            if first.deadline > now:
                break
            expired.append(self._pending.popitem(last=False)[1])
        return expired

    def next_deadline(self) -> float | None:
        return next(iter(self._pending.values())).deadline if self._pending else None


def response_from(data: DataResponse) -> Response:
    """The client's `Response` for an ingestor's `DataResponse`."""
    status = data.status if data.status != Status.STATUS_UNSPECIFIED else Status.ERROR
    response = Response(request_id=data.request_id, status=status, reason=data.reason)
    response.candles.extend(data.candles)
    return response


def timeout_response(pending: Pending, timeout: float) -> Response:
    return Response(
        request_id=pending.request_id,
        status=Status.TIMEOUT,
        reason=f"no ingestor answered within {timeout:g} s",
        error_code=TIMEOUT,
    )
