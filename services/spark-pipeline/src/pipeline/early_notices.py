"""Who notifies a request: the history query, or the stored-answers path ahead of it.

A request answered wholly from storage can be notified the moment its final
marker reaches Kafka (`stored_answers`); the history query reads the same marker
a micro-batch later. This registry lets exactly one of them publish, and hands
what was published early to the query, which stays the only writer of
``requests`` and records it (with `EARLY_BATCH` as its batch id, so a replay of
that micro-batch does not publish it again).

A crash between the early publish and the query's record loses the registry: the
replayed marker is then notified again, as after a crash between the query's own
record and publish (`history_notices.plan`). Nothing is ever left unnotified.
The whole design, and what it costs: docs/adr/0010-history-notification-publishers.md.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Final

from pipeline.history_notices import CompletedRequest
from pipeline.known_requests import KnownRequests

#: The ``batch_id`` of a ``requests`` row that was published ahead of the history query.
EARLY_BATCH: Final = -1
#: How long the query waits for an early notice under way before it fails its batch.
TAKE_TIMEOUT_S: Final = 30.0


class _Claim:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


_EARLY_UNDER_WAY = _Claim("early notice under way")
_QUERY = _Claim("the history query's")


class EarlyNotices:
    """Claims on request ids: the early path's, and the history query's."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._known: KnownRequests | None = None
        #: request id -> a claim, or the request published early and not yet recorded
        self._claims: dict[str, _Claim | CompletedRequest] = {}

    def follow(self, known: KnownRequests) -> None:
        """The ids in ``requests`` as the current history sink knows them (a restarted
        query brings a fresh, not yet loaded set)."""
        with self._changed:
            self._known = known

    # -- the early path ---------------------------------------------------------------

    def wait_vouching(self, timeout_s: float) -> bool:
        """True once the current sink's ids are read: only then can `claim` say yes."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._changed:
                known = self._known
            if known is not None and known.complete:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)  # the sink's one read of `requests`, in its own thread

    def claim(self, request_id: str) -> bool:
        """True if the early path is to notify this request now.

        Only a request surely not in ``requests`` (the sink's set is complete and
        lacks it) and not claimed by the query or another marker is.
        """
        with self._changed:
            known = self._known
            if known is None or known.to_look_up([request_id]) or request_id in self._claims:
                return False
            self._claims[request_id] = _EARLY_UNDER_WAY
            return True

    def published(self, request: CompletedRequest) -> None:
        """The early path published ``request``: the query records it."""
        with self._changed:
            self._claims[request.request_id] = request
            self._changed.notify_all()

    def failed(self, request_id: str) -> None:
        """The early path gave up before publishing: the query notifies it as usual."""
        with self._changed:
            self._claims.pop(request_id, None)
            self._changed.notify_all()

    # -- the history query ------------------------------------------------------------

    def take(
        self, request_ids: Sequence[str], timeout_s: float = TAKE_TIMEOUT_S
    ) -> dict[str, CompletedRequest]:
        """What was published early among ``request_ids``; the others are the query's
        from now on (the early path leaves them alone until `finish`)."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while under_way := [i for i in request_ids if self._claims.get(i) is _EARLY_UNDER_WAY]:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(
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
