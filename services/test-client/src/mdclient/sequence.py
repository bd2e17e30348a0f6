"""Gap and duplicate detection on live topics (pure: no sockets, no threads).

The pipeline stamps every Tick and OHLC with ``sequence`` (1, 2, 3, ... per
topic) and ``publisher_epoch`` (one value per publisher start; docs/protocol.md
"Sequence numbers"). Per topic: the next number is accepted, an older or equal
one is a duplicate (a last value re-sent to a new subscriber, a copy), a jump is
a gap (messages lost on the way), another epoch a restarted publisher (the
numbering starts again: neither a gap nor a replay). ``sequence`` 0 comes from a
publisher that predates numbering and is passed through unchecked.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Literal


class Verdict(enum.Enum):
    FIRST = "first"  # the topic's first message: the baseline
    NEXT = "next"
    DUPLICATE = "duplicate"
    GAP = "gap"
    RESTART = "restart"  # another publisher epoch
    UNSEQUENCED = "unsequenced"


@dataclass(frozen=True, slots=True)
class Check:
    verdict: Verdict
    missed: int = 0  # GAP: how many numbers were skipped

    @property
    def deliver(self) -> bool:
        return self.verdict is not Verdict.DUPLICATE


_FIRST = Check(Verdict.FIRST)
_NEXT = Check(Verdict.NEXT)
_DUPLICATE = Check(Verdict.DUPLICATE)
_RESTART = Check(Verdict.RESTART)
_UNSEQUENCED = Check(Verdict.UNSEQUENCED)


class SequenceTracker:
    """The last (epoch, sequence) seen per topic key."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: dict[Hashable, tuple[int, int]] = {}

    def check(self, key: Hashable, epoch: int, sequence: int) -> Check:
        if sequence == 0:
            return _UNSEQUENCED
        last = self._last.get(key)
        if last is None:
            self._last[key] = (epoch, sequence)
            return _FIRST
        last_epoch, last_sequence = last
        if epoch != last_epoch:
            self._last[key] = (epoch, sequence)
            return _RESTART
        if sequence <= last_sequence:
            return _DUPLICATE
        self._last[key] = (epoch, sequence)
        if sequence == last_sequence + 1:
            return _NEXT
        return Check(Verdict.GAP, sequence - last_sequence - 1)

    def forget(self, key: Hashable) -> None:
        self._last.pop(key, None)


SequenceKind = Literal["gap", "restart", "recovered", "recovery_failed"]


@dataclass(frozen=True, slots=True)
class SequenceEvent:
    """What a live stream reports about a topic's sequence (`on_sequence`, or the log).

    gap: `missed` messages were lost (ticks stay lost live: they are in the
    ``ticks`` table); restart: the publisher restarted; recovered: the closed
    candles of the gap were read from Iceberg and delivered (`candles` of them);
    recovery_failed: that read failed (`reason`).
    """

    topic: str
    kind: SequenceKind
    missed: int = 0
    candles: int = 0
    reason: str = ""

    def describe(self) -> str:
        if self.kind == "gap":
            return f"{self.topic}: {self.missed} message(s) lost (sequence gap)"
        if self.kind == "restart":
            return f"{self.topic}: the publisher restarted (new epoch)"
        if self.kind == "recovered":
            return f"{self.topic}: recovered, {self.candles} closed candle(s) read from Iceberg"
        return f"{self.topic}: recovery failed: {self.reason}"


def backfill_start(closed_upto_ms: int | None, first_open_ms: int, period_seconds: int) -> int:
    """The first open time whose closed candle a gap may have swallowed.

    After the newest closed candle delivered before the gap, or from the first
    candle the stream saw when none closed yet; the read runs to now. A window's
    closed candle is stored before it is published, so the table holds each lost one.
    """
    return first_open_ms if closed_upto_ms is None else closed_upto_ms + period_seconds * 1000
