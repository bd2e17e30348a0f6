"""Historical requests end to end: simulator -> ingestor -> real Kafka, read back and compared."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from infra.exchange_sim import expected_klines
from ingestor.app import Ingestor
from mdproto import envelope
from mdproto.messages import DataRequest, HistorySource, Market, Status

pytestmark = pytest.mark.stack

MIN = 60_000


def history_request(
    request_id: str, start: int, count: int, *, ticker: str = "BINANCE:BTC/USDT", period: int = 60
) -> DataRequest:
    return DataRequest(
        request_id=request_id,
        client_id="client-1",
        kind=DataRequest.HISTORICAL,
        ticker=ticker,
        period_seconds=period,
        start_time_ms=start,
        end_time_ms=start + count * period * 1000,
        notification_topic="RESPONSE:client-1",
        submitted_at_ms=start,
    )


def past_start(sim: Any, minutes_back: int) -> int:
    return (sim.now_ms() // MIN - minutes_back) * MIN


async def serve(harness: Any, run_ingestor: Any, requests: list[DataRequest], **overrides: Any):  # type: ignore[no-untyped-def]
    """Start an ingestor, publish the requests, wait until each has a final marker."""
    relay = harness.FakeRelay()
    settings = harness.settings(relay, **overrides)
    ingestor = Ingestor(settings)
    task = await run_ingestor(ingestor)
    try:
        await relay.wait_subscribed()
        for request in requests:
            await relay.publish(request)
        results = {
            r.request_id: await asyncio.to_thread(
                harness.batches_until_final, settings, r.request_id
            )
            for r in requests
        }
    finally:
        await ingestor.stop()
        await task
        relay.close()
    return settings, ingestor, results


def rows_of(batches: list[Any]) -> list[tuple[float | int, ...]]:
    return [
        (r.open_time_ms, r.open, r.high, r.low, r.close, r.volume)
        for b in batches
        if not b.is_final
        for r in b.rows
    ]


def test_multi_page_backfill_equals_the_simulator_candles(harness: Any, run_ingestor: Any) -> None:
    sim = harness.sim
    start = past_start(sim, 3000)
    request = history_request("hist-2500", start, 2500)
    settings, ingestor, results = asyncio.run(
        serve(harness, run_ingestor, [request], history={"batch_size": 400})
    )
    batches = results["hist-2500"]
    expected = expected_klines("BTC/USDT", "1m", start, start + 2500 * MIN - 1, model=sim.model)
    assert len(expected) == 2500
    assert rows_of(batches) == [tuple(k.ohlcv()) for k in expected]
    # What Binance reports beyond OHLCV travels too (ccxt's OHLCV drops it).
    assert [
        (r.trade_count, r.quote_volume, r.taker_buy_volume, r.taker_buy_quote_volume)
        for b in batches[:-1]
        for r in b.rows
    ] == [
        (k.trades, float(k.quote_volume), float(k.taker_buy_base), float(k.taker_buy_quote))
        for k in expected
    ]

    data, final = batches[:-1], batches[-1]
    assert [b.sequence for b in batches] == list(range(8))  # 7 data records (400 rows) + marker
    assert data[0].metadata.request_id == "hist-2500"
    assert data[0].metadata.notification_topic == "RESPONSE:client-1"
    assert data[0].metadata.ingestor_id == settings.ingestor_id
    assert all(not b.HasField("metadata") for b in data[1:])
    meta = final.metadata
    assert final.is_final and (meta.status, meta.total_rows, meta.total_batches) == (
        Status.OK,
        2500,
        7,
    )
    assert meta.expected_gaps == 0
    assert ingestor.adapter("BINANCE:").rest_calls == 3


def test_illiquid_market_gaps_are_counted_and_a_future_range_is_not_found(
    harness: Any, run_ingestor: Any
) -> None:
    sim = harness.sim
    start = past_start(sim, 600)
    gappy = history_request("hist-gaps", start, 500, ticker="BINANCE:XYZ/USDT")
    future = history_request("hist-future", sim.now_ms() + 3600_000, 10)
    _, _, results = asyncio.run(serve(harness, run_ingestor, [gappy, future]))
    expected = expected_klines("XYZ/USDT", "1m", start, start + 500 * MIN - 1, model=sim.model)
    assert 0 < len(expected) < 500
    assert rows_of(results["hist-gaps"]) == [tuple(k.ohlcv()) for k in expected]
    meta = results["hist-gaps"][-1].metadata
    assert (meta.status, meta.total_rows, meta.expected_gaps) == (
        Status.OK,
        len(expected),
        500 - len(expected),
    )
    (marker,) = results["hist-future"]
    assert marker.is_final and marker.metadata.status == Status.NOT_FOUND


def test_rate_limits_and_outages_are_retried_to_success(harness: Any, run_ingestor: Any) -> None:
    sim = harness.sim
    sim.add_fault("rate_limit", count=2, retry_after=1, path="/api/v3/klines")
    sim.add_fault("unavailable", count=2, path="/api/v3/klines")
    sim.add_fault("ban", count=1, retry_after=1, path="/api/v3/klines")
    start = past_start(sim, 2000)
    request = history_request("hist-faults", start, 1500)
    _, _, results = asyncio.run(serve(harness, run_ingestor, [request]))
    expected = expected_klines("BTC/USDT", "1m", start, start + 1500 * MIN - 1, model=sim.model)
    assert rows_of(results["hist-faults"]) == [tuple(k.ohlcv()) for k in expected]
    assert results["hist-faults"][-1].metadata.status == Status.OK
    triggered = [f["kind"] for f in sim.stats()["faults_triggered"]]
    assert triggered == ["rate_limit", "rate_limit", "unavailable", "unavailable", "ban"]


def test_a_page_the_exchange_answered_empty_is_reported_missing(
    harness: Any, run_ingestor: Any
) -> None:
    """Three windows of 100 minutes, fetched concurrently; one comes back 200 OK with
    no candles. BTC/USDT trades every minute, so that is no quiet stretch: the final
    marker counts no exchange gap for it, and the pipeline's `missing = expected -
    rows - exchange_gaps` reports its 100 candles missing (`mdclient history --verify`
    exits 11)."""
    sim = harness.sim
    sim.add_fault("truncate", keep=0, path="/api/v3/klines", after=1)  # the 2nd page asked
    start = past_start(sim, 400)
    request = history_request("hist-dropped", start, 300)
    _, _, results = asyncio.run(
        serve(harness, run_ingestor, [request], exchange={"page_limit": 100})
    )
    (emptied,) = [e for e in sim.stats()["log"] if e["fault"] == "truncate"]
    dropped = int(emptied["query"]["startTime"])  # window 2 or 3: they are asked together
    expected = expected_klines("BTC/USDT", "1m", start, start + 300 * MIN - 1, model=sim.model)
    kept = [k for k in expected if not dropped <= k.open_time < dropped + 100 * MIN]
    assert rows_of(results["hist-dropped"]) == [tuple(k.ohlcv()) for k in kept]
    meta = results["hist-dropped"][-1].metadata
    assert (meta.status, meta.expected_candles, meta.total_rows, meta.expected_gaps) == (
        Status.OK,
        300,
        200,
        0,
    )
    assert meta.expected_candles - meta.total_rows - meta.expected_gaps == 100  # missing


def test_slow_responses_time_out_and_are_retried(harness: Any, run_ingestor: Any) -> None:
    sim = harness.sim
    sim.add_fault("slow", count=2, delay=2.0, path="/api/v3/klines")
    start = past_start(sim, 200)
    request = history_request("hist-slow", start, 100)
    _, _, results = asyncio.run(
        serve(harness, run_ingestor, [request], exchange={"timeout_ms": 500})
    )
    assert results["hist-slow"][-1].metadata.status == Status.OK
    assert len(rows_of(results["hist-slow"])) == 100
    assert [f["kind"] for f in sim.stats()["faults_triggered"]] == ["slow", "slow"]


def test_unknown_symbols_end_in_an_error_marker_with_the_reason(
    harness: Any, run_ingestor: Any
) -> None:
    sim = harness.sim
    sim.add_fault("unknown_symbol", count=1, path="/api/v3/klines")
    start = past_start(sim, 100)
    at_exchange = history_request("hist-badsym", start, 10)  # the exchange says -1121
    unlisted = history_request("hist-unlisted", start, 10, ticker="BINANCE:NOPE/USDT")
    bad_period = history_request("hist-period", start, 10, period=7)
    ticks = history_request("hist-ticks", start, 10)  # tick bars: period 0, `bars`
    ticks.period_seconds, ticks.bars = 0, "100ticks"
    work = [at_exchange, unlisted, bad_period, ticks]
    _, _, results = asyncio.run(serve(harness, run_ingestor, work))
    (marker,) = results["hist-badsym"]
    meta = marker.metadata
    assert marker.is_final and meta.status == Status.ERROR
    assert meta.error_code == "bad_symbol" and "Invalid symbol." in meta.reason
    assert meta.request_id == "hist-badsym" and meta.ticker == "BINANCE:BTC/USDT"
    meta = results["hist-unlisted"][-1].metadata
    assert (meta.status, meta.error_code) == (Status.ERROR, "bad_symbol")
    assert "NOPE/USDT" in meta.reason
    meta = results["hist-period"][-1].metadata  # left to the bars from trades (ADR 0015)
    trades = HistorySource.SOURCE_TRADES
    assert (meta.status, meta.source, meta.total_rows) == (Status.OK, trades, 0)
    (marker,) = results["hist-ticks"]  # one marker naming the bars; the exchange not asked
    meta = marker.metadata
    assert (meta.status, meta.source, meta.bars, meta.period_seconds) == (
        Status.OK,
        trades,
        "100ticks",
        0,
    )
    assert len([f for f in sim.stats()["faults_triggered"]]) == 1  # never retried


def test_malformed_work_does_not_stop_the_ingestor(harness: Any, run_ingestor: Any) -> None:
    sim = harness.sim

    async def scenario() -> tuple[Any, Any, list[Any]]:
        relay = harness.FakeRelay()
        settings = harness.settings(relay)
        ingestor = Ingestor(settings)
        task = await run_ingestor(ingestor)
        try:
            await relay.wait_subscribed()
            await relay.publish_raw([b"BINANCE:", b"\x09", b"\x01garbage"])
            await relay.publish_raw([b"BINANCE:", b"\x01", b"\x01\xff\xff\xff\xff"])
            await relay.publish_raw([b"BINANCE:"])
            await relay.publish(DataRequest(request_id="bad id!", ticker="BINANCE:BTC/USDT"))
            good = history_request("hist-after-junk", past_start(sim, 100), 30)
            await relay.publish(good)
            batches = await asyncio.to_thread(
                harness.batches_until_final, settings, "hist-after-junk"
            )
            return ingestor.intake, ingestor.stats, batches
        finally:
            await ingestor.stop()
            await task
            relay.close()

    intake, stats, batches = asyncio.run(scenario())
    assert intake.stats.malformed == 3
    assert batches[-1].metadata.status == Status.OK and batches[-1].metadata.total_rows == 30
    assert stats.history_jobs == 1


def test_markets_are_published_at_start_and_on_config_update(
    harness: Any, run_ingestor: Any
) -> None:
    listed = len(harness.sim.model.specs)  # every market the simulator lists, each round

    async def scenario() -> tuple[Any, list[Market]]:
        relay = harness.FakeRelay()
        settings = harness.settings(relay)
        ingestor = Ingestor(settings)
        task = await run_ingestor(ingestor)
        try:
            await asyncio.wait_for(ingestor.markets_ready.wait(), 30)
            await relay.wait_subscribed()
            from mdproto.messages import IngestorControl

            await relay.send_control(
                IngestorControl(action=IngestorControl.CONFIG_UPDATE, config={"batch_size": "9"}),
                "BINANCE:",
            )

            def two_rounds(records: list[Any]) -> bool:
                return len(records) >= 2 * listed

            records = await asyncio.to_thread(
                harness.read_topic, harness.bootstrap, settings.kafka.topic_markets, two_rounds
            )
            return ingestor, [envelope.decode_record(v, Market) for _, v in records]
        finally:
            await ingestor.stop()
            await task
            relay.close()

    ingestor, markets = asyncio.run(scenario())
    tickers = {m.ticker for m in markets}
    assert {"BINANCE:BTC/USDT", "BINANCE:ETH/USDT", "BINANCE:XYZ/USDT"} <= tickers
    btc = next(m for m in markets if m.ticker == "BINANCE:BTC/USDT")
    assert (btc.exchange, btc.symbol, btc.base, btc.quote, btc.active) == (
        "BINANCE",
        "BTCUSDT",
        "BTC",
        "USDT",
        True,
    )
    assert btc.price_precision == 0.01 and btc.amount_precision == 0.00001
    assert btc.min_cost == 5 and btc.updated_at_ms > 0
    old = next(m for m in markets if m.ticker == "BINANCE:OLD/USDT")
    assert not old.active  # delisted (status BREAK)
    assert ingestor.stats.markets_published == len(markets) == 2 * listed
    assert len(tickers) == listed
    assert ingestor.jobs is not None and ingestor.jobs.batch_size == 9


def test_second_exchange_format_coinbase(harness: Any, run_ingestor: Any) -> None:
    """Coinbase Exchange: 300 candles per call and bounded windows (the venue's
    default, not configured), same records; no trade count reported: unset."""
    sim = harness.sim
    start = past_start(sim, 1000)
    request = history_request("hist-coinbase", start, 700, ticker="COINBASE:BTC/USDT")
    coinbase = {
        "prefix": "COINBASE",
        "api_base_url": sim.base_url,
        "enable_rate_limit": False,
        "live": False,
    }
    _, ingestor, results = asyncio.run(
        serve(harness, run_ingestor, [request], exchanges={"coinbaseexchange": coinbase})
    )
    expected = expected_klines("BTC/USDT", "1m", start, start + 700 * MIN - 1, model=sim.model)
    assert rows_of(results["hist-coinbase"]) == [tuple(k.ohlcv()) for k in expected]
    assert results["hist-coinbase"][-1].metadata.status == Status.OK
    rows = [r for b in results["hist-coinbase"] for r in b.rows]
    assert not any(r.HasField("trade_count") or r.HasField("quote_volume") for r in rows)
    adapter = ingestor.adapter("COINBASE:")
    assert adapter.page_limit == 300 and adapter.rest_calls == 3


@pytest.mark.parametrize("exchange_id", ["okx", "bybit"])
def test_newest_first_exchanges_page_every_candle_once(
    harness: Any, run_ingestor: Any, exchange_id: str
) -> None:
    """OKX and Bybit return a window's NEWEST candles: small bounded pages still store
    every candle once, with the quote volume and no trade count (neither reports one)."""
    sim = harness.sim
    start = past_start(sim, 1000)
    prefix = exchange_id.upper()
    request = history_request(f"hist-{exchange_id}", start, 700, ticker=f"{prefix}:BTC/USDT")
    config = {"api_base_url": sim.base_url, "enable_rate_limit": False, "page_limit": 50}
    _, ingestor, results = asyncio.run(
        serve(harness, run_ingestor, [request], exchanges={exchange_id: config})
    )
    batches = results[f"hist-{exchange_id}"]
    expected = expected_klines("BTC/USDT", "1m", start, start + 700 * MIN - 1, model=sim.model)
    assert rows_of(batches) == [tuple(k.ohlcv()) for k in expected]
    rows = [r for b in batches for r in b.rows]
    assert [r.quote_volume for r in rows] == [float(k.quote_volume) for k in expected]
    assert not any(r.HasField("trade_count") for r in rows)
    meta = batches[-1].metadata
    assert (meta.status, meta.total_rows, meta.expected_gaps) == (Status.OK, 700, 0)
    adapter = ingestor.adapter(f"{prefix}:")
    assert (adapter.page_limit, adapter.bounded_pages, adapter.rest_calls) == (50, True, 14)


def test_metrics_count_outcomes_rows_and_kafka_deliveries(harness: Any, run_ingestor: Any) -> None:
    """/metrics reads the same counters the fetch path keeps (scraped over real HTTP)."""
    import urllib.request

    from ingestor import metrics
    from mdproto.runtime.metrics_http import MetricsServer

    sim = harness.sim
    start = past_start(sim, 200)
    good = history_request("metrics-ok", start, 120)
    bad = history_request("metrics-bad", start, 10, ticker="BINANCE:NOPE/USDT")
    scraped: dict[str, str] = {}

    def get(url: str) -> str:
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())

    async def scenario() -> None:
        relay = harness.FakeRelay()
        settings = harness.settings(relay)
        ingestor = Ingestor(settings)
        http = MetricsServer(
            "127.0.0.1", 0, metrics.registry_for(ingestor), lambda: metrics.health(ingestor)
        )
        http.start()
        task = await run_ingestor(ingestor)
        try:
            await relay.wait_subscribed()
            for request in (good, bad):
                await relay.publish(request)
                await asyncio.to_thread(harness.batches_until_final, settings, request.request_id)
            for path in ("/metrics", "/healthz"):
                scraped[path] = await asyncio.to_thread(get, f"http://127.0.0.1:{http.port}{path}")
        finally:
            await ingestor.stop()
            await task
            http.close()
            relay.close()

    asyncio.run(scenario())
    text = scraped["/metrics"]
    assert 'ingestor_history_outcomes_total{error_code="",status="OK"} 1.0' in text
    assert 'ingestor_history_outcomes_total{error_code="bad_symbol",status="ERROR"} 1.0' in text
    assert "ingestor_history_rows_total 120.0" in text
    assert 'ingestor_requests_total{kind="history"} 2.0' in text
    assert 'ingestor_kafka_records_total{state="failed"} 0.0' in text
    assert "ingestor_requests_taken_over_total 0.0" in text
    assert 'ingestor_claims_records_total{kind="failed"} 0.0' in text
    assert '"status": "ok"' in scraped["/healthz"]
