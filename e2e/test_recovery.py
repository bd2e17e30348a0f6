"""A pipeline crash, a catalog restart and an S3 outage while a request is being stored:
the request still gets every candle once and exactly one notification. A hung
pipeline: requests are refused with a reason within seconds."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import zmq

from infra.exchange_sim import expected_klines
from infra.exchange_sim.control import SimulatorControl
from infra.platform.faults import Faults
from infra.platform.metrics import PIPELINE_SERVES_HISTORY, metric_sample
from infra.platform.supervisor import PlatformEndpoints
from infra.testing import notified_request_ids
from mdclient import (
    Client,
    ClientSettings,
    HistoryResult,
    PipelineUnavailable,
    SubmitRejected,
    TriggerRejected,
)
from mdclient.history import ProgressEvent
from mdproto import topics
from mdproto.messages import Status

pytestmark = [pytest.mark.e2e, pytest.mark.stack, pytest.mark.spark]

HOUR_MS = 3_600_000


def interrupted_mid_store(
    fault: Callable[[], None],
    *,
    page_delay_s: float,
    fast_pages: int = 0,
    symbol: str,
    days_ago: int,
    client_id: str,
    endpoints: PlatformEndpoints,
    client_settings: ClientSettings,
    sim: SimulatorControl,
) -> None:
    """Ask for 5 days of BINANCE:`symbol` (7,200 candles: 8 exchange pages, all but the
    first `fast_pages` slowed by `page_delay_s`), run `fault` once the pipeline has
    stored part of them, and check the answer: every candle once, and one notification
    on the client's topic. (The ingestor fetches 4 pages at once: fast pages stored
    while the others are held make "part of them" sure, whatever the pipeline's pace.)"""
    ticker = f"BINANCE:{symbol}"
    now = int(time.time() * 1000)
    start = (now - days_ago * 24 * HOUR_MS) // HOUR_MS * HOUR_MS
    end = start + 5 * 24 * HOUR_MS
    expected = [k.open_time for k in expected_klines(symbol, "1m", start, end)]
    expected = [t for t in expected if t < end]

    # Count every notification on the client's topic with a plain SUB of our own.
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    counter = ctx.socket(zmq.SUB)
    counter.connect(endpoints.market_data)
    counter.subscribe(topics.response_topic(client_id).encode())
    results: list[HistoryResult] = []
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            with Client(settings=client_settings, client_id=client_id) as client:
                results.append(client.history(ticker, "1m", start, end, timeout_s=300))
        except BaseException as exc:
            errors.append(exc)

    slowed = 8 - fast_pages
    sim.add_fault("slow", delay=page_delay_s, path="/api/v3/klines", after=fast_pages, count=slowed)
    worker = threading.Thread(target=ask)
    worker.start()
    try:
        reader = Client(settings=client_settings).reader()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            rows = reader.read_ohlc("market.ohlc", ticker, 60, start, end)
            if 0 < rows.num_rows < len(expected):
                break
            time.sleep(0.5)
        else:
            pytest.fail("the pipeline never committed a part of the request")
        fault()
    finally:
        worker.join(timeout=400)
        sim.clear_faults()
    # A pipeline down longer than the relay's 5 s heartbeat check ends the SDK's wait
    # with PipelineUnavailable (docs/protocol.md "Pipeline liveness"); the request itself
    # is still answered once the pipeline is back, and its outcome is recorded.
    assert all(isinstance(e, PipelineUnavailable) for e in errors), errors
    if results:
        [result] = results
        request_id, table, reported = result.request_id, result.table, result.reported_rows
    else:
        [ended] = errors
        assert isinstance(ended, PipelineUnavailable) and ended.request_id
        request_id = ended.request_id
        with Client(settings=client_settings) as client:
            deadline = time.monotonic() + 300
            while not (status := client.status(request_id)).done:
                assert time.monotonic() < deadline, f"{request_id} never answered: {status}"
                time.sleep(1)
        assert status.notification is not None and status.notification.status == Status.OK
        reported = status.notification.row_count
        table = reader.read_ohlc("market.ohlc", ticker, 60, start, end)
    open_times = [int(ts.timestamp() * 1000) for ts in table.column("open_time").to_pylist()]
    assert open_times == expected  # every candle, once
    assert reported == len(expected)

    # A barrier request on the same topic: anything published for the first
    # request before it (a duplicate) is already in the counter's queue.
    with Client(settings=client_settings, client_id=client_id) as client:
        client.history("BINANCE:ETH/USDT", "1m", start, start + HOUR_MS)
    assert notified_request_ids(counter).count(request_id) == 1
    counter.close()


def test_pipeline_killed_mid_request_notifies_once_without_duplicates(
    faults: Faults,
    endpoints: PlatformEndpoints,
    client_settings: ClientSettings,
    sim: SimulatorControl,
) -> None:
    def crash() -> None:
        faults.kill("spark-pipeline")  # SIGKILL: a process, or the whole container
        faults.start("spark-pipeline")  # returns once its streaming queries run again

    # Two pages stored, six held at the exchange for 8 s each (under the ingestor's 10 s
    # page timeout): the crash comes mid-request.
    interrupted_mid_store(
        crash,
        page_delay_s=8,
        fast_pages=2,
        symbol="BTC/USDT",
        days_ago=30,
        client_id="e2e-crash",
        endpoints=endpoints,
        client_settings=client_settings,
        sim=sim,
    )


def test_catalog_restart_and_an_s3_outage_mid_request_answer_once(
    faults: Faults,
    endpoints: PlatformEndpoints,
    client_settings: ClientSettings,
    sim: SimulatorControl,
) -> None:
    """Issue 25 on the platform: the pipeline's commits retry through a catalog restart
    and 20 s without S3."""
    s3 = "minio" if faults.stack == "compose" else "seaweedfs"

    def outage() -> None:
        faults.restart("iceberg-rest")  # returns once the catalog answers again
        faults.kill(s3)
        time.sleep(20)  # the outage itself: commits in this window must wait and retry
        faults.start(s3)

    # Two rounds of four 8 s pages: the second round's rows and the request's record are
    # committed while the catalog restarts and S3 is down.
    try:
        interrupted_mid_store(
            outage,
            page_delay_s=8,
            symbol="SOL/USDT",
            days_ago=120,
            client_id="e2e-outage",
            endpoints=endpoints,
            client_settings=client_settings,
            sim=sim,
        )
    finally:
        faults.wait_ready(s3)  # back for later tests, whatever happened


def test_a_hung_pipeline_is_refused_within_seconds_with_a_reason(
    faults: Faults,
    endpoints: PlatformEndpoints,
    client_settings: ClientSettings,
    sim: SimulatorControl,
) -> None:
    """Issue 27: the pipeline frozen (SIGSTOP; compose: the cgroup freezer), the relay
    refuses history submits and trigger registrations `pipeline_unavailable` within
    its 5 s heartbeat timeout, instead of an OK followed by the client's timeout.
    Issue 45: a request accepted before the freeze ends with the same code, at the
    relay's down report on `PIPELINE:status`, not at the history timeout."""
    serving = f"{endpoints.relay_metrics}/metrics"
    history = PIPELINE_SERVES_HISTORY
    assert metric_sample(serving, history) == 1
    start = (int(time.time() * 1000) - 200 * 24 * HOUR_MS) // HOUR_MS * HOUR_MS
    in_flight: list[BaseException] = []
    accepted = threading.Event()

    def waiting(event: ProgressEvent) -> None:
        if event.phase == "waiting":
            accepted.set()

    def ask() -> None:  # another range, held at the exchange: in flight at the freeze
        early = start - 10 * 24 * HOUR_MS
        try:
            with Client(settings=client_settings) as client:
                client.history("BINANCE:BTC/USDT", "1m", early, early + HOUR_MS, progress=waiting)
        except BaseException as exc:
            in_flight.append(exc)

    sim.add_fault("slow", delay=30, path="/api/v3/klines", count=1)
    asker = threading.Thread(target=ask)
    asker.start()
    assert accepted.wait(60), in_flight
    paused_at = time.monotonic()
    faults.pause("spark-pipeline")
    try:
        asker.join(timeout=60)
        in_flight_s = time.monotonic() - paused_at
        assert not asker.is_alive(), "the request in flight outlived the pipeline"
        [ended] = in_flight
        assert isinstance(ended, PipelineUnavailable), ended
        assert ended.error_code == "pipeline_unavailable" and "heartbeat" in ended.reason
        while metric_sample(serving, history) != 0:  # refreshed every second
            assert time.monotonic() - paused_at < 10, "still accepting history after 10 s"
            time.sleep(0.2)
        with Client(settings=client_settings) as client:
            asked = time.monotonic()
            with pytest.raises(SubmitRejected) as refused:
                client.history("BINANCE:BTC/USDT", "1m", start, start + HOUR_MS)
            answered_s = time.monotonic() - asked
            with pytest.raises(TriggerRejected) as trigger_refused:
                client.register_trigger("BINANCE:BTC/USDT", ["above:1000000"])
        failed_after_s = time.monotonic() - paused_at
    finally:
        faults.unpause("spark-pipeline")
        sim.clear_faults()
    assert refused.value.error_code == "pipeline_unavailable"
    assert "heartbeat" in refused.value.reason, refused.value.reason
    assert trigger_refused.value.error_code == "pipeline_unavailable"
    assert answered_s < 2 and failed_after_s < 10, (answered_s, failed_after_s)

    # Back: accepted again once the heartbeat returns, and answered.
    deadline = time.monotonic() + 60
    while metric_sample(serving, history) != 1:
        assert time.monotonic() < deadline, "the relay never heard the pipeline again"
        time.sleep(0.2)
    with Client(settings=client_settings) as client:
        result = client.history("BINANCE:BTC/USDT", "1m", start, start + HOUR_MS)
    assert result.reported_rows == 60
    print(
        f"hung pipeline: refused {failed_after_s:.1f} s after the freeze "
        f"(the refusal itself took {answered_s * 1000:.0f} ms); the request in flight "
        f"ended pipeline_unavailable {in_flight_s:.1f} s after it"
    )
