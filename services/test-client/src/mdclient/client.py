"""`Client`: the SDK facade wiring transport, dispatcher, flows and the Iceberg reader.

Example::

    with Client("relay-host") as client:
        result = client.history("BINANCE:BTC/USDT", "1m", "-24h", "now")
        df = result.to_pandas()
        for message in client.live("BINANCE:BTC/USDT", ohlc=["1m"]):
            ...
        with client.book("BINANCE:BTC/USDT") as book:
            for _ in book:
                print(book.best_bid(), book.best_ask())
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, TypedDict, TypeVar, Unpack

from google.protobuf.message import Message

from mdclient import timeparse
from mdclient.book import BookCallback, BookEventCallback, BookStream
from mdclient.config import ClientSettings, NotifyName, load_settings
from mdclient.dispatch import Dispatcher
from mdclient.errors import (
    ConfigError,
    InvalidRequest,
    RelayUnavailable,
    RequestTimeout,
    StorageError,
    SubmitRejected,
)
from mdclient.history import (
    PATTERNS,
    HistoryOutcome,
    HistoryQuery,
    HistoryResult,
    ProgressCallback,
    ProgressEvent,
    RetryPolicy,
    bars_name,
    decode_reply,
    wait_for_history,
)
from mdclient.legacy import fetch_sync
from mdclient.live import LiveCallback, LiveStream, SequenceCallback, StatusCallback, live_topics
from mdclient.request_status import RequestStatus, status_from_relays, status_from_row
from mdclient.streams import Closeable
from mdclient.transport import CurveKeys, Transport
from mdclient.triggers import (
    TriggerEvents,
    build_register,
    check_ack,
    event_topic,
    parse_condition,
)
from mdproto import envelope, rules, topics
from mdproto.error_codes import BAD_CHANNEL, BAD_TIME, RELAY_UNAVAILABLE, SNAPSHOT_GONE
from mdproto.markets import Precision
from mdproto.messages import (
    OHLC,
    CEPCondition,
    CEPTriggerAck,
    CEPTriggerRequest,
    HistoryReadyNotification,
    NotifyPattern,
    RequestStatusQuery,
    RequestStatusReply,
    Status,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from mdclient.book_history import StoredBook
    from mdclient.frames import IcebergReader
    from mdclient.recording import RecordingStatus
    from mdclient.replay import FollowLive, Position, Replay
    from mdclient.trades import TradeBatches, TradesResult

log = logging.getLogger(__name__)

TimeLike = int | datetime | str
Stream = TypeVar("Stream", LiveStream, BookStream)
PeriodLike = int | str


class TriggerOptions(TypedDict, total=False):
    """The optional arguments of `Client.register_trigger` and `Client.add_trigger`."""

    trigger_id: str | None  # default: a new random id
    period: PeriodLike  # candle period the conditions are evaluated on; 0: ticks
    within: PeriodLike  # a two-condition sequence: the second at most this after the first
    repeating: bool  # fire again after each match (default: once, then final)
    expires: TimeLike | None  # when the trigger ends on its own (default: never)
    per_trigger: bool | None  # events on CEP:{trigger_id}; default from settings.notify
    check: bool  # False: skip the client-side checks (the relay still validates)


def new_request_id() -> str:
    """32 hex chars: equal length means no id is a prefix of another (topic prefixes)."""
    return uuid.uuid4().hex


def new_client_id() -> str:
    return f"mdc-{uuid.uuid4().hex[:16]}"


def exchange_name(text: str) -> str:
    """`binance` or `BINANCE:` -> `BINANCE`; InvalidRequest if it cannot name an exchange."""
    name = text.strip().upper().rstrip(":")
    if not topics.is_valid_exchange(name):
        raise InvalidRequest(f"{text!r} is not an exchange name such as BINANCE")
    return name


class _Watch(Closeable):
    """Handle of `Client.watch`; closing it twice is harmless."""

    def __init__(
        self, client: Client, topic: str, callback: Callable[[str, Message], None]
    ) -> None:
        self.topic = topic
        self._client: Client | None = client
        self._callback = callback

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client._unwatch(self.topic, self._callback)


class Client(Closeable):
    """History (async, both notification patterns), live and legacy calls over one relay.

    Connecting waits until the market-data SUB has completed its handshake
    with the relay (RelayUnavailable otherwise) and, for the per-client
    pattern, subscribes `RESPONSE:{client_id}` once for the client's lifetime.
    Methods may be called from several threads.
    """

    def __init__(
        self,
        relay_host: str | None = None,
        *,
        request_endpoint: str | None = None,
        market_data_endpoint: str | None = None,
        client_id: str | None = None,
        notify: NotifyName | None = None,
        settings: ClientSettings | None = None,
        reader: IcebergReader | None = None,
    ) -> None:
        base = settings if settings is not None else load_settings()
        updates = {
            key: value
            for key, value in {
                "relay_host": relay_host,
                "request_endpoint": request_endpoint,
                "market_data_endpoint": market_data_endpoint,
                "client_id": client_id,
                "notify": notify,
            }.items()
            if value is not None
        }
        self.settings = base.model_copy(update=updates)
        self.client_id = self.settings.client_id or new_client_id()
        if not topics.is_valid_id(self.client_id):
            raise ConfigError(
                f"client_id {self.client_id!r} must be 1-128 characters of [A-Za-z0-9_.-]"
            )
        if self.settings.notify not in PATTERNS:
            raise ConfigError(f"notify must be one of {sorted(PATTERNS)}")
        self._reader = reader
        self._reader_lock = threading.Lock()
        self._streams: set[LiveStream | BookStream] = set()
        self._event_streams: set[TriggerEvents] = set()
        self._streams_lock = threading.Lock()
        self._dispatcher = Dispatcher()
        self._transport = Transport(
            self.settings.request_addresses,
            self.settings.market_data_addresses,
            self._dispatcher.handle,
            settle_s=self.settings.subscribe_settle_ms / 1000,
            failover_s=self.settings.failover_timeout_s,
            curve=CurveKeys.load(
                self.settings.curve_secret_key_file, self.settings.curve_server_key_file
            ),
        )
        self._closed = False
        try:
            self._connect()
        except BaseException:
            self._transport.close()
            raise

    # --- lifecycle ---

    def _connect(self) -> None:
        timeout = self.settings.connect_timeout_s
        if not self._transport.subscriber.wait_connected(timeout):
            raise RelayUnavailable(
                f"relay market-data socket {self.settings.market_data_address} not reachable "
                f"within {timeout:g}s{self._transport.subscriber.hint()}",
                error_code=RELAY_UNAVAILABLE,
            )
        if self.settings.notify == "per_client":
            # Pattern 1: one subscription for the client's lifetime.
            self.subscribe(topics.response_topic(self.client_id))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._streams_lock:
            streams: list[LiveStream | BookStream | TriggerEvents] = [
                *self._streams,
                *self._event_streams,
            ]
        for stream in streams:
            stream.close()
        self._transport.close()

    @property
    def relays_connected(self) -> int:
        """Relays whose market-data socket this client holds a connection to right now."""
        return self._transport.subscriber.links

    @property
    def request_failovers(self) -> int:
        """Requests resent to another relay because one was silent (several relays)."""
        return self._transport.requests.failovers

    @property
    def dispatch_stats(self) -> dict[str, int]:
        """Counters of what the SUB socket received (received, unclaimed_notification, ...)."""
        return dict(self._dispatcher.stats)

    # --- HistoryPorts (used by the flows) ---

    def request(self, frames: Sequence[bytes], timeout_s: float) -> list[bytes]:
        return self._transport.requests.request(frames, timeout_s)

    def subscribe(self, topic: str) -> None:
        """Reference-counted subscribe that returns once the subscription is live."""
        self._transport.subscriber.subscribe(topic, self.settings.connect_timeout_s)

    def unsubscribe(self, topic: str) -> None:
        """Best effort: runs in cleanup paths, where raising would hide the real error."""
        try:
            self._transport.subscriber.unsubscribe(topic)
        except RelayUnavailable as exc:
            log.debug("unsubscribe %s skipped: %s", topic, exc)

    # --- history ---

    def query(
        self, ticker: str, period: PeriodLike, start: TimeLike, end: TimeLike = "now"
    ) -> HistoryQuery:
        """Validate and normalise arguments (human times, `1m` periods; `100ticks`, `2.5vol`
        for tick or volume bars from recorded trades) into a query."""
        now_ms = int(time.time() * 1000)
        bars = bars_name(period)
        try:
            return HistoryQuery(
                ticker=ticker,
                period_seconds=0 if bars else timeparse.parse_period(period),
                start_ms=timeparse.to_ms(start, now_ms=now_ms),
                end_ms=timeparse.to_ms(end, now_ms=now_ms),
                bars=bars,
            )
        except timeparse.TimeFormatError as exc:
            raise InvalidRequest(str(exc), error_code=BAD_TIME) from None

    def wait_history(
        self,
        query: HistoryQuery,
        *,
        notify: NotifyName | None = None,
        timeout_s: float | None = None,
        attempts: int | None = None,
        progress: ProgressCallback | None = None,
        refetch: bool = False,
    ) -> HistoryOutcome:
        """Subscribe, submit, wait (with retries): the notification, without reading rows.

        `refetch` asks the platform to fetch the whole range from the exchange even
        where it is stored (by default only what is not stored is fetched).
        """
        pattern_name = notify or self.settings.notify
        if pattern_name not in PATTERNS:
            raise InvalidRequest(f"notify must be one of {sorted(PATTERNS)}")
        policy = RetryPolicy(
            attempts=attempts or self.settings.attempts,
            submit_timeout_s=self.settings.submit_timeout_s,
            history_timeout_s=timeout_s or self.settings.history_timeout_s,
            progress_interval_s=self.settings.progress_interval_s,
        )
        return wait_for_history(
            self,
            self._dispatcher,
            query,
            client_id=self.client_id,
            pattern=PATTERNS[pattern_name],
            policy=policy,
            new_request_id=new_request_id,
            progress=progress,
            recover=self._recorded_outcome if self.settings.recover_from_table else None,
            refetch=refetch,
        )

    def status(self, request_id: str) -> RequestStatus:
        """A history request's state (docs/protocol.md "Request status"): its outcome from
        the requests table (OK, NOT_FOUND, ERROR); without one, PENDING if a relay
        accepted it, UNKNOWN if no relay this client lists remembers accepting it.

        An outcome needs only the Iceberg catalog: a client that lost its notification,
        or its process, recovers with the request_id alone. Telling PENDING from UNKNOWN
        asks every relay; one that does not answer, when no other says PENDING, raises
        its RequestTimeout (it may be the one that accepted the request).
        """
        try:
            rules.check_id("request_id", request_id)
        except rules.RuleViolation as bad:
            raise InvalidRequest(bad.reason, error_code=bad.error_code) from None
        recorded = self.recorded_status(request_id)
        if recorded is not None:
            return recorded
        return self.relay_status(request_id)

    def recorded_status(self, request_id: str) -> RequestStatus | None:
        """The outcome in the requests table, or None: Iceberg only, no relay."""
        row = self.reader().read_request(self.settings.requests_table, request_id)
        return status_from_row(request_id, row)

    def relay_status(self, request_id: str) -> RequestStatus:
        """PENDING or UNKNOWN from the relays alone (`status` without the table)."""
        return status_from_relays(request_id, self._ask_relays(request_id))

    def _ask_relays(self, request_id: str) -> list[RequestStatusReply]:
        frames = envelope.encode(RequestStatusQuery(request_id=request_id))
        replies: list[RequestStatusReply] = []
        silent: list[RequestTimeout] = []
        for answer in self._transport.request_each(frames, self.settings.connect_timeout_s):
            if isinstance(answer, RequestTimeout):
                silent.append(answer)
                continue
            reply = decode_reply(answer, RequestStatusReply, request_id, SubmitRejected)
            if reply.status == Status.REJECTED:
                raise SubmitRejected(
                    reply.reason or "status query refused",
                    error_code=reply.error_code,
                    request_id=request_id,
                )
            replies.append(reply)
        if silent and not any(r.status == Status.OK for r in replies):
            raise silent[0]
        return replies

    def _recorded_outcome(self, request_id: str) -> HistoryReadyNotification | None:
        try:
            recorded = self.recorded_status(request_id)
        except StorageError as exc:  # the wait already failed; do not hide that behind this
            log.warning("cannot look up request %s in the requests table: %s", request_id, exc)
            return None
        return recorded.notification if recorded is not None else None

    def history(
        self,
        ticker: str,
        period: PeriodLike,
        start: TimeLike,
        end: TimeLike = "now",
        *,
        notify: NotifyName | None = None,
        timeout_s: float | None = None,
        attempts: int | None = None,
        progress: ProgressCallback | None = None,
        pin_snapshot: bool | None = None,
        refetch: bool = False,
    ) -> HistoryResult:
        """Candles of [start, end): request, wait for the notification, read Iceberg.

        `period` "100ticks" (every 100 trades) or "2.5vol" (every 2.5 of base volume) asks
        for bars built from recorded trades: the table then has ``market.trade_bars``'s
        columns (``seq``, ``open_time``/``close_time``, OHLCV, trade ids), sorted by seq."""
        query = self.query(ticker, period, start, end)
        outcome = self.wait_history(
            query,
            notify=notify,
            timeout_s=timeout_s,
            attempts=attempts,
            progress=progress,
            refetch=refetch,
        )
        note = outcome.notification
        snapshot = note.snapshot_id or None
        if note.status == Status.NOT_FOUND:
            from mdclient.frames import empty_candles, empty_trade_bars

            table = empty_trade_bars() if query.bars else empty_candles()
            snapshot_note = ""
        else:
            if progress is not None:
                progress(
                    ProgressEvent(
                        "reading", outcome.attempts, outcome.attempts, note.request_id,
                        outcome.elapsed_s, note.iceberg_table,
                    )
                )  # fmt: skip
            pin = self.settings.pin_snapshot if pin_snapshot is None else pin_snapshot
            table, snapshot_note = self._read_candles(
                note.iceberg_table or self.settings.ohlc_table,
                query,
                snapshot if pin else None,
            )
        return HistoryResult(
            table=table,
            status=Status.Name(note.status),
            request_id=note.request_id,
            attempts=outcome.attempts,
            elapsed_s=outcome.elapsed_s,
            snapshot_id=snapshot,
            reported_rows=note.row_count,
            notification=note,
            snapshot_note=snapshot_note,
        )

    def _read_candles(
        self, table_name: str, query: HistoryQuery, snapshot_id: int | None
    ) -> tuple[pa.Table, str]:
        """The rows at the pinned snapshot; if upkeep expired it, the current ones and a
        note saying so (the result carries it, the CLI prints it: never a silent switch)."""
        reader = self.reader()
        read = (
            partial(
                reader.read_trade_bars, table_name, query.ticker, query.bars,
                query.start_ms, query.end_ms,
            )
            if query.bars
            else partial(
                reader.read_ohlc, table_name, query.ticker, query.period_seconds,
                query.start_ms, query.end_ms,
            )
        )  # fmt: skip
        try:
            return read(snapshot_id=snapshot_id), ""
        except StorageError as exc:
            if exc.error_code != SNAPSHOT_GONE:
                raise
            note = (
                f"{exc.reason}: read the current snapshot instead (the same rows unless a "
                "later request replaced some)"
            )
        log.warning("%s", note)
        return read(), note

    def reader(self) -> IcebergReader:
        """The Iceberg reader (pyiceberg is imported on first use only)."""
        with self._reader_lock:
            if self._reader is None:
                from mdclient.frames import IcebergReader

                self._reader = IcebergReader(
                    self.settings.catalog_properties(), catalog_name=self.settings.catalog_name
                )
            return self._reader

    def markets(self, exchange: str) -> pa.Table:
        """The exchange's markets from Iceberg `market.markets` (one row per ticker:
        active, precisions, limits; 0 = not given), sorted by ticker.

        Empty when the exchange has none; `StorageError` (`no_table`) while the table
        does not exist yet. Reads Iceberg only: the relay is not asked.
        """
        return self.reader().read_markets(self.settings.markets_table, exchange_name(exchange))

    def precision(self, ticker: str) -> Precision:
        """How to show `ticker`'s prices and amounts (`mdproto.markets.Precision`): at its
        tick and lot size from Iceberg `market.markets`, else each value in its shortest
        form. Never raises for want of metadata; reads Iceberg only."""
        from mdclient.book import read_precision

        return read_precision(self.reader(), self.settings, ticker)

    def recording(self, exchange: str | None = None) -> RecordingStatus:
        """What the platform records (of `exchange`, else every exchange), from Iceberg
        `market.ticks` and `market.gaps`: per ticker its oldest and newest stored trade,
        trades of the current UTC day, and gaps open, repairing, repaired and unrepairable
        (with their reasons); `RecordingStatus.table()` as Arrow.

        A ticker is listed when it has trades or gaps stored (mdclient.recording).
        `StorageError` when `market.ticks` cannot be read (`no_table` before the pipeline
        first started); a missing `market.gaps` leaves the gap counts None and says why in
        `gaps_note`. Reads Iceberg only: the relay is not asked.
        """
        from mdclient.recording import read_recording

        name = exchange_name(exchange) if exchange else None
        return read_recording(self.reader(), self.settings, name, int(time.time() * 1000))

    def trades(
        self,
        ticker: str,
        start: TimeLike,
        end: TimeLike = "now",
        *,
        columns: Sequence[str] | None = None,
    ) -> TradesResult:
        """The stored trades of `ticker` in [start, end) from Iceberg ``market.ticks``, in
        trade-time order (`.table` Arrow, `.to_pandas()`), with the range's integrity report
        (`.report`: recorded since, gaps in the range by status, not recorded before the
        recording began; mdclient.trades). `columns`: fewer of the table's columns.

        `NotRecorded` (its `report` says why) when nothing of the range is recorded: never
        an empty answer. The read is filtered to the ticker's partition and the range's
        days; a range larger than memory: `trade_batches`. Reads Iceberg only.
        """
        from mdclient.trades import read_trades, trade_range

        now_ms = int(time.time() * 1000)
        query = trade_range(ticker, start, end, now_ms=now_ms, columns=columns)
        return read_trades(self.reader(), self.settings, query)

    def trade_batches(
        self,
        ticker: str,
        start: TimeLike,
        end: TimeLike = "now",
        *,
        columns: Sequence[str] | None = None,
        batch_rows: int = 65_536,
    ) -> TradeBatches:
        """`trades` as an iterator of Arrow record batches (at most `batch_rows` rows each),
        in trade-time order, for ranges that do not fit in memory: one group of files
        whose trades overlap in time (about a day of the ticker) is read at a time. Its
        `report` and `schema` are known before the first batch; `NotRecorded` is raised
        here, before any row is read.
        """
        from mdclient.trades import open_trade_batches, trade_range

        now_ms = int(time.time() * 1000)
        query = trade_range(ticker, start, end, now_ms=now_ms, columns=columns)
        return open_trade_batches(self.reader(), self.settings, query, batch_rows)

    def replay(
        self,
        tickers: str | Sequence[str],
        start: TimeLike,
        end: TimeLike = "now",
        *,
        channels: Iterable[str] = ("trades",),
        speed: float | str = "max",
        cursor: str | None = None,
        marker: bool = True,
    ) -> Replay:
        """The stored trades (`trades`), book changes (`book`) and closed candles
        (`ohlc:60`, `ohlc:1m`) of `tickers` in [start, end), merged in event-time order and
        yielded as the live topics' messages (Tick, BookSnapshot, BookDelta, OHLC): a loop
        written against `live` and `book` runs unchanged. Each topic's messages carry
        their own `sequence` (1, 2, ...; a gap is a loss); a `ReplayComplete` ends it
        (`marker=False`: none).

        `speed`: 1, 10, ... keeps the event-time spacing divided by it; "max" goes as
        fast as the loop reads, with one piece per stream in memory. `replay.cursor`
        after any message, passed back as `cursor=` with the same tickers, range and
        channels, resumes with the rest exactly once (a book topic restarts from the
        book at the cursor, one BookSnapshot). `InvalidRequest` (bad_ticker, bad_time,
        bad_time_range, range_too_large, bad_channel, bad_speed, bad_cursor), and
        `UnknownTicker` for a ticker with nothing stored for the channels asked, before
        any message. Reads Iceberg only (mdclient.replay); `replay_into_live` goes on
        into live trades.
        """
        from mdclient.replay import replay_from, replay_query

        query = replay_query(
            tickers,
            start,
            end,
            channels=channels,
            speed=speed,
            cursor=cursor,
            now_ms=int(time.time() * 1000),
        )
        return replay_from(self.reader(), self.settings, query, marker=marker)

    def replay_batches(
        self, tickers: str | Sequence[str], start: TimeLike, end: TimeLike = "now"
    ) -> Iterator[pa.RecordBatch]:
        """The stored trades of `tickers` in [start, end) as Arrow record batches in the
        replay's order (time, the tickers' order, trade id), with a `ticker` column: the
        batch mode of `replay` for backtests that read columns (no message per trade,
        no sequences or cursor). The same checks as `replay` before the first batch
        (mdclient.replay.trade_batches_in_order)."""
        from mdclient.replay import IcebergStore, replay_query, trade_batches_in_order

        query = replay_query(tickers, start, end, now_ms=int(time.time() * 1000))
        store = IcebergStore(self.reader(), self.settings)
        return trade_batches_in_order(store, query)

    def replay_into_live(
        self,
        tickers: str | Sequence[str],
        start: TimeLike,
        *,
        channels: Iterable[str] = ("trades",),
        speed: float | str = "max",
    ) -> FollowLive:
        """The stored trades and closed candles (`channels`: `trades`, `ohlc:60`, ...) of
        `tickers` from `start` (as `replay`), then their live ones without a gap or a
        duplicate at the seam, until closed: the live topics are subscribed before the
        store is read and wait (up to `live_queue_size`); a `ReplayComplete` marks the
        seam; at each topic's first live message the store is read again until it holds
        that message (a candle is stored seconds, a trade up to a minute after it is
        published; `replay_seam_timeout_s`, then `ReplaySeamTimeout`), and a live message
        already delivered is dropped (mdclient.replay.FollowLive). `book` is refused
        (`bad_channel`): a live book starts from its own snapshot (`Client.book`)."""
        from mdclient.replay import Cursor, FollowLive, LiveBuffer, replay_from, replay_query

        now_ms = int(time.time() * 1000)
        query = replay_query(tickers, start, "now", channels=channels, speed=speed, now_ms=now_ms)
        if any(channel.kind == "book" for channel in query.channels):
            raise InvalidRequest(
                "replay_into_live goes on with trades and candles; a live book starts "
                "from its own snapshot (Client.book)",
                error_code=BAD_CHANNEL,
            )
        want_ticks = any(channel.kind == "trades" for channel in query.channels)
        periods = [c.period_seconds for c in query.channels if c.kind == "ohlc"]
        channel_of = {topic: channel.name for topic, _, channel in query.streams}
        live = LiveBuffer(self.settings.live_queue_size)
        streams: list[LiveStream] = []
        try:
            for ticker in query.tickers:
                streams.append(
                    self.live(ticker, ticks=want_ticks, ohlc=periods, callback=live.offer)
                )
            stored = replay_from(self.reader(), self.settings, query)
        except BaseException:
            for stream in streams:
                stream.close()
            raise

        def reread(topic: str, position: Position | None, end_ms: int) -> Replay:
            at = None if position is None else Cursor(query.epoch, {topic: position}).encode()
            ticker = topic.partition("|")[0]
            again = replay_query(
                ticker,
                query.start_ms,
                end_ms,
                channels=[channel_of[topic]],
                cursor=at,
                now_ms=end_ms,
            )
            return replay_from(self.reader(), self.settings, again, marker=False)

        def close_live() -> None:
            for stream in streams:
                stream.close()

        return FollowLive(
            stored,
            reread,
            live,
            on_close=close_live,
            seam_timeout_s=self.settings.replay_seam_timeout_s,
        )

    # --- legacy ---

    def fetch_ohlc_sync(
        self,
        ticker: str,
        period: PeriodLike,
        start: TimeLike,
        end: TimeLike = "now",
        *,
        limit: int = 0,
        timeout_s: float | None = None,
        attempts: int | None = None,
    ) -> HistoryResult:
        """Deprecated OHLCRequest -> Response: candles come back in the reply itself."""
        from mdclient.frames import candles_from_ohlc

        query = self.query(ticker, period, start, end)
        outcome = fetch_sync(
            self,
            query,
            client_id=self.client_id,
            limit=limit,
            timeout_s=timeout_s or self.settings.legacy_timeout_s,
            attempts=attempts or self.settings.legacy_attempts,
            new_request_id=new_request_id,
        )
        return HistoryResult(
            table=candles_from_ohlc(outcome.response.candles),
            status=Status.Name(outcome.response.status),
            request_id=outcome.request_id,
            attempts=outcome.attempts,
            elapsed_s=outcome.elapsed_s,
            reported_rows=len(outcome.response.candles),
        )

    # --- live ---

    def live(
        self,
        ticker: str,
        *,
        ticks: bool | None = None,
        ohlc: Iterable[PeriodLike] = (),
        callback: LiveCallback | None = None,
        on_status: StatusCallback | None = None,
        on_sequence: SequenceCallback | None = None,
    ) -> LiveStream:
        """Subscribe to `{ticker}|status`, then `{ticker}|tick` and/or `{ticker}|ohlc:{period}`.

        Without `callback`, iterate the returned stream; with one, it is called
        on the receiving thread. `ticks` defaults to True when no period is given.
        Feed state changes (STARTED, LOST, RECOVERED...) go to `on_status` (receiving
        thread) or the log; FAILED, or REFUSED for a period asked here, ends the
        stream: iterating raises FeedUnavailable/FeedRefused, `stream.error` holds it.
        Close the stream (or use it as a context manager) to unsubscribe.
        """
        try:
            topics.parse_ticker(ticker)
            periods = tuple(timeparse.parse_period(p) for p in ohlc)
        except (ValueError, timeparse.TimeFormatError) as exc:
            raise InvalidRequest(str(exc)) from None
        want_ticks = not periods if ticks is None else ticks
        try:
            topic_list = live_topics(ticker, ticks=want_ticks, ohlc_periods=periods)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        # The status topic first: a REFUSED answering the data subscription finds it in place.
        topic_list = [topics.status_topic(ticker), *topic_list]
        stream = LiveStream(
            topic_list,
            self._close_stream,
            maxsize=self.settings.live_queue_size,
            callback=callback,
            periods=periods,
            on_status=on_status,
            on_sequence=on_sequence,
            recover=self._closed_candles,
            recovery_delay_s=self.settings.live_recovery_delay_s,
        )
        return self._open_stream(stream)

    def _open_stream(self, stream: Stream) -> Stream:
        """Route the stream's topics to it, then subscribe them in order (status first)."""
        with self._streams_lock:
            self._streams.add(stream)
        for topic in stream.topics:
            self._dispatcher.add_sink(topic, stream.deliver)
        try:
            for topic in stream.topics:
                self.subscribe(topic)
                stream.subscribed.append(topic)
        except BaseException:
            stream.close()  # unsubscribes only what was subscribed
            raise
        return stream

    def book(
        self,
        ticker: str,
        *,
        callback: BookCallback | None = None,
        on_event: BookEventCallback | None = None,
        on_status: StatusCallback | None = None,
    ) -> BookStream:
        """Subscribe to `{ticker}|status`, then `{ticker}|book`: a live L2 order book.

        The stream keeps the book (`best_bid`, `best_ask`, `spread`, `depth(n)`,
        `in_sync`, `wait_synced`); iterate it (or pass `callback`) for each snapshot or
        delta once applied. A lost message or an exchange-side reset marks the book out
        of sync until the next snapshot (at most ~1 s): each is a `BookEvent` to
        `on_event` or the log. FAILED feed status ends the stream as for `live`.
        """
        try:
            topics.parse_ticker(ticker)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        stream = BookStream(
            ticker,
            self._close_stream,
            maxsize=self.settings.live_queue_size,
            callback=callback,
            on_event=on_event,
            on_status=on_status,
        )
        return self._open_stream(stream)

    def book_at(self, ticker: str, at: TimeLike) -> StoredBook:
        """The stored book of `ticker` at `at`, exact: the newest snapshot in Iceberg
        ``market.book_snapshots`` at or before it (stored every ~10 s, and on each reset)
        with the ``market.book_deltas`` after it up to `at` applied in order.

        A `StoredBook` (an `OrderBook`): `exact` false (and `gap` why) when the deltas
        after the snapshot skip an exchange sequence: the book is then as it was before
        the gap. `StorageError` when no snapshot lies within `book_lookback_s` before
        `at` (`no_book`). Reads Iceberg only (mdclient.book_history).
        """
        from mdclient.book_history import book_time, read_book_at

        at_ms = book_time(ticker, at, now_ms=int(time.time() * 1000))
        return read_book_at(self.reader(), self.settings, ticker, at_ms)

    def book_samples(
        self,
        ticker: str,
        start: TimeLike,
        end: TimeLike = "now",
        *,
        every_ms: int = 1000,
        depth: int = 10,
    ) -> pa.Table:
        """The book of `ticker` every `every_ms` over [start, end): one Arrow row per
        sample time with its best `depth` levels per side (``bid_price_0``,
        ``bid_amount_0``, ... ``ask_amount_{depth-1}``; null where a side is shorter),
        ``exact`` (no delta missing before it), ``book_time`` and ``exchange_sequence``
        (mdclient.book_history.sample_schema).

        Reads the range's snapshots and deltas once and steps forward. `InvalidRequest`
        for an empty or inverted range, a step under 1 ms, a depth out of 1..1000, or
        more than 1,000,000 samples; `StorageError` `no_book` when no book is stored at
        or before any sample time: never an empty answer.
        """
        from mdclient.book_history import read_book_samples, sample_range

        now_ms = int(time.time() * 1000)
        query = sample_range(ticker, start, end, every_ms, depth, now_ms=now_ms)
        return read_book_samples(self.reader(), self.settings, query)

    def on_live(
        self,
        ticker: str,
        callback: LiveCallback,
        *,
        ticks: bool | None = None,
        ohlc: Iterable[PeriodLike] = (),
        on_status: StatusCallback | None = None,
        on_sequence: SequenceCallback | None = None,
    ) -> LiveStream:
        """Callback form of `live`; returns the handle to `close()`."""
        return self.live(
            ticker,
            ticks=ticks,
            ohlc=ohlc,
            callback=callback,
            on_status=on_status,
            on_sequence=on_sequence,
        )

    def watch(self, topic: str, callback: Callable[[str, Message], None]) -> Closeable:
        """Every message on exactly `topic`, of any type, to `callback` (subscriber thread).

        The raw form of `live` and `trigger_events` for programs that relay topics as
        they are (the gateway): no feed-status handling, no gap recovery; notifications
        and trigger events are still deduplicated by sequence. Close the handle to
        unsubscribe.
        """
        if not topic:
            raise InvalidRequest("an empty topic would subscribe to everything")
        self._dispatcher.add_topic_sink(topic, callback)
        try:
            self.subscribe(topic)
        except BaseException:
            self._dispatcher.remove_topic_sink(topic, callback)
            raise
        return _Watch(self, topic, callback)

    def _unwatch(self, topic: str, callback: Callable[[str, Message], None]) -> None:
        self._dispatcher.remove_topic_sink(topic, callback)
        if not self._closed:
            self.unsubscribe(topic)

    def _closed_candles(self, ticker: str, period: int, start_ms: int, end_ms: int) -> list[OHLC]:
        """What a live stream's gap recovery reads: the stored candles of [start, end)."""
        from mdclient.frames import closed_ohlc

        table = self.reader().read_ohlc(self.settings.ohlc_table, ticker, period, start_ms, end_ms)
        return closed_ohlc(table)

    def _close_stream(self, stream: LiveStream | BookStream) -> None:
        with self._streams_lock:
            self._streams.discard(stream)
        for topic in stream.topics:
            self._dispatcher.remove_sink(topic, stream.deliver)
        if not self._closed:
            for topic in stream.subscribed:
                self.unsubscribe(topic)

    # --- CEP triggers ---

    def register_trigger(
        self,
        ticker: str,
        conditions: Sequence[str | CEPCondition],
        **options: Unpack[TriggerOptions],
    ) -> TriggerEvents:
        """Subscribe to the trigger's event topic, then register it; iterate the result.

        Conditions are CEPConditions or `KIND:THRESHOLD[@WINDOW]` strings (`above:100`,
        `pct:5@60s`); two of them are a sequence, the second at most `within` after the
        first (options: `TriggerOptions`). The stream yields ARMED (the pipeline
        evaluates the trigger), FIRED ... and ends after the trigger's final event.
        Closing it does not cancel the trigger.
        Raises TriggerRejected (with the relay's reason) or InvalidRequest.
        """
        request = self._trigger_request(ticker, conditions, options)
        stream = self._open_events([event_topic(request)], [request.trigger_id], until_final=True)
        try:
            stream.ack = self._trigger_call(request)  # subscribed first: no event can slip by
        except BaseException:
            stream.close()
            raise
        return stream

    def add_trigger(
        self,
        ticker: str,
        conditions: Sequence[str | CEPCondition],
        **options: Unpack[TriggerOptions],
    ) -> CEPTriggerAck:
        """Register without subscribing (bulk registration; watch with `trigger_events`)."""
        return self._trigger_call(self._trigger_request(ticker, conditions, options))

    def cancel_trigger(self, trigger_id: str) -> CEPTriggerAck:
        """Cancel by id; the trigger's stream then gets a final CANCELLED event."""
        request = CEPTriggerRequest(
            trigger_id=trigger_id, client_id=self.client_id, action=CEPTriggerRequest.CANCEL
        )
        return self._trigger_call(request)

    def list_triggers(self) -> list[CEPTriggerRequest]:
        """This client id's registered, unexpired triggers (as the relay's store has them)."""
        request = CEPTriggerRequest(client_id=self.client_id, action=CEPTriggerRequest.LIST)
        return list(self._trigger_call(request).triggers)

    def trigger_events(
        self, trigger_ids: Iterable[str] | None = None, *, until_final: bool = False
    ) -> TriggerEvents:
        """Events of this client's triggers (RESPONSE:{client_id}), or of the given ids
        (also on their CEP:{trigger_id} topics); `until_final` ends after each id's final."""
        ids = list(trigger_ids) if trigger_ids is not None else None
        topic_list = [topics.response_topic(self.client_id)]
        topic_list += [topics.cep_topic(t) for t in ids or ()]
        return self._open_events(topic_list, ids, until_final=until_final)

    def _trigger_request(
        self, ticker: str, conditions: Sequence[str | CEPCondition], options: TriggerOptions
    ) -> CEPTriggerRequest:
        unknown = set(options) - set(TriggerOptions.__annotations__)
        if unknown:  # what a signature would refuse, refused the same way
            raise TypeError(f"unexpected trigger options: {', '.join(sorted(unknown))}")
        period = options.get("period", 0)
        within = options.get("within", 0)
        expires = options.get("expires")
        per_trigger = options.get("per_trigger")
        try:
            period_s = 0 if period in (0, "0") else timeparse.parse_period(period)
            within_s = 0 if within in (0, "0") else timeparse.parse_period(within)
            expires_ms = 0
            if expires not in (None, 0):
                assert expires is not None
                expires_ms = timeparse.to_ms(expires, now_ms=int(time.time() * 1000))
        except timeparse.TimeFormatError as exc:
            raise InvalidRequest(str(exc), error_code=BAD_TIME) from None
        parsed = [parse_condition(c) if isinstance(c, str) else c for c in conditions]
        if per_trigger is None:
            per_trigger = self.settings.notify == "per_request"
        fields = {
            "trigger_id": options.get("trigger_id") or new_request_id(),
            "client_id": self.client_id,
            "ticker": ticker,
            "conditions": parsed,
            "period_seconds": period_s,
            "within_seconds": within_s,
            "repeating": options.get("repeating", False),
            "expires_at_ms": expires_ms,
        }
        if options.get("check", True):
            return build_register(**fields, per_client=not per_trigger)  # type: ignore[arg-type]
        notify = (
            NotifyPattern.NOTIFY_PER_REQUEST if per_trigger else NotifyPattern.NOTIFY_PER_CLIENT
        )
        return CEPTriggerRequest(**fields, action=CEPTriggerRequest.REGISTER, notify=notify)  # type: ignore[arg-type]

    def _trigger_call(self, request: CEPTriggerRequest) -> CEPTriggerAck:
        frames = self.request(envelope.encode(request), self.settings.submit_timeout_s)
        return check_ack(frames, request.trigger_id)

    def _open_events(
        self, topic_list: list[str], trigger_ids: list[str] | None, *, until_final: bool
    ) -> TriggerEvents:
        stream = TriggerEvents(topic_list, trigger_ids, self._close_events, until_final=until_final)
        with self._streams_lock:
            self._event_streams.add(stream)
        for topic in stream.topics:
            self._dispatcher.add_event_sink(topic, stream.deliver)
        try:
            for topic in stream.topics:
                self.subscribe(topic)
                stream.subscribed.append(topic)
        except BaseException:
            stream.close()
            raise
        return stream

    def _close_events(self, stream: TriggerEvents) -> None:
        with self._streams_lock:
            self._event_streams.discard(stream)
        for topic in stream.topics:
            self._dispatcher.remove_event_sink(topic, stream.deliver)
        if not self._closed:
            for topic in stream.subscribed:
                self.unsubscribe(topic)
