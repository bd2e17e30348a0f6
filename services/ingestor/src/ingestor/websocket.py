"""The ingestor's websocket client: one connection handler shared by every venue.

In the shape of cryptofeed's `connection_handler`: a `Connection` owns one websocket
to one URL and everything about keeping it: connect, reconnect with capped backoff
(`retry.backoff_delay`), the venue's keep-alive (`Link`) (its ping request, or websocket
protocol pings), a silence watchdog, and sending every subscription again on each
new connection. It knows no exchange's messages: the texts it receives go to its
`StreamHandler` (`ingestor.book_streams.BookStreams` parses them with the venue's
`BookWire`), and it tells the handler when a connection starts and when it is lost.

Steps of one connection (`_run`), repeated while anything is subscribed:

1. connect (aiohttp's websocket client, the handshake bounded by `connect_timeout_s`);
   a failure is reported (`on_lost`) and retried after the backoff;
2. `on_connected`, then every subscription, in the order they were made, then
   whatever is subscribed or unsubscribed while connected, one writer keeping order;
3. read: each text to `on_text`; the venue's ping every `interval_s`; nothing
   received for `silence_s` (no data, no pong) ends the connection;
4. on its end `on_lost`; reconnect at once after a connection that carried data,
   after the backoff after one that did not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from ingestor.model import ExchangeCallError, FaultKind
from ingestor.rest import Network
from ingestor.retry import RetryPolicy, backoff_delay

log = logging.getLogger(__name__)

#: The largest message read (a whole book snapshot of a deep market fits).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class StreamHandler(Protocol):
    """What a `Connection` reports to (called on the event loop, never concurrently)."""

    def on_connected(self) -> None:
        """A new connection is up; the subscriptions are sent right after."""
        ...

    def on_text(self, text: str) -> None:
        """One text message; must not raise."""
        ...

    def on_lost(self, error: ExchangeCallError) -> None:
        """The connection ended, or could not be made (`error` says why)."""
        ...


@dataclass(frozen=True, slots=True)
class Link:
    """How a connection is made and kept alive.

    `ping`: the venue's request sent every `interval_s` (its answer counts as traffic
    for the watchdog); None: websocket protocol pings at that interval, an unanswered
    one ending the connection. `connect_timeout_s` bounds a handshake; `backoff` spaces
    the attempts after failures (`retry.backoff_delay`).
    """

    ping: str | None
    interval_s: float
    connect_timeout_s: float = 10.0
    backoff: RetryPolicy = field(default_factory=RetryPolicy)

    @property
    def silence_s(self) -> float | None:
        """Nothing received for this long ends the connection (two pings unanswered);
        None with protocol pings, whose pongs aiohttp keeps to itself."""
        return None if self.ping is None else 2.5 * self.interval_s


def request_text(request: Mapping[str, Any] | str) -> str:
    return request if isinstance(request, str) else json.dumps(request, separators=(",", ":"))


class Connection:
    """One websocket to `url` for as long as anything is subscribed (see the module)."""

    def __init__(
        self,
        url: str,
        handler: StreamHandler,
        link: Link,
        name: str = "",
        network: Network | None = None,
    ) -> None:
        """`network`: TLS, the websocket proxy and proxies from the environment (ccxt's
        for the exchange: `Network.of`)."""
        self.url, self.name = url, name or url
        self._handler, self._link = handler, link
        self._network = network or Network()
        self._subscriptions: dict[str, str] = {}  # key -> its request, in subscription order
        self._outbox: asyncio.Queue[str] | None = None  # the open connection's, else None
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self.connects = 0  # connections made (tests, logs)

    @property
    def connected(self) -> bool:
        return self._outbox is not None

    def subscribe(self, key: str, request: Mapping[str, Any] | str) -> None:
        """Send `request` now if connected, and again on every new connection, until
        `unsubscribe(key)`; connects if not running."""
        text = request_text(request)
        self._subscriptions[key] = text
        if self._outbox is not None:
            self._outbox.put_nowait(text)
        self.start()

    def start(self) -> None:
        """Run (connect, keep connected) if anything is subscribed and it is not running."""
        if self._subscriptions and (self._task is None or self._task.done()):
            self._task = asyncio.create_task(self._run(), name=f"websocket {self.name}")
            self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """A run that died of a bug (the handler raised) fails the watches instead of
        leaving them waiting; the next `start` runs again."""
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        log.error("%s: websocket client failed", self.name, exc_info=error)
        self._handler.on_lost(ExchangeCallError(FaultKind.NETWORK, f"{self.name}: {error!r}"))

    def unsubscribe(self, key: str, request: Mapping[str, Any] | str | None) -> None:
        """Forget `key`'s subscription; `request` (if any) goes out if connected. The connection
        stays open (a resubscription follows a rebuilt book's unsubscribe), but is not
        made again once lost with nothing subscribed."""
        known = self._subscriptions.pop(key, None) is not None
        if known and request is not None and self._outbox is not None:
            self._outbox.put_nowait(request_text(request))

    async def close(self) -> None:
        self._subscriptions.clear()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _run(self) -> None:
        failures = 0
        while self._subscriptions:
            try:
                ws = await self._connect()
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                failures += 1
                reason = f"{self.name}: cannot connect to {self.url}: {exc!r}"
                self._handler.on_lost(ExchangeCallError(FaultKind.NETWORK, reason))
                await asyncio.sleep(backoff_delay(failures, self._link.backoff, random.random()))
                continue
            reason, carried = await self._serve(ws)
            log.info("%s: websocket lost (%s)", self.name, reason)
            self._handler.on_lost(ExchangeCallError(FaultKind.NETWORK, f"{self.name}: {reason}"))
            failures = 0 if carried else failures + 1
            if failures:
                await asyncio.sleep(backoff_delay(failures, self._link.backoff, random.random()))

    async def _connect(self) -> aiohttp.ClientWebSocketResponse:
        network = self._network
        if self._session is None:
            self._session = aiohttp.ClientSession(trust_env=network.trust_env)
        protocol_pings = self._link.interval_s if self._link.ping is None else None
        async with asyncio.timeout(self._link.connect_timeout_s):
            ws = await self._session.ws_connect(
                self.url,
                heartbeat=protocol_pings,
                max_msg_size=MAX_MESSAGE_BYTES,
                ssl=network.tls(),
                proxy=network.ws_proxy,
            )
        self.connects += 1
        return ws

    async def _serve(self, ws: aiohttp.ClientWebSocketResponse) -> tuple[str, bool]:
        """Steps 2-3 on one connection: (why it ended, whether it carried anything)."""
        outbox: asyncio.Queue[str] = asyncio.Queue()
        for text in self._subscriptions.values():
            outbox.put_nowait(text)
        self._outbox = outbox
        self._handler.on_connected()
        writer = asyncio.create_task(self._write(ws, outbox))
        try:
            return await self._read(ws, writer)
        finally:
            self._outbox = None
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError, OSError):
                await writer
            await ws.close()

    async def _write(self, ws: aiohttp.ClientWebSocketResponse, outbox: asyncio.Queue[str]) -> None:
        """Requests in order, and the venue's ping whenever `interval_s` passed without."""
        ping = self._link.ping
        while True:
            try:
                text = await asyncio.wait_for(outbox.get(), self._link.interval_s)
            except TimeoutError:
                if ping is None:
                    continue
                text = ping
            await ws.send_str(text)

    async def _read(
        self, ws: aiohttp.ClientWebSocketResponse, writer: asyncio.Task[None]
    ) -> tuple[str, bool]:
        carried = False
        silence = self._link.silence_s
        while True:
            try:
                message = await ws.receive(timeout=silence)
            except TimeoutError:
                return f"nothing received for {silence:.0f} s", carried
            if message.type is aiohttp.WSMsgType.TEXT:
                carried = True
                self._handler.on_text(message.data)
            elif message.type is aiohttp.WSMsgType.BINARY:
                carried = True
                self._handler.on_text(message.data.decode())
            elif message.type is aiohttp.WSMsgType.ERROR:
                return f"websocket error {ws.exception()!r}", carried
            else:  # CLOSE, CLOSING, CLOSED
                return f"closed by the exchange (code {ws.close_code})", carried
            if writer.done():  # a send failed: the connection is gone
                return f"send failed: {writer.exception()!r}", carried
