"""Typed errors of the SDK; each carries the server's reason where there is one.

The CLI maps every class to one exit code (`ERRORS` in exit_codes.py, and the
README), so scripts can tell "the relay refused" from "the exchange failed"
from "nobody answered".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mdproto.error_codes import NOT_RECORDED, UNKNOWN_TICKER

if TYPE_CHECKING:
    from mdclient.trades import TradeIntegrity
    from mdproto.messages import HistoryReadyNotification


class MdClientError(Exception):
    """Base class. `reason` is human-readable, `error_code` machine-readable."""

    def __init__(self, reason: str, *, error_code: str = "", request_id: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.error_code = error_code
        self.request_id = request_id

    def __str__(self) -> str:
        code = f" [{self.error_code}]" if self.error_code else ""
        rid = f" (request {self.request_id})" if self.request_id else ""
        return f"{self.reason}{code}{rid}"


class ConfigError(MdClientError):
    """The YAML file, an environment override or a flag is invalid."""


class InvalidRequest(MdClientError):  # noqa: N818 (public API names)
    """The request is invalid before anything is sent (bad ticker, period or range)."""


class RelayUnavailable(MdClientError):  # noqa: N818 (public API names)
    """The relay's sockets could not be reached within the connect timeout."""


class ProtocolMismatch(MdClientError):  # noqa: N818 (public API names)
    """The relay answered with frames or a message this client does not expect."""


class SubmitRejected(MdClientError):  # noqa: N818 (public API names)
    """The relay refused the request (SubmitResponse/Response REJECTED)."""


class HistoryFailed(MdClientError):  # noqa: N818 (public API names)
    """The platform gave up on the request (ERROR notification or legacy ERROR).

    `notification` is the ERROR notification itself (None for legacy): its
    integrity report says how many candles are missing.
    """

    def __init__(
        self,
        reason: str,
        *,
        error_code: str = "",
        request_id: str = "",
        notification: HistoryReadyNotification | None = None,
    ) -> None:
        super().__init__(reason, error_code=error_code, request_id=request_id)
        self.notification = notification


class PipelineUnavailable(HistoryFailed):
    """The pipeline stopped serving history while the request was in flight
    (`pipeline_unavailable`): its relay reported the heartbeat overdue on
    `PIPELINE:status`, or the pipeline itself said history does not run. The wait
    ends there instead of at the history timeout; retry once the pipeline is back
    (a submit is refused at once until then)."""


class IngestorUnavailable(HistoryFailed):
    """No live ingestor is left to serve the exchange of a request in flight
    (`no_ingestor`): the one serving it died or hung, and no other of that exchange
    is alive to take its claim over; its relay said so on
    `INGESTORS:{exchange}|status`. The wait ends there instead of at the history
    timeout; retry once an ingestor runs (a submit is refused at once until then)."""


class MdTimeout(MdClientError):  # noqa: N818 (public API names)
    """Base of the two timeouts: nobody answered in time."""


class RequestTimeout(MdTimeout):
    """The relay did not answer a request on :5559 (after every attempt)."""


class HistoryTimeout(MdTimeout):
    """No HistoryReadyNotification arrived for any attempt (or legacy TIMEOUT)."""

    def __init__(
        self,
        reason: str,
        *,
        error_code: str = "",
        request_id: str = "",
        request_ids: tuple[str, ...] = (),
    ) -> None:
        super().__init__(reason, error_code=error_code, request_id=request_id)
        self.request_ids = request_ids


class ReplaySeamTimeout(MdTimeout):
    """`replay_into_live`: the store did not hold a topic's first live message within
    `replay_seam_timeout_s`, so what came between the stored replay and live could not
    all be read: the replay ends here instead of going on with a gap nobody sees.
    Replaying again from the last message's time (or a cursor) resumes it."""


class FeedUnavailable(MdClientError):  # noqa: N818 (public API names)
    """A live feed cannot be served: FAILED (unknown symbol, exchange down) from the
    ingestor, or REFUSED (unsupported candle period) by the relay, on `{ticker}|status`."""

    def __init__(
        self,
        reason: str,
        *,
        error_code: str = "",
        state: str = "",
        ticker: str = "",
        period_seconds: int = 0,
    ) -> None:
        super().__init__(reason, error_code=error_code)
        self.state = state  # FAILED or REFUSED
        self.ticker = ticker
        self.period_seconds = period_seconds  # REFUSED: the candle period refused


class FeedRefused(FeedUnavailable):
    """REFUSED: the platform does not serve this (e.g. a candle period outside its list)."""


class StorageError(MdClientError):
    """Reading the rows from Iceberg (REST catalog or S3) failed."""


class NotRecorded(MdClientError):  # noqa: N818 (public API names)
    """A trade read's range holds no recording: no trade of the ticker is stored, none
    before the range ends, or none after it starts. `report` (mdclient.trades) says
    which: never an empty answer that looks like a quiet market."""

    def __init__(self, report: TradeIntegrity) -> None:
        super().__init__(report.reason, error_code=NOT_RECORDED)
        self.report = report


class UnknownTicker(MdClientError):  # noqa: N818 (public API names)
    """A replay names a ticker with nothing stored for any channel asked (`unknown_ticker`):
    never recorded, or a typo of one that was. Raised before any message."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, error_code=UNKNOWN_TICKER)
