"""The one error type the protocol package raises for bad input."""

from __future__ import annotations

from mdproto.error_codes import Carrier, carried_by


class ProtocolError(ValueError):
    """A frame sequence, record or topic that is not a valid protocol message.

    `reason` is a short, single-line explanation meant for log lines and for
    error replies to clients; `code` is a stable machine-readable label
    (e.g. for metrics) from `ProtocolError.CODES`, the "frame" codes of
    `mdproto.error_codes`.
    """

    CODES = carried_by(Carrier.FRAME)

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason
