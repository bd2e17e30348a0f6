"""The platform side, all through the SDK (`mdclient`): live topics, history, status.

The only module that touches `mdclient.Client`. Its calls block (they wait for the
relay or Iceberg), so the web layer runs them in executor threads; messages arrive
on the SDK's subscriber thread and are encoded to JSON there, once per message.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from google.protobuf.message import Message

from gateway.messages import (
    GatewayError,
    HistoryParams,
    Topic,
    control_frame,
    int64,
    message_frame,
)
from gateway.messages import to_dict as message_dict
from gateway.notices import ReceivedStamps
from mdclient import Client, HistoryResult, MdClientError, SequenceEvent
from mdclient.live import feed_error
from mdclient.request_status import RequestStatus
from mdproto.error_codes import FEED_UNAVAILABLE, UNAVAILABLE
from mdproto.messages import FeedStatus, HistoryReadyNotification

log = logging.getLogger(__name__)


class SdkUpstream:
    """Opens one SDK subscription per topic for the hub; history and status calls.

    Every HistoryReadyNotification it receives leaves its stamps in `received`, which
    `status` adds to what the requests table holds (gateway.notices).
    """

    def __init__(self, client: Client) -> None:
        self.client = client
        self.received = ReceivedStamps()

    def open(
        self, topic: Topic, deliver: Callable[[str], None], fail: Callable[[str, str], None]
    ) -> Any:
        try:
            if topic.live:
                return self._live(topic, deliver, fail)
            return self.client.watch(
                topic.name, lambda name, message: self._watched(name, message, deliver)
            )
        except MdClientError as exc:
            raise GatewayError(exc.error_code or UNAVAILABLE, exc.reason) from None

    def _watched(self, name: str, message: Message, deliver: Callable[[str], None]) -> None:
        if isinstance(message, HistoryReadyNotification):
            self.received.add(message)
        deliver(message_frame(name, message))

    def _live(
        self, topic: Topic, deliver: Callable[[str], None], fail: Callable[[str, str], None]
    ) -> Any:
        """An SDK live stream: duplicates dropped, lost candles recovered from Iceberg,
        the feed's state told (`feed_status`), FAILED/REFUSED end the subscription."""
        name = topic.name

        def on_message(message: Message) -> None:
            deliver(message_frame(name, message))

        def on_status(status: FeedStatus) -> None:
            deliver(control_frame("feed_status", name, data=message_dict(status)))
            error = feed_error(status)
            if error is not None:
                fail(error.error_code or FEED_UNAVAILABLE, error.reason)

        def on_sequence(event: SequenceEvent) -> None:
            deliver(
                control_frame(
                    "sequence",
                    name,
                    kind=event.kind,
                    missed=int64(event.missed),  # a difference of uint64 sequences
                    candles=event.candles,
                    reason=event.reason,
                )
            )

        return self.client.on_live(
            topic.ticker,
            on_message,
            ticks=topic.kind == "tick",
            ohlc=[topic.period_seconds] if topic.kind == "ohlc" else [],
            on_status=on_status,
            on_sequence=on_sequence,
        )

    def history(self, params: HistoryParams, timeout_s: float) -> HistoryResult:
        """Submit, wait for the notification, read the rows from Iceberg (SDK errors raise)."""
        try:
            result = self.client.history(
                params.ticker,
                params.period,
                params.start,
                params.end,
                timeout_s=timeout_s,
                refetch=params.refetch,
            )
        except MdClientError as exc:  # an ERROR notification is a received one too
            note = getattr(exc, "notification", None)
            if isinstance(note, HistoryReadyNotification):
                self.received.add(note)
            raise
        if result.notification is not None:
            self.received.add(result.notification)
        return result

    def status(self, request_id: str) -> RequestStatus:
        """The requests table's answer, with the stamps the notification was received
        with when this gateway received it (else they stay 0: not recorded)."""
        answer = self.client.status(request_id)
        if answer.notification is None:
            return answer
        return dataclasses.replace(answer, notification=self.received.stamped(answer.notification))
