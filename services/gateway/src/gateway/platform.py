"""The platform side, all through the SDK (`mdclient`): live topics, history, status,
what the platform records, stored trades.

The only module that touches `mdclient.Client`. Its calls block (they wait for the
relay or Iceberg), so the web layer runs them in executor threads; messages arrive
on the SDK's subscriber thread and are encoded to JSON there, once per message.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from google.protobuf.message import Message

from gateway.messages import (
    GatewayError,
    HistoryParams,
    Topic,
    book_event_frame,
    book_frame,
    control_frame,
    int64,
    message_frame,
)
from gateway.messages import to_dict as message_dict
from gateway.notices import ReceivedStamps
from mdclient import Client, HistoryResult, MdClientError, SequenceEvent
from mdclient.book import BookEvent, BookMessage, BookStream
from mdclient.live import feed_error
from mdclient.request_status import RequestStatus, status_from_notification
from mdproto.error_codes import FEED_UNAVAILABLE, UNAVAILABLE
from mdproto.markets import Precision
from mdproto.messages import BookReset, BookSnapshot, FeedStatus, HistoryReadyNotification

if TYPE_CHECKING:
    import pyarrow as pa

    from gateway.book_answers import BookAtParams, SamplesParams
    from gateway.replay_socket import ReplayParams
    from gateway.trade_answers import TradesParams
    from mdclient.book_history import StoredBook
    from mdclient.recording import RecordingStatus
    from mdclient.replay import FollowLive, Replay
    from mdclient.trades import TradeBatches

log = logging.getLogger(__name__)


class SdkUpstream:
    """Opens one SDK subscription per topic for the hub; history and status calls.

    Every HistoryReadyNotification it receives leaves its stamps in `received`, which
    `status` adds to what the requests table holds (gateway.notices).
    """

    def __init__(self, client: Client, book_levels: int = 20) -> None:
        self.client = client
        self.book_levels = book_levels
        self.received = ReceivedStamps()
        self._precisions: dict[str, Precision] = {}  # ticker -> its known steps

    def open(
        self, topic: Topic, deliver: Callable[[str], None], fail: Callable[[str, str], None]
    ) -> Any:
        try:
            if topic.live:
                return self._live(topic, deliver, fail)
            if topic.kind == "book":
                return self._book(topic, deliver, fail)
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
            on_status=self._status_sink(name, deliver, fail),
            on_sequence=on_sequence,
        )

    def _book(
        self, topic: Topic, deliver: Callable[[str], None], fail: Callable[[str, str], None]
    ) -> BookStream:
        """The SDK's book (sequence checks, resync by snapshot) as ladders (`BookLadder`)
        with the market's tick and lot size, so a page prints prices at one width."""
        ladder = BookLadder(topic.name, deliver, self.book_levels, self.precision(topic.ticker))
        stream = self.client.book(
            topic.ticker,
            callback=ladder.on_book,
            on_event=ladder.on_event,
            on_status=self._status_sink(topic.name, deliver, fail),
        )
        ladder.attach(stream)
        return stream

    @staticmethod
    def _status_sink(
        name: str, deliver: Callable[[str], None], fail: Callable[[str, str], None]
    ) -> Callable[[FeedStatus], None]:
        """The feed's state told (`feed_status`); FAILED/REFUSED end the subscription."""

        def on_status(status: FeedStatus) -> None:
            deliver(control_frame("feed_status", name, data=message_dict(status)))
            error = feed_error(status)
            if error is not None:
                fail(error.error_code or FEED_UNAVAILABLE, error.reason)

        return on_status

    def precision(self, ticker: str) -> Precision:
        """The ticker's tick and lot size (Iceberg `market.markets`), read once: a
        market's steps hardly ever change, and a book subscription should not wait on
        Iceberg each time. An unknown one is asked again next time."""
        known = self._precisions.get(ticker)
        if known is None:
            known = self.client.precision(ticker)
            if known != Precision():
                self._precisions[ticker] = known
        return known

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

    def trade_batches(self, params: TradesParams) -> TradeBatches:
        """Stored trades from Iceberg, batch by batch, with their integrity report (the
        SDK's `trade_batches`; NotRecorded raised before any row; no relay)."""
        return self.client.trade_batches(params.ticker, params.start, params.end)

    def replay(self, params: ReplayParams) -> Replay:
        """A stored range's replay (the SDK's `replay`, checked there; no relay), without
        its marker: the gateway sends `replay_complete` itself."""
        return self.client.replay(
            list(params.tickers),
            params.start,
            params.end,
            channels=params.channels,
            speed=params.speed,
            cursor=params.cursor,
            marker=False,
        )

    def replay_into_live(self, params: ReplayParams) -> FollowLive:
        """The stored range up to now, then the live trades and candles (the SDK's
        `replay_into_live`: subscribed through this gateway's client before the store is
        read; its `book` refusal, `bad_channel`)."""
        return self.client.replay_into_live(
            list(params.tickers), params.start, channels=params.channels, speed=params.speed
        )

    def book_at(self, params: BookAtParams) -> tuple[StoredBook, int]:
        """The exact stored book at a time and that time in epoch ms (the SDK's `book_at`;
        no relay)."""
        from mdclient.book_history import book_time

        at_ms = book_time(params.ticker, params.at, now_ms=int(time.time() * 1000))
        return self.client.book_at(params.ticker, at_ms), at_ms

    def book_samples(self, params: SamplesParams) -> pa.Table:
        """The stored book sampled over a range (the SDK's `book_samples`; no relay)."""
        return self.client.book_samples(
            params.ticker, params.start, params.end, every_ms=params.every_ms, depth=params.depth
        )

    def recording(self, exchange: str | None) -> RecordingStatus:
        """What the platform records, from Iceberg (the SDK's `recording`; no relay)."""
        return self.client.recording(exchange)

    def status(self, request_id: str) -> RequestStatus:
        """The requests table's outcome, with the stamps the notification was received
        with when this gateway received it (else they stay 0: not recorded); else the
        notification this gateway received (its row a micro-batch away); else the relays'
        PENDING or UNKNOWN (docs/protocol.md "Request status")."""
        recorded = self.client.recorded_status(request_id)
        if recorded is not None and recorded.notification is not None:
            stamped = self.received.stamped(recorded.notification)
            return dataclasses.replace(recorded, notification=stamped)
        note = self.received.received(request_id)
        if note is not None:
            return status_from_notification(note)
        return self.client.relay_status(request_id)


class BookLadder:
    """One book topic's frames: a ladder of the SDK book's best `levels` per side after
    each message the book applied, and its events (no book of its own: the SDK's).

    The SDK reports a feed reset before it hands over the snapshot; the reset is told
    from that snapshot instead (its BookReset, for the page's words). A gap is followed
    by the stale ladder (`in_sync` false), so a ladder is always the topic's last
    frame: what a late joiner gets (gateway.hub). Messages may arrive before
    `client.book` returns the stream: the first ladder then waits for `attach`. The
    lock keeps ladders in the order of the book states they show.
    """

    def __init__(
        self,
        topic: str,
        deliver: Callable[[str], None],
        levels: int,
        precision: Precision | None = None,
    ) -> None:
        self._topic = topic
        self._deliver = deliver
        self._levels = levels
        self._precision = precision or Precision()
        self._lock = threading.Lock()
        self._stream: BookStream | None = None
        self._exchange_ids = (0, 0)  # (exchange_sequence, exchange_time_ms) last applied

    def attach(self, stream: BookStream) -> None:
        with self._lock:
            self._stream = stream
            if stream.received:  # applied before we could read it
                self._send_ladder()

    def on_book(self, message: BookMessage) -> None:
        with self._lock:
            if isinstance(message, BookSnapshot) and message.reset != BookReset.BOOK_RESET_NONE:
                reset = BookReset.Name(message.reset)
                self._deliver(
                    book_event_frame(self._topic, "reset", reset=reset, reason=message.reason)
                )
            sequence, time_ms = self._exchange_ids
            self._exchange_ids = (
                message.exchange_sequence or sequence,
                message.exchange_time_ms or time_ms,
            )
            self._send_ladder()

    def on_event(self, event: BookEvent) -> None:
        if event.kind == "reset":
            log.info("%s", event.describe())  # told from its snapshot (on_book)
            return
        frame = book_event_frame(
            self._topic,
            event.kind,
            reason=event.reason,
            missed=event.missed,
            waited_ms=event.waited_ms,
        )
        with self._lock:
            self._deliver(frame)
            if event.kind == "gap":
                self._send_ladder()

    def _send_ladder(self) -> None:
        if self._stream is None:
            return
        bids, asks = self._stream.depth(self._levels)
        sequence, time_ms = self._exchange_ids
        self._deliver(
            book_frame(
                self._topic,
                bids,
                asks,
                in_sync=self._stream.in_sync,
                exchange_sequence=sequence,
                exchange_time_ms=time_ms,
                precision=self._precision,
            )
        )
