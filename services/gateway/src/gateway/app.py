"""The aiohttp application: WebSocket `/ws`, WebSocket `/replay`, `POST /history`,
`GET /status/{id}`, `GET /recording`, `GET /trades`, `GET /book`, `GET /book/samples`,
the page.

An adapter only: parsing and encoding live in gateway.messages, fan-out in
gateway.hub, the platform behind gateway.platform.SdkUpstream.
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import logging
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from aiohttp import WSCloseCode, WSMsgType, web

from gateway import book_answers, messages, replay_socket, trade_answers
from gateway.config import GatewaySettings
from gateway.hub import Hub
from gateway.messages import GatewayError, HistoryFormat
from gateway.platform import SdkUpstream
from mdclient import (
    HistoryFailed,
    HistoryResult,
    HistoryTimeout,
    IngestorUnavailable,
    InvalidRequest,
    MdClientError,
    NotRecorded,
    PipelineUnavailable,
    RelayUnavailable,
    RequestTimeout,
    StorageError,
    SubmitRejected,
)
from mdclient.replay import FollowLive, Replay
from mdproto import topics
from mdproto.error_codes import BAD_ID, BAD_REQUEST, INTERNAL, NO_BOOK, UNAUTHORIZED
from mdproto.tables import Ohlc, TradeBars

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)
_T = TypeVar("_T")

STATIC = Path(str(resources.files("gateway") / "static"))
CHART_JS = STATIC / "vendor" / "lightweight-charts.standalone.production.js"

HUB = web.AppKey("hub", Hub)
UPSTREAM = web.AppKey("upstream", SdkUpstream)
SETTINGS = web.AppKey("settings", GatewaySettings)
#: Open WebSockets, closed at shutdown: aiohttp's graceful stop otherwise waits for
#: each browser to hang up (up to its 60 s shutdown timeout).
SOCKETS = web.AppKey("sockets", weakref.WeakSet[web.WebSocketResponse])
HISTORY_POOL = web.AppKey("history_pool", ThreadPoolExecutor)
#: POST /history answers by outcome: "ok" or the error_code sent (gateway.metrics).
HISTORY_OUTCOMES = web.AppKey("history_outcomes", collections.Counter[str])

#: SDK error -> HTTP status (the body always carries error_code and reason).
_HTTP_STATUS: tuple[tuple[type[MdClientError], int], ...] = (
    (InvalidRequest, 400),
    (SubmitRejected, 422),
    (PipelineUnavailable, 503),  # an accepted request's pipeline stopped: retry later
    (IngestorUnavailable, 503),  # an accepted request's last ingestor died or hung: retry later
    (HistoryFailed, 502),
    (HistoryTimeout, 504),
    (RequestTimeout, 504),
    (RelayUnavailable, 503),
)


def error_response(status: int, error_code: str, reason: str, **extra: Any) -> web.Response:
    body = {"error_code": error_code, "reason": reason, **extra}
    return web.json_response(body, status=status)


@web.middleware
async def require_token(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """With `token` set, every route but /healthz and /static needs it (header, or
    `?token=` for the page and browsers' WebSockets, which cannot set headers).

    /static holds the page's code, styles and words, no data: the browser fetches
    them from `<script>`/`<link>` tags and `fetch` calls that carry no token."""
    token = request.app[SETTINGS].token
    if token and request.path != "/healthz" and not request.path.startswith("/static/"):
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        given = given or request.query.get("token", "")
        if not hmac.compare_digest(given.encode(), token.encode()):
            log.warning(
                "refused %s %s from %s: bad token", request.method, request.path, request.remote
            )
            return error_response(401, UNAUTHORIZED, "a valid bearer token is required")
    return await handler(request)


async def websocket(request: web.Request) -> web.WebSocketResponse:
    ws = web.WebSocketResponse(heartbeat=20)
    await ws.prepare(request)
    request.app[SOCKETS].add(ws)
    hub = request.app[HUB]
    session = hub.session(ws.send_str, request.app[SETTINGS].client_queue_size)
    try:
        async for frame in ws:
            if frame.type != WSMsgType.TEXT:
                if frame.type == WSMsgType.BINARY:
                    session.push(messages.error_frame(BAD_REQUEST, "send JSON text frames"))
                continue
            try:
                op = messages.parse_op(frame.data)
            except GatewayError as exc:
                session.push(messages.error_frame(exc.error_code, exc.reason, exc.topic))
                continue
            if op.op == "subscribe":
                # Not awaited inline: a slow upstream subscribe must not hold the others.
                task = asyncio.create_task(hub.subscribe(session, op.topic))
                session.pending.add(task)
                task.add_done_callback(session.pending.discard)
            else:
                await hub.unsubscribe(session, op.topic.name)
    finally:
        await hub.leave(session)
    return ws


async def replay(request: web.Request) -> web.WebSocketResponse:
    """A stored range replayed in the live topics' frames (gateway.replay_socket): its
    query refused, or the replay's error, as one `error` frame before the close. The
    Iceberg reads run on the history workers, one chunk at a time, paused while the
    client is slow; a client that hangs up stops the reads (its last cursor resumes)."""
    ws = web.WebSocketResponse(heartbeat=20)
    await ws.prepare(request)
    request.app[SOCKETS].add(ws)
    loop = asyncio.get_running_loop()
    pool = request.app[HISTORY_POOL]
    upstream = request.app[UPSTREAM]
    try:
        params = replay_socket.parse_replay_query(request.query)
        stream: Replay | FollowLive
        if params.follow:
            stream = await loop.run_in_executor(pool, upstream.replay_into_live, params)
        else:
            stream = await loop.run_in_executor(pool, upstream.replay, params)
        books = {ticker for _, ticker, channel in stream.query.streams if channel.kind == "book"}
        precisions = {t: await loop.run_in_executor(pool, upstream.precision, t) for t in books}
    except GatewayError as exc:
        await ws.send_str(messages.error_frame(exc.error_code, exc.reason))
        await ws.close()
        return ws
    except MdClientError as exc:
        await ws.send_str(messages.error_frame(error_code(exc), exc.reason))
        await ws.close()
        return ws

    async def fetch(read: Callable[[], _T]) -> _T:
        return await loop.run_in_executor(pool, read)

    async def listen() -> None:  # the client sends nothing: this sees it hang up
        async for _ in ws:
            pass

    frames = replay_socket.LiveFrames(request.app[SETTINGS].book_levels, precisions)
    if isinstance(stream, FollowLive):
        sending = replay_socket.pump_follow(ws.send_str, stream, fetch)
    else:
        sending = replay_socket.pump(ws.send_str, stream, fetch, frames=frames)
    sender = asyncio.create_task(sending)
    listener = asyncio.create_task(listen())
    try:
        await asyncio.wait({sender, listener}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stream.close()
        for task in (sender, listener):
            task.cancel()
        await asyncio.gather(sender, listener, return_exceptions=True)
    if sender.done() and not sender.cancelled() and not ws.closed:
        failure = sender.exception()
        if isinstance(failure, MdClientError):  # a read failed halfway: say so, then close
            await ws.send_str(messages.error_frame(error_code(failure), failure.reason))
        elif failure is not None and not isinstance(failure, ConnectionError):
            log.error("replay failed", exc_info=failure)
            await ws.send_str(messages.error_frame(INTERNAL, "the replay failed"))
    await ws.close()
    return ws


async def history(request: web.Request) -> web.StreamResponse:
    try:
        body = await request.json() if request.can_read_body else {}
    except ValueError:
        return error_response(400, BAD_REQUEST, "the body must be a JSON object")
    try:
        params = messages.parse_history(body)
        fmt = messages.choose_format(
            request.query.get("format") or (body.get("format") if isinstance(body, dict) else None),
            request.headers.get("Accept"),
        )
    except GatewayError as exc:
        return error_response(400, exc.error_code, exc.reason)
    app = request.app
    loop = asyncio.get_running_loop()
    upstream, timeout_s = app[UPSTREAM], app[SETTINGS].history_timeout_s
    try:  # timed in the worker: a wait for a free worker is not the platform's time
        result, call_s = await loop.run_in_executor(
            app[HISTORY_POOL], _timed, lambda: upstream.history(params, timeout_s)
        )
    except MdClientError as exc:
        response = _sdk_error(exc)
        app[HISTORY_OUTCOMES][error_code(exc)] += 1
        return response
    app[HISTORY_OUTCOMES]["ok"] += 1
    body_bytes, encode_s = await loop.run_in_executor(
        app[HISTORY_POOL], _timed, lambda: encode_history(result, fmt)
    )
    headers = history_headers(result)
    # The SDK's elapsed_s ends at the notification; the rest of its call read the rows.
    headers["Server-Timing"] = messages.server_timing(
        result.elapsed_s, call_s - result.elapsed_s, encode_s
    )
    return web.Response(body=body_bytes, content_type=messages.MEDIA_TYPES[fmt], headers=headers)


def _timed(call: Callable[[], _T]) -> tuple[_T, float]:
    started = time.perf_counter()
    return call(), time.perf_counter() - started


def _sdk_error(exc: MdClientError) -> web.Response:
    status = next((code for cls, code in _HTTP_STATUS if isinstance(exc, cls)), 502)
    extra: dict[str, Any] = {"request_id": exc.request_id}
    note = getattr(exc, "notification", None)
    if note is not None:
        extra["notification"] = messages.notification_dict(note)
    return error_response(status, error_code(exc), exc.reason, **extra)


def error_code(exc: MdClientError) -> str:
    """The SDK's code; `internal` for an error that carries none (docs/protocol.md)."""
    return exc.error_code or INTERNAL


def history_headers(result: HistoryResult) -> dict[str, str]:
    report = messages.integrity(result.notification)
    headers = {"X-Request-Id": result.request_id, "X-Status": result.status}
    headers.update({f"X-{k.replace('_', '-').title()}": str(v) for k, v in report.items()})
    return headers


def encode_history(result: HistoryResult, fmt: HistoryFormat) -> bytes:
    """Rows as JSON (open_time in epoch ms; 64-bit integers as decimal strings, like
    the OHLC messages), an Arrow IPC stream, or Parquet."""
    import pyarrow as pa

    table = result.table
    if fmt != "json":
        return messages.table_bytes(table, fmt)
    times = table.column(Ohlc.OPEN_TIME).cast(pa.int64()).to_pylist()
    counts = table.column(Ohlc.TRADE_COUNT).to_pylist()
    columns = (Ohlc.OPEN, Ohlc.HIGH, Ohlc.LOW, Ohlc.CLOSE, Ohlc.VOLUME)
    values = [table.column(name).to_pylist() for name in columns]
    candles = [
        {
            "open_time_ms": str(t // 1000),
            **dict(zip(columns, row, strict=True)),
            "trade_count": messages.int64(n),
        }
        for t, n, *row in zip(times, counts, *values, strict=True)
    ]
    note = result.notification
    bars = note.bars if note is not None else ""
    if bars and table.num_rows:  # tick or volume bars: where each ends, which trades it holds
        for candle, extra in zip(candles, _bar_fields(table), strict=True):
            candle.update(extra)
    return messages.dumps(
        {
            "request_id": result.request_id,
            "status": result.status,
            "ticker": note.ticker if note is not None else "",
            "period_seconds": note.period_seconds if note is not None else 0,
            **({"bars": bars} if bars else {}),
            "attempts": result.attempts,
            "elapsed_s": round(result.elapsed_s, 3),
            "snapshot_id": messages.int64(result.snapshot_id),
            "integrity": messages.integrity(note),
            "candles": candles,
        }
    ).encode()


def _bar_fields(table: pa.Table) -> list[dict[str, Any]]:
    """The ``market.trade_bars`` columns a tick or volume bar adds to a candle's."""
    import pyarrow

    closes = table.column(TradeBars.CLOSE_TIME).cast(pyarrow.int64()).to_pylist()
    return [
        {
            "seq": messages.int64(row[TradeBars.SEQ]),
            "close_time_ms": messages.int64(us // 1000),
            "first_trade_id": row[TradeBars.FIRST_TRADE_ID],
            "last_trade_id": row[TradeBars.LAST_TRADE_ID],
            "incomplete": row[TradeBars.INCOMPLETE],
        }
        for row, us in zip(
            table.select(
                [
                    TradeBars.SEQ,
                    TradeBars.FIRST_TRADE_ID,
                    TradeBars.LAST_TRADE_ID,
                    TradeBars.INCOMPLETE,
                ]
            ).to_pylist(),
            closes,
            strict=True,
        )
    ]


async def status(request: web.Request) -> web.Response:
    request_id = request.match_info["request_id"]
    if not topics.is_valid_id(request_id):  # no submit can carry it: not UNKNOWN either
        return error_response(400, BAD_ID, f"{request_id!r}: an id is {messages.ID_RULE}")
    loop = asyncio.get_running_loop()
    try:
        answer = await loop.run_in_executor(
            request.app[HISTORY_POOL], request.app[UPSTREAM].status, request_id
        )
    except MdClientError as exc:
        return _sdk_error(exc)
    note = answer.notification
    return web.json_response(
        {
            "request_id": answer.request_id,
            "state": answer.state,
            "notification": messages.notification_dict(note) if note is not None else None,
        },
        dumps=messages.dumps,
    )


async def recording(request: web.Request) -> web.Response:
    """What the platform records (`?exchange=`), the SDK's `RecordingStatus` as JSON."""
    try:
        exchange = messages.parse_recording_query(request.query)
    except GatewayError as exc:
        return error_response(400, exc.error_code, exc.reason)
    loop = asyncio.get_running_loop()
    try:
        answer = await loop.run_in_executor(
            request.app[HISTORY_POOL], request.app[UPSTREAM].recording, exchange
        )
    except MdClientError as exc:
        return _sdk_error(exc)
    return web.json_response(answer.as_dict(), dumps=messages.dumps)


async def trades(request: web.Request) -> web.StreamResponse:
    """Stored trades of a ticker over a range, streamed batch by batch in the format asked
    (gateway.trade_answers), with the integrity report; 404 `not_recorded` (with the
    report) for a range with no recording. A read that fails once rows are on their way
    aborts the connection: a cut body, never one that looks whole."""
    try:
        params, fmt = _query_and_format(request, trade_answers.parse_trades_query)
    except GatewayError as exc:
        return error_response(400, exc.error_code, exc.reason)
    loop = asyncio.get_running_loop()
    pool = request.app[HISTORY_POOL]
    try:
        batches = await loop.run_in_executor(pool, request.app[UPSTREAM].trade_batches, params)
    except NotRecorded as exc:
        return error_response(404, error_code(exc), exc.reason, integrity=exc.report.as_dict())
    except MdClientError as exc:
        return _sdk_error(exc)
    encoder = trade_answers.TradeEncoder(fmt, batches.report, batches.schema)
    response = web.StreamResponse(
        headers={
            "Content-Type": messages.MEDIA_TYPES[fmt],
            **trade_answers.report_headers(batches.report),
        }
    )
    await response.prepare(request)
    await response.write(encoder.start())

    def encode_next() -> bytes | None:
        batch = next(batches, None)
        return None if batch is None else encoder.batch(batch)

    while (chunk := await loop.run_in_executor(pool, encode_next)) is not None:
        if chunk:
            await response.write(chunk)
    await response.write(encoder.finish())
    await response.write_eof()
    return response


async def book_at(request: web.Request) -> web.Response:
    """The exact stored book of a ticker at a time (gateway.book_answers); 404 `no_book`
    when no snapshot is stored within the SDK's lookback before it."""
    try:
        params = book_answers.parse_book_query(request.query)
    except GatewayError as exc:
        return error_response(400, exc.error_code, exc.reason)
    loop = asyncio.get_running_loop()
    try:
        book, at_ms = await loop.run_in_executor(
            request.app[HISTORY_POOL], request.app[UPSTREAM].book_at, params
        )
    except MdClientError as exc:
        return _book_error(exc)
    body = book_answers.book_dict(book, at_ms, params.depth)
    return web.json_response(body, dumps=messages.dumps)


async def book_samples(request: web.Request) -> web.Response:
    """The stored book's top levels every step over a range, in the format asked
    (gateway.book_answers); 404 `no_book` when no book is stored in or before it."""
    try:
        params, fmt = _query_and_format(request, book_answers.parse_samples_query)
    except GatewayError as exc:
        return error_response(400, exc.error_code, exc.reason)

    def answer() -> bytes:  # read and encode on a history worker
        table = request.app[UPSTREAM].book_samples(params)
        return book_answers.encode_samples(
            table, fmt, ticker=params.ticker, every_ms=params.every_ms, depth=params.depth
        )

    try:
        body = await asyncio.get_running_loop().run_in_executor(request.app[HISTORY_POOL], answer)
    except MdClientError as exc:
        return _book_error(exc)
    return web.Response(body=body, content_type=messages.MEDIA_TYPES[fmt])


def _query_and_format(
    request: web.Request, parse: Callable[[Mapping[str, str]], _T]
) -> tuple[_T, HistoryFormat]:
    """A GET's parameters (`parse`) and its answer's format (`format=` or Accept)."""
    fmt = messages.choose_format(request.query.get("format"), request.headers.get("Accept"))
    return parse(request.query), fmt


def _book_error(exc: MdClientError) -> web.Response:
    if isinstance(exc, StorageError) and exc.error_code == NO_BOOK:
        return error_response(404, NO_BOOK, exc.reason)
    return _sdk_error(exc)


async def healthz(request: web.Request) -> web.Response:
    hub = request.app[HUB]
    return web.json_response(
        {"status": "ok", "topics": hub.topic_count, "messages": hub.stats.upstream_messages}
    )


async def info(request: web.Request) -> web.Response:
    """What the page offers: tickers and candle periods (config `tickers`, `periods`)."""
    s = request.app[SETTINGS]
    return web.json_response({"tickers": s.tickers, "periods": s.periods})


async def index(request: web.Request) -> web.StreamResponse:
    if not CHART_JS.is_file():
        log.error("chart library missing (%s): run `make gateway-assets`", CHART_JS)
    return web.FileResponse(STATIC / "index.html")


def create_app(settings: GatewaySettings, upstream: SdkUpstream) -> web.Application:
    """The application over an SDK client the caller owns (and closes)."""
    app = web.Application(middlewares=[require_token])
    app[SETTINGS] = settings
    app[UPSTREAM] = upstream
    app[HISTORY_OUTCOMES] = collections.Counter()

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        app[HUB] = Hub(upstream)
        app[HISTORY_POOL] = ThreadPoolExecutor(settings.history_workers, "gateway-history")
        yield
        await app[HUB].close()
        app[HISTORY_POOL].shutdown(wait=False, cancel_futures=True)

    async def close_sockets(app: web.Application) -> None:
        open_sockets: weakref.WeakSet[web.WebSocketResponse] = app[SOCKETS]
        for ws in list(open_sockets):
            await ws.close(code=WSCloseCode.GOING_AWAY, message=b"gateway shutting down")

    app[SOCKETS] = weakref.WeakSet()
    app.on_shutdown.append(close_sockets)
    app.cleanup_ctx.append(lifecycle)
    app.router.add_get("/", index)
    app.router.add_get("/ws", websocket)
    app.router.add_get("/replay", replay)
    app.router.add_post("/history", history)
    app.router.add_get("/status/{request_id}", status)
    app.router.add_get("/recording", recording)
    app.router.add_get("/trades", trades)
    app.router.add_get("/book", book_at)
    app.router.add_get("/book/samples", book_samples)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/info", info)
    app.router.add_static("/static", STATIC)
    return app
