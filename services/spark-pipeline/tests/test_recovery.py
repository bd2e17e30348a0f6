"""kill -9 of the driver, at chosen points and at a random one, and queries failing after a
commit (restarted in-process): nothing lost, nothing doubled.

Each test owns its pipeline configuration (namespace, topics, checkpoints) and
restarts it several times; the PUB port is fixed per test, so one SUB, connected
once, hears every incarnation (it reconnects long before Spark has started).
"""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest
from candle_oracle import aggregate

from mdproto import envelope
from mdproto.messages import OHLC, HistoryReadyNotification, Status

pytestmark = [pytest.mark.stack, pytest.mark.spark]

KILLED = -signal.SIGKILL


def _unnumbered(message: Any) -> Any:
    copy = type(message)()
    copy.CopyFrom(message)
    copy.ClearField("sequence")
    copy.ClearField("publisher_epoch")
    return copy


def test_history_crash_points_notify_once_and_never_duplicate_rows(
    make_run: Any, tools: Any, build: Any
) -> None:
    run = make_run(
        PIPELINE_LIVE__ENABLED="false",
        PIPELINE_CEP__ENABLED="false",
        PIPELINE_MARKETS__ENABLED="false",
    )
    sub = tools.Subscriber(run.pub_endpoint)
    kafka = tools.Kafka(run.endpoints.kafka_bootstrap)
    lake = tools.Lake(run.endpoints, run.namespace)
    t0 = build.T0
    n = 3000
    meta = build.metadata("crash-1", client_id="crash-client", start=t0, end=t0 + n * build.MINUTE)
    kafka.send(
        run.batches_topic,
        build.request_records("crash-1", [build.candle(i) for i in range(n)], meta=meta),
    )
    is_ours = tools.is_notification("crash-1")

    # 1. Killed after the candles are committed, before the request is recorded.
    run.start(crash_at="history-after-ohlc-commit")
    assert run.wait_exit() == KILLED
    assert len(lake.rows("ohlc")) == n
    assert lake.rows("requests") == []
    # 2. Replayed: candles MERGEd again (no duplicates), request recorded, killed
    #    before publishing.
    run.start(crash_at="history-after-requests-commit")
    assert run.wait_exit() == KILLED
    [recorded] = lake.rows("requests")
    assert (recorded["request_id"], recorded["status"], recorded["row_count"]) == (
        "crash-1",
        "OK",
        n,
    )
    assert sub.matching(is_ours) == []
    # 3. Replayed: the recorded notification is published, then the driver dies
    #    before Spark commits the batch. The message may or may not have left the
    #    socket before the kill.
    run.start(crash_at="history-after-publish")
    assert run.wait_exit() == KILLED
    before = len(sub.matching(is_ours))
    assert before in (0, 1)
    # 4. A clean run publishes the same notification once more (at-least-once in
    #    that window), then moves on; a sentinel request proves nothing else follows.
    run.start()
    run.wait_ready()
    got = sub.wait_for(is_ours, count=before + 1)
    kafka.send(
        run.batches_topic, build.request_records("crash-sentinel", [build.candle(0, t0=t0 - 10**9)])
    )
    sub.wait_for(tools.is_notification("crash-sentinel"))
    got = sub.matching(is_ours)
    assert len(got) == before + 1
    first = got[0].message
    assert isinstance(first, HistoryReadyNotification)
    # The same notification; numbered by the publisher that sent it (a restart: new epoch).
    assert all(_unnumbered(g.message) == _unnumbered(first) for g in got)
    assert all(g.topic == "RESPONSE:crash-client" for g in got)
    assert (first.status, first.row_count) == (Status.OK, n)
    assert first.snapshot_id == recorded["snapshot_id"]

    rows = lake.rows("ohlc")
    assert len(rows) == n + 1  # + the sentinel's candle
    assert len({(r["ticker"], r["period_seconds"], r["open_time"]) for r in rows}) == n + 1
    assert len(lake.rows("requests")) == 2
    sub.close()


def test_live_kill9_loses_and_duplicates_nothing(make_run: Any, tools: Any, build: Any) -> None:
    run = make_run(
        PIPELINE_HISTORY__ENABLED="false",
        PIPELINE_CEP__ENABLED="false",
        PIPELINE_MARKETS__ENABLED="false",
    )
    sub = tools.Subscriber(run.pub_endpoint)
    kafka = tools.Kafka(run.endpoints.kafka_bootstrap)
    lake = tools.Lake(run.endpoints, run.namespace)
    b = 1_704_067_200_000  # 2024-01-01T00:00:00Z
    tickers = ["BINANCE:BTC/USDT", "BINANCE:ETH/USDT"]

    def ticks(first_s: int, last_s: int) -> dict[str, list[Any]]:
        """One trade per ticker every 2 s; prices wander, amounts are exact binary fractions."""
        out: dict[str, list[Any]] = {t: [] for t in tickers}
        for k, ticker in enumerate(tickers):
            for s in range(first_s, last_s, 2):
                price = 100.0 + k * 10 + ((s * 7919) % 23) - 11
                amount = 0.25 * (1 + s % 5)
                out[ticker].append(
                    build.tick(f"{s}", price, b + s * 1000, amount=amount, ticker=ticker)
                )
        return out

    def send(chunk: dict[str, list[Any]], redeliver: int = 0) -> None:
        for ticker, items in chunk.items():
            values = [envelope.encode_record(x) for x in items]
            values += values[:redeliver]  # an ingestor reconnect re-sends a few trades
            kafka.send(run.ticks_topic, values, key=ticker)

    chunks = [ticks(0, 300), ticks(300, 480), ticks(480, 600)]
    everything = [x for chunk in chunks for items in chunk.values() for x in items]

    # 1. Killed right after the first closed candles are committed, before they are
    #    published and before Spark commits that batch.
    send(chunks[0], redeliver=5)
    run.start(crash_at="live-after-candles-commit")
    assert run.wait_exit() == KILLED
    # 2. A clean start; more ticks; then kill -9 of driver and JVM while the next
    #    chunk is being processed.
    run.start()
    run.wait_ready()
    send(chunks[1], redeliver=3)
    sub.wait_for(lambda m: isinstance(m.message, OHLC) and m.message.open_time_ms >= b + 300_000)
    send(chunks[2])
    run.kill9()
    # 3. Restart; an advance tick far ahead closes every window of the data above.
    run.start()
    run.wait_ready()
    send({tickers[0]: [build.tick("advance", 100.0, b + 3_600_000, ticker=tickers[0])]})

    expected = {
        (c.ticker, c.period_seconds, c.open_time_ms): c for c in aggregate(everything, [60, 300])
    }
    expected_trades = sorted((x.ticker, x.trade_id) for x in everything)

    def live_candles() -> list[dict[str, Any]]:
        # Not the advance tick's own candles: an idle ticker's window closes by timeout.
        return lake.rows(
            "ohlc",
            "source = 'live' and ticker != 'PROBE:SUB/SCRIBED' "
            "and open_time < '2024-01-01T01:00:00+00:00'",
        )

    deadline = time.monotonic() + tools.WAIT_S
    while len(live_candles()) < len(expected) and time.monotonic() < deadline:
        time.sleep(1)
    while time.monotonic() < deadline:
        stored_trades = [(r["ticker"], r["trade_id"]) for r in lake.rows("ticks")]
        if len(stored_trades) >= len(expected_trades) + 1:
            break
        time.sleep(1)

    candles = live_candles()
    keys = [
        (r["ticker"], r["period_seconds"], int(r["open_time"].timestamp() * 1000)) for r in candles
    ]
    assert len(keys) == len(set(keys)), "a closed candle was written twice"
    assert set(keys) == set(expected), "a closed candle is missing"
    for row, key in zip(candles, keys, strict=True):
        c = expected[key]
        assert (row["open"], row["high"], row["low"], row["close"]) == (
            c.open,
            c.high,
            c.low,
            c.close,
        )
        assert (row["volume"], row["trade_count"]) == (c.volume, c.trade_count), key
    stored_trades = sorted((r["ticker"], r["trade_id"]) for r in lake.rows("ticks"))
    assert stored_trades == sorted([*expected_trades, (tickers[0], "advance")])
    sub.close()


def _scrape(port: int) -> dict[str, float]:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def _eventually(check: Any, what: str, timeout_s: float) -> Any:
    """``check()``'s first truthy value, polled until the deadline."""
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.5)
    return value


def test_failed_queries_restart_in_process_and_write_exactly_once(
    make_run: Any, tools: Any, build: Any
) -> None:
    """Micro-batches fail right after their commit (as when a commit's state is unknown but
    it landed): each query restarts from its checkpoint, the process and the other
    queries run on, the replays add no row and notify once, and the pipeline keeps
    serving. A table from before gets the commit-retry properties at start."""
    from pyiceberg.catalog import load_catalog

    from pipeline.lake import COMMIT_RETRY_PROPERTIES
    from pipeline.markets import MARKETS_SCHEMA

    run = make_run(
        PIPELINE_CEP__ENABLED="false",
        PIPELINE_FAIL_AT="history-after-ohlc-commit,history-after-requests-commit,"
        "live-after-ticks-commit",
        PIPELINE_RESTART__BACKOFF_INITIAL_S="0.5",
    )
    endpoints = run.endpoints
    catalog = load_catalog(endpoints.catalog_name, **endpoints.pyiceberg_catalog_properties())
    catalog.create_namespace(run.namespace)
    catalog.create_table(  # as an older pipeline left it: Iceberg's 4 commit retries
        f"{run.namespace}.markets", MARKETS_SCHEMA, properties={"format-version": "2"}
    )
    sub = tools.Subscriber(run.pub_endpoint)
    kafka = tools.Kafka(run.endpoints.kafka_bootstrap)
    lake = tools.Lake(run.endpoints, run.namespace)
    t0, n = build.T0, 600

    def request(request_id: str, first: int) -> None:
        start = t0 + first * build.MINUTE
        rows = [build.candle(i, t0=start) for i in range(n)]
        meta = build.metadata(request_id, start=start, end=start + n * build.MINUTE)
        kafka.send(run.batches_topic, build.request_records(request_id, rows, meta=meta))

    b = 1_704_067_200_000  # 2024-01-01T00:00:00Z

    def trades(first: int, last: int) -> list[Any]:
        return [build.tick(f"t{i}", 100.0 + i % 7, b + i * 1000) for i in range(first, last)]

    sent = trades(0, 40)
    request("restart-1", 0)
    kafka.send(run.ticks_topic, [envelope.encode_record(x) for x in [*sent, *sent[:5]]])

    run.start()
    run.wait_ready()
    # History fails after the ohlc commit, then, replayed, after the requests commit;
    # ticks-persist after its first MERGE. Each replay then gets through.
    sub.wait_for(tools.is_notification("restart-1"))
    restarts = {"history": 2.0, "ticks-persist": 1.0}

    def restarted() -> bool:
        samples = _scrape(run.metrics_port)
        return all(
            samples.get(f'pipeline_query_restarts_total{{query="{q}"}}') == count
            for q, count in restarts.items()
        )

    _eventually(restarted, f"restarts {restarts}", tools.WAIT_S)
    # Still serving: a new request and new trades after the restarts.
    more = trades(40, 60)
    request("restart-2", n)
    kafka.send(run.ticks_topic, [envelope.encode_record(x) for x in more])
    sub.wait_for(tools.is_notification("restart-2"))
    everything = sorted((x.ticker, x.trade_id) for x in [*sent, *more])
    _eventually(
        lambda: len(lake.rows("ticks")) >= len(everything), "every trade stored", tools.WAIT_S
    )

    assert run.process is not None and run.process.poll() is None, "the pipeline exited"
    samples = _scrape(run.metrics_port)
    for query in ("candles-store", "markets"):
        assert samples[f'pipeline_query_restarts_total{{query="{query}"}}'] == 0.0
        assert samples[f'pipeline_query_active{{query="{query}"}}'] == 1.0
    for query in restarts:
        assert samples[f'pipeline_query_active{{query="{query}"}}'] == 1.0
    # Exactly once: one notification per request (restart-1's replays came before
    # restart-2's), every candle and trade once, one requests row each.
    for request_id in ("restart-1", "restart-2"):
        [got] = sub.matching(tools.is_notification(request_id))
        assert isinstance(got.message, HistoryReadyNotification)
        assert (got.message.status, got.message.row_count) == (Status.OK, n)
    candles = lake.rows("ohlc", "source = 'history'")
    assert len(candles) == 2 * n
    assert len({(r["ticker"], r["period_seconds"], r["open_time"]) for r in candles}) == 2 * n
    assert sorted(r["request_id"] for r in lake.rows("requests")) == ["restart-1", "restart-2"]
    assert sorted((r["ticker"], r["trade_id"]) for r in lake.rows("ticks")) == everything
    log = run.log_text()
    assert "query history failed: InjectedFailureError: injected failure at history-after" in log
    assert "query ticks-persist restarted from its checkpoint" in log
    properties = lake.table("markets").properties
    assert {k: properties.get(k) for k in COMMIT_RETRY_PROPERTIES} == COMMIT_RETRY_PROPERTIES

    run.stop()
    assert run.process.returncode == 0
    sub.close()
