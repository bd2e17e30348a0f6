"""Replay without Iceberg: merge order, sequences, cursor resume, pacing on an injected
clock, the book a stream starts from, and the request checks."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from mdclient.book_history import DELTA_COLUMNS, SNAPSHOT_COLUMNS
from mdclient.errors import InvalidRequest, UnknownTicker
from mdclient.replay import (
    TRADE_COLUMNS,
    Channel,
    Cursor,
    Pacer,
    Replay,
    ReplayComplete,
    ReplayLimits,
    ReplayQuery,
    open_replay,
    parse_channel,
    parse_speed,
    replay_query,
    tick_items,
)
from mdproto.book import OrderBook
from mdproto.messages import OHLC, BookDelta, BookSnapshot, TakerSide, Tick
from mdproto.tables import BookDeltas, BookSnapshots, Ticks, arrow_schema

BTC, ETH = "BINANCE:BTC/USDT", "BINANCE:ETH/USDT"
T0 = 1_700_000_000_000
NOW = T0 + 86_400_000
Levels = list[tuple[float, float]]


def _levels(levels: Levels) -> list[dict[str, float]]:
    return [{"price": p, "amount": a} for p, a in levels]


class Store:
    """A `ReplayStore` over in-memory rows; `reads` records every read (kind, lo, hi)."""

    def __init__(self) -> None:
        self.trade_rows: dict[str, list[dict[str, Any]]] = {}
        self.candle_rows: dict[tuple[str, int], list[OHLC]] = {}
        self.snapshot_rows: dict[str, list[dict[str, Any]]] = {}
        self.delta_rows: dict[str, list[dict[str, Any]]] = {}
        self.reads: list[tuple[str, int, int]] = []
        self.group_ms = 1000

    def trade(self, ticker: str, at_ms: int, trade_id: str, price: float = 1.0) -> None:
        self.trade_rows.setdefault(ticker, []).append(
            {
                Ticks.TRADE_ID: trade_id,
                Ticks.PRICE: price,
                Ticks.AMOUNT: 0.5,
                Ticks.SIDE: "BUY",
                Ticks.TRADE_TIME: at_ms * 1000,
                Ticks.INGESTED_AT: at_ms * 1000 + 7000,
            }
        )

    def candle(self, ticker: str, period: int, open_ms: int) -> None:
        self.candle_rows.setdefault((ticker, period), []).append(
            OHLC(ticker=ticker, period_seconds=period, open_time_ms=open_ms, close=2.0, closed=True)
        )

    def snapshot(self, ticker: str, at_ms: int, seq: int, bids: Levels, asks: Levels) -> None:
        self.snapshot_rows.setdefault(ticker, []).append(
            {
                BookSnapshots.SNAPSHOT_TIME: at_ms * 1000,
                BookSnapshots.EXCHANGE_SEQUENCE: seq,
                BookSnapshots.DEPTH: 10,
                BookSnapshots.BIDS: _levels(bids),
                BookSnapshots.ASKS: _levels(asks),
            }
        )

    def delta(self, ticker: str, at_ms: int, seq: int, bids: Levels, asks: Levels) -> None:
        rows = self.delta_rows.setdefault(ticker, [])
        rows.append(
            {
                BookDeltas.DELTA_TIME: at_ms * 1000,
                BookDeltas.EXCHANGE_SEQUENCE: seq,
                BookDeltas.EXCHANGE_PREV_SEQUENCE: seq - 1,
                BookDeltas.BIDS: _levels(bids),
                BookDeltas.ASKS: _levels(asks),
                BookDeltas.KAFKA_OFFSET: len(rows),
            }
        )

    # --- ReplayStore ---

    def holds(self, ticker: str, channel: Channel) -> bool:
        if channel.kind == "trades":
            return ticker in self.trade_rows
        if channel.kind == "book":
            return ticker in self.snapshot_rows
        return (ticker, channel.period_seconds) in self.candle_rows

    def trade_groups(self, ticker: str, lo_ms: int, hi_ms: int) -> Iterator[pa.Table]:
        """A group per `group_ms` of time (as files of that span would be), each read
        (and recorded) when the consumer reaches it, rows in reverse (any order)."""
        for a in range(lo_ms, hi_ms, self.group_ms):
            b = min(a + self.group_ms, hi_ms)
            self.reads.append(("trades", a, b))
            rows = [
                r
                for r in self.trade_rows.get(ticker, [])
                if a * 1000 <= r[Ticks.TRADE_TIME] < b * 1000
            ]
            schema = arrow_schema(Ticks.SCHEMA, TRADE_COLUMNS)
            yield pa.Table.from_pylist(rows[::-1], schema=schema)

    def candles(self, ticker: str, period: int, lo_ms: int, hi_ms: int) -> list[OHLC]:
        self.reads.append(("candles", lo_ms, hi_ms))
        found = self.candle_rows.get((ticker, period), [])
        return [c for c in found if lo_ms <= c.open_time_ms < hi_ms]

    def book_snapshots(self, ticker: str, lo_us: int, hi_us: int) -> pa.Table:
        self.reads.append(("snapshots", lo_us, hi_us))
        rows = self.snapshot_rows.get(ticker, [])
        kept = [r for r in rows if lo_us <= r[BookSnapshots.SNAPSHOT_TIME] < hi_us]
        schema = arrow_schema(BookSnapshots.SCHEMA, SNAPSHOT_COLUMNS)
        return pa.Table.from_pylist(kept, schema=schema)

    def book_deltas(self, ticker: str, lo_us: int, hi_us: int) -> pa.Table:
        self.reads.append(("deltas", lo_us, hi_us))
        rows = self.delta_rows.get(ticker, [])
        kept = [r for r in rows if lo_us <= r[BookDeltas.DELTA_TIME] < hi_us]
        return pa.Table.from_pylist(kept, schema=arrow_schema(BookDeltas.SCHEMA, DELTA_COLUMNS))


SMALL = ReplayLimits(trade_chunk=3, book_slice_ms=1000, candle_slice=2)


def query(
    tickers: tuple[str, ...] = (BTC,),
    channels: tuple[str, ...] = ("trades",),
    *,
    start: int = T0,
    end: int = T0 + 10_000,
    speed: float | str = "max",
    cursor: str | None = None,
) -> ReplayQuery:
    return replay_query(
        tickers, start, end, channels=channels, speed=speed, cursor=cursor, now_ms=NOW
    )


def busy_store() -> Store:
    """Two tickers' trades (ties in one ms, across 1 s slices), 1 s candles, a book."""
    store = Store()
    for i in range(12):
        store.trade(BTC, T0 + i * 700, f"b{i}")
        store.trade(ETH, T0 + i * 700, f"e{i}")
    store.trade(BTC, T0 + 1400, "b2x")  # a tie with b2 in one ms
    for i in range(9):
        store.candle(BTC, 1, T0 + i * 1000)
    store.snapshot(BTC, T0 - 500, 10, [(100.0, 1.0)], [(101.0, 1.0)])
    store.delta(BTC, T0 - 200, 11, [(100.0, 2.0)], [])  # before the range: in the first book
    store.delta(BTC, T0 + 300, 12, [(99.0, 1.0)], [])
    store.delta(BTC, T0 + 2500, 13, [], [(101.0, 0.0), (102.0, 3.0)])
    store.snapshot(BTC, T0 + 5000, 13, [(100.0, 2.0), (99.0, 1.0)], [(102.0, 3.0)])
    store.delta(BTC, T0 + 5000, 14, [(100.5, 1.0)], [])
    return store


CHANNELS = ("trades", "book", "ohlc:1s")


def run(replay: Replay) -> tuple[list[tuple[str, Any]], ReplayComplete | None]:
    """(topic, message) of every message, and the marker."""
    out: list[tuple[str, Any]] = []
    for message in replay:
        if isinstance(message, ReplayComplete):
            return out, message
        out.append((replay.topic, message))
    return out, None


def event_time(message: Any) -> int:
    if isinstance(message, Tick):
        return int(message.timestamp_ms)
    if isinstance(message, OHLC):
        return int(message.open_time_ms + message.period_seconds * 1000)
    return int(message.exchange_time_ms)


def test_merges_every_stored_message_in_event_time_order_with_its_own_sequences() -> None:
    store = busy_store()
    replay = open_replay(store, query((BTC, ETH), CHANNELS), limits=SMALL)
    got, done = run(replay)
    by_topic: dict[str, list[Any]] = {}
    for topic, message in got:
        by_topic.setdefault(topic, []).append(message)
    assert set(by_topic) == {"BINANCE:BTC/USDT|tick", "BINANCE:ETH/USDT|tick",
                             "BINANCE:BTC/USDT|book", "BINANCE:BTC/USDT|ohlc:1"}  # fmt: skip
    ticks = by_topic["BINANCE:BTC/USDT|tick"]
    assert [t.trade_id for t in ticks] == [
        "b0", "b1", "b2", "b2x", *(f"b{i}" for i in range(3, 12))
    ]  # fmt: skip
    assert ticks[0] == Tick(
        ticker=BTC,
        trade_id="b0",
        price=1.0,
        amount=0.5,
        timestamp_ms=T0,
        side=TakerSide.BUY,
        ingested_at_ms=T0 + 7,
        sequence=1,
        publisher_epoch=T0,
    )
    # the book starts from the book just before the range, then every stored change in it
    book = by_topic["BINANCE:BTC/USDT|book"]
    assert [type(m).__name__ for m in book] == [
        "BookSnapshot", "BookDelta", "BookDelta", "BookSnapshot", "BookDelta"
    ]  # fmt: skip
    assert [(lv.price, lv.amount) for lv in book[0].bids] == [(100.0, 2.0)]
    assert book[0].exchange_sequence == 11
    assert [m.exchange_sequence for m in book[1:]] == [12, 13, 13, 14]
    # candles at their close: open times in the range, each after its second ends
    candles = by_topic["BINANCE:BTC/USDT|ohlc:1"]
    assert [c.open_time_ms for c in candles] == [T0 + i * 1000 for i in range(9)]
    for messages in by_topic.values():
        assert [m.sequence for m in messages] == list(range(1, len(messages) + 1))
    times = [event_time(m) for _, m in got]
    times[got.index(("BINANCE:BTC/USDT|book", book[0]))] = T0  # the start book is at start
    assert times == sorted(times)
    assert done is not None and done.messages == len(got)
    assert done.per_topic["BINANCE:ETH/USDT|tick"] == 12
    assert replay.complete


def test_at_one_time_the_streams_go_in_the_order_asked() -> None:
    store = busy_store()
    got, _ = run(open_replay(store, query((ETH, BTC), ("trades",)), limits=SMALL))
    at_t0 = [m.trade_id for _, m in got if m.timestamp_ms == T0]
    assert at_t0 == ["e0", "b0"]


def _stored(got: list[tuple[str, Any]]) -> list[tuple[str, bytes]]:
    """The stored messages as (topic, bytes) without their sequence (a resumed book
    topic's first snapshot takes one), the book a fresh stream starts from left out."""
    out = []
    for topic, m in got:
        if isinstance(m, BookSnapshot) and m.exchange_sequence == 11:
            continue
        copy = type(m)()
        copy.CopyFrom(m)
        copy.sequence = 0
        out.append((topic, copy.SerializeToString(deterministic=True)))
    return out


@pytest.mark.parametrize("stop", [1, 2, 5, 9, 17, 30, 38])
def test_a_resume_from_the_cursor_delivers_the_rest_exactly_once(stop: int) -> None:
    store = busy_store()
    full, _ = run(open_replay(store, query((BTC, ETH), CHANNELS), limits=SMALL))
    assert len(full) == 39
    first = open_replay(store, query((BTC, ETH), CHANNELS), limits=SMALL)
    head = [(first.topic, m) for m in itertools.islice(first, stop)]
    first.close()
    assert next(first, None) is None  # closed: no marker
    cursor = first.cursor
    second = open_replay(store, query((BTC, ETH), CHANNELS, cursor=cursor), limits=SMALL)
    rest, done = run(second)
    assert done is not None
    # the resumed book topic restarts from the book at the cursor: one snapshot, the
    # next sequence, equal to the book a client built from what it received
    head_book = [m for t, m in head if t.endswith("|book")]
    if head_book:
        resumed = next(m for t, m in rest if t.endswith("|book"))
        assert isinstance(resumed, BookSnapshot)
        assert resumed.sequence == head_book[-1].sequence + 1
        built = OrderBook(BTC)
        for m in head_book:
            built.replace(m) if isinstance(m, BookSnapshot) else built.apply(m)
        rebuilt = OrderBook(BTC)
        rebuilt.replace(resumed)
        assert rebuilt == built
        rest = [(t, m) for t, m in rest if m is not resumed]
    assert _stored(head) + _stored(rest) == _stored(full)


def test_sequences_and_epoch_continue_across_a_resume() -> None:
    store = busy_store()
    first = open_replay(store, query(channels=("trades",)), limits=SMALL)
    head = list(itertools.islice(first, 4))
    second = open_replay(store, query(channels=("trades",), cursor=first.cursor), limits=SMALL)
    rest, _ = run(second)
    sequences = [m.sequence for m in head] + [m.sequence for _, m in rest]
    assert sequences == list(range(1, 14))
    assert {m.publisher_epoch for _, m in rest} == {T0}


class Clock:
    """A clock that only `sleep` moves."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_paced_replay_keeps_event_spacing_divided_by_speed() -> None:
    store = Store()
    for i, at in enumerate([0, 1000, 1000, 4000, 9000]):
        store.trade(BTC, T0 + at, f"t{i}")
    clock = Clock()
    replay = open_replay(store, query(speed=10), clock=clock, sleep=clock.sleep, marker=False)
    seen = []
    for message in replay:
        seen.append((round(clock.now - 100.0, 6), message.timestamp_ms - T0))  # type: ignore[union-attr]
    assert seen == [(0.0, 0), (0.1, 1000), (0.1, 1000), (0.4, 4000), (0.9, 9000)]
    assert clock.sleeps == pytest.approx([0.1, 0.3, 0.5])


def test_a_slow_consumer_gets_late_events_at_once_and_max_never_sleeps() -> None:
    clock = Clock()
    pacer = Pacer(2.0, clock)
    assert pacer.delay(T0) == 0.0
    clock.now += 5.0  # the consumer was busy 5 s: 10 s of events are due
    assert pacer.delay(T0 + 4000) == 0.0
    assert pacer.delay(T0 + 12_000) == pytest.approx(1.0)
    store = busy_store()
    replay = open_replay(store, query(), clock=clock, sleep=clock.sleep)
    clock.sleeps.clear()
    assert len(run(replay)[0]) == 13 and clock.sleeps == []


def test_max_reads_one_slice_per_stream_ahead_of_the_consumer() -> None:
    store = Store()
    for i in range(100):
        store.trade(BTC, T0 + i * 100, f"t{i}")
    replay = open_replay(store, query(end=T0 + 10_000), limits=SMALL)
    next(replay)
    assert store.reads == [("trades", T0, T0 + 1000)]
    for _ in range(10):
        next(replay)
    assert store.reads[-1] == ("trades", T0 + 1000, T0 + 2000) and len(store.reads) == 2


def test_book_deltas_before_the_first_snapshot_are_left_out() -> None:
    store = Store()
    store.delta(BTC, T0 + 10, 5, [(1.0, 1.0)], [])
    store.snapshot(BTC, T0 + 20, 6, [(1.0, 2.0)], [(2.0, 1.0)])
    store.delta(BTC, T0 + 30, 7, [(1.0, 3.0)], [])
    got, _ = run(open_replay(store, query(channels=("book",))))
    assert [(type(m), m.exchange_sequence) for _, m in got] == [(BookSnapshot, 6), (BookDelta, 7)]


def test_parse_channel_and_speed() -> None:
    assert parse_channel("trades") == Channel("trades")
    assert parse_channel(" BOOK ") == Channel("book")
    assert parse_channel("ohlc:1m") == Channel("ohlc", 60)
    assert parse_channel("ohlc:60").topic(BTC) == "BINANCE:BTC/USDT|ohlc:60"
    assert parse_speed("max") is None
    assert parse_speed(10) == 10.0
    assert parse_speed("10x") == 10.0
    assert parse_speed(0.5) == 0.5
    for bad in ("ticks", "ohlc", "ohlc:0", "ohlc:x", "book:1", ""):
        with pytest.raises(InvalidRequest) as info:
            parse_channel(bad)
        assert info.value.error_code == "bad_channel"
    for speed in (0, -1, "fast", float("nan"), float("inf"), True, "", 2e6):
        with pytest.raises(InvalidRequest) as info:
            parse_speed(speed)  # type: ignore[arg-type]
        assert info.value.error_code == "bad_speed"


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"tickers": ("btc-usdt",)}, "bad_ticker"),
        ({"start": T0 + 10, "end": T0}, "bad_time_range"),
        ({"start": T0, "end": T0}, "bad_time_range"),
        ({"start": 0}, "bad_time_range"),
        ({"end": NOW + 2 * 86_400_000}, "bad_time_range"),
        ({"start": T0 - 400 * 86_400_000}, "range_too_large"),
        ({"start": "yesterday-ish"}, "bad_time"),
        ({"channels": ()}, "bad_channel"),
        ({"channels": ("trades", "quotes")}, "bad_channel"),
        ({"speed": 0}, "bad_speed"),
        ({"cursor": "not a cursor"}, "bad_cursor"),
        ({"cursor": "eyJ2IjoyfQ"}, "bad_cursor"),  # {"v":2}
        ({"cursor": Cursor(T0, {}).encode()[:-3]}, "bad_cursor"),
    ],
)
def test_bad_requests_have_clear_codes(kwargs: dict[str, Any], code: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        query(**kwargs)
    assert info.value.error_code == code


def test_a_cursor_of_another_replay_or_outside_the_range_is_refused() -> None:
    store = busy_store()
    other = open_replay(store, query((ETH,)), limits=SMALL)
    next(other)
    with pytest.raises(InvalidRequest, match="another replay") as info:
        query((BTC,), cursor=other.cursor)
    assert info.value.error_code == "bad_cursor"
    mine = open_replay(store, query(), limits=SMALL)
    next(mine)
    with pytest.raises(InvalidRequest, match="outside") as info:
        query(start=T0 + 5000, cursor=mine.cursor)
    assert info.value.error_code == "bad_cursor"


def test_an_unknown_ticker_is_refused_before_any_message() -> None:
    store = busy_store()
    with pytest.raises(UnknownTicker) as info:
        open_replay(store, query((BTC, "BINANCE:DOGE/USDT")))
    assert info.value.error_code == "unknown_ticker"
    assert store.reads == []
    # stored for one channel asked is enough: the others are simply empty
    got, done = run(open_replay(store, query((ETH,), ("trades", "book"))))
    assert len(got) == 12 and done is not None


def test_the_cli_prints_lines_a_cursor_and_resumes_with_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from mdclient import replay as replay_module
    from mdclient.cli import main

    store = busy_store()

    def from_store(reader: object, settings: object, q: ReplayQuery, **kw: Any) -> Replay:
        return open_replay(store, q, limits=SMALL, **kw)

    monkeypatch.setattr(replay_module, "replay_from", from_store)
    args = ["replay", BTC, ETH, "--start", str(T0), "--end", str(T0 + 10_000)]
    assert main([*args, "--channels", "trades,ohlc:1s", "--count", "5"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert len(lines) == 5 and "#b0" in lines[0] and lines[0].endswith("[1]")
    cursor = err.split("--cursor ")[1].split()[0]
    assert main([*args, "--channels", "trades,ohlc:1s", "--cursor", cursor]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 13 + 12 + 9 - 5
    assert "replay complete: 29 messages" in err
    assert main([*args, "--speed", "fast"]) == 2
    assert "bad_speed" in capsys.readouterr().err
    assert main(["replay", "BINANCE:DOGE/USDT", "--start", str(T0), "--end", str(T0 + 1)]) == 6


def test_follow_goes_on_into_live_ticks_without_a_gap_or_a_duplicate_at_the_seam() -> None:
    from mdclient.replay import FollowLive, LiveBuffer, Position

    store = Store()
    for i in range(3):
        store.trade(BTC, T0 + i * 100, f"t{i}")
    live = LiveBuffer(100)
    # t3 was published before the live subscription and is not stored yet when the
    # replay reads; live brings t4 on, t5 twice (a relay's duplicate)
    for i in (4, 5, 5, 6, 7):
        live.put(Tick(ticker=BTC, trade_id=f"t{i}", timestamp_ms=T0 + i * 100, sequence=40 + i))
    q = query(end=T0 + 450)
    stored = open_replay(store, q, limits=SMALL)
    polls: list[tuple[Position | None, int]] = []

    def reread(topic: str, position: Position | None, end_ms: int) -> Replay:
        polls.append((position, end_ms))
        cursor = Cursor(q.epoch, {} if position is None else {topic: position}).encode()
        again = replay_query((BTC,), T0, end_ms, cursor=cursor, now_ms=NOW)
        return open_replay(store, again, limits=SMALL)

    def sleep(seconds: float) -> None:  # the pipeline stores t3 to t5 meanwhile
        for i in (3, 4, 5):
            store.trade(BTC, T0 + i * 100, f"t{i}")

    follow = FollowLive(stored, reread, live, sleep=sleep, clock=lambda: 0.0)
    got = [next(follow) for _ in range(9)]
    assert isinstance(got[3], ReplayComplete)  # the stored range is done: the seam
    ticks = [m for m in got if isinstance(m, Tick)]
    assert [t.trade_id for t in ticks] == [f"t{i}" for i in range(8)]
    assert [t.sequence for t in ticks] == list(range(1, 9))
    assert {t.publisher_epoch for t in ticks} == {T0}
    assert [end for _, end in polls] == [T0 + 401, T0 + 401]  # t4 not stored, then stored
    assert polls[0][0] is not None and polls[0][0].time_ms == T0 + 200
    assert follow.duplicates == 1


def test_follow_ends_with_a_seam_timeout_when_the_store_never_holds_the_first_live_one() -> None:
    """No silent gap: the trades between the replay and live could not be read."""
    from mdclient.errors import ReplaySeamTimeout
    from mdclient.replay import FollowLive, LiveBuffer, Position

    store = Store()
    store.trade(BTC, T0, "t0")
    live = LiveBuffer(100)
    live.put(Tick(ticker=BTC, trade_id="t9", timestamp_ms=T0 + 900))
    q = query(end=T0 + 450)
    clock = Clock()

    def reread(topic: str, position: Position | None, end_ms: int) -> Replay:
        return open_replay(store, replay_query((BTC,), T0, end_ms, now_ms=NOW))

    follow = FollowLive(
        open_replay(store, q), reread, live, sleep=clock.sleep, clock=clock, seam_timeout_s=2.0
    )
    got = [next(follow) for _ in range(2)]
    assert [getattr(m, "trade_id", None) for m in got] == ["t0", None]
    with pytest.raises(ReplaySeamTimeout, match="t9") as ended:
        next(follow)
    assert ended.value.error_code == "seam_timeout"
    assert sum(clock.sleeps) == pytest.approx(2.0)


def test_follow_goes_on_into_live_candles_keeping_corrections_and_dropping_previews() -> None:
    from mdclient.replay import FollowLive, LiveBuffer, Position

    store = Store()
    for i in range(3):
        store.candle(BTC, 1, T0 + i * 1000)
    live = LiveBuffer(100)

    def candle(i: int, **kw: Any) -> OHLC:
        return OHLC(ticker=BTC, period_seconds=1, open_time_ms=T0 + i * 1000, **kw)

    # c3 closed before the subscription and is not stored yet when the replay reads;
    # live brings c4 on (a preview first), c4 again (a relay's repeat), its correction
    for message in (
        candle(4, closed=False),
        candle(4, closed=True),
        candle(4, closed=True),
        candle(4, closed=True, correction=True, close=3.0),
        candle(5, closed=True),
    ):
        live.offer(message)
    q = query(channels=("ohlc:1s",), end=T0 + 3500)
    polls: list[tuple[Position | None, int]] = []

    def reread(topic: str, position: Position | None, end_ms: int) -> Replay:
        polls.append((position, end_ms))
        cursor = Cursor(q.epoch, {} if position is None else {topic: position}).encode()
        again = replay_query((BTC,), T0, end_ms, channels=("ohlc:1s",), cursor=cursor, now_ms=NOW)
        return open_replay(store, again, limits=SMALL)

    def sleep(seconds: float) -> None:  # the pipeline stores c3 and c4 meanwhile
        for i in (3, 4):
            store.candle(BTC, 1, T0 + i * 1000)

    follow = FollowLive(
        open_replay(store, q, limits=SMALL), reread, live, sleep=sleep, clock=lambda: 0.0
    )
    got = [next(follow) for _ in range(8)]
    assert isinstance(got[3], ReplayComplete)
    candles = [m for m in got if isinstance(m, OHLC)]
    assert [(c.open_time_ms - T0) // 1000 for c in candles] == [0, 1, 2, 3, 4, 4, 5]
    assert [c.correction for c in candles] == [False] * 5 + [True, False]
    assert [c.sequence for c in candles] == list(range(1, 8))
    assert [end for _, end in polls] == [T0 + 4001, T0 + 4001]  # c4 not stored, then stored
    assert (follow.duplicates, live.dropped) == (1, 0)


def test_replay_into_live_refuses_the_book_before_subscribing(
    fake_relay: Any, settings_for: Any
) -> None:
    import time

    from mdclient import Client

    start = int(time.time() * 1000) - 60_000
    with (
        Client(settings=settings_for(fake_relay)) as client,
        pytest.raises(InvalidRequest) as refused,
    ):
        client.replay_into_live(BTC, start, channels=("trades", "book"))
    assert refused.value.error_code == "bad_channel"
    assert ("sub", f"{BTC}|tick") not in fake_relay.events


def test_the_client_replays_into_live_ticks_subscribed_before_the_store_is_read(
    fake_relay: Any, settings_for: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from mdclient import Client
    from mdclient import replay as replay_module

    t0 = int(time.time() * 1000) - 600_000  # a recent start: ten minutes ago
    store = Store()
    for i in range(3):
        store.trade(BTC, t0 + i * 100, f"t{i}")
    wide = ReplayLimits()

    def from_store(reader: object, settings: object, q: ReplayQuery, **kw: Any) -> Replay:
        assert ("sub", f"{BTC}|tick") in fake_relay.events  # live first
        return open_replay(store, q, limits=wide, **kw)

    monkeypatch.setattr(replay_module, "replay_from", from_store)
    with Client(settings=settings_for(fake_relay)) as client:
        follow = client.replay_into_live(BTC, t0)
        stored = [next(follow) for _ in range(4)]
        store.trade(BTC, t0 + 300, "t3")  # stored meanwhile, with the first live one
        store.trade(BTC, t0 + 400, "t4")
        for i in (4, 4, 5):  # t3 came before the subscription; t4 twice (a relay's repeat)
            tick = Tick(ticker=BTC, trade_id=f"t{i}", timestamp_ms=t0 + i * 100)
            fake_relay.publish(f"{BTC}|tick", tick)
        live = [next(follow) for _ in range(3)]
        follow.close()
    assert isinstance(stored[3], ReplayComplete)
    ids = [m.trade_id for m in stored[:3] + live]  # type: ignore[union-attr]
    assert ids == ["t0", "t1", "t2", "t3", "t4", "t5"]
    assert [m.sequence for m in stored[:3] + live] == [1, 2, 3, 4, 5, 6]  # type: ignore[union-attr]
    assert follow.duplicates == 1


def test_the_cli_follows_into_live_after_the_stored_range(
    fake_relay: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import time

    from mdclient import replay as replay_module
    from mdclient.cli import main

    t0 = int(time.time() * 1000) - 600_000
    store = Store()
    for i in range(3):
        store.trade(BTC, t0 + i * 100, f"t{i}")
    wide = ReplayLimits()
    live_t3 = Tick(ticker=BTC, trade_id="t3", timestamp_ms=t0 + 300)
    published: list[Tick] = []

    def from_store(reader: object, settings: object, q: ReplayQuery, **kw: Any) -> Replay:
        if not published:  # the replay: t3 is live, not stored yet
            fake_relay.wait_for(lambda events: ("sub", f"{BTC}|tick") in events)
            fake_relay.publish(f"{BTC}|tick", live_t3)
            published.append(live_t3)
        else:  # the read at the seam: the pipeline has stored it
            store.trade(BTC, t0 + 300, "t3")
        return open_replay(store, q, limits=wide, **kw)

    monkeypatch.setattr(replay_module, "replay_from", from_store)
    endpoints = ["--request-endpoint", fake_relay.request_endpoint]
    endpoints += ["--market-data-endpoint", fake_relay.market_data_endpoint]
    args = ["replay", BTC, "--start", str(t0), "--follow", "--count", "4", *endpoints]
    assert main(args) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert len(lines) == 4 and all(f"#t{i}" in line for i, line in enumerate(lines))
    assert "replay complete: 3 messages; live from here" in err
    assert main([*args, "--end", "-1m"]) == 2


def test_batch_mode_gives_the_trades_of_every_ticker_in_the_replays_order() -> None:
    from mdclient.replay import TICKER_COLUMN, trade_batches_in_order

    store = busy_store()
    q = query((ETH, BTC), end=T0 + 10_000)
    batches = list(trade_batches_in_order(store, q, batch_rows=5))
    table = pa.Table.from_batches(batches)
    assert max(b.num_rows for b in batches) <= 5
    got = list(
        zip(table[TICKER_COLUMN].to_pylist(), table[Ticks.TRADE_ID].to_pylist(), strict=True)
    )
    stored, _ = run(open_replay(store, q, limits=SMALL))  # the message replay's order
    assert got == [(t.ticker, t.trade_id) for _, t in stored]
    assert table.column_names == [TICKER_COLUMN, *TRADE_COLUMNS]
    with pytest.raises(InvalidRequest) as refused:
        trade_batches_in_order(store, query(channels=("trades", "book")))
    assert refused.value.error_code == "bad_channel"
    with pytest.raises(UnknownTicker):
        trade_batches_in_order(store, query(("BINANCE:DOGE/USDT",)))


def test_trade_rows_become_the_live_topic_ticks_nulls_included() -> None:
    rows = pa.table(
        {
            Ticks.TRADE_ID: ["7", "8", "9"],
            Ticks.PRICE: [1.5, None, 2.0],
            Ticks.AMOUNT: [0.25, 0.5, None],
            Ticks.SIDE: ["SELL", None, "SIDEWAYS"],
            Ticks.TRADE_TIME: pa.array([1_000_999, 2_000_000, 2_000_001], pa.timestamp("us")),
            Ticks.INGESTED_AT: pa.array([1_500_000, None, 3_000_000], pa.timestamp("us")),
        }
    )
    items = tick_items(BTC, rows)
    assert [(i.time_ms, i.tie) for i in items] == [
        (1000, (1_000_999, "7")), (2000, (2_000_000, "8")), (2000, (2_000_001, "9"))
    ]  # fmt: skip
    assert [i.message for i in items] == [
        Tick(ticker=BTC, trade_id="7", price=1.5, amount=0.25, timestamp_ms=1000,
             side=TakerSide.SELL, ingested_at_ms=1500),
        Tick(ticker=BTC, trade_id="8", amount=0.5, timestamp_ms=2000),
        Tick(ticker=BTC, trade_id="9", price=2.0, timestamp_ms=2000, ingested_at_ms=3000),
    ]  # fmt: skip
