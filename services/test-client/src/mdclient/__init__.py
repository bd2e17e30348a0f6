"""mdclient: history, live, legacy and CEP-trigger client of the market-data platform.

Importing this package is cheap: pyarrow, pandas and pyiceberg are imported
only when rows are read.
"""

from mdclient.client import Client, TriggerOptions, new_client_id, new_request_id
from mdclient.config import ClientSettings, load_settings
from mdclient.dispatch import SequenceEvent
from mdclient.errors import (
    ConfigError,
    FeedRefused,
    FeedUnavailable,
    HistoryFailed,
    HistoryTimeout,
    IngestorUnavailable,
    InvalidRequest,
    MdClientError,
    MdTimeout,
    NotRecorded,
    PipelineUnavailable,
    ProtocolMismatch,
    RelayUnavailable,
    ReplaySeamTimeout,
    RequestTimeout,
    StorageError,
    SubmitRejected,
    UnknownTicker,
)
from mdclient.history import HistoryOutcome, HistoryQuery, HistoryResult, ProgressEvent
from mdclient.live import LiveStream
from mdclient.triggers import TriggerEvents, TriggerRejected

__all__ = [
    "Client",
    "ClientSettings",
    "ConfigError",
    "FeedRefused",
    "FeedUnavailable",
    "HistoryFailed",
    "HistoryOutcome",
    "HistoryQuery",
    "HistoryResult",
    "HistoryTimeout",
    "IngestorUnavailable",
    "InvalidRequest",
    "LiveStream",
    "MdClientError",
    "MdTimeout",
    "NotRecorded",
    "PipelineUnavailable",
    "ProgressEvent",
    "ProtocolMismatch",
    "RelayUnavailable",
    "ReplaySeamTimeout",
    "RequestTimeout",
    "SequenceEvent",
    "StorageError",
    "SubmitRejected",
    "TriggerEvents",
    "TriggerOptions",
    "TriggerRejected",
    "UnknownTicker",
    "load_settings",
    "new_client_id",
    "new_request_id",
]
