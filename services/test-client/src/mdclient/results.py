"""What a history or legacy call returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

    from mdproto.messages import HistoryReadyNotification


@dataclass(frozen=True)
class HistoryResult:
    """Candles (frames.SCHEMA) plus how they were obtained.

    `status` is "OK" or "NOT_FOUND" (then `table` is empty); failures raise.
    """

    table: pa.Table
    status: str
    request_id: str
    attempts: int
    elapsed_s: float
    snapshot_id: int | None = None
    reported_rows: int = 0  # row_count of the notification (rows written for the request)
    notification: HistoryReadyNotification | None = None

    def __len__(self) -> int:
        return int(self.table.num_rows)

    @property
    def empty(self) -> bool:
        return bool(self.table.num_rows == 0)

    def to_pandas(self) -> Any:
        """A pandas DataFrame (typed Any: pandas ships no type stubs here)."""
        return self.table.to_pandas()
