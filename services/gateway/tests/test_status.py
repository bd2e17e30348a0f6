"""`GET /status` answers the whole notification: the requests table's fields plus the
stamps of the publication the gateway received (gateway.notices), over a real aiohttp
server, the real SdkUpstream and a fake SDK client."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer
from google.protobuf.message import Message

from gateway.app import create_app
from gateway.config import GatewaySettings
from gateway.notices import ReceivedStamps
from gateway.platform import SdkUpstream
from mdclient import HistoryFailed, HistoryResult
from mdclient.frames import candles_from_ohlc
from mdclient.request_status import RequestStatus
from mdproto.messages import CEPTriggerEvent, HistoryReadyNotification, Status

T = "BINANCE:BTC/USDT"
EPOCH = 2**63 + 5  # above 2**53: must come back exactly, as a string


def recorded(request_id: str, status: Status.ValueType = Status.OK) -> HistoryReadyNotification:
    """A notification as market.requests gives it back: no stamps."""
    return HistoryReadyNotification(
        request_id=request_id, status=status, ticker=T, period_seconds=60, snapshot_id=2**60
    )


def published(
    request_id: str, sequence: int, status: Status.ValueType = Status.OK
) -> HistoryReadyNotification:
    note = recorded(request_id, status)
    note.sequence, note.publisher_epoch = sequence, EPOCH
    return note


class Handle:
    def close(self) -> None:
        pass


class FakeClient:
    """mdclient.Client's surface SdkUpstream uses; every request is in the table."""

    def __init__(self, recorded: tuple[str, ...] | None = None) -> None:
        self.next_history: HistoryResult | Exception | None = None
        self.recorded = recorded  # ids with a row (None: every id)
        self.relays_asked: list[str] = []

    def history(self, *args: Any, **kwargs: Any) -> HistoryResult:
        assert self.next_history is not None
        if isinstance(self.next_history, Exception):
            raise self.next_history
        return self.next_history

    def recorded_status(self, request_id: str) -> RequestStatus | None:
        if self.recorded is not None and request_id not in self.recorded:
            return None
        return RequestStatus(request_id, "OK", recorded(request_id))

    def relay_status(self, request_id: str) -> RequestStatus:
        """The relays' answer: they accepted ids starting `running`."""
        self.relays_asked.append(request_id)
        state = "PENDING" if request_id.startswith("running") else "UNKNOWN"
        return RequestStatus(request_id, state, accepted_at_ms=5 if state == "PENDING" else 0)

    def watch(self, topic: str, callback: Callable[[str, Message], None]) -> Handle:
        request_id = topic.partition(":")[2]
        callback(topic, CEPTriggerEvent(trigger_id=request_id))  # not a notification
        callback(topic, published(request_id, sequence=7))
        return Handle()


def result(note: HistoryReadyNotification) -> HistoryResult:
    return HistoryResult(candles_from_ohlc([]), "OK", note.request_id, 1, 0.1, 1, 0, note)


def test_status_answers_the_stamps_of_the_notifications_the_gateway_received() -> None:
    client = FakeClient()

    async def scenario(http: aiohttp.ClientSession, base: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        client.next_history = result(published("mine", sequence=1))
        async with http.post(f"{base}/history", json={"ticker": T, "period": 60, "start": 0}):
            pass
        failed = published("failed", sequence=2, status=Status.ERROR)
        client.next_history = HistoryFailed("x", error_code="x", notification=failed)
        async with http.post(f"{base}/history", json={"ticker": T, "period": 60, "start": 0}):
            pass
        async with http.ws_connect(f"{base}/ws") as ws:
            await ws.send_json({"op": "subscribe", "topic": "HISTORY_READY:watched"})
            while (await ws.receive_json(timeout=5))["type"] != "message":
                pass
        for request_id in ("mine", "failed", "watched", "elsewhere"):
            async with http.get(f"{base}/status/{request_id}") as resp:
                assert resp.status == 200
                out[request_id] = (await resp.json())["notification"]
        return out

    async def run() -> dict[str, Any]:
        upstream = SdkUpstream(client)  # type: ignore[arg-type]
        app = create_app(GatewaySettings(), upstream)
        async with TestServer(app, host="127.0.0.1") as server, aiohttp.ClientSession() as http:
            return await scenario(http, str(server.make_url("")))

    out = asyncio.run(run())
    stamps = {k: (n["sequence"], n["publisher_epoch"]) for k, n in out.items()}
    assert stamps == {
        "mine": ("1", str(EPOCH)),
        "failed": ("2", str(EPOCH)),
        "watched": ("7", str(EPOCH)),
        "elsewhere": (None, None),  # published to another client: the table has no stamps
    }
    for request_id, note in out.items():  # the rest is the table's, every field present
        assert note["request_id"] == request_id and note["snapshot_id"] == str(2**60)
        assert set(note) == {f.name for f in HistoryReadyNotification.DESCRIPTOR.fields}


def test_received_stamps_keep_the_latest_publication_of_the_newest_requests() -> None:
    stamps = ReceivedStamps(capacity=2)
    stamps.add(published("a", sequence=1))
    stamps.add(recorded("b"))  # recovered from the table: nothing to remember
    assert len(stamps) == 1
    republished = published("a", sequence=1)
    republished.publisher_epoch = EPOCH + 1  # after a pipeline restart
    stamps.add(republished)
    assert stamps.stamped(recorded("a")).publisher_epoch == EPOCH + 1
    stamps.add(published("c", sequence=1))
    stamps.add(published("d", sequence=1))
    assert stamps.stamped(recorded("a")).publisher_epoch == 0  # evicted: the oldest
    assert stamps.stamped(recorded("d")).sequence == 1
    table_note = recorded("d")
    assert stamps.stamped(table_note) is not table_note and table_note.sequence == 0


def test_a_received_notification_answers_status_before_its_row_is_written() -> None:
    """A stored answer is notified ahead of the history query's `requests` row: the
    gateway that received it says OK, not PENDING, in between (CI's conformance run)."""
    from mdclient.request_status import status_from_notification

    stamps = ReceivedStamps(capacity=1)
    stamps.add(published("early", sequence=3))
    note = stamps.received("early")
    assert note is not None and note.sequence == 3
    answer = status_from_notification(note)
    assert (answer.request_id, answer.state, answer.done) == ("early", "OK", True)
    stamps.add(published("later", sequence=1))
    assert stamps.received("early") is None  # evicted with its stamps


def test_status_without_an_outcome_is_the_relays_pending_or_unknown() -> None:
    """Issue 47: an id never submitted was PENDING, like one running. A notification the
    gateway received answers before its row exists, without asking the relays."""
    client = FakeClient(recorded=("done",))

    async def scenario(http: aiohttp.ClientSession, base: str) -> dict[str, Any]:
        client.next_history = result(published("received", sequence=4))
        async with http.post(f"{base}/history", json={"ticker": T, "period": 60, "start": 0}):
            pass
        out: dict[str, Any] = {}
        for request_id in ("done", "received", "running-1", "never"):
            async with http.get(f"{base}/status/{request_id}") as resp:
                assert resp.status == 200
                out[request_id] = await resp.json()
        return out

    async def run() -> dict[str, Any]:
        upstream = SdkUpstream(client)  # type: ignore[arg-type]
        app = create_app(GatewaySettings(), upstream)
        async with TestServer(app, host="127.0.0.1") as server, aiohttp.ClientSession() as http:
            return await scenario(http, str(server.make_url("")))

    out = asyncio.run(run())
    assert {k: v["state"] for k, v in out.items()} == {
        "done": "OK",
        "received": "OK",
        "running-1": "PENDING",
        "never": "UNKNOWN",
    }
    assert out["never"] == {"request_id": "never", "state": "UNKNOWN", "notification": None}
    assert client.relays_asked == ["running-1", "never"]
