"""History requests end to end: client -> relay -> ingestor -> Kafka -> Spark -> Iceberg -> client.

Every test talks to the real platform (the `platform` fixture) and compares
what comes back with the exchange simulator's deterministic candles.
"""

from __future__ import annotations

import threading
import time
import urllib.request
import uuid
from typing import Any

import pytest

from infra.exchange_sim import replay
from infra.exchange_sim.control import SimulatorControl
from infra.platform.supervisor import PlatformEndpoints
from infra.testing import exchange_rows, result_rows, table_rows
from mdclient import Client, ClientSettings, HistoryFailed, HistoryResult, SubmitRejected
from mdproto import envelope
from mdproto.messages import (
    HistorySource,
    NotifyPattern,
    Status,
    SubmitHistoricalRequest,
    SubmitResponse,
)

pytestmark = [pytest.mark.e2e, pytest.mark.stack, pytest.mark.spark]

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


def past_range(days_ago: float, hours: int) -> tuple[int, int]:
    """A whole-hour range in the past, so every candle in it is closed."""
    now = int(time.time() * 1000)
    start = (now - int(days_ago * DAY_MS)) // HOUR_MS * HOUR_MS
    return start, start + hours * HOUR_MS


def test_per_client_topic_answers_with_the_exchange_candles(
    client_settings: ClientSettings,
) -> None:
    start, end = past_range(days_ago=3, hours=6)
    with Client(settings=client_settings, client_id="e2e-per-client") as client:
        result = client.history("BINANCE:BTC/USDT", "1m", start, end)
    assert result.status == "OK"
    assert result.notification is not None
    assert result.notification.client_id == "e2e-per-client"
    assert result_rows(result) == exchange_rows("BTC/USDT", start, end)
    assert len(result) == result.reported_rows == 360


def test_per_request_topic_answers_with_the_exchange_candles(
    client_settings: ClientSettings,
) -> None:
    start, end = past_range(days_ago=4, hours=3)
    with Client(settings=client_settings, notify="per_request") as client:
        result = client.history("BINANCE:ETH/USDT", "1m", start, end)
    assert result.status == "OK"
    assert result_rows(result) == exchange_rows("ETH/USDT", start, end)


def test_recorded_binance_candles_come_back_exactly(
    client_settings: ClientSettings, sim: SimulatorControl
) -> None:
    """ccxt's recording of Binance's real klines response (infra.exchange_sim.replay),
    cycled over three hours with some minutes left empty: ingestor, Kafka, Spark,
    Iceberg, and the client reads back exactly the recorded values. (The other
    exchanges: e2e/test_exchanges_without_binance.py.)"""
    start, _ = past_range(days_ago=14, hours=3)
    slots = 3 * 60
    rows = replay.series("binance", start, slots, {0, 1, 57, 100, slots - 1}, replay.MIN)
    expected = [tuple(map(float, replay.WINDOWS["binance"].ohlcv(r))) for r in rows]
    sim.replay("binance", replay.MIN, rows)
    try:
        with Client(settings=client_settings, client_id="e2e-replay-binance") as client:
            result = client.history("BINANCE:BTC/USDT", "1m", start, start + slots * replay.MIN)
    finally:
        sim.clear_replays()
    assert result.status == "OK"
    assert result_rows(result) == expected
    assert result.reported_rows == len(expected) == slots - 5


def test_sparse_market_gaps_are_not_errors(client_settings: ClientSettings) -> None:
    start, end = past_range(days_ago=5, hours=4)
    with Client(settings=client_settings) as client:
        result = client.history("BINANCE:XYZ/USDT", "1m", start, end)
    expected = exchange_rows("XYZ/USDT", start, end)
    assert 0 < len(expected) < 240, "the illiquid symbol should have minutes without trades"
    assert result.status == "OK"
    assert result_rows(result) == expected
    note = result.notification
    assert note is not None  # the integrity report tells exchange gaps from missing candles
    assert (note.expected_candles, note.exchange_gaps) == (240, 240 - len(expected))
    assert (note.missing_candles, note.source) == (0, HistorySource.SOURCE_EXCHANGE)


def test_a_page_that_cannot_be_fetched_is_reported_as_missing_candles(
    client_settings: ClientSettings, sim: SimulatorControl
) -> None:
    start, end = past_range(days_ago=9, hours=48)  # 2,880 candles: three exchange pages
    # The second page fails with an error the ingestor does not retry (Binance's -1100).
    bad_parameter = '{"code":-1100,"msg":"Illegal characters found in parameter \'startTime\'."}'
    sim.add_fault("error", status=400, body=bad_parameter, path="/api/v3/klines", after=1)
    try:
        with Client(settings=client_settings) as client, pytest.raises(HistoryFailed) as info:
            client.history("BINANCE:ETH/USDT", "1m", start, end)
    finally:
        sim.clear_faults()
    note = info.value.notification
    assert note is not None and note.status == Status.ERROR
    assert note.expected_candles == 2880
    assert 0 < note.missing_candles < 2880  # what the first page brought is not missing


def test_unknown_symbol_is_refused_at_submit(
    client_settings: ClientSettings, endpoints: PlatformEndpoints
) -> None:
    """The relay knows the ingestor's markets (market.markets): bad_symbol in the ack.
    (Without market metadata the ingestor's bad_symbol arrives as an ERROR
    notification: services/ingestor/tests/test_stack_history.py.)"""
    deadline = time.monotonic() + 60
    while _relay_sample(endpoints, 'relay_known_markets{exchange="BINANCE",state="all"}') < 1:
        assert time.monotonic() < deadline, "the relay never learned BINANCE's markets"
        time.sleep(0.5)
    start, end = past_range(days_ago=1, hours=1)
    with Client(settings=client_settings) as client, pytest.raises(SubmitRejected) as info:
        client.history("BINANCE:NOPE/USDT", "1m", start, end)
    assert info.value.error_code == "bad_symbol"
    assert "NOPE/USDT" in info.value.reason


def _relay_sample(endpoints: PlatformEndpoints, sample: str) -> float:
    with urllib.request.urlopen(f"{endpoints.relay_metrics}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(sample + " "):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_lost_attempt_is_retried_with_a_new_request_id(
    client_settings: ClientSettings, sim: SimulatorControl
) -> None:
    start, end = past_range(days_ago=6, hours=2)
    # The first klines call hangs until the ingestor's own exchange timeout (10 s), so
    # the first attempt cannot be answered within the 5 s the client waits: it always
    # retries. A later notification of any attempt completes the call, and a loaded CI
    # machine's micro-batches took up to 27 s, so the call gets 8 attempts (40 s) in all.
    # (A 15 s wait failed: the retried page answered the first attempt in 11 s.)
    sim.add_fault("slow", delay=20, path="/api/v3/klines", count=1)
    try:
        with Client(settings=client_settings) as client:
            result = client.history("BINANCE:SOL/USDT", "1m", start, end, timeout_s=5, attempts=8)
    finally:
        sim.clear_faults()
    assert result.attempts >= 2
    assert result_rows(result) == exchange_rows("SOL/USDT", start, end)


def test_two_clients_on_one_ticker_get_only_their_own_notifications(
    client_settings: ClientSettings,
) -> None:
    # "e2e-twin" is a prefix of "e2e-twin2": ZeroMQ delivers RESPONSE:e2e-twin2 to the
    # subscriber of RESPONSE:e2e-twin too, and the client must not take it for its own.
    start, end = past_range(days_ago=2, hours=2)
    results: dict[str, HistoryResult] = {}
    errors: list[BaseException] = []

    def ask(client_id: str) -> None:
        try:
            with Client(settings=client_settings, client_id=client_id) as client:
                results[client_id] = client.history("BINANCE:BTC/USDT", "1m", start, end)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=(cid,)) for cid in ("e2e-twin", "e2e-twin2")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    a, b = results["e2e-twin"], results["e2e-twin2"]
    assert a.notification is not None and b.notification is not None
    assert a.notification.client_id == "e2e-twin"
    assert b.notification.client_id == "e2e-twin2"
    assert a.request_id != b.request_id
    assert result_rows(a) == result_rows(b) == exchange_rows("BTC/USDT", start, end)


def test_legacy_synchronous_request(client_settings: ClientSettings) -> None:
    start, end = past_range(days_ago=7, hours=1)
    with Client(settings=client_settings) as client:
        result = client.fetch_ohlc_sync("BINANCE:BTC/USDT", "1m", start, end)
    assert result.status == Status.Name(Status.OK)
    assert result_rows(result) == exchange_rows("BTC/USDT", start, end)


def test_a_missed_notification_is_recovered_from_the_request_status(
    client_settings: ClientSettings,
) -> None:
    """Submit without listening (as a client that crashed after its ack), then ask the status."""
    start, end = past_range(days_ago=6, hours=2)
    request_id = f"e2e-status-{uuid.uuid4().hex[:12]}"
    submit = SubmitHistoricalRequest(
        request_id=request_id, ticker="BINANCE:BTC/USDT", period_seconds=60,
        start_time_ms=start, end_time_ms=end, notify=NotifyPattern.NOTIFY_PER_REQUEST,
    )  # fmt: skip
    with Client(settings=client_settings, notify="per_request") as client:
        ack = envelope.decode(client.request(envelope.encode(submit), 10.0), SubmitResponse)
        assert ack.status == Status.OK, ack.reason
        assert client.status(request_id).state in ("PENDING", "OK")
        deadline = time.monotonic() + 120
        while (status := client.status(request_id)).state == "PENDING":
            assert time.monotonic() < deadline, "no outcome recorded within 120 s"
            time.sleep(0.5)
        note = status.notification
        assert status.state == "OK" and note is not None
        assert (note.request_id, note.row_count, note.ticker) == (request_id, 120, submit.ticker)
        table = client.reader().read_ohlc(
            note.iceberg_table, submit.ticker, 60, start, end, snapshot_id=note.snapshot_id
        )
    assert table_rows(table) == exchange_rows("BTC/USDT", start, end)


def _klines_calls(
    sim: SimulatorControl, symbol: str, start: int, end: int, after_seq: int
) -> list[dict[str, Any]]:
    """Klines calls for the symbol's [start, end) the simulator served after log position
    `after_seq`.

    By position, not by list index: the log keeps the last 2,000 requests of a
    whole test session, so it is trimmed at the front while a test reads it. By
    symbol and range: an earlier test's request may still be retrying its pages.
    """
    log = sim.stats(include_log=True)["log"]
    return [
        entry
        for entry in log
        if entry["path"] == "/api/v3/klines"
        and entry["query"].get("symbol") == symbol
        and start <= int(entry["query"].get("startTime", -1)) < end
        and entry["seq"] > after_seq
    ]


def _log_position(sim: SimulatorControl) -> int:
    return int(sim.stats()["requests_total"])


def test_stored_ranges_are_answered_from_iceberg_and_only_gaps_are_fetched(
    client_settings: ClientSettings, sim: SimulatorControl
) -> None:
    start, end = past_range(days_ago=11, hours=2)
    ticker, hour = "BINANCE:SOL/USDT", 3_600_000
    with Client(settings=client_settings) as client:
        first = client.history(ticker, "1m", start, end)
        before = _log_position(sim)
        again = client.history(ticker, "1m", start, end)
        stored_calls = _klines_calls(sim, "SOLUSDT", start, end + hour, before)
        wider = client.history(ticker, "1m", start, end + hour)
        gap_calls = _klines_calls(sim, "SOLUSDT", start, end + hour, before)
        forced = client.history(ticker, "1m", start, end, refetch=True)
    expected = exchange_rows("SOL/USDT", start, end)
    assert result_rows(first) == result_rows(again) == result_rows(forced) == expected
    assert result_rows(wider) == exchange_rows("SOL/USDT", start, end + hour)
    sources = [r.notification.source for r in (first, again, wider, forced) if r.notification]
    assert sources == [
        HistorySource.SOURCE_EXCHANGE,
        HistorySource.SOURCE_STORAGE,
        HistorySource.SOURCE_STORAGE_AND_EXCHANGE,
        HistorySource.SOURCE_EXCHANGE,
    ]
    assert stored_calls == []  # the repeat never reached the exchange
    assert gap_calls and all(int(c["query"]["startTime"]) >= end for c in gap_calls)
    assert again.notification is not None and again.notification.missing_candles == 0
