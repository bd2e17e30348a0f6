"""The deprecated synchronous flow: OHLCRequest -> Response on the same REQ channel.

The relay holds the request open until an ingestor answers (or its own 30 s
timeout answers TIMEOUT), so the client's timeout is a little longer. A lost
reply costs the REQ socket (lazy pirate in the transport); another attempt,
if configured, uses a new request_id.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from mdclient.errors import (
    HistoryFailed,
    HistoryTimeout,
    ProtocolMismatch,
    RequestTimeout,
    SubmitRejected,
)
from mdclient.history import HistoryQuery
from mdproto import ProtocolError, envelope
from mdproto.error_codes import REQUEST_ID_MISMATCH
from mdproto.messages import OHLCRequest, Response, Status


class RequestPort(Protocol):
    def request(self, frames: Sequence[bytes], timeout_s: float) -> list[bytes]: ...


@dataclass(frozen=True, slots=True)
class LegacyOutcome:
    response: Response
    request_id: str
    attempts: int
    elapsed_s: float


def fetch_sync(
    port: RequestPort,
    query: HistoryQuery,
    *,
    client_id: str,
    limit: int,
    timeout_s: float,
    attempts: int,
    new_request_id: Callable[[], str],
    clock: Callable[[], float] = time.monotonic,
) -> LegacyOutcome:
    """OK or NOT_FOUND Response; raises SubmitRejected, HistoryFailed or a timeout."""
    started = clock()
    last: RequestTimeout | None = None
    for attempt in range(1, attempts + 1):
        request_id = new_request_id()
        request = OHLCRequest(
            request_id=request_id,
            client_id=client_id,
            ticker=query.ticker,
            period_seconds=query.period_seconds,
            start_time_ms=query.start_ms,
            end_time_ms=query.end_ms,
            limit=limit,
        )
        try:
            reply = port.request(envelope.encode(request), timeout_s)
        except RequestTimeout as exc:
            last = exc
            continue
        response = check_response(reply, request_id)
        return LegacyOutcome(response, request_id, attempt, clock() - started)
    assert last is not None
    raise RequestTimeout(
        f"{last.reason} ({attempts} attempt(s))", error_code=last.error_code, request_id=request_id
    )


def check_response(frames: Sequence[bytes], request_id: str) -> Response:
    try:
        response = envelope.decode(frames, Response)
    except ProtocolError as exc:
        raise ProtocolMismatch(
            f"legacy reply is not a Response: {exc.reason}", error_code=exc.code
        ) from None
    if response.request_id and response.request_id != request_id:
        raise ProtocolMismatch(
            f"Response is for request {response.request_id!r}, sent {request_id!r}",
            error_code=REQUEST_ID_MISMATCH,
            request_id=request_id,
        )
    status = response.status
    if status in (Status.OK, Status.NOT_FOUND):
        return response
    name = Status.Name(status)
    reason = response.reason or f"legacy request ended with status {name}"
    code = response.error_code or name.lower()
    if status == Status.REJECTED:
        raise SubmitRejected(reason, error_code=code, request_id=request_id)
    if status == Status.TIMEOUT:
        raise HistoryTimeout(
            reason, error_code=code, request_id=request_id, request_ids=(request_id,)
        )
    raise HistoryFailed(reason, error_code=code, request_id=request_id)
