"""The gateway in a background thread of this process (tests, benchmarks).

`cli.main` is the service; this serves the same application on its own event
loop so a test or a benchmark can talk to it over real sockets.
"""

from __future__ import annotations

import asyncio
import threading
from types import TracebackType
from typing import Self

from aiohttp import web

from gateway.app import create_app
from gateway.config import GatewaySettings
from gateway.platform import SdkUpstream
from mdclient import Client, ClientSettings


class GatewayThread:
    """`with GatewayThread(settings, client_settings) as gw: gw.url` (port 0: a free one)."""

    def __init__(self, settings: GatewaySettings, client_settings: ClientSettings) -> None:
        self.settings = settings
        self.client = Client(settings=client_settings)
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self.port = 0
        self._thread = threading.Thread(target=self._run, name="gateway", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.port}"

    def __enter__(self) -> Self:
        self._thread.start()
        if not self._started.wait(30) or self._error is not None:
            self.close()
            raise RuntimeError(f"the gateway did not start: {self._error}")
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._start())
        except BaseException as exc:
            self._error = exc
            self._started.set()
            return
        self._started.set()
        self._loop.run_forever()
        if self._runner is not None:
            self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    async def _start(self) -> None:
        app = create_app(self.settings, SdkUpstream(self.client, self.settings.book_levels))
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.host, self.settings.port)
        await site.start()
        server = site._server
        assert isinstance(server, asyncio.base_events.Server)
        self.port = int(server.sockets[0].getsockname()[1])

    def close(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)
        self.client.close()
