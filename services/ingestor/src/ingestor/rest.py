"""What answers the ingestor's REST requests: the network, or a test's recorded payloads.

One call shape, `Transport`: (url, method, headers, body) -> `HttpAnswer` (status,
headers, body text). `HttpTransport` sends it with the ingestor's own aiohttp
session (ccxt's configured timeout, TLS and proxy); tests inject a function that
answers from recorded exchange payloads, so every venue's request and parser run
as in production and only the network is replaced (cryptofeed's injected
connection style). `ExchangeAdapter` (`ingestor.exchanges`) builds each request
with ccxt's `sign` and lets ccxt's `handle_errors` judge each answer.

`TransportSession` hands the same transport to ccxt's own `fetch`, for the calls
that stay on ccxt's unified methods (markets, tickers, server time) when a test
injects one: the slice of `aiohttp.ClientSession` that `fetch` uses.
"""

from __future__ import annotations

import json
import socket
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import aiohttp
import yarl


@dataclass(frozen=True, slots=True)
class HttpAnswer:
    """An HTTP response: status, headers and the body as text."""

    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    body: str = ""
    reason: str = ""

    @classmethod
    def of_json(
        cls, value: Any, status: int = 200, headers: Mapping[str, str] | None = None
    ) -> HttpAnswer:
        """A JSON body (`value` encoded), e.g. a recorded exchange payload."""
        return cls(
            status, {"Content-Type": "application/json", **(headers or {})}, json.dumps(value)
        )


#: (url, method, request headers, request body) -> the exchange's answer.
Transport = Callable[[str, str, Mapping[str, str], str | None], Awaitable[HttpAnswer]]


@dataclass(frozen=True, slots=True)
class Network:
    """ccxt's network settings of one exchange, for the ingestor's own HTTP and websocket
    clients: its CA file and whether certificates are checked, its HTTP(S) proxy
    (`httpProxy`/`httpsProxy`), its websocket proxy (`wsProxy`/`wssProxy`), and whether
    aiohttp reads proxies from the environment (`aiohttp_trust_env`)."""

    cafile: str | None = None
    verify: bool = True
    proxy: str | None = None
    ws_proxy: str | None = None
    trust_env: bool = False

    @classmethod
    def of(cls, exchange: Any) -> Network:
        """A ccxt exchange's."""
        return cls(
            cafile=exchange.cafile if exchange.verify else None,
            verify=bool(exchange.verify),
            proxy=exchange.httpsProxy or exchange.httpProxy or exchange.aiohttp_proxy,
            ws_proxy=exchange.wssProxy or exchange.wsProxy,
            trust_env=bool(exchange.aiohttp_trust_env),
        )

    def tls(self) -> ssl.SSLContext | bool:
        """aiohttp's ``ssl`` argument (False: certificates not checked)."""
        return ssl.create_default_context(cafile=self.cafile) if self.verify else False


class HttpTransport:
    """The network: one aiohttp session per exchange, opened on the first request.

    `timeout_ms` bounds the connect, each read and the whole request (as ccxt's
    `timeout`); TLS and the proxy are ccxt's for the exchange (`Network`).
    """

    def __init__(self, timeout_ms: int, network: Network | None = None) -> None:
        seconds = timeout_ms / 1000
        self._timeout = aiohttp.ClientTimeout(
            total=seconds, sock_connect=seconds, sock_read=seconds
        )
        self._network = network or Network()
        self._session: aiohttp.ClientSession | None = None

    async def __call__(
        self, url: str, method: str, headers: Mapping[str, str], body: str | None
    ) -> HttpAnswer:
        """Raises aiohttp's `ClientError`s and `TimeoutError`, or `OSError` (DNS)."""
        network = self._network
        if self._session is None:
            connector = aiohttp.TCPConnector(
                ssl=network.tls(),
                enable_cleanup_closed=True,
                family=socket.AF_UNSPEC,
                happy_eyeballs_delay=0,
            )
            self._session = aiohttp.ClientSession(connector=connector, trust_env=network.trust_env)
        async with self._session.request(
            method,
            yarl.URL(url, encoded=True),
            data=body.encode() if body else None,
            headers=dict(headers),
            timeout=self._timeout,
            proxy=network.proxy,
        ) as response:
            text = await response.text(errors="replace")
            joined: dict[str, str] = {}
            for name, value in response.headers.items():  # repeated headers: one, joined
                joined[name] = f"{joined[name]}, {value}" if name in joined else value
            return HttpAnswer(response.status, joined, text, response.reason or "")

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()


class _Context:
    """An `async with` target that holds nothing to release."""

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None


class _Response(_Context):
    """An `HttpAnswer` as the aiohttp response ccxt's `fetch` reads."""

    def __init__(self, answer: HttpAnswer) -> None:
        self.status = answer.status
        self.reason = answer.reason
        self.headers = dict(answer.headers)
        self._body = answer.body

    async def text(self, errors: str = "strict") -> str:
        return self._body

    async def __aenter__(self) -> _Response:
        return self


class _Pending(_Context):
    """`session.get(...)`: the request is sent when entered."""

    def __init__(self, send: Awaitable[HttpAnswer]) -> None:
        self._send = send

    async def __aenter__(self) -> _Response:
        return _Response(await self._send)


class TransportSession:
    """ccxt's `session` (config key) answering through a `Transport`: what ccxt's own
    `fetch` calls (`get`/`post`/`put`/`delete` as `async with`, `headers`)."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        self.headers: dict[str, str] = {}

    def _send(
        self, method: str, url: Any, data: Any, headers: Mapping[str, str] | None
    ) -> _Pending:
        body = data.decode() if isinstance(data, bytes) else data
        return _Pending(self._transport(str(url), method, dict(headers or {}), body))

    def get(self, url: Any, *, data: Any = None, headers: Any = None, **_: Any) -> _Pending:
        return self._send("GET", url, data, headers)

    def post(self, url: Any, *, data: Any = None, headers: Any = None, **_: Any) -> _Pending:
        return self._send("POST", url, data, headers)

    def put(self, url: Any, *, data: Any = None, headers: Any = None, **_: Any) -> _Pending:
        return self._send("PUT", url, data, headers)

    def delete(self, url: Any, *, data: Any = None, headers: Any = None, **_: Any) -> _Pending:
        return self._send("DELETE", url, data, headers)

    async def close(self) -> None:
        return None
