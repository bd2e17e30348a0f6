"""Replay: the stored trades, book changes and candles of several tickers over a range,
merged in event-time order and delivered as the live topics' messages
(docs/protocol.md "Replay").

    Client.replay / open_replay / mdclient replay / the gateway's WebSocket /replay
      -> replay_query        the one check (bad_ticker, bad_time, bad_time_range,
                             range_too_large, bad_channel, bad_speed, bad_cursor)
      -> one source per (ticker, channel), in (event time, tie) order, read from the
         store in pieces (trades: file groups; `ReplayLimits`): one per stream in memory
      -> heapq.merge on (event time, stream order, tie) -> per-topic sequence numbers
      -> Replay: iterate it like `client.live` (Tick, OHLC, BookSnapshot, BookDelta,
         then a ReplayComplete marker); `cursor` after every message; `Pacer` keeps the
         event-time spacing divided by `speed` (the clock and sleep are injected)

Event times: a trade's trade_time; a book change's exchange time; a candle's close
(open_time + period: when the live topic publishes the closed candle). Ties within a
stream: a trade's (µs, trade_id), a book change's (µs, exchange sequence, delta before
snapshot, Kafka offset), a candle's open time. The cursor holds, per topic, the last
delivered (event time, tie, sequence): a resume reads each stream from its own
position, so it delivers exactly the rest. Pull-based: nothing is read ahead of the
consumer but the current slice of each stream, so `max` speed runs at the reader's
pace with bounded memory. Plain data and pure functions first, then the store.
"""

from __future__ import annotations

import base64
import binascii
import heapq
import json
import logging
import math
import queue
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from mdclient import timeparse
from mdclient.book_history import (
    DELTA_COLUMNS,
    SNAPSHOT_COLUMNS,
    BookReplay,
    changes,
    ticker_and_times,
)
from mdclient.errors import InvalidRequest, ReplaySeamTimeout, UnknownTicker
from mdclient.streams import Closeable
from mdproto import topics
from mdproto.error_codes import (
    BAD_CHANNEL,
    BAD_CURSOR,
    BAD_SPEED,
    BAD_TIME_RANGE,
    RANGE_TOO_LARGE,
    SEAM_TIMEOUT,
)
from mdproto.messages import OHLC, BookDelta, BookSnapshot, TakerSide, Tick
from mdproto.tables import BookDeltas, BookSnapshots, Ticks, arrow_schema

if TYPE_CHECKING:
    from mdclient.config import ClientSettings
    from mdclient.frames import IcebergReader

log = logging.getLogger(__name__)

ReplayMessage = Tick | OHLC | BookSnapshot | BookDelta
ChannelKind = Literal["trades", "book", "ohlc"]
Tie = tuple[int | str, ...]

#: The longest range one replay takes (a year): longer is surely a mistake.
MAX_RANGE_MS = 366 * 86_400_000
#: How far past now a range may end (as the relay's rule): nothing is stored there.
MAX_AHEAD_MS = 86_400_000
MAX_TICKERS = 100
#: The fastest paced speed; faster is `max`.
MAX_SPEED = 1_000_000.0
#: A tie above every stored change of one µs: the book a stream starts from sorts after them.
_AFTER = 2**62
#: Plain ints: an enum attribute lookup per trade costs microseconds.
_SIDES = {"BUY": int(TakerSide.BUY), "SELL": int(TakerSide.SELL)}
_NO_SIDE = int(TakerSide.SIDE_UNSPECIFIED)
_SIDE_NAMES = pa.array(list(_SIDES))
_SIDE_VALUES = pa.array(list(_SIDES.values()), pa.int32())
TRADE_COLUMNS: tuple[str, ...] = (
    Ticks.TRADE_ID,
    Ticks.PRICE,
    Ticks.AMOUNT,
    Ticks.SIDE,
    Ticks.TRADE_TIME,
    Ticks.INGESTED_AT,
)


# --- the request ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Channel:
    """What to replay of each ticker: `trades` ({ticker}|tick), `book` ({ticker}|book) or
    `ohlc:PERIOD` ({ticker}|ohlc:SECONDS, the stored closed candles)."""

    kind: ChannelKind
    period_seconds: int = 0

    @property
    def name(self) -> str:
        return f"ohlc:{self.period_seconds}" if self.kind == "ohlc" else self.kind

    def topic(self, ticker: str) -> str:
        if self.kind == "trades":
            return topics.tick_topic(ticker)
        if self.kind == "book":
            return topics.book_topic(ticker)
        return topics.ohlc_topic(ticker, self.period_seconds)


def parse_channel(text: str) -> Channel:
    """`trades`, `book`, `ohlc:60` or `ohlc:1m` -> Channel; InvalidRequest `bad_channel`."""
    name = text.strip().lower() if isinstance(text, str) else ""
    if name in ("trades", "book"):
        return Channel(name)  # type: ignore[arg-type]
    kind, _, period = name.partition(":")
    if kind == "ohlc" and period:
        try:
            return Channel("ohlc", timeparse.parse_period(period))
        except timeparse.TimeFormatError as exc:
            raise InvalidRequest(f"channel {text!r}: {exc}", error_code=BAD_CHANNEL) from None
    raise InvalidRequest(
        f"channel {text!r} is not trades, book or ohlc:PERIOD (e.g. ohlc:60, ohlc:1m)",
        error_code=BAD_CHANNEL,
    )


def parse_speed(value: float | str) -> float | None:
    """1, 10, 0.5, "10", "10x" -> that factor of real time; "max" -> None (as fast as the
    consumer reads); InvalidRequest `bad_speed` otherwise."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "max":
            return None
        text = text.removesuffix("x")
        try:
            number = float(text)
        except ValueError:
            number = math.nan
    elif isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    else:
        number = math.nan
    if not (0 < number <= MAX_SPEED):  # also NaN
        raise InvalidRequest(
            f"speed {value!r} is not a factor in (0, {MAX_SPEED:g}] nor 'max'",
            error_code=BAD_SPEED,
        )
    return number


@dataclass(frozen=True, slots=True)
class Position:
    """A stream's last delivered message: its event time, tie and sequence."""

    time_ms: int
    tie: Tie
    sequence: int

    @property
    def key(self) -> tuple[int, Tie]:
        return (self.time_ms, self.tie)


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a replay stopped: per topic the last delivered `Position`. `encode()` is
    the text a dropped client passes back (`cursor=`); topics absent start afresh."""

    epoch: int
    positions: Mapping[str, Position] = field(default_factory=dict)

    def encode(self) -> str:
        data = {
            "v": 1,
            "epoch": self.epoch,
            "at": {t: [p.time_ms, list(p.tie), p.sequence] for t, p in self.positions.items()},
        }
        raw = json.dumps(data, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> Cursor:
        """The cursor `encode` wrote; InvalidRequest `bad_cursor` for anything else."""
        try:
            raw = base64.urlsafe_b64decode(text.strip() + "=" * (-len(text.strip()) % 4))
            data = json.loads(raw)
            if data.get("v") != 1 or not isinstance(data["epoch"], int):
                raise ValueError("unknown version")
            positions = {}
            for topic, (at, tie, seq) in data["at"].items():
                if not (isinstance(at, int) and isinstance(seq, int) and seq > 0):
                    raise ValueError(f"bad position of {topic}")
                if not all(isinstance(x, int | str) for x in tie):
                    raise ValueError(f"bad tie of {topic}")
                positions[str(topic)] = Position(at, tuple(tie), seq)
        except (ValueError, TypeError, KeyError, AttributeError, binascii.Error) as exc:
            raise InvalidRequest(
                f"cursor is not one a replay gave ({exc})", error_code=BAD_CURSOR
            ) from None
        return cls(data["epoch"], positions)


@dataclass(frozen=True, slots=True)
class ReplayQuery:
    """A checked replay: `replay_query`'s answer."""

    tickers: tuple[str, ...]
    start_ms: int
    end_ms: int
    channels: tuple[Channel, ...]
    speed: float | None  # None: max
    cursor: Cursor | None = None

    @property
    def streams(self) -> list[tuple[str, str, Channel]]:
        """(topic, ticker, channel) in merge order: tickers as given, then channels."""
        return [(c.topic(t), t, c) for t in self.tickers for c in self.channels]

    @property
    def epoch(self) -> int:
        """The publisher_epoch every message carries: the first run's, kept by resumes."""
        return self.cursor.epoch if self.cursor is not None else max(1, self.start_ms)


def replay_query(
    tickers: str | Sequence[str],
    start: int | datetime | str,
    end: int | datetime | str,
    *,
    channels: Iterable[str] = ("trades",),
    speed: float | str = "max",
    cursor: str | None = None,
    now_ms: int,
) -> ReplayQuery:
    """A replay checked, or InvalidRequest with its code: the SDK's, CLI's and gateway's
    one check."""
    names = [tickers] if isinstance(tickers, str) else list(tickers)
    names = list(dict.fromkeys(t.strip().upper() for t in names))
    if not 1 <= len(names) <= MAX_TICKERS:
        raise InvalidRequest(f"replay 1 to {MAX_TICKERS} tickers, not {len(names)}")
    for name in names[1:]:
        ticker_and_times(name, (), now_ms)
    start_ms, end_ms = ticker_and_times(names[0], (start, end), now_ms)
    if start_ms <= 0 or end_ms <= start_ms or end_ms > now_ms + MAX_AHEAD_MS:
        raise InvalidRequest(
            f"need 0 < start < end <= a day from now, got [{start_ms}, {end_ms}) in epoch ms",
            error_code=BAD_TIME_RANGE,
        )
    if end_ms - start_ms > MAX_RANGE_MS:
        raise InvalidRequest(
            f"a replay covers at most {MAX_RANGE_MS // 86_400_000} days: split the range",
            error_code=RANGE_TOO_LARGE,
        )
    parsed = tuple(dict.fromkeys(parse_channel(c) for c in channels))
    if not parsed:
        raise InvalidRequest("name at least one channel", error_code=BAD_CHANNEL)
    query = ReplayQuery(tuple(names), start_ms, end_ms, parsed, parse_speed(speed))
    if cursor is None:
        return query
    resume = Cursor.decode(cursor)
    own = {topic for topic, _, _ in query.streams}
    foreign = sorted(set(resume.positions) - own)
    if foreign:
        raise InvalidRequest(
            f"the cursor is of another replay (topics {foreign} not asked)", error_code=BAD_CURSOR
        )
    if any(not start_ms <= p.time_ms < end_ms for p in resume.positions.values()):
        raise InvalidRequest("the cursor lies outside the range", error_code=BAD_CURSOR)
    return ReplayQuery(query.tickers, start_ms, end_ms, parsed, query.speed, resume)


# --- pure: items, sources, merge, pacing --------------------------------------------------


class Item(NamedTuple):
    """One message of a stream at its event time and tie (its order in the stream)."""

    time_ms: int
    tie: Tie
    message: ReplayMessage


class ReplayEvent(NamedTuple):
    """A delivered message: its live topic, event time and the message (sequenced)."""

    topic: str
    time_ms: int
    message: ReplayMessage


@dataclass(frozen=True, slots=True)
class ReplayComplete:
    """The end of a replay: every stored message of the range delivered. `cursor`
    resumes nothing more; `messages` counts this run's, `per_topic` by topic."""

    cursor: str
    messages: int
    per_topic: Mapping[str, int]


def tick_items(ticker: str, rows: pa.Table) -> list[Item]:
    """``market.ticks`` rows (`TRADE_COLUMNS`) in trade order (`in_trade_order`) -> Tick
    items, whose ties (µs, trade id) are then in order too. The columns are made into
    the message's values as Arrow first; only the message is built per row."""
    micros = rows.column(Ticks.TRADE_TIME).cast(pa.int64())
    sides = pc.index_in(rows.column(Ticks.SIDE), value_set=_SIDE_NAMES)
    items = []
    for us, ms, ing, trade_id, price, amount, side in zip(
        micros.to_pylist(),
        pc.divide(micros, 1000).to_pylist(),
        _whole_ms(rows.column(Ticks.INGESTED_AT)).to_pylist(),
        rows.column(Ticks.TRADE_ID).to_pylist(),
        pc.fill_null(rows.column(Ticks.PRICE), 0.0).to_pylist(),
        pc.fill_null(rows.column(Ticks.AMOUNT), 0.0).to_pylist(),
        pc.fill_null(_SIDE_VALUES.take(sides), _NO_SIDE).to_pylist(),
        strict=True,
    ):
        tick = Tick(
            ticker=ticker,
            trade_id=trade_id,
            price=price,
            amount=amount,
            timestamp_ms=ms,
            side=side,
            ingested_at_ms=ing,
        )
        items.append(Item(ms, (us, trade_id), tick))
    return items


def _whole_ms(times: pa.ChunkedArray) -> pa.ChunkedArray:
    """Timestamps (µs) as whole epoch milliseconds, 0 for none."""
    return pc.fill_null(pc.divide(times.cast(pa.int64()), 1000), 0)


def in_trade_order(rows: pa.Table) -> pa.Table:
    """Rows of one ticker in the replay's trade order: (trade time, trade id)."""
    order = [(Ticks.TRADE_TIME, "ascending"), (Ticks.TRADE_ID, "ascending")]
    return rows.take(pc.sort_indices(rows, order))


def tick_stream(ticker: str, groups: Iterable[pa.Table], chunk: int) -> Iterator[Item]:
    """Tick items of a ticker's trade groups in order: each group sorted as Arrow, then
    made into messages `chunk` rows at a time (only those are Python objects at once)."""
    for group in groups:
        rows = in_trade_order(group)
        for offset in range(0, rows.num_rows, chunk):
            yield from tick_items(ticker, rows.slice(offset, chunk))


def candle_items(candles: Sequence[OHLC]) -> list[Item]:
    """Closed candles -> items at their close time (open + period), by open time."""
    items = [Item(c.open_time_ms + c.period_seconds * 1000, (c.open_time_ms,), c) for c in candles]
    items.sort(key=lambda i: i.tie)
    return items


def change_items(ticker: str, snapshots: pa.Table, deltas: pa.Table) -> list[Item]:
    """Stored snapshots and deltas -> items in the order a book applies them."""
    return [Item(c[0] // 1000, c[:4], c[4]) for c in changes(ticker, snapshots, deltas)]


def after(items: Iterable[Item], position: Position | None) -> Iterator[Item]:
    """The items past `position` (all of them without one)."""
    if position is None:
        yield from items
        return
    key = position.key
    for item in items:
        if (item.time_ms, item.tie) > key:
            yield item


def sliced(
    read: Callable[[int, int], list[Item]], lo_ms: int, end_ms: int, slice_ms: int
) -> Iterator[Item]:
    """`read(lo, hi)` over [lo_ms, end_ms) one slice at a time: the items of a stream
    whose every slice is sorted and holds what falls in it."""
    while lo_ms < end_ms:
        hi = min(end_ms, lo_ms + slice_ms)
        yield from read(lo_ms, hi)
        lo_ms = hi


def book_stream(start: tuple[Item, ...] | None, changes_after: Iterator[Item]) -> Iterator[Item]:
    """A book topic: the book it starts from (a snapshot item; None: no exact book), then
    the stored changes; deltas before the first snapshot are left out (no book to apply
    them to, as a live subscriber is never sent)."""
    synced = False
    for item in start or ():
        synced = True
        yield item
    for item in changes_after:
        if isinstance(item.message, BookSnapshot):
            synced = True
        if synced:
            yield item


def merge(streams: Sequence[tuple[str, Iterator[Item]]]) -> Iterator[tuple[str, Item]]:
    """The streams' items in event-time order; at one time in the streams' order, then
    by tie. Lazy: one item of each stream is held."""
    if len(streams) == 1:  # one stream is in order already
        [(topic, items)] = streams
        for item in items:
            yield topic, item
        return

    def keyed(index: int, topic: str, items: Iterator[Item]) -> Iterator[tuple[Any, ...]]:
        for item in items:
            yield (item.time_ms, index, item.tie, topic, item)

    ordered = heapq.merge(
        *(keyed(i, topic, items) for i, (topic, items) in enumerate(streams)),
        key=lambda entry: entry[:3],
    )
    for entry in ordered:
        yield entry[3], entry[4]


class Pacer:
    """Event-time spacing divided by `speed`, on an injected clock (seconds): `delay`
    says how long to wait before an event. The first event sets the origin; a consumer
    that fell behind gets the late events at once (no wait), never skipped."""

    def __init__(self, speed: float, clock: Callable[[], float]) -> None:
        self.speed = speed
        self._clock = clock
        self._origin: tuple[float, int] | None = None

    def delay(self, time_ms: int) -> float:
        now = self._clock()
        if self._origin is None:
            self._origin = (now, time_ms)
            return 0.0
        wall0, event0 = self._origin
        due = wall0 + (time_ms - event0) / 1000.0 / self.speed
        return max(0.0, due - now)


class Replay(Closeable, Iterator["ReplayMessage | ReplayComplete"]):
    """`for message in replay:` yields the live topics' messages in event-time order,
    paced by the query's speed, then one `ReplayComplete` (`marker=False`: none).

    Each message carries its topic's next `sequence` (1, 2, ... continued by a resume)
    and `publisher_epoch` (the first run's): a gap in them is a loss. `cursor` is where
    a resume starts after the last message yielded; `topic` that message's topic.
    `events()` is the unpaced form with topics (the gateway paces on its own loop).
    """

    def __init__(
        self,
        query: ReplayQuery,
        streams: Sequence[tuple[str, Iterator[Item]]],
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        marker: bool = True,
    ) -> None:
        self.query = query
        self.topics = tuple(topic for topic, _ in streams)
        #: Where a resume started (the cursor's positions); the last item taken and the
        #: sequence per topic make the positions since, built only when asked.
        self._resumed: dict[str, Position] = dict(
            query.cursor.positions if query.cursor is not None else {}
        )
        self._sequences = {t: p.sequence for t, p in self._resumed.items()}
        self._last: dict[str, Item] = {}
        self._epoch = query.epoch
        self._merged = merge(streams)
        self._pacer = None if query.speed is None else Pacer(query.speed, clock)
        self._sleep = sleep
        self._marker = marker
        self._taken = self._take()
        self.topic = ""
        self.complete = False
        self._closed = False

    @property
    def per_topic(self) -> dict[str, int]:
        """Messages delivered per topic by this run (a resume counts from its cursor)."""
        resumed = self._resumed
        return {
            t: self._sequences.get(t, 0) - (resumed[t].sequence if t in resumed else 0)
            for t in self.topics
        }

    @property
    def messages(self) -> int:
        """Messages delivered by this run."""
        return sum(self.per_topic.values())

    @property
    def cursor(self) -> str:
        """Resume after the last message delivered: pass it as `cursor=`."""
        positions = {t: p for t in self.topics if (p := self.position(t)) is not None}
        return Cursor(self._epoch, positions).encode()

    def position(self, topic: str) -> Position | None:
        """The topic's last delivered message (None: none yet)."""
        item = self._last.get(topic)
        if item is None:
            return self._resumed.get(topic)
        return Position(item.time_ms, item.tie, self._sequences[topic])

    def events(self) -> Iterator[ReplayEvent]:
        """Unpaced: each message sequenced, counted and in the cursor as it is taken."""
        for topic, item in self._taken:
            yield ReplayEvent(topic, item.time_ms, item.message)

    def _take(self) -> Iterator[tuple[str, Item]]:
        """The merged items, each message sequenced, counted and in the cursor."""
        sequences, last, epoch = self._sequences, self._last, self._epoch
        for topic, item in self._merged:
            if self._closed:
                return
            sequence = sequences.get(topic, 0) + 1
            sequences[topic] = sequence
            last[topic] = item
            message = item.message
            message.sequence = sequence
            message.publisher_epoch = epoch
            self.topic = topic
            yield topic, item
        self.complete = not self._closed

    def finished(self) -> ReplayComplete:
        return ReplayComplete(self.cursor, self.messages, self.per_topic)

    def __iter__(self) -> Replay:
        return self

    def __next__(self) -> ReplayMessage | ReplayComplete:
        taken = next(self._taken, None)
        if taken is None:
            if self._marker and self.complete:
                self._marker = False
                return self.finished()
            raise StopIteration
        item = taken[1]
        if self._pacer is not None:
            wait = self._pacer.delay(item.time_ms)
            if wait > 0:
                self._sleep(wait)
        return item.message

    def close(self) -> None:
        """Stop: the next step ends the iteration (no marker); `cursor` stays valid."""
        self._closed = True


# --- batch mode ---------------------------------------------------------------------------

#: The column batch mode adds: which ticker a row is of.
TICKER_COLUMN = "ticker"
#: Rows per record batch of batch mode.
BATCH_ROWS = 65_536


def trade_batches_in_order(
    store: ReplayStore, query: ReplayQuery, *, batch_rows: int = BATCH_ROWS
) -> Iterator[pa.RecordBatch]:
    """The trades of the query's tickers as Arrow record batches (`TICKER_COLUMN` then
    `TRADE_COLUMNS`) in the replay's order (µs, the tickers' order asked, trade id): a
    backtest that reads columns gets the rows without a message per trade. Each
    ticker's file groups are read as the merge reaches them (memory: about one group
    per ticker, as `Replay`). Trades only (`bad_channel` otherwise), checked here,
    before the first batch; no sequences, cursor or pacing."""
    if any(channel.kind != "trades" for channel in query.channels):
        raise InvalidRequest("batch replay serves trades only", error_code=BAD_CHANNEL)
    for ticker in query.tickers:
        if not store.holds(ticker, Channel("trades")):
            raise UnknownTicker(f"nothing of {ticker} is stored for trades: never recorded")
    return _merged_batches(store, query, batch_rows)


def _merged_batches(
    store: ReplayStore, query: ReplayQuery, batch_rows: int
) -> Iterator[pa.RecordBatch]:
    """A merge by watermark: every ticker holds its current group, sorted; all rows up to
    the earliest last time among them go out (sorted together), and a ticker whose
    group is spent reads its next one. Groups of a ticker do not overlap in time, so
    nothing read later can come before what went out."""
    order = [(Ticks.TRADE_TIME, "ascending"), ("_rank", "ascending"), (Ticks.TRADE_ID, "ascending")]
    groups = {
        ticker: iter(store.trade_groups(ticker, query.start_ms, query.end_ms))
        for ticker in query.tickers
    }
    held: dict[str, pa.Table] = {}
    while True:
        for ticker in list(groups):
            while ticker not in held:
                group = next(groups[ticker], None)
                if group is None:
                    del groups[ticker]
                    break
                if group.num_rows:
                    held[ticker] = _ranked(in_trade_order(group), ticker, query.tickers)
        if not held:
            return
        watermark = min(_last_micros(rows) for rows in held.values())
        out = []
        for ticker, rows in list(held.items()):
            times = rows[Ticks.TRADE_TIME]
            due = pc.less_equal(times.cast(pa.int64()), watermark)
            out.append(rows.filter(due))
            rest = rows.filter(pc.invert(due))
            if rest.num_rows:
                held[ticker] = rest
            else:
                del held[ticker]
        merged = pa.concat_tables(out)
        yield from (
            merged.take(pc.sort_indices(merged, order))
            .drop_columns(["_rank"])
            .to_batches(batch_rows)
        )


def _last_micros(rows: pa.Table) -> int:
    """The trade time of the last row (rows in trade order), µs."""
    return int(rows[Ticks.TRADE_TIME].cast(pa.int64())[rows.num_rows - 1].as_py())


def _ranked(rows: pa.Table, ticker: str, tickers: Sequence[str]) -> pa.Table:
    """`rows` with the ticker column first and its rank in the query (the tie order)."""
    n = rows.num_rows
    rows = rows.add_column(0, TICKER_COLUMN, pa.repeat(pa.scalar(ticker), n))
    return rows.append_column("_rank", pa.repeat(pa.scalar(tickers.index(ticker)), n))


# --- into live data ----------------------------------------------------------------------


LiveMessage = Tick | OHLC


def live_key(message: LiveMessage) -> tuple[str, str | int, int, int]:
    """A live message's topic, its identity there (a trade id, a candle's open time),
    its event time (as `Replay` orders it) and its row time (what a range selects)."""
    if isinstance(message, Tick):
        topic = topics.tick_topic(message.ticker)
        return topic, message.trade_id, message.timestamp_ms, message.timestamp_ms
    period_ms = message.period_seconds * 1000
    topic = topics.ohlc_topic(message.ticker, message.period_seconds)
    opened = message.open_time_ms
    return topic, opened, opened + period_ms, opened


class LiveBuffer(queue.Queue[LiveMessage]):
    """The live ticks and closed candles waiting for the seam, bounded: `offer` (the
    subscriber thread) never blocks; a message that finds it full is dropped and
    counted in `dropped` (a consumer more than `maxsize` behind live loses them,
    logged). Candle previews are not kept: a replay delivers closed candles."""

    def __init__(self, maxsize: int) -> None:
        super().__init__(maxsize)
        self.dropped = 0

    def offer(self, message: object) -> None:
        if not isinstance(message, Tick | OHLC) or (
            isinstance(message, OHLC) and not message.closed
        ):
            return
        try:
            self.put_nowait(message)
        except queue.Full:
            self.dropped += 1
            log.warning(
                "replay follow: %s dropped, %d live wait", live_key(message)[:2], self.maxsize
            )


class FollowLive(Closeable, Iterator["ReplayMessage | ReplayComplete"]):
    """A replay of trades and candles that goes on into live data without a gap or a
    duplicate at the seam (`Client.replay_into_live`).

    The live topics are subscribed before anything is read and wait in `live` (a
    queue the subscriber thread fills). The stored replay runs first (its
    `ReplayComplete` marks the seam); then for each topic, at its first live message
    L, the store is read again from where the replay stopped up to L, until it holds
    L itself (the pipeline stores a closed candle seconds and a trade up to a minute
    after it is published; `poll_s` apart, at most `seam_timeout_s`, then
    `ReplaySeamTimeout`: never a gap the consumer cannot see): every stored message
    before L is delivered, then L and the live ones after it. A live message already
    delivered (the same trade id, the same candle open time) is dropped (counted in
    `duplicates`); a candle `correction` always goes through. Live messages carry on
    their topic's replay `sequence` and epoch, so the consumer sees one topic.
    """

    def __init__(
        self,
        stored: Replay,
        reread: Callable[[str, Position | None, int], Replay],
        live: LiveBuffer,
        *,
        on_close: Callable[[], None] = lambda: None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        poll_s: float = 0.5,
        seam_timeout_s: float = 120.0,
        remembered: int = 100_000,
    ) -> None:
        self.stored = stored
        self._reread = reread
        self._live = live
        self._on_close = on_close
        self._sleep = sleep
        self._clock = clock
        self._poll_s = poll_s
        self._timeout_s = seam_timeout_s
        self._epoch = stored.query.epoch
        self._bridged: set[str] = set()
        self._ids: dict[str, deque[str | int]] = {}  # recent identities delivered, per topic
        self._id_sets: dict[str, set[str | int]] = {}
        self._remembered = remembered
        self._sequences: dict[str, int] = {}
        self._pending: deque[LiveMessage] = deque()
        self._closed = False
        self.duplicates = 0
        self.topic = ""

    def _note(self, message: LiveMessage, *, numbered: bool = False) -> LiveMessage:
        """Count `message` delivered on its topic: its sequence (the next unless
        `numbered`: the stored replay's), its identity remembered."""
        topic, ident, _, _ = live_key(message)
        if numbered:
            self._sequences[topic] = message.sequence
        else:
            sequence = self._sequences.get(topic, 0) + 1
            self._sequences[topic] = sequence
            message.sequence, message.publisher_epoch = sequence, self._epoch
        ids, known = self._ids.setdefault(topic, deque()), self._id_sets.setdefault(topic, set())
        ids.append(ident)
        known.add(ident)
        if len(ids) > self._remembered:
            known.discard(ids.popleft())
        self.topic = topic
        return message

    @property
    def query(self) -> ReplayQuery:
        return self.stored.query

    def __iter__(self) -> FollowLive:
        return self

    def __next__(self) -> ReplayMessage | ReplayComplete:
        if not self.stored.complete:
            message = next(self.stored)
            if isinstance(message, Tick | OHLC):
                return self._note(message, numbered=True)
            return message  # the marker: the stored range is done
        while not self._closed:
            if (live := self._next_live(0.25)) is not None:
                return live
        raise StopIteration

    def stored_events(self) -> Iterator[ReplayEvent]:
        """The stored replay's unpaced events (`Replay.events`), noted for the seam: the
        gateway paces them itself, then `take`s the live ones."""
        for event in self.stored.events():
            if isinstance(event.message, Tick | OHLC):
                self._note(event.message, numbered=True)
            yield event

    def take(self, limit: int, wait_s: float = 0.25) -> list[LiveMessage]:
        """After the stored range: up to `limit` live messages, waiting at most `wait_s`
        for the first and not at all for the rest (empty: none came, or closed)."""
        out: list[LiveMessage] = []
        while len(out) < limit and not self._closed:
            message = self._next_live(0.0 if out else wait_s)
            if message is None:
                break
            out.append(message)
        return out

    def _next_live(self, wait_s: float) -> LiveMessage | None:
        """The next live message to deliver, bridged and deduplicated; None when none
        came within `wait_s`."""
        while not self._pending:
            try:
                message = self._live.get(timeout=wait_s) if wait_s else self._live.get_nowait()
            except queue.Empty:
                return None
            topic, ident, _, _ = live_key(message)
            if topic not in self._bridged:
                self._bridged.add(topic)
                self._pending.extend(self._bridge(topic, message))
            correction = isinstance(message, OHLC) and message.correction
            if ident in self._id_sets.get(topic, ()) and not correction:
                self.duplicates += 1
                continue
            self._pending.append(message)
        return self._note(self._pending.popleft())

    def _bridge(self, topic: str, first: LiveMessage) -> list[LiveMessage]:
        """The stored messages between the replay's last one and `first`, read until the
        store holds `first`; `ReplaySeamTimeout` when it does not within the timeout."""
        position = self.stored.position(topic)
        known = self._id_sets.get(topic, set())
        _, first_id, first_event_ms, first_row_ms = live_key(first)
        if first_id in known or (position is not None and first_event_ms < position.time_ms):
            return []  # the replay went past it: what came after it is live too
        deadline = self._clock() + self._timeout_s
        while True:
            stored = [
                m
                for m in self._reread(topic, position, first_row_ms + 1)
                if isinstance(m, Tick | OHLC)
            ]
            if any(live_key(m)[1] == first_id for m in stored):
                break
            if self._clock() >= deadline:
                raise ReplaySeamTimeout(
                    f"{topic}: the store did not hold the first live message ({first_id}) "
                    f"within {self._timeout_s:g} s, so the messages before it may be "
                    "missing; replay again from the last one received",
                    error_code=SEAM_TIMEOUT,
                )
            self._sleep(self._poll_s)
        out = []
        for message in stored:
            ident = live_key(message)[1]
            if ident == first_id:
                break
            if ident not in known:
                out.append(message)
        return out

    def close(self) -> None:
        """Stop, and close the live subscriptions."""
        self._closed = True
        self.stored.close()
        self._on_close()


# --- the store ---------------------------------------------------------------------------


class ReplayStore(Protocol):
    """Where the rows come from (`IcebergStore`; tests pass tables)."""

    def holds(self, ticker: str, channel: Channel) -> bool:
        """Whether anything of `ticker` is stored for `channel` (at any time)."""
        ...

    def trade_groups(self, ticker: str, lo_ms: int, hi_ms: int) -> Iterator[pa.Table]:
        """`TRADE_COLUMNS` of trades with trade_time in [lo_ms, hi_ms), read lazily in
        groups whose time spans do not overlap, the groups in time order (rows within a
        group in any order)."""
        ...

    def candles(self, ticker: str, period: int, lo_ms: int, hi_ms: int) -> list[OHLC]:
        """Stored (closed) candles with open_time in [lo_ms, hi_ms)."""
        ...

    def book_snapshots(self, ticker: str, lo_us: int, hi_us: int) -> pa.Table:
        """`book_history.SNAPSHOT_COLUMNS` of snapshots with their time in [lo_us, hi_us)."""
        ...

    def book_deltas(self, ticker: str, lo_us: int, hi_us: int) -> pa.Table:
        """`book_history.DELTA_COLUMNS` of deltas with their time in [lo_us, hi_us)."""
        ...


@dataclass(frozen=True, slots=True)
class ReplayLimits:
    """How much of each stream is in memory (a trade file group is made into messages
    `trade_chunk` at a time; book changes and candles are read in slices) and the
    book's lookback."""

    trade_chunk: int = 10_000  # trades made into messages at a time, of one file group
    book_slice_ms: int = 300_000
    candle_slice: int = 1000  # candles per read
    book_lookback_ms: int = 3_600_000


def _book_start(
    store: ReplayStore, ticker: str, limit: tuple[int, Tie], lookback_ms: int
) -> BookSnapshot | None:
    """The exact book after every stored change up to `limit` (time ms, tie), from the
    newest snapshot at or before it within the lookback; None without one, or when a
    delta after it is missing (the stream then waits for the next stored snapshot)."""
    at_ms, tie = limit
    hi_us = int(tie[0]) + 1  # the tie's µs, inclusive
    snapshots = store.book_snapshots(ticker, (at_ms - lookback_ms) * 1000, hi_us)
    no_deltas = arrow_schema(BookDeltas.SCHEMA, DELTA_COLUMNS).empty_table()
    bases = [i for i in change_items(ticker, snapshots, no_deltas) if i.tie <= tie]
    if not bases:
        return None
    base = bases[-1]
    deltas = store.book_deltas(ticker, int(base.tie[0]), hi_us)
    replay = BookReplay(ticker)
    for item in (base, *change_items(ticker, snapshots.slice(0, 0), deltas)):
        if item is base or base.tie < item.tie <= tie:
            replay.step((*item.tie, item.message))  # type: ignore[arg-type]
    book = replay.book
    return book.snapshot() if book.exact else None


def stream_items(
    store: ReplayStore,
    query: ReplayQuery,
    ticker: str,
    channel: Channel,
    position: Position | None,
    limits: ReplayLimits,
) -> Iterator[Item]:
    """One topic's items over the query's range, past `position`."""
    start, end = query.start_ms, query.end_ms
    lo = start if position is None else position.time_ms
    if channel.kind == "trades":
        groups = store.trade_groups(ticker, lo, end)
        return after(tick_stream(ticker, groups, limits.trade_chunk), position)
    if channel.kind == "ohlc":
        period = channel.period_seconds

        def read_candles(a: int, b: int) -> list[Item]:
            return candle_items(store.candles(ticker, period, a, b))

        first_open = start if position is None else int(position.tie[0])
        step = period * 1000 * limits.candle_slice
        return after(sliced(read_candles, first_open, end, step), position)

    def read_book(a: int, b: int) -> list[Item]:
        lo_us, hi_us = a * 1000, b * 1000
        snapshots = store.book_snapshots(ticker, lo_us, hi_us)
        return change_items(ticker, snapshots, store.book_deltas(ticker, lo_us, hi_us))

    rest = after(sliced(read_book, lo, end, limits.book_slice_ms), position)
    # A fresh stream starts from the book just before the range (its changes before the
    # first µs of it); a resumed one from the book at its position.
    limit = (start, (start * 1000 - 1, _AFTER)) if position is None else position.key
    return _book_items(store, ticker, limit, limits, rest)


def _book_items(
    store: ReplayStore,
    ticker: str,
    limit: tuple[int, Tie],
    limits: ReplayLimits,
    rest: Iterator[Item],
) -> Iterator[Item]:
    """The book at `limit` (read when the stream is first pulled), then `rest`."""
    snapshot = _book_start(store, ticker, limit, limits.book_lookback_ms)
    first = None if snapshot is None else (Item(limit[0], limit[1], snapshot),)
    yield from book_stream(first, rest)


def open_replay(
    store: ReplayStore,
    query: ReplayQuery,
    *,
    limits: ReplayLimits | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    marker: bool = True,
) -> Replay:
    """The replay of `query` from `store`; UnknownTicker (before any message) for a
    ticker with nothing stored for any channel asked."""
    limits = limits or ReplayLimits()
    for ticker in query.tickers:
        if not any(store.holds(ticker, channel) for channel in query.channels):
            names = ", ".join(c.name for c in query.channels)
            raise UnknownTicker(f"nothing of {ticker} is stored for {names}: never recorded")
    positions = query.cursor.positions if query.cursor is not None else {}
    streams = [
        (topic, stream_items(store, query, ticker, channel, positions.get(topic), limits))
        for topic, ticker, channel in query.streams
    ]
    return Replay(query, streams, clock=clock, sleep=sleep, marker=marker)


def replay_from(
    reader: IcebergReader,
    settings: ClientSettings,
    query: ReplayQuery,
    *,
    marker: bool = True,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Replay:
    """`open_replay` from Iceberg (`Client.replay`, the CLI, the gateway), the book's
    lookback as `book_at`'s (`book_lookback_s`)."""
    limits = ReplayLimits(book_lookback_ms=int(settings.book_lookback_s * 1000))
    store = IcebergStore(reader, settings)
    return open_replay(store, query, limits=limits, clock=clock, sleep=sleep, marker=marker)


class IcebergStore:
    """`ReplayStore` over the SDK's Iceberg reader (``market.ticks``, ``market.ohlc``,
    ``market.book_snapshots``, ``market.book_deltas``)."""

    def __init__(self, reader: IcebergReader, settings: ClientSettings) -> None:
        self._reader = reader
        self._settings = settings

    def holds(self, ticker: str, channel: Channel) -> bool:
        s = self._settings
        if channel.kind == "trades":
            return self._reader.holds(s.ticks_table, Ticks.TICKER, ticker)
        if channel.kind == "book":
            return self._reader.holds(s.book_snapshots_table, BookSnapshots.TICKER, ticker)
        return self._reader.holds(s.ohlc_table, "ticker", ticker)

    def trade_groups(self, ticker: str, lo_ms: int, hi_ms: int) -> Iterator[pa.Table]:
        """The reader's file groups (`IcebergReader.trade_groups`): one scan planned, each
        group's files read when the consumer reaches it."""
        table = self._settings.ticks_table
        return self._reader.trade_groups(table, ticker, lo_ms, hi_ms, TRADE_COLUMNS)

    def candles(self, ticker: str, period: int, lo_ms: int, hi_ms: int) -> list[OHLC]:
        from mdclient.frames import closed_ohlc

        table = self._reader.read_ohlc(self._settings.ohlc_table, ticker, period, lo_ms, hi_ms)
        return closed_ohlc(table)

    def book_snapshots(self, ticker: str, lo_us: int, hi_us: int) -> pa.Table:
        table = self._settings.book_snapshots_table
        return self._book_rows(
            table, BookSnapshots.SNAPSHOT_TIME, SNAPSHOT_COLUMNS, ticker, lo_us, hi_us
        )

    def book_deltas(self, ticker: str, lo_us: int, hi_us: int) -> pa.Table:
        table = self._settings.book_deltas_table
        return self._book_rows(table, BookDeltas.DELTA_TIME, DELTA_COLUMNS, ticker, lo_us, hi_us)

    def _book_rows(
        self,
        table: str,
        column: str,
        columns: Sequence[str],
        ticker: str,
        lo_us: int,
        hi_us: int,
    ) -> pa.Table:
        """The reader's range is whole ms, both ends in: read wider, keep [lo_us, hi_us)."""
        rows = self._reader.read_book_rows(
            table, ticker, column, lo_us // 1000, hi_us // 1000 + 1, columns
        )
        micros = rows[column].cast(pa.int64())
        return rows.filter(pc.and_(pc.greater_equal(micros, lo_us), pc.less(micros, hi_us)))
