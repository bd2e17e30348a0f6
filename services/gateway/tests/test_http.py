"""The gateway's answers over a real aiohttp server with a fake platform (no SDK):
64-bit ids exact for a JavaScript client, /status as documented, refused ops' topics."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from gateway.app import create_app
from gateway.config import GatewaySettings
from gateway.messages import HistoryParams, Topic, message_frame
from mdclient import HistoryFailed, HistoryResult, IngestorUnavailable, PipelineUnavailable
from mdclient.frames import candles_from_ohlc
from mdclient.request_status import RequestStatus
from mdproto.error_codes import NO_INGESTOR, PIPELINE_UNAVAILABLE
from mdproto.messages import OHLC, HistoryReadyNotification, Status

T = "BINANCE:BTC/USDT"
#: An Iceberg snapshot id seen on a real platform: above 2**53, so a JSON number
#: would reach a JavaScript client as 520810068597018600.
SNAPSHOT = 520810068597018615
EPOCH = 2**63 + 5  # uint64 stamps above 2**53 too


def published(**fields: Any) -> HistoryReadyNotification:
    """A notification as the pipeline publishes it, every 64-bit id above 2**53."""
    return HistoryReadyNotification(
        snapshot_id=SNAPSHOT, sequence=2**53 + 1, publisher_epoch=EPOCH, **fields
    )


def as_javascript(text: str) -> Any:
    """JSON as JavaScript's JSON.parse reads it: every number a double."""
    return json.loads(text, parse_int=float)


class Handle:
    def close(self) -> None:
        pass


class FakePlatform:
    """SdkUpstream's surface: `open` publishes one notification on the topic at once."""

    def __init__(self) -> None:
        self.history_params: list[HistoryParams] = []
        self.failure: Exception | None = None

    def open(
        self, topic: Topic, deliver: Callable[[str], None], fail: Callable[[str, str], None]
    ) -> Handle:
        note = published(request_id="r1", status=Status.OK)
        deliver(message_frame(topic.name, note))
        return Handle()

    def history(self, params: HistoryParams, timeout_s: float) -> HistoryResult:
        self.history_params.append(params)
        if self.failure is not None:
            raise self.failure
        rows = [OHLC(ticker=T, period_seconds=60, open_time_ms=60_000, trade_count=3)]
        note = published(request_id="r1", ticker=T, period_seconds=60, row_count=1)
        return HistoryResult(candles_from_ohlc(rows), "OK", "r1", 1, 0.1, SNAPSHOT, 1, note)

    def status(self, request_id: str) -> RequestStatus:
        # As read from market.requests: the table keeps no sequence or publisher_epoch.
        note = HistoryReadyNotification(request_id=request_id, snapshot_id=SNAPSHOT)
        return RequestStatus(request_id, "OK", note)


Scenario = Callable[[aiohttp.ClientSession, str], Any]


def serve(platform: FakePlatform, scenario: Scenario) -> Any:
    async def run() -> Any:
        app = create_app(GatewaySettings(), upstream=platform)  # type: ignore[arg-type]
        async with TestServer(app, host="127.0.0.1") as server, aiohttp.ClientSession() as http:
            return await scenario(http, str(server.make_url("")))

    return asyncio.run(run())


def test_an_id_above_2_53_reaches_a_javascript_client_exactly() -> None:
    async def scenario(http: aiohttp.ClientSession, base: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with http.ws_connect(f"{base}/ws") as ws:
            await ws.send_json({"op": "subscribe", "topic": "HISTORY_READY:r1"})
            frames = [as_javascript(await ws.receive_str(timeout=5)) for _ in range(2)]
            out["ws"] = next(f for f in frames if f["type"] == "message")["data"]
        body = {"ticker": T, "period": 60, "start": "60000", "end": 120_000}
        async with http.post(f"{base}/history", json=body) as resp:
            out["history"] = as_javascript(await resp.text())
        async with http.get(f"{base}/status/r1") as resp:
            out["status"] = as_javascript(await resp.text())
        return out

    platform = FakePlatform()
    out = serve(platform, scenario)
    for data in (out["ws"], out["history"], out["status"]["notification"]):
        assert data["snapshot_id"] == str(SNAPSHOT)
    assert out["ws"]["sequence"] == str(2**53 + 1)
    assert out["ws"]["publisher_epoch"] == str(EPOCH)
    history = out["history"]
    assert history["candles"][0]["open_time_ms"] == "60000"
    assert history["candles"][0]["trade_count"] == "3"
    assert history["integrity"]["row_count"] == "1"
    # Epoch ms as a decimal string or a number: both taken, passed on as sent.
    assert (platform.history_params[0].start, platform.history_params[0].end) == ("60000", 120_000)


def test_status_refuses_malformed_ids_and_tells_what_the_table_does_not_keep() -> None:
    async def scenario(http: aiohttp.ClientSession, base: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, request_id in (("bad", "bad%20id!"), ("long", "a" * 129), ("ok", "r.1_-x")):
            async with http.get(f"{base}/status/{request_id}") as resp:
                out[name] = (resp.status, await resp.json())
        return out

    out = serve(FakePlatform(), scenario)
    for name in ("bad", "long"):
        status, body = out[name]
        assert status == 400 and body["error_code"] == "bad_id", body
        assert "[A-Za-z0-9_.-]" in body["reason"]
    status, body = out["ok"]
    assert status == 200 and body["state"] == "OK"
    note = body["notification"]
    assert note["request_id"] == "r.1_-x" and note["snapshot_id"] == str(SNAPSHOT)
    assert note["sequence"] is None and note["publisher_epoch"] is None


def test_an_error_notification_keeps_the_stamps_it_was_published_with() -> None:
    async def scenario(http: aiohttp.ClientSession, base: str) -> tuple[int, Any]:
        async with http.post(f"{base}/history", json={"ticker": T, "period": 60, "start": 0}) as r:
            return r.status, as_javascript(await r.text())

    platform = FakePlatform()
    note = published(request_id="r2", status=Status.ERROR)
    platform.failure = HistoryFailed("gave up", error_code="x", request_id="r2", notification=note)
    status, body = serve(platform, scenario)
    assert status == 502 and body["error_code"] == "x"
    assert body["notification"]["sequence"] == str(2**53 + 1)
    assert body["notification"]["publisher_epoch"] == str(EPOCH)


@pytest.mark.parametrize(
    ("error", "code"),
    [(PipelineUnavailable, PIPELINE_UNAVAILABLE), (IngestorUnavailable, NO_INGESTOR)],
)
def test_a_pipeline_or_ingestor_that_stops_under_a_request_is_503(
    error: type[HistoryFailed], code: str
) -> None:
    """The SDK ends the wait at the relay's down report; the gateway passes its code on."""

    async def scenario(http: aiohttp.ClientSession, base: str) -> tuple[int, Any]:
        async with http.post(f"{base}/history", json={"ticker": T, "period": 60, "start": 0}) as r:
            return r.status, await r.json()

    platform = FakePlatform()
    platform.failure = error(
        "stopped serving while the request was in flight (relay: ...)",
        error_code=code,
        request_id="r3",
    )
    status, body = serve(platform, scenario)
    assert status == 503 and body["error_code"] == code
    assert body["request_id"] == "r3" and "in flight" in body["reason"]


def test_a_refused_op_names_the_topic_it_was_sent_with() -> None:
    async def scenario(http: aiohttp.ClientSession, base: str) -> list[dict[str, Any]]:
        ops: list[Any] = [
            {"op": "subscribe", "topic": "BINANCE:"},
            {"op": "publish", "topic": "CEP:t1"},
            {"op": "unsubscribe", "topic": 5},
            {"op": "subscribe"},
        ]
        async with http.ws_connect(f"{base}/ws") as ws:
            for op in ops:
                await ws.send_json(op)
            return [await ws.receive_json(timeout=5) for _ in ops]

    errors = serve(FakePlatform(), scenario)
    assert [(e["type"], e["error_code"], e["topic"]) for e in errors] == [
        ("error", "bad_topic", "BINANCE:"),
        ("error", "bad_request", "CEP:t1"),
        ("error", "bad_topic", None),  # not a string: no topic to name
        ("error", "bad_request", None),
    ]
