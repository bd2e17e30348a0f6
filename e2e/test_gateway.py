"""The gateway over the real platform: WebSocket live topics, HTTP history and status."""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.stack, pytest.mark.spark]

TICKER = "BINANCE:BTC/USDT"
TICK = f"{TICKER}|tick"
CANDLES = f"{TICKER}|ohlc:60"

Frame = dict[str, Any]


async def _until(
    ws: aiohttp.ClientWebSocketResponse, want: Callable[[Frame], bool], timeout_s: float
) -> tuple[Frame, list[Frame]]:
    """The first frame `want` accepts, and every frame received before it."""
    seen: list[Frame] = []
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no matching frame within {timeout_s} s; got {seen[-5:]}")
        frame = json.loads(await ws.receive_str(timeout=left))
        if want(frame):
            return frame, seen
        seen.append(frame)


def test_websocket_serves_live_ticks_and_candles_on_exact_topics(gateway: str) -> None:
    async def scenario() -> tuple[list[Frame], Frame, Frame, Frame]:
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(f"{gateway}/ws") as ws,
        ):
            for topic in (TICK, CANDLES, f"{TICKER}|ohlc:", "BINANCE:"):
                await ws.send_json({"op": "subscribe", "topic": topic})
            # Prefixes are refused at once: the gateway serves exact topics only.
            refused, _ = await _until(ws, lambda f: f["type"] == "error", 5)
            # A period the platform does not serve live: REFUSED by the relay, told in seconds.
            start = time.monotonic()
            await ws.send_json({"op": "subscribe", "topic": f"{TICKER}|ohlc:6"})
            unsupported, _ = await _until(
                ws, lambda f: f["type"] == "error" and f["topic"] == f"{TICKER}|ohlc:6", 30
            )
            assert time.monotonic() - start < 15  # 0.05 s on a quiet machine
            frames: list[Frame] = []
            kinds: set[str] = set()
            # The first live data of a just-started pipeline on loaded cores is slow
            # (e2e/test_live.py): generous, the bench measures.
            deadline = time.monotonic() + 240
            while kinds != {"Tick", "OHLC"}:
                frame, before = await _until(
                    ws, lambda f: f["type"] == "message", deadline - time.monotonic()
                )
                frames += [*before, frame]
                kinds.add(frame["message_type"])
            await ws.send_json({"op": "unsubscribe", "topic": TICK})
            gone, _ = await _until(ws, lambda f: f["type"] == "unsubscribed", 10)
            return frames, refused, unsupported, gone

    frames, refused, unsupported, gone = asyncio.run(scenario())
    assert refused["error_code"] == "bad_topic"
    assert refused["topic"] in (f"{TICKER}|ohlc:", "BINANCE:")  # the refused op's topic
    assert unsupported["error_code"] == "unsupported_period", unsupported
    assert gone["topic"] == TICK
    messages = [f for f in frames if f["type"] == "message"]
    for frame in messages:  # exact topics: never `|ohlc:6`, never another period
        assert frame["topic"] in (TICK, CANDLES), frame
        data = frame["data"]
        assert data["ticker"] == TICKER
        if frame["topic"] == TICK:
            assert frame["message_type"] == "Tick" and data["price"] > 0
            assert data["timestamp_ms"].isdigit() and data["side"] in ("BUY", "SELL")
        else:
            assert frame["message_type"] == "OHLC" and data["period_seconds"] == 60
            assert data["low"] <= data["open"] <= data["high"]
            assert int(data["open_time_ms"]) % 60_000 == 0
        assert data["sequence"].isdigit() and data["publisher_epoch"].isdigit()  # exact strings


def test_http_history_as_json_arrow_and_parquet_and_its_status(gateway: str) -> None:
    # One fixed range for the three answers (relative times would move between them).
    end_ms = int(time.time() * 1000) // 60_000 * 60_000 - 3_600_000
    body = {"ticker": TICKER, "period": "1m", "start": end_ms - 7_200_000, "end": end_ms}

    async def scenario() -> tuple[Any, ...]:
        # No client-side limit: the gateway bounds a history call itself (its SDK timeout
        # and attempts, then 504), and a just-started pipeline on loaded cores is slow.
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as http:
            async with http.post(f"{gateway}/history", json=body) as resp:
                assert resp.status == 200, await resp.text()
                as_json = await resp.json()
            arrow_type = "application/vnd.apache.arrow.stream"
            headers = {"Accept": arrow_type}
            async with http.post(f"{gateway}/history", json=body, headers=headers) as resp:
                assert resp.status == 200 and resp.content_type == arrow_type
                arrow = await resp.read()
                arrow_headers = dict(resp.headers)
            url = f"{gateway}/history?format=parquet"
            async with http.post(url, json=body) as resp:
                assert resp.status == 200, await resp.text()
                parquet = await resp.read()
            async with http.get(f"{gateway}/status/{as_json['request_id']}") as resp:
                status = await resp.json()
            async with http.get(f"{gateway}/status/never-submitted-0") as resp:
                unknown = await resp.json()
            async with http.get(f"{gateway}/status/bad%20id!") as resp:
                malformed = (resp.status, (await resp.json())["error_code"])
            bad = {**body, "ticker": "btc-usdt"}
            async with http.post(f"{gateway}/history", json=bad) as resp:
                rejected = (resp.status, await resp.json())
            return as_json, arrow, arrow_headers, parquet, status, unknown, malformed, rejected

    as_json, arrow, arrow_headers, parquet, status, unknown, malformed, rejected = asyncio.run(
        scenario()
    )
    candles = as_json["candles"]
    assert as_json["status"] == "OK" and len(candles) >= 100  # ~120 one-minute candles
    times = [int(c["open_time_ms"]) for c in candles]  # 64-bit integers: decimal strings
    assert times == sorted(times) and all(t % 60_000 == 0 for t in times)
    report = as_json["integrity"]
    assert int(report["expected_candles"]) >= len(candles)
    assert report["missing_candles"] == "0" and report["source"].startswith("SOURCE_")
    assert report["row_count"] == str(len(candles))
    assert as_json["snapshot_id"].isdigit()
    table = pa.ipc.open_stream(arrow).read_all()
    assert table.num_rows == int(arrow_headers["X-Row-Count"])
    assert arrow_headers["X-Missing-Candles"] == "0"
    from_parquet = pq.read_table(io.BytesIO(parquet))
    assert from_parquet.column("close").to_pylist() == table.column("close").to_pylist()
    assert table.num_rows == len(candles)
    assert status["state"] == "OK" and status["notification"]["request_id"] == as_json["request_id"]
    assert status["notification"]["snapshot_id"] == as_json["snapshot_id"]
    # The whole notification: the stamps of the publication this gateway received.
    assert int(status["notification"]["sequence"]) >= 1
    assert int(status["notification"]["publisher_epoch"]) > 0
    assert "notify;dur=" in arrow_headers["Server-Timing"]
    # Never submitted: no outcome, and no relay remembers accepting it (not PENDING).
    assert unknown == {"request_id": "never-submitted-0", "state": "UNKNOWN", "notification": None}
    assert malformed == (400, "bad_id")  # can never exist: not UNKNOWN either
    assert rejected[0] == 400 and rejected[1]["error_code"]
