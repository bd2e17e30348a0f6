"""The HistoryReadyNotifications this gateway received, kept for `GET /status`.

`market.requests` records every field of a notification but `sequence` and
`publisher_epoch`: the pipeline commits the row *before* it publishes (so a crash
between the two re-publishes rather than loses), and the numbers are given at
send time by the PUB server process, per topic, on topics (`RESPONSE:{client_id}`)
that trigger events numbered in that process share (docs/protocol.md "Gateway").
So the gateway remembers the stamps of the notifications it received itself (its
`POST /history` waits, its WebSocket subscriptions to notification topics) and
`/status` answers those requests with the notification as published.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from mdproto.messages import HistoryReadyNotification

#: Requests remembered (the newest): one notification each.
CAPACITY = 10_000


class ReceivedStamps:
    """request_id -> its latest publication received, stamps and all.

    Thread-safe: the SDK's subscriber thread and the history workers add, status
    workers read. A re-publication (after a pipeline restart) replaces the one kept:
    it is the latest publication, with a new epoch.
    """

    def __init__(self, capacity: int = CAPACITY) -> None:
        self._capacity = capacity
        self._notes: OrderedDict[str, HistoryReadyNotification] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, note: HistoryReadyNotification) -> None:
        """Remember a received notification (unstamped: recovered from the table, skipped)."""
        if not note.publisher_epoch:
            return
        with self._lock:
            self._notes[note.request_id] = note
            self._notes.move_to_end(note.request_id)
            while len(self._notes) > self._capacity:
                self._notes.popitem(last=False)

    def received(self, request_id: str) -> HistoryReadyNotification | None:
        """The notification received for `request_id`, if any: an answer from storage is
        notified before the history query records its row, so the table can still say
        PENDING for a request this gateway saw answered."""
        with self._lock:
            return self._notes.get(request_id)

    def stamped(self, note: HistoryReadyNotification) -> HistoryReadyNotification:
        """`note` (read from the table) with the stamps it was received with, if it was."""
        received = self.received(note.request_id)
        if received is None or note.publisher_epoch:
            return note
        out = HistoryReadyNotification()
        out.CopyFrom(note)
        out.sequence, out.publisher_epoch = received.sequence, received.publisher_epoch
        return out

    def __len__(self) -> int:
        return len(self._notes)
