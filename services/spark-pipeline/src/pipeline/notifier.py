"""The one publisher of HistoryReadyNotification, and who notifies each request once.

Two places learn that a request is answered:

- the history query (`history`), once it has recorded the request's ``requests``
  row: every request goes through it, and it is the table's only writer;
- the stored-answers thread (`stored_answers`), the moment the final marker of a
  request answered wholly from storage reaches Kafka, a micro-batch earlier.

Neither publishes: both hand the request to `HistoryNotifier`, which publishes it
and keeps the claims that let exactly one of them have it:

1. The early path may have a request only while it is surely new: the query's id
   set (`known_requests`) is read in full and lacks it, and nobody claimed it
   (`notify_early`).
2. The query `take`s its micro-batch's ids: it waits for early notices under way
   (at most `TAKE_TIMEOUT_S`, then fails the batch), gets what was published early
   and claims the rest.
3. It records both kinds; what was published early gets `EARLY_BATCH` as its batch
   id, so a replay of that micro-batch never publishes it again
   (`history_notices.plan` decides what a replay publishes again).
4. It publishes its own (`notify_recorded`), then `finish`es: the claims go once
   recorded; after a failed batch, what was published early waits for the replay.
5. Every publish is remembered (`sent`, the last `SENT_MEMORY` ids): a micro-batch
   that fails after its publish (Spark's checkpoint commit on a store that is down,
   an error in a later step) is replayed, finds its request recorded and sent by
   this process, and stays silent (`history_notices.plan`).

A crash between an early publish and the query's record loses the claims: the
replayed marker is notified again, as after a crash between the query's own
record and publish (the memory of step 5 dies with the process too). A request is
never left unnotified; a duplicate carries the same request id. The decision and
its figures: docs/adr/0010-history-notification-publishers.md.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Final

from pipeline.history_notices import CompletedRequest
from pipeline.known_requests import KnownRequests

if TYPE_CHECKING:
    from pipeline.pub_server import Publisher

#: The ``batch_id`` of a ``requests`` row that was published ahead of the history query.
EARLY_BATCH: Final = -1
#: How long the query waits for an early notice under way before it fails its batch.
TAKE_TIMEOUT_S: Final = 30.0
#: Published request ids remembered for replays: a failed batch is replayed as soon as its
#: query restarts, long before this many other requests are published.
SENT_MEMORY: Final = 10_000


class EarlyNoticeStuckError(RuntimeError):
    """An early notice stayed under way past `TAKE_TIMEOUT_S`: the query's batch fails."""


class _Claim:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


_EARLY_UNDER_WAY = _Claim("early notice under way")
_QUERY = _Claim("the history query's")


class HistoryNotifier:
    """Publishes every HistoryReadyNotification; holds the claims on request ids."""

    def __init__(self, publisher: Publisher) -> None:
        self._publisher = publisher
        self._changed = threading.Condition()
        self._known: KnownRequests | None = None
        #: request id -> a claim, or the request published early and not yet recorded
        self._claims: dict[str, _Claim | CompletedRequest] = {}
        #: request ids published by this process, oldest first (step 5)
        self._sent: OrderedDict[str, None] = OrderedDict()

    def follow(self, known: KnownRequests) -> None:
        """The ids in ``requests`` as the current history sink knows them (a restarted
        query brings a fresh, not yet loaded set)."""
        with self._changed:
            self._known = known

    def _publish(self, requests: Sequence[CompletedRequest]) -> None:
        """One at a time, each remembered once it went out: if a send fails midway, the
        replay sends only the rest."""
        for request in requests:
            self._publisher.publish_many([(request.notification_topic, request.notification())])
            with self._changed:
                self._sent[request.request_id] = None
                while len(self._sent) > SENT_MEMORY:
                    self._sent.popitem(last=False)

    def sent(self, request_ids: Collection[str]) -> frozenset[str]:
        """Which of ``request_ids`` this process has published (step 5): a replayed
        batch must not publish them again."""
        with self._changed:
            return frozenset(i for i in request_ids if i in self._sent)

    # -- the stored-answers thread ----------------------------------------------------

    def wait_vouching(self, timeout_s: float) -> bool:
        """True once the current sink's ids are read: only then can an early notice go."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._changed:
                known = self._known
            if known is not None and known.complete:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)  # the sink's one read of `requests`, in its own thread

    def notify_early(
        self, request_id: str, answer: Callable[[], CompletedRequest]
    ) -> CompletedRequest | None:
        """Publish ``answer()`` now if the request is surely new and unclaimed (step 1);
        None if it is not the early path's. If ``answer`` raises, the request is left
        to the query and the error goes to the caller."""
        with self._changed:
            known = self._known
            if known is None or known.to_look_up([request_id]) or request_id in self._claims:
                return None
            self._claims[request_id] = _EARLY_UNDER_WAY
        try:
            request = answer()
            self._publish([request])
        except BaseException:
            with self._changed:
                self._claims.pop(request_id, None)
                self._changed.notify_all()
            raise
        with self._changed:
            self._claims[request_id] = request
            self._changed.notify_all()
        return request

    # -- the history query ------------------------------------------------------------

    def take(
        self, request_ids: Sequence[str], timeout_s: float = TAKE_TIMEOUT_S
    ) -> dict[str, CompletedRequest]:
        """What was published early among ``request_ids`` (step 2); the others are the
        query's from now on (the early path leaves them alone until `finish`)."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while under_way := [i for i in request_ids if self._claims.get(i) is _EARLY_UNDER_WAY]:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise EarlyNoticeStuckError(
                        f"early notices still under way after {timeout_s:g} s: {under_way}"
                    )
                self._changed.wait(left)
            early: dict[str, CompletedRequest] = {}
            for request_id in request_ids:
                claim = self._claims.get(request_id)
                if isinstance(claim, CompletedRequest):
                    early[request_id] = claim
                else:
                    self._claims[request_id] = _QUERY
            return early

    def notify_recorded(self, requests: Sequence[CompletedRequest]) -> None:
        """Publish what the query has just recorded (step 4)."""
        self._publish(requests)

    def finish(self, request_ids: Sequence[str], *, recorded: bool) -> None:
        """The query's batch is over. Recorded: every claim goes (the ids are in the
        sink's set now). Not recorded (the batch failed): the query's claims go, and
        what was published early waits for the batch's replay to record it."""
        with self._changed:
            for request_id in request_ids:
                if recorded or self._claims.get(request_id) is _QUERY:
                    self._claims.pop(request_id, None)

    @property
    def claims(self) -> int:
        """Ids claimed now (by either side): none once every batch has recorded its own."""
        with self._changed:
            return len(self._claims)
