"""Feed status end to end: SDK client -> real relay -> real ingestor -> simulator, and back.

An unknown symbol makes the ingestor's feed FAILED (bad_symbol); the relay
publishes it on `{ticker}|status` and the client's iterator raises. A candle
period the pipeline does not serve is REFUSED by the relay. A real symbol
reports STARTED. No pipeline runs: statuses do not need one.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from infra.testing import free_port
from ingestor.app import Ingestor
from mdclient import Client, ClientSettings, FeedRefused, FeedUnavailable
from mdproto.messages import FeedStatus
from relay import Relay, RelaySettings

pytestmark = pytest.mark.stack
log = logging.getLogger(__name__)


def start_relay() -> tuple[Relay, threading.Thread]:
    relay = Relay(RelaySettings.loopback(f"tcp://127.0.0.1:{free_port()}"))  # no pipeline
    relay.start()
    thread = threading.Thread(target=relay.run, name="relay-loop", daemon=True)
    thread.start()
    return relay, thread


def first_failure(client: Client, ticker: str, **kwargs: Any) -> tuple[FeedUnavailable, float]:
    """Subscribe, iterate until the stream fails; the error and seconds since subscribing."""
    started = time.monotonic()
    with client.live(ticker, **kwargs) as stream:
        try:
            for _ in stream:
                pass
        except FeedUnavailable as exc:
            return exc, time.monotonic() - started
    raise AssertionError(f"{ticker}: the stream ended without a FeedUnavailable")


def test_client_sees_failed_refused_and_started_through_relay_and_ingestor(
    harness: Any, run_ingestor: Any
) -> None:
    relay, relay_thread = start_relay()
    assert relay.endpoints is not None
    ends = relay.endpoints
    fake_relay = SimpleNamespace(
        endpoints={
            "relay_work_endpoint": ends.ingestor_work,
            "relay_control_endpoint": ends.ingestor_control,
            "relay_response_endpoint": ends.ingestor_response,
        }
    )
    client_settings = ClientSettings(
        request_endpoint=ends.client_request, market_data_endpoint=ends.market_data
    )

    def wait_served(timeout_s: float = 15.0) -> None:
        """Until the relay saw the ingestor subscribe to its work socket."""
        deadline = time.monotonic() + timeout_s
        while relay.metrics.sample("relay_ingestor_subscriptions", {"socket": "work"}) < 1:
            assert time.monotonic() < deadline, "the ingestor never subscribed to the relay"
            time.sleep(0.05)

    def client_side() -> tuple[
        tuple[FeedUnavailable, float], tuple[FeedUnavailable, float], FeedStatus
    ]:
        started = threading.Event()
        seen: list[FeedStatus] = []

        def on_status(status: FeedStatus) -> None:
            seen.append(status)
            started.set()

        wait_served()
        with Client(settings=client_settings) as client:
            failed = first_failure(client, "BINANCE:NOPE/USDT")
            refused = first_failure(client, "BINANCE:BTC/USDT", ohlc=["15m"])
            with client.live("BINANCE:ETH/USDT", on_status=on_status):
                assert started.wait(20), "no STARTED for a real symbol"
        return failed, refused, seen[0]

    async def scenario() -> Any:
        ingestor = Ingestor(harness.settings(fake_relay))
        task = await run_ingestor(ingestor)
        try:
            return await asyncio.to_thread(client_side)
        finally:
            await ingestor.stop()
            await task

    try:
        (failed, failed_s), (refused, refused_s), started = asyncio.run(scenario())
    finally:
        relay.stop()
        relay_thread.join(10)
        relay.close()
    log.warning("subscribe -> FAILED %.3f s, -> REFUSED %.3f s", failed_s, refused_s)
    assert (failed.state, failed.error_code, failed.ticker) == (
        "FAILED",
        "bad_symbol",
        "BINANCE:NOPE/USDT",
    )
    assert failed_s < 5.0
    assert isinstance(refused, FeedRefused) and refused.period_seconds == 900
    assert refused.error_code == "unsupported_period" and refused_s < 2.0
    assert (started.ticker, started.state) == ("BINANCE:ETH/USDT", FeedStatus.STARTED)
    assert started.ingestor_id
