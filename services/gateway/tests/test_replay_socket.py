"""WebSocket /replay: the query, the pump (pacing on an injected clock, cursor frames,
the end) and the socket over a real aiohttp server with a fake store behind the SDK's
replay."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pyarrow as pa
import pytest
from aiohttp.test_utils import TestServer

from gateway.app import create_app
from gateway.config import GatewaySettings
from gateway.messages import GatewayError, message_frame
from gateway.replay_socket import LiveFrames, ReplayParams, parse_replay_query, pump
from mdclient.replay import (
    TRADE_COLUMNS,
    Channel,
    FollowLive,
    LiveBuffer,
    Replay,
    ReplayEvent,
    ReplayLimits,
    open_replay,
    replay_query,
)
from mdproto.messages import OHLC, Tick
from mdproto.tables import Ticks, arrow_schema

BTC, ETH = "BINANCE:BTC/USDT", "BINANCE:ETH/USDT"
T0 = 1_700_000_000_000


class TradeStore:
    """Trades only: every 100 ms of 2 s for BTC and ETH (ETH 50 ms later)."""

    def holds(self, ticker: str, channel: Channel) -> bool:
        return ticker in (BTC, ETH) and channel.kind == "trades"

    def trade_groups(self, ticker: str, lo_ms: int, hi_ms: int) -> Iterator[pa.Table]:
        for a in range(lo_ms, hi_ms, 500):  # a group per 500 ms
            yield self.trades(ticker, a, min(a + 500, hi_ms))

    def trades(self, ticker: str, lo_ms: int, hi_ms: int) -> pa.Table:
        shift = 50 if ticker == ETH else 0
        rows = [
            {
                Ticks.TRADE_ID: str(i),
                Ticks.PRICE: 1.0 + i,
                Ticks.AMOUNT: 1.0,
                Ticks.SIDE: "SELL",
                Ticks.TRADE_TIME: (T0 + shift + i * 100) * 1000,
                Ticks.INGESTED_AT: None,
            }
            for i in range(20)
            if lo_ms <= T0 + shift + i * 100 < hi_ms
        ]
        return pa.Table.from_pylist(rows, schema=arrow_schema(Ticks.SCHEMA, TRADE_COLUMNS))

    def candles(self, ticker: str, period: int, lo_ms: int, hi_ms: int) -> list[OHLC]:
        return []

    def book_snapshots(self, ticker: str, lo_us: int, hi_us: int) -> pa.Table:
        raise AssertionError("no book asked")

    book_deltas = book_snapshots


class FakePlatform:
    """SdkUpstream's replay over the SDK's replay of `TradeStore`."""

    def precision(self, ticker: str) -> Any:
        raise AssertionError("no book asked")

    def replay(self, params: ReplayParams) -> Replay:
        query = replay_query(
            params.tickers,
            params.start,
            params.end,
            channels=params.channels,
            speed=params.speed,
            cursor=params.cursor,
            now_ms=T0 + 86_400_000,
        )
        limits = ReplayLimits(trade_chunk=7)
        return open_replay(TradeStore(), query, limits=limits, marker=False)


def frames(
    path: str,
    upstream: FakePlatform | None = None,
    until: Callable[[dict[str, Any]], bool] = lambda frame: False,
) -> list[dict[str, Any]]:
    """Every frame the socket sends until it closes (or up to the first `until` holds
    for: then the client closes)."""

    async def run() -> list[dict[str, Any]]:
        app = create_app(GatewaySettings(), upstream=upstream or FakePlatform())  # type: ignore[arg-type]
        out = []
        async with (
            TestServer(app, host="127.0.0.1") as server,
            aiohttp.ClientSession() as http,
            http.ws_connect(f"{server.make_url('')}{path}") as ws,
        ):
            async for frame in ws:
                out.append(json.loads(frame.data))
                if until(out[-1]):
                    break
        return out

    return asyncio.run(run())


SPAN = f"tickers={BTC},{ETH}&start={T0}&end={T0 + 2000}"


def test_the_query_is_checked() -> None:
    assert parse_replay_query(
        {"tickers": f"{BTC}, {ETH}", "start": "-10m", "channels": "trades,ohlc:60", "speed": "10"}
    ) == ReplayParams((BTC, ETH), "-10m", "now", ("trades", "ohlc:60"), "10")
    for bad in ({"start": "1"}, {"tickers": BTC}, {"tickers": BTC, "start": "1", "x": "1"}):
        with pytest.raises(GatewayError) as refused:
            parse_replay_query(bad)
        assert refused.value.error_code == "bad_request"


def test_the_socket_sends_live_frames_cursors_and_the_end_and_resumes() -> None:
    got = frames(f"/replay?{SPAN}")
    messages = [f for f in got if f["type"] == "message"]
    assert len(messages) == 40
    assert [f["type"] for f in got[-2:]] == ["replay_cursor", "replay_complete"]
    done = got[-1]
    assert done["messages"] == "40"
    assert done["per_topic"] == {f"{BTC}|tick": "20", f"{ETH}|tick": "20"}
    first = messages[0]
    assert (first["topic"], first["message_type"]) == (f"{BTC}|tick", "Tick")
    assert first["data"]["sequence"] == "1" and first["data"]["side"] == "SELL"
    times = [int(f["data"]["timestamp_ms"]) for f in messages]
    assert times == sorted(times)
    # a cursor from the middle of a run resumes with the rest, sequences continued
    replay = FakePlatform().replay(ReplayParams((BTC, ETH), T0, T0 + 2000))
    head = [next(replay) for _ in range(15)]
    rest = frames(f"/replay?{SPAN}&cursor={replay.cursor}")
    resumed = [f for f in rest if f["type"] == "message"]
    assert len(head) + len(resumed) == 40
    # the same frames, sequences included: each topic's numbering goes on
    assert [(f["topic"], f["data"]) for f in messages[15:]] == [
        (f["topic"], f["data"]) for f in resumed
    ]


class FollowPlatform(FakePlatform):
    """FakePlatform whose `replay_into_live` goes on into two live BTC trades: "19" (the
    stored replay's last: the seam is there, and it is a repeat) and "20"."""

    def __init__(self) -> None:
        self.follows: list[FollowLive] = []

    def replay_into_live(self, params: ReplayParams) -> FollowLive:
        def replay(end_ms: int) -> Replay:
            query = replay_query(params.tickers, params.start, end_ms, now_ms=T0 + 2000)
            return open_replay(TradeStore(), query, limits=ReplayLimits(trade_chunk=7))

        live = LiveBuffer(10)
        for trade_id in (19, 20):
            live.offer(Tick(ticker=BTC, trade_id=str(trade_id), timestamp_ms=T0 + trade_id * 100))
        follow = FollowLive(
            replay(T0 + 2000),
            lambda topic, position, end_ms: replay(end_ms),
            live,
            seam_timeout_s=0.0,
            clock=lambda: 0.0,
        )
        self.follows.append(follow)
        return follow


def test_follow_sends_the_stored_range_then_live_messages_on_one_sequence() -> None:
    platform = FollowPlatform()
    query = f"tickers={BTC},{ETH}&start={T0}&follow=true"
    got = frames(
        f"/replay?{query}", platform, until=lambda f: f.get("data", {}).get("trade_id") == "20"
    )
    assert [f["type"] for f in got[-3:]] == ["replay_cursor", "replay_complete", "message"]
    assert got[-2]["messages"] == "40"
    live = got[-1]
    assert (live["topic"], live["data"]["sequence"]) == (f"{BTC}|tick", "21")
    [follow] = platform.follows
    assert follow.duplicates == 1


def test_follow_takes_no_end_and_no_cursor() -> None:
    for extra in ("&end=-1m", "&cursor=abc", "&follow=maybe"):
        with pytest.raises(GatewayError) as refused:
            parse_replay_query({"tickers": BTC, "start": "-1h", "follow": "true"} | _param(extra))
        assert refused.value.error_code == "bad_request"


def _param(text: str) -> dict[str, str]:
    name, _, value = text.lstrip("&").partition("=")
    return {name: value}


@pytest.mark.parametrize(
    ("query", "code"),
    [
        (f"{SPAN}&speed=fast", "bad_speed"),
        (f"{SPAN}&channels=quotes", "bad_channel"),
        (f"{SPAN}&cursor=zzz", "bad_cursor"),
        (f"tickers=BINANCE:DOGE/USDT&start={T0}&end={T0 + 1}", "unknown_ticker"),
        (f"tickers={BTC}&start={T0 + 5}&end={T0}", "bad_time_range"),
        (f"tickers={BTC}", "bad_request"),
    ],
)
def test_a_refused_replay_is_one_error_frame(query: str, code: str) -> None:
    [error] = frames(f"/replay?{query}")
    assert error["type"] == "error" and error["error_code"] == code


def test_the_pump_paces_on_its_clock_and_sends_a_cursor_per_chunk() -> None:
    replay = FakePlatform().replay(ReplayParams((BTC,), T0, T0 + 1000, speed="4"))
    now = [0.0]
    sent: list[str] = []
    waits: list[float] = []

    async def send(text: str) -> None:
        sent.append(text)

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        now[0] += seconds

    async def fetch(read: Any) -> list[ReplayEvent]:
        result: list[ReplayEvent] = read()
        return result

    asyncio.run(pump(send, replay, fetch, chunk=4, clock=lambda: now[0], sleep=sleep))
    kinds = [json.loads(s)["type"] for s in sent]
    assert kinds == ["message"] * 4 + ["replay_cursor"] + ["message"] * 4 + ["replay_cursor"] + [
        "message",
        "message",
        "replay_cursor",
        "replay_complete",
    ]
    assert waits == pytest.approx([0.025] * 9)  # 100 ms apart at 4x
    assert now[0] == pytest.approx(0.225)
    first = json.loads(sent[0])
    assert sent[0] == message_frame(first["topic"], replay_first_tick())


def replay_first_tick() -> Any:
    replay = FakePlatform().replay(ReplayParams((BTC,), T0, T0 + 1000))
    return next(replay)


def test_book_changes_go_out_as_the_live_book_topics_ladders_and_every_frame_fits_the_schema() -> (
    None
):
    import jsonschema

    from mdproto.book import levels_message
    from mdproto.markets import Precision
    from mdproto.messages import BookDelta, BookReset, BookSnapshot

    schema = json.loads(
        (Path(__file__).parents[3] / "docs" / "gateway-messages.schema.json").read_text()
    )
    topic = f"{BTC}|book"
    frames = LiveFrames(levels=1, precisions={BTC: Precision.of(0.5, 0.1)})

    def event(message: Any) -> ReplayEvent:
        return ReplayEvent(topic, message.exchange_time_ms, message)

    snap = BookSnapshot(
        ticker=BTC,
        bids=levels_message([(99.0, 1.0), (98.0, 2.0)]),
        asks=levels_message([(101.0, 1.0)]),
        exchange_sequence=5,
        exchange_time_ms=T0,
        reset=BookReset.BOOK_RESET_START,
    )
    follows = BookDelta(
        ticker=BTC, bids=levels_message([(99.5, 3.0)]), exchange_sequence=6,
        exchange_prev_sequence=5, exchange_time_ms=T0 + 1,
    )  # fmt: skip
    skips = BookDelta(
        ticker=BTC, bids=levels_message([(99.0, 0.0)]), exchange_sequence=9,
        exchange_prev_sequence=8, exchange_time_ms=T0 + 2,
    )  # fmt: skip
    sent = [json.loads(f) for m in (snap, follows, skips) for f in frames(event(m))]
    assert [(f["type"], f.get("kind")) for f in sent] == [
        ("book_event", "reset"), ("book", None), ("book", None), ("book_event", "gap"),
        ("book", None),
    ]  # fmt: skip
    assert sent[1]["bids"] == [[99.0, 1.0]] and sent[1]["in_sync"] is True
    assert sent[2]["bids"] == [[99.5, 3.0]] and sent[2]["exchange_sequence"] == "6"
    assert sent[4]["in_sync"] is False and sent[4]["bids"] == [[99.5, 3.0]]
    assert sent[1]["price_decimals"] == 1
    tick = ReplayEvent(f"{BTC}|tick", T0, replay_first_tick())
    sent += [json.loads(f) for f in frames(tick)]
    sent += frames_of_a_run()
    validator = jsonschema.Draft202012Validator({**schema, "$ref": "#/$defs/server_frame"})
    for frame in sent:
        validator.validate(frame)


def frames_of_a_run() -> list[dict[str, Any]]:
    got = frames(f"/replay?tickers={BTC}&start={T0}&end={T0 + 300}")
    assert [f["type"] for f in got] == ["message"] * 3 + ["replay_cursor", "replay_complete"]
    return got
