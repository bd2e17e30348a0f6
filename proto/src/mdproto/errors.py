"""The one error type the protocol package raises for bad input."""

from __future__ import annotations


class ProtocolError(ValueError):
    """A frame sequence, record or topic that is not a valid protocol message.

    `reason` is a short, single-line explanation meant for log lines and for
    error replies to clients; `code` is a stable machine-readable label
    (e.g. for metrics) from `ProtocolError.CODES`.
    """

    CODES = frozenset(
        {
            "frame_count",
            "empty_frame",
            "bad_version",
            "unknown_type",
            "unexpected_type",
            "bad_payload",
            "too_large",
            "bad_topic",
        }
    )

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason
