"""Feed status end to end: SDK client -> real relay -> real ingestor -> simulator, and back.

An unknown symbol makes the ingestor's feed FAILED (bad_symbol); the relay
publishes it on `{ticker}|status` and the client's iterator raises. A candle
period the pipeline does not serve is REFUSED by the relay. A real symbol
reports STARTED, a dropped websocket LOST then RECOVERED, an exchange whose
websocket endpoint is down FAILED after `live.start_attempts`. No pipeline
runs: statuses do not need one.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest

from infra.testing import free_port
from ingestor.app import Ingestor
from mdclient import Client, ClientSettings, FeedRefused, FeedUnavailable
from mdproto.messages import FeedStatus
from relay import Relay, RelaySettings
from relay.metrics import INGESTOR_SUBSCRIPTIONS

pytestmark = pytest.mark.stack
log = logging.getLogger(__name__)
T = TypeVar("T")


def run_platform(
    harness: Any,
    run_ingestor: Any,
    client_side: Callable[[Client], T],
    **relay_overrides: Any,
) -> T:
    """A real relay (thread) and ingestor (event loop) while `client_side` runs (a thread)."""
    settings = RelaySettings.loopback(f"tcp://127.0.0.1:{free_port()}", **relay_overrides)
    relay = Relay(settings)  # no pipeline upstream: statuses do not need one
    ends = relay.start()
    relay_thread = threading.Thread(target=relay.run, name="relay-loop", daemon=True)
    relay_thread.start()
    endpoints = SimpleNamespace(
        endpoints={
            "relay_work_endpoint": ends.ingestor_work,
            "relay_control_endpoint": ends.ingestor_control,
            "relay_response_endpoint": ends.ingestor_response,
        }
    )

    def with_client() -> T:
        deadline = time.monotonic() + 15
        while relay.metrics.sample(INGESTOR_SUBSCRIPTIONS, {"socket": "work"}) < 1:
            assert time.monotonic() < deadline, "the ingestor never subscribed to the relay"
            time.sleep(0.05)
        client_settings = ClientSettings(
            request_endpoint=ends.client_request, market_data_endpoint=ends.market_data
        )
        with Client(settings=client_settings) as client:
            return client_side(client)

    async def scenario() -> T:
        ingestor = Ingestor(harness.settings(endpoints, live={"start_attempts": 3}))
        task = await run_ingestor(ingestor)
        try:
            return await asyncio.to_thread(with_client)
        finally:
            await ingestor.stop()
            await task

    try:
        return asyncio.run(scenario())
    finally:
        relay.stop()
        relay_thread.join(10)
        relay.close()


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


def next_state(statuses: queue.SimpleQueue[FeedStatus], timeout_s: float = 20.0) -> int:
    try:
        return statuses.get(timeout=timeout_s).state
    except queue.Empty:
        raise AssertionError(f"no FeedStatus within {timeout_s} s") from None


def test_unknown_symbol_fails_and_an_unsupported_period_is_refused(
    harness: Any, run_ingestor: Any
) -> None:
    def client_side(client: Client) -> Any:
        return (
            first_failure(client, "BINANCE:NOPE/USDT"),
            first_failure(client, "BINANCE:BTC/USDT", ohlc=["15m"]),
        )

    (failed, failed_s), (refused, refused_s) = run_platform(harness, run_ingestor, client_side)
    log.warning("subscribe -> FAILED %.3f s, -> REFUSED %.3f s", failed_s, refused_s)
    assert (failed.state, failed.error_code, failed.ticker) == (
        "FAILED",
        "bad_symbol",
        "BINANCE:NOPE/USDT",
    )
    assert failed_s < 5.0
    assert isinstance(refused, FeedRefused) and refused.period_seconds == 900
    assert refused.error_code == "unsupported_period" and refused_s < 2.0


def test_a_feed_starts_is_lost_and_recovers(harness: Any, run_ingestor: Any) -> None:
    sim = harness.sim

    def client_side(client: Client) -> list[int]:
        statuses: queue.SimpleQueue[FeedStatus] = queue.SimpleQueue()
        with client.live("BINANCE:ETH/USDT", on_status=statuses.put):
            states = [next_state(statuses)]
            sim.wait_for_subscribers("ETH/USDT", 1)
            assert sim.drop_websockets("ETH/USDT") >= 1
            states += [next_state(statuses), next_state(statuses)]
        return states

    states = run_platform(harness, run_ingestor, client_side)
    assert states == [FeedStatus.STARTED, FeedStatus.LOST, FeedStatus.RECOVERED]


def test_an_exchange_that_stays_down_fails_the_feed_then_it_starts(
    harness: Any, run_ingestor: Any
) -> None:
    sim = harness.sim

    def client_side(client: Client) -> tuple[FeedUnavailable, float, list[int]]:
        sim.add_fault("unavailable", path="/stream", count=1000)  # websocket handshakes: 503
        failed, failed_s = first_failure(client, "BINANCE:SOL/USDT")
        sim.clear_faults()
        # The relay re-announces the ticker (grace period): the ingestor starts it again.
        statuses: queue.SimpleQueue[FeedStatus] = queue.SimpleQueue()
        with client.live("BINANCE:SOL/USDT", on_status=statuses.put):
            states = [next_state(statuses)]  # the relay's last value first
            while states[-1] != FeedStatus.STARTED:
                states.append(next_state(statuses))
        return failed, failed_s, states

    failed, failed_s, states = run_platform(
        harness, run_ingestor, client_side, realtime_refresh_s=1.0
    )
    log.warning("exchange down: subscribe -> FAILED %.3f s", failed_s)
    assert failed.state == "FAILED" and "after 3 attempts" in failed.reason
    assert failed.error_code in ("exchange_unavailable", "network_error")
    # The restart is announced as LOST (it replaces the FAILED), then the data says STARTED.
    assert FeedStatus.LOST in states and states[-1] == FeedStatus.STARTED
