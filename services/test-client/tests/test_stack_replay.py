"""Replay through the REAL REST catalog + S3 (local_stack): tables `ticks`, `ohlc`,
`book_snapshots` and `book_deltas` made from mdproto.tables, replayed by the SDK: every
stored row of a 10-minute window in event-time order, in the live topics' messages,
the end marker, and a resume from a cursor taken halfway that delivers the rest once.

Trades of two tickers come in two appends whose times interleave (and tie in one ms);
BTC's book has a snapshot before the window, deltas on both sides of its start and a
snapshot inside it; BTC has 1-minute candles."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.transforms import DayTransform, IdentityTransform, MonthTransform

from mdclient.book_history import book_at_from
from mdclient.config import ClientSettings
from mdclient.errors import UnknownTicker
from mdclient.frames import IcebergReader
from mdclient.replay import ReplayComplete, replay_from, replay_query
from mdproto.messages import OHLC, BookDelta, BookSnapshot, Tick
from mdproto.tables import BookDeltas, BookSnapshots, Ohlc, TableSchema, Ticks, arrow_schema

pytestmark = pytest.mark.stack

BTC, ETH = "BINANCE:BTC/USDT", "BINANCE:ETH/USDT"
MINUTE = 60_000
START = 1_700_000_000_000 // MINUTE * MINUTE
END = START + 10 * MINUTE
BTC_TIMES = [START - 5_000] + [START + k * 7_919 for k in range(76)]  # one before the window
ETH_TIMES = [START + 3 + k * 13_001 for k in range(46)] + [START + 7_919]  # a tie with BTC
_TRANSFORMS: dict[str, Any] = {
    "identity": IdentityTransform(),
    "day": DayTransform(),
    "month": MonthTransform(),
}


def new_table(catalog: Any, name: str, shape: TableSchema) -> Any:
    with catalog.create_table(name, schema=arrow_schema(shape)).update_spec() as spec:
        for p in shape.partitioning:
            spec.add_field(p.column, _TRANSFORMS[p.transform])
    return catalog.load_table(name)


def ticks(ticker: str, times_ms: list[int]) -> pa.Table:
    exchange, _, symbol = ticker.partition(":")
    return pa.Table.from_pylist(
        [
            {
                Ticks.TICKER: ticker, Ticks.EXCHANGE: exchange, Ticks.SYMBOL: symbol,
                Ticks.TRADE_ID: f"{ticker[8:11]}{i:03d}", Ticks.PRICE: 100.0 + i,
                Ticks.AMOUNT: 0.25, Ticks.SIDE: "SELL" if i % 2 else "BUY",
                Ticks.TRADE_TIME: ms * 1000, Ticks.INGESTED_AT: (ms + 7) * 1000,
            }
            for i, ms in enumerate(times_ms)
        ],
        schema=arrow_schema(Ticks.SCHEMA),
    )  # fmt: skip


def candles(ticker: str, count: int) -> pa.Table:
    rows = []
    for i in range(count):
        rows.append(
            {
                Ohlc.TICKER: ticker, Ohlc.EXCHANGE: "BINANCE", Ohlc.SYMBOL: ticker[8:],
                Ohlc.PERIOD_SECONDS: 60, Ohlc.OPEN_TIME: (START + i * MINUTE) * 1000,
                Ohlc.OPEN: 1.0 + i, Ohlc.HIGH: 2.0 + i, Ohlc.LOW: 0.5 + i, Ohlc.CLOSE: 1.5 + i,
                Ohlc.VOLUME: 3.0, Ohlc.TRADE_COUNT: 4 + i, Ohlc.SOURCE: "history",
            }
        )  # fmt: skip
    schema = arrow_schema(Ohlc.SCHEMA)
    full = [{name: row.get(name) for name in schema.names} for row in rows]
    return pa.Table.from_pylist(full, schema=schema)


def levels(*pairs: tuple[float, float]) -> list[dict[str, float]]:
    return [{"price": p, "amount": a} for p, a in pairs]


def snapshot(at_ms: int, seq: int, bids: Any, asks: Any) -> dict[str, Any]:
    return {
        BookSnapshots.TICKER: BTC, BookSnapshots.EXCHANGE: "BINANCE",
        BookSnapshots.SYMBOL: "BTC/USDT", BookSnapshots.SNAPSHOT_TIME: at_ms * 1000,
        BookSnapshots.EXCHANGE_SEQUENCE: seq, BookSnapshots.DEPTH: 10,
        BookSnapshots.RESET: "BOOK_RESET_NONE", BookSnapshots.BIDS: bids,
        BookSnapshots.ASKS: asks, BookSnapshots.INGESTED_AT: at_ms * 1000,
    }  # fmt: skip


def delta(at_ms: int, seq: int, bid: float, amount: float) -> dict[str, Any]:
    return {
        BookDeltas.TICKER: BTC, BookDeltas.EXCHANGE: "BINANCE", BookDeltas.SYMBOL: "BTC/USDT",
        BookDeltas.DELTA_TIME: at_ms * 1000, BookDeltas.EXCHANGE_SEQUENCE: seq,
        BookDeltas.EXCHANGE_PREV_SEQUENCE: seq - 1, BookDeltas.BIDS: levels((bid, amount)),
        BookDeltas.ASKS: [], BookDeltas.INGESTED_AT: at_ms * 1000,
        BookDeltas.KAFKA_PARTITION: 0, BookDeltas.KAFKA_OFFSET: seq,
    }  # fmt: skip


SNAPSHOTS = [
    snapshot(START - 30_000, 100, levels((99.0, 1.0)), levels((101.0, 1.0))),
    # written with the delta of the same update (sequence 130, 29.3 s into the window)
    snapshot(START + 29_300, 130, levels((98.0, 2.0)), levels((101.0, 1.0))),
]
DELTAS = [delta(START - 20_000 + k * 1_700, 101 + k, 99.0 - (k % 3), 1.0 + k) for k in range(60)]


@pytest.fixture(scope="module")
def lake(local_stack: Any) -> dict[str, Any]:
    endpoints = local_stack.endpoints
    catalog = load_catalog(endpoints.catalog_name, **endpoints.pyiceberg_catalog_properties())
    ns = f"replay_{uuid.uuid4().hex[:8]}"
    catalog.create_namespace(ns)
    tick_table = new_table(catalog, f"{ns}.ticks", Ticks.SCHEMA)
    btc = ticks(BTC, BTC_TIMES)
    even = btc.take(list(range(0, len(BTC_TIMES), 2)))
    tick_table.append(pa.concat_tables([even, ticks(ETH, ETH_TIMES)]))
    tick_table.append(btc.take(list(range(1, len(BTC_TIMES), 2))))  # interleaves with `even`
    new_table(catalog, f"{ns}.ohlc", Ohlc.SCHEMA).append(candles(BTC, 12))
    books = new_table(catalog, f"{ns}.book_snapshots", BookSnapshots.SCHEMA)
    books.append(pa.Table.from_pylist(SNAPSHOTS, schema=arrow_schema(BookSnapshots.SCHEMA)))
    changes = new_table(catalog, f"{ns}.book_deltas", BookDeltas.SCHEMA)
    changes.append(pa.Table.from_pylist(DELTAS, schema=arrow_schema(BookDeltas.SCHEMA)))
    props = endpoints.catalog_settings().model_dump()
    named = {"name": "catalog_name", "uri": "catalog_uri"}
    fields = {named.get(key, key): str(value) for key, value in props.items()}
    settings = ClientSettings.model_validate(
        {
            **fields,
            "ticks_table": f"{ns}.ticks",
            "ohlc_table": f"{ns}.ohlc",
            "book_snapshots_table": f"{ns}.book_snapshots",
            "book_deltas_table": f"{ns}.book_deltas",
        }
    )
    reader = IcebergReader(settings.catalog_properties(), catalog_name=settings.catalog_name)
    return {"settings": settings, "reader": reader}


CHANNELS = ("trades", "book", "ohlc:1m")


def replay(lake: dict[str, Any], tickers: tuple[str, ...], cursor: str | None = None) -> Any:
    query = replay_query(
        tickers, START, END, channels=CHANNELS, speed="max", cursor=cursor, now_ms=END
    )
    return replay_from(lake["reader"], lake["settings"], query)


def event_time(message: Any) -> int:
    if isinstance(message, Tick):
        return int(message.timestamp_ms)
    if isinstance(message, OHLC):
        return int(message.open_time_ms) + 60_000
    return int(message.exchange_time_ms)


def without_sequence(messages: list[tuple[str, Any]]) -> list[tuple[str, bytes]]:
    out = []
    for topic, message in messages:
        copy = type(message)()
        copy.CopyFrom(message)
        copy.sequence = 0
        out.append((topic, copy.SerializeToString(deterministic=True)))
    return out


def test_every_stored_row_is_replayed_in_order_and_a_resume_delivers_the_rest_once(
    lake: dict[str, Any],
) -> None:
    run = replay(lake, (BTC, ETH))
    got: list[tuple[str, Any]] = []
    for message in run:
        if isinstance(message, ReplayComplete):
            done = message
            break
        got.append((run.topic, message))
    else:
        pytest.fail("no replay complete marker")
    by_topic: dict[str, list[Any]] = {}
    for topic, message in got:
        by_topic.setdefault(topic, []).append(message)

    in_window = sorted((ms, i) for i, ms in enumerate(BTC_TIMES) if START <= ms < END)
    assert [(t.timestamp_ms, t.trade_id) for t in by_topic[f"{BTC}|tick"]] == [
        (ms, f"BTC{i:03d}") for ms, i in in_window
    ]
    eth = sorted((ms, f"ETH{i:03d}") for i, ms in enumerate(ETH_TIMES) if ms < END)
    assert [(t.timestamp_ms, t.trade_id) for t in by_topic[f"{ETH}|tick"]] == eth
    assert [c.open_time_ms for c in by_topic[f"{BTC}|ohlc:60"]] == [
        START + i * MINUTE for i in range(10)
    ]
    book = by_topic[f"{BTC}|book"]
    stored = [d for d in DELTAS if d[BookDeltas.DELTA_TIME] >= START * 1000]
    assert isinstance(book[0], BookSnapshot)  # the book just before the window
    expected_start = book_at_from(
        BTC,
        pa.Table.from_pylist(SNAPSHOTS[:1], schema=arrow_schema(BookSnapshots.SCHEMA)),
        pa.Table.from_pylist(DELTAS, schema=arrow_schema(BookDeltas.SCHEMA)),
        START - 1,
    )
    assert book[0].exchange_sequence == expected_start.exchange_sequence
    changes = [(type(m), m.exchange_sequence) for m in book[1:]]
    assert changes == sorted(
        [(BookDelta, d[BookDeltas.EXCHANGE_SEQUENCE]) for d in stored] + [(BookSnapshot, 130)],
        key=lambda c: (c[1], c[0] is BookSnapshot),
    )
    for messages in by_topic.values():
        assert [m.sequence for m in messages] == list(range(1, len(messages) + 1))
    times = [START if m is book[0] else event_time(m) for _, m in got]
    assert times == sorted(times)
    assert done.messages == len(got) == sum(done.per_topic.values())

    half = len(got) // 2
    first = replay(lake, (BTC, ETH))
    head = [(first.topic, m) for m in itertools.islice(first, half)]
    first.close()
    second = replay(lake, (BTC, ETH), cursor=first.cursor)
    rest = [(second.topic, m) for m in second if not isinstance(m, ReplayComplete)]
    assert second.complete
    resumed_book = next(m for t, m in rest if t == f"{BTC}|book")
    assert isinstance(resumed_book, BookSnapshot)  # the book at the cursor, then the rest
    rest = [(t, m) for t, m in rest if m is not resumed_book]
    assert without_sequence(head + rest) == without_sequence(got)


def test_an_unknown_ticker_is_refused(lake: dict[str, Any]) -> None:
    with pytest.raises(UnknownTicker):
        replay(lake, (BTC, "BINANCE:DOGE/USDT"))
