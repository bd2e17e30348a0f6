"""The ingestor's own request and market counters; metrics.py exports them.

The other parts keep theirs (SinkStats, IntakeStats, FeedStats, ClaimStats).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class IngestorStats:
    history_jobs: int = 0  # historical requests this ingestor fetched
    legacy_jobs: int = 0
    skipped_claimed: int = 0  # another ingestor claimed them first
    skipped_repeat: int = 0  # already seen by this ingestor
    taken_over: int = 0  # requests this ingestor took over from a silent claim holder
    markets_published: int = 0
    rows: int = 0  # candles written for history requests
    # Finished history requests by (status name, error_code): bounded, unlike a per-request log.
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
