"""A crashed pipeline: the request still gets exactly one notification and no duplicate rows."""

from __future__ import annotations

import threading
import time

import pytest
import zmq

from infra.exchange_sim import expected_klines
from infra.exchange_sim.control import SimulatorControl
from infra.platform.faults import Faults
from infra.platform.supervisor import PlatformEndpoints
from infra.testing import notified_request_ids
from mdclient import Client, ClientSettings, HistoryResult
from mdproto import topics

pytestmark = [pytest.mark.e2e, pytest.mark.stack, pytest.mark.spark]

HOUR_MS = 3_600_000


def test_pipeline_killed_mid_request_notifies_once_without_duplicates(
    faults: Faults,
    endpoints: PlatformEndpoints,
    client_settings: ClientSettings,
    sim: SimulatorControl,
) -> None:
    client_id = "e2e-crash"
    now = int(time.time() * 1000)
    start = (now - 30 * 24 * HOUR_MS) // HOUR_MS * HOUR_MS
    end = start + 5 * 24 * HOUR_MS  # 7,200 candles: 8 exchange pages
    expected = [k.open_time for k in expected_klines("BTC/USDT", "1m", start, end)]
    expected = [t for t in expected if t < end]

    # Count every notification on the client's topic with a plain SUB of our own.
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    counter = ctx.socket(zmq.SUB)
    counter.connect(endpoints.market_data)
    counter.subscribe(topics.response_topic(client_id).encode())

    # Slow pages keep the ingestor busy long enough to crash the pipeline mid-request.
    sim.add_fault("slow", delay=2, path="/api/v3/klines", count=8)
    results: list[HistoryResult] = []
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            with Client(settings=client_settings, client_id=client_id) as client:
                results.append(client.history("BINANCE:BTC/USDT", "1m", start, end, timeout_s=300))
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=ask)
    worker.start()
    try:
        # Wait until the pipeline has committed part of the request, then crash it.
        reader = Client(settings=client_settings).reader()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            rows = reader.read_ohlc("market.ohlc", "BINANCE:BTC/USDT", 60, start, end)
            if 0 < rows.num_rows < len(expected):
                break
            time.sleep(0.5)
        else:
            pytest.fail("the pipeline never committed a part of the request")
        faults.kill("spark-pipeline")  # SIGKILL: a process, or the whole container
        faults.start("spark-pipeline")  # returns once its streaming queries run again
        worker.join(timeout=400)
    finally:
        sim.clear_faults()
    assert not errors, errors
    [result] = results
    open_times = [int(ts.timestamp() * 1000) for ts in result.table.column("open_time").to_pylist()]
    assert open_times == expected  # every candle, once
    assert result.reported_rows == len(expected)

    # A barrier request on the same topic: anything published for the first
    # request before it (a duplicate) is already in the counter's queue.
    with Client(settings=client_settings, client_id=client_id) as client:
        client.history("BINANCE:ETH/USDT", "1m", start, start + HOUR_MS)
    assert notified_request_ids(counter).count(result.request_id) == 1
