"""WebSocket `/replay`: a stored range replayed in the live topics' frames (docs/protocol.md
"Replay"), the query and the pump (no aiohttp here: the app passes `send` and `fetch`).

    GET /replay?tickers=A,B&start=&end=&channels=trades,book,ohlc:60&speed=10&cursor=
        [&follow=true: the SDK's replay_into_live, trades and candles, up to now, then live]
      -> parse_replay_query (bad_request) -> the SDK's replay (its checks: bad_ticker,
         bad_time, bad_time_range, range_too_large, bad_channel, bad_speed, bad_cursor;
         unknown_ticker) -> `error` frame and close on any of them
      -> pump: the SDK's unpaced events, `chunk` at a time on a worker thread; each as
         the frames its live topic sends (`LiveFrames`: a `message` for a trade or a
         candle; for a book change the `book` ladder of the book it leaves, as the
         gateway's live book topic), paced here by `speed` on the event loop; a
         `replay_cursor` frame after each chunk; `replay_complete` at the end
      -> follow: after `replay_complete` (the seam), the live messages as they come

Backpressure: the next chunk is read only once every frame of the last one is sent,
and each send waits while the socket's buffer is full, so a slow client holds at most
one chunk and the socket's buffer in the gateway, and the Iceberg reads pause with it.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.messages import GatewayError, book_event_frame, book_frame, dumps, message_frame
from mdproto.book import OrderBook
from mdproto.error_codes import BAD_REQUEST
from mdproto.markets import Precision
from mdproto.messages import BookDelta, BookReset, BookSnapshot

if TYPE_CHECKING:
    from mdclient.replay import FollowLive, Replay, ReplayEvent

#: Messages read per worker call (and between two cursor frames).
CHUNK = 500

_PARAMS = {"tickers", "start", "end", "channels", "speed", "cursor", "follow", "token"}
_TRUE, _FALSE = {"true", "1", "yes"}, {"false", "0", "no", ""}


@dataclass(frozen=True, slots=True)
class ReplayParams:
    tickers: tuple[str, ...]
    start: int | str
    end: int | str = "now"
    channels: tuple[str, ...] = ("trades",)
    speed: str = "max"
    cursor: str | None = None
    follow: bool = False


def parse_replay_query(query: Mapping[str, str]) -> ReplayParams:
    """The socket's query: comma-separated `tickers` and `channels`, times as the SDK
    takes them (epoch ms, `-2h`, `now`, ISO). The SDK checks the values."""
    unknown = set(query) - _PARAMS
    if unknown:
        raise GatewayError(BAD_REQUEST, f"unknown parameter(s): {', '.join(sorted(unknown))}")
    for name in ("tickers", "start"):
        if not query.get(name, "").strip():
            raise GatewayError(BAD_REQUEST, f"missing parameter {name!r}")
    start, end = (
        int(t) if t.isdigit() else t
        for t in (query["start"].strip(), query.get("end", "now").strip())
    )
    follow = query.get("follow", "").strip().lower()
    if follow not in _TRUE | _FALSE:
        raise GatewayError(BAD_REQUEST, f"follow must be true or false, not {follow!r}")
    if follow in _TRUE and (end != "now" or query.get("cursor")):
        raise GatewayError(BAD_REQUEST, "follow replays up to now, then live: no end, no cursor")
    return ReplayParams(
        tickers=tuple(t.strip() for t in query["tickers"].split(",") if t.strip()),
        start=start,
        end=end,
        channels=tuple(c.strip() for c in query.get("channels", "trades").split(",")),
        speed=query.get("speed", "max").strip(),
        cursor=query.get("cursor") or None,
        follow=follow in _TRUE,
    )


class LiveFrames:
    """The frames a live subscriber of each topic gets: trades and candles as `message`
    frames; a book topic as `book` ladders (best `levels` per side) of a book kept
    here, with `book_event` for a reset snapshot and for a delta that does not follow
    (the ladder is then stale, `in_sync` false, until the next snapshot), as
    `platform.BookLadder` does for a live book."""

    def __init__(self, levels: int = 20, precisions: Mapping[str, Precision] | None = None) -> None:
        self._levels = levels
        self._precisions = dict(precisions or {})
        self._books: dict[str, OrderBook] = {}
        self._synced: set[str] = set()

    def __call__(self, event: ReplayEvent) -> list[str]:
        message, topic = event.message, event.topic
        if not isinstance(message, BookSnapshot | BookDelta):
            return [message_frame(topic, message)]
        book = self._books.setdefault(topic, OrderBook(message.ticker))
        out = []
        if isinstance(message, BookSnapshot):
            if message.reset != BookReset.BOOK_RESET_NONE:
                name = BookReset.Name(message.reset)
                out.append(book_event_frame(topic, "reset", reset=name, reason=message.reason))
            book.replace(message)
            self._synced.add(topic)
        elif topic in self._synced and book.follows(message):
            book.apply(message)
        elif topic in self._synced:
            self._synced.discard(topic)
            reason = f"stored delta after {message.exchange_prev_sequence} does not follow"
            out.append(book_event_frame(topic, "gap", reason=reason, missed=1))
        out.append(
            book_frame(
                topic,
                book.bids.top(self._levels),
                book.asks.top(self._levels),
                in_sync=topic in self._synced,
                exchange_sequence=book.exchange_sequence,
                exchange_time_ms=book.exchange_time_ms,
                precision=self._precisions.get(message.ticker, Precision()),
            )
        )
        return out


def cursor_frame(replay: Replay) -> str:
    """Where a resume starts: after every message sent so far."""
    return dumps(
        {"type": "replay_cursor", "cursor": replay.cursor, "messages": str(replay.messages)}
    )


def complete_frame(replay: Replay) -> str:
    """Every stored message of the range was sent."""
    done = replay.finished()
    return dumps(
        {
            "type": "replay_complete",
            "cursor": done.cursor,
            "messages": str(done.messages),
            "per_topic": {topic: str(n) for topic, n in done.per_topic.items()},
        }
    )


async def pump(
    send: Callable[[str], Awaitable[None]],
    replay: Replay,
    fetch: Callable[[Callable[[], list[ReplayEvent]]], Awaitable[list[ReplayEvent]]],
    *,
    frames: Callable[[ReplayEvent], list[str]] | None = None,
    chunk: int = CHUNK,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] | None = None,
) -> None:
    """Send the replay: `fetch` runs a read of the next chunk off the event loop; `frames`
    (a `LiveFrames` by default) says what each event is sent as; `sleep` (asyncio.sleep
    by default) waits out the pacing."""
    events = replay.events()
    await _send_stored(send, replay, events, fetch, frames or LiveFrames(), chunk, clock, sleep)


async def pump_follow(
    send: Callable[[str], Awaitable[None]],
    follow: FollowLive,
    fetch: Callable[[Callable[[], list[Any]]], Awaitable[list[Any]]],
    *,
    chunk: int = CHUNK,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] | None = None,
) -> None:
    """`pump` of the stored range (`replay_complete` marks the seam), then each live
    message as a `message` frame as it comes, until the socket closes."""
    from mdclient.replay import live_key

    stored = follow.stored
    events = follow.stored_events()
    await _send_stored(send, stored, events, fetch, LiveFrames(), chunk, clock, sleep)
    while True:
        for message in await fetch(lambda: follow.take(chunk)):
            await send(message_frame(live_key(message)[0], message))


async def _send_stored(
    send: Callable[[str], Awaitable[None]],
    replay: Replay,
    events: Iterator[ReplayEvent],
    fetch: Callable[[Callable[[], list[ReplayEvent]]], Awaitable[list[ReplayEvent]]],
    encode: Callable[[ReplayEvent], list[str]],
    chunk: int,
    clock: Callable[[], float],
    sleep: Callable[[float], Awaitable[None]] | None,
) -> None:
    import asyncio

    from mdclient.replay import Pacer

    wait = sleep or asyncio.sleep
    pacer = None if replay.query.speed is None else Pacer(replay.query.speed, clock)
    while batch := await fetch(lambda: list(itertools.islice(events, chunk))):
        for event in batch:
            if pacer is not None and (delay := pacer.delay(event.time_ms)) > 0:
                await wait(delay)
            for frame in encode(event):
                await send(frame)
        await send(cursor_frame(replay))
    await send(complete_frame(replay))
