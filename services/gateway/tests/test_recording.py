"""`GET /recording` over a real aiohttp server with a fake platform: the SDK's status as
JSON, the query checked, SDK errors as HTTP errors, the token required."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from gateway.app import create_app
from gateway.config import GatewaySettings
from gateway.messages import GatewayError, parse_recording_query
from mdclient import StorageError
from mdclient.recording import GapCounts, RecordedMarket, RecordingStatus

T = "BINANCE:BTC/USDT"
SINCE_MS = 1_795_132_800_123


class FakePlatform:
    """SdkUpstream's `recording`; records the exchanges asked."""

    def __init__(self) -> None:
        self.asked: list[str | None] = []
        self.failure: Exception | None = None

    def recording(self, exchange: str | None) -> RecordingStatus:
        self.asked.append(exchange)
        if self.failure is not None:
            raise self.failure
        market = RecordedMarket(T, SINCE_MS, SINCE_MS + 5, 2**40, GapCounts(open=1))
        return RecordingStatus(exchange, SINCE_MS + 9, "2026-11-20", (market,))


def serve(platform: FakePlatform, *paths: str, token: str = "") -> list[tuple[int, Any]]:
    async def run() -> list[tuple[int, Any]]:
        app = create_app(GatewaySettings(token=token), upstream=platform)  # type: ignore[arg-type]
        out = []
        async with TestServer(app, host="127.0.0.1") as server, aiohttp.ClientSession() as http:
            for path in paths:
                async with http.get(str(server.make_url(path))) as resp:
                    out.append((resp.status, await resp.json()))
        return out

    return asyncio.run(run())


def test_recording_answers_the_sdks_status_as_json() -> None:
    platform = FakePlatform()
    (all_, one) = serve(platform, "/recording", "/recording?exchange=binance")
    assert platform.asked == [None, "BINANCE"]
    assert all_[0] == 200 and all_[1]["exchange"] is None
    status, body = one
    assert status == 200 and body["exchange"] == "BINANCE"
    (market,) = body["markets"]
    assert market["ticker"] == T and market["state"] == "repairing"
    assert market["since_ms"] == str(SINCE_MS) and market["trades_today"] == str(2**40)
    assert market["gaps"] == {"open": 1, "repairing": 0, "repaired": 0, "unrepairable": 0}


def test_a_bad_query_is_refused_and_sdk_errors_keep_their_code() -> None:
    platform = FakePlatform()
    bad_exchange, unknown = serve(platform, "/recording?exchange=no%20way", "/recording?x=1")
    assert bad_exchange[0] == 400 and bad_exchange[1]["error_code"] == "bad_request"
    assert unknown == (400, {"error_code": "bad_request", "reason": "unknown parameter(s): x"})
    assert platform.asked == []
    platform.failure = StorageError("no Iceberg table market.ticks", error_code="no_table")
    ((status, body),) = serve(platform, "/recording")
    assert (status, body["error_code"]) == (502, "no_table")


def test_recording_needs_the_token() -> None:
    platform = FakePlatform()
    refused, header_less = serve(
        platform, "/recording", "/recording?token=s3cret&exchange=BINANCE", token="s3cret"
    )
    assert refused[0] == 401 and header_less[0] == 200
    assert platform.asked == ["BINANCE"]


@pytest.mark.parametrize(
    ("query", "exchange"),
    [({}, None), ({"exchange": ""}, None), ({"exchange": "okx:"}, "OKX"), ({"token": "t"}, None)],
)
def test_the_exchange_parameter(query: dict[str, str], exchange: str | None) -> None:
    assert parse_recording_query(query) == exchange


def test_a_ticker_is_not_an_exchange() -> None:
    with pytest.raises(GatewayError) as info:
        parse_recording_query({"exchange": "BINANCE:BTC/USDT"})
    assert info.value.error_code == "bad_request"
