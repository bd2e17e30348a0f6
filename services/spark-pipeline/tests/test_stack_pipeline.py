"""The pipeline on the real local stack: Kafka -> Spark -> Iceberg + PUB.

One pipeline process (history and live paths) serves every test in this
module: Spark needs ~10 s and ~1.5 GB to start on this 2-core machine. Each test
uses its own request ids and tickers, so the tests do not depend on each other.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from candle_oracle import aggregate

from infra.testing import Subscriber
from mdproto import envelope
from mdproto.book import OrderBook, levels_message
from mdproto.messages import (
    OHLC,
    BookDelta,
    BookReset,
    BookSnapshot,
    HistoryReadyNotification,
    HistorySource,
    OHLCBatch,
    Status,
    Tick,
)
from pipeline.notifier import EARLY_BATCH

pytestmark = [pytest.mark.stack, pytest.mark.spark, pytest.mark.heavy(seconds=280)]


@pytest.fixture(scope="module")
def pipeline(make_run: Any, tools: Any) -> Iterator[Any]:
    run = make_run(
        PIPELINE_HISTORY__WARM_UP="true",  # the other stack tests' pipelines skip it
        # Previews of every batch: with the default 0.25 s a window that a batch within
        # 0.25 s of the last preview closes has none (ADR 0020), so whether
        # test_ticks_become_candles_published_and_stored sees each window's preview would
        # hang on how Kafka split its three sends into batches.
        PIPELINE_LIVE__PREVIEW_INTERVAL_S="0",
    )
    sub = tools.Subscriber(run.pub_endpoint)  # connected before the PUB even binds
    run.start()
    run.wait_ready()
    kafka = tools.Kafka(run.endpoints.kafka_bootstrap)
    tools.confirm_subscription(sub, kafka, run.ticks_topic)
    yield tools.Harness(run, sub, kafka, tools.Lake(run.endpoints, run.namespace))
    sub.close()
    run.stop()


def _notification(
    pipeline: Any, tools: Any, request_id: str
) -> tuple[str, HistoryReadyNotification]:
    [got] = pipeline.sub.wait_for(tools.is_notification(request_id))
    assert isinstance(got.message, HistoryReadyNotification)
    return got.topic, got.message


def _range_filter(build: Any, start: int, end: int, ticker: str | None = None) -> str:
    from datetime import UTC, datetime

    def iso(ms: int) -> str:
        return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S+00:00")

    return (
        f"ticker = '{ticker or build.TICKER}' and period_seconds = 60 "
        f"and open_time >= '{iso(start)}' and open_time < '{iso(end)}'"
    )


def test_request_batches_become_iceberg_rows_and_one_ok_notification(
    pipeline: Any, tools: Any, build: Any
) -> None:
    t0 = build.T0
    rows = [build.candle(i, t0=t0) for i in range(2500)]
    for i, row in enumerate(rows):  # what exchanges report beyond OHLCV, or not
        if i % 2:
            row.ClearField("trade_count")  # not reported: null, not 0
        if i % 3 == 0:
            row.quote_volume, row.taker_buy_volume, row.taker_buy_quote_volume = i + 0.5, 1.0, 2.0
    meta = build.metadata(
        "hist-ok-1", client_id="client-ok", start=t0, end=t0 + 2500 * build.MINUTE
    )
    pipeline.kafka.send(
        pipeline.run.batches_topic, build.request_records("hist-ok-1", rows, meta=meta)
    )

    topic, n = _notification(pipeline, tools, "hist-ok-1")

    assert topic == "RESPONSE:client-ok"
    assert (n.status, n.row_count, n.client_id) == (Status.OK, 2500, "client-ok")
    assert n.iceberg_table == f"{pipeline.run.namespace}.ohlc"
    assert (n.ticker, n.period_seconds, n.start_time_ms, n.end_time_ms) == (
        build.TICKER,
        60,
        t0,
        t0 + 2500 * build.MINUTE,
    )
    assert n.snapshot_id != 0
    stored = pipeline.lake.rows("ohlc", _range_filter(build, t0, n.end_time_ms), n.snapshot_id)
    got = sorted((int(r["open_time"].timestamp() * 1000), r["open"], r["close"]) for r in stored)
    assert got == [(c.open_time_ms, c.open, c.close) for c in rows]
    kept = {
        int(r["open_time"].timestamp() * 1000): (
            r["trade_count"],
            r["quote_volume"],
            r["taker_buy_volume"],
            r["taker_buy_quote_volume"],
        )
        for r in stored
    }
    assert kept == {
        c.open_time_ms: (
            c.trade_count if c.HasField("trade_count") else None,
            *(
                (c.quote_volume, c.taker_buy_volume, c.taker_buy_quote_volume)
                if c.HasField("quote_volume")
                else (None, None, None)
            ),
        )
        for c in rows
    }
    assert {r["source"] for r in stored} == {"history"}
    assert {r["request_id"] for r in stored} == {"hist-ok-1"}


def test_metrics_and_health_follow_the_streaming_queries(
    pipeline: Any, tools: Any, build: Any
) -> None:
    """/metrics counts the history batch that produced a notification; /healthz lists
    every query as running."""
    import json
    import urllib.request

    t0 = build.T0 + 10_000 * build.MINUTE
    rows = [build.candle(i, t0=t0) for i in range(30)]
    end = t0 + 30 * build.MINUTE
    meta = build.metadata("hist-metrics", client_id="client-m", start=t0, end=end)
    pipeline.kafka.send(
        pipeline.run.batches_topic,
        build.request_records("hist-metrics", rows, meta=meta, per_record=10),
    )
    _notification(pipeline, tools, "hist-metrics")
    base = f"http://127.0.0.1:{pipeline.run.metrics_port}"
    with urllib.request.urlopen(base + "/healthz", timeout=10) as response:
        health = json.loads(response.read())
    assert health["status"] == "ok" and health["stopped_queries"] == []
    assert "history" in health["queries"]

    scrape = pipeline.run.metrics
    # The batch's progress event follows its notification (published inside the batch).
    deadline = time.monotonic() + 60
    samples = scrape()
    # Input rows are Kafka records: 3 batches of 10 candles and the final marker.
    while samples.get('pipeline_input_rows_total{query="history"}', 0) < 4:
        assert time.monotonic() < deadline, "no progress event for the history batch"
        time.sleep(0.5)
        samples = scrape()
    assert samples['pipeline_batches_total{query="history"}'] >= 1
    # Spark's own Kafka metric, through the progress's JSON (pipeline.progress.JsonEvents).
    assert samples['pipeline_kafka_lag_offsets{query="history"}'] >= 0
    # The appends loaded tables through the driver's FileIO without a line each.
    log = pipeline.run.log_text()
    assert "history batch" in log and "Loaded FileIO" not in log
    assert samples['pipeline_query_active{query="history"}'] == 1.0
    assert samples["pipeline_pub_server_up"] == 1.0
    # Its live engine's series, read from the PUB process at scrape time: the group's
    # only member owns every partition of the ticks topic.
    ticks = f'topic="{pipeline.run.ticks_topic}"'
    owned = [v for k, v in samples.items() if k.startswith("pipeline_live_partitions_owned{")]
    assert len(owned) == 2 and min(owned) >= 1, owned  # market.ticks and market.book
    assert any(k.startswith("pipeline_live_records_total{") and ticks in k for k in samples)


def test_error_marker_and_bad_rows_become_error_notifications(
    pipeline: Any, tools: Any, build: Any
) -> None:
    failed = build.request_records(
        "hist-err-1",
        [],
        status=Status.ERROR,
        reason="exchange answered 503",
        error_code="exchange_unavailable",
        meta=build.metadata("hist-err-1", client_id=""),
    )
    t0 = build.T0 + 10**9  # a range no other test writes
    rows = [build.candle(i, t0=t0) for i in range(10)]
    rows[4] = build.candle(4, t0=t0, open=math.nan)  # Iceberg cannot be asked to keep this
    bad = build.request_records(
        "hist-bad-1", rows, meta=build.metadata("hist-bad-1", start=t0, end=t0 + 10 * build.MINUTE)
    )
    garbage = [b"not a record", envelope.encode_record(Tick(ticker=build.TICKER))]
    pipeline.kafka.send(pipeline.run.batches_topic, [*garbage, *failed, *bad])

    topic, n = _notification(pipeline, tools, "hist-err-1")
    assert topic == "HISTORY_READY:hist-err-1"
    assert (n.status, n.reason, n.error_code) == (
        Status.ERROR,
        "exchange answered 503",
        "exchange_unavailable",
    )
    assert (n.row_count, n.snapshot_id) == (0, 0)

    _, n = _notification(pipeline, tools, "hist-bad-1")
    assert (n.status, n.error_code, n.row_count) == (Status.ERROR, "incomplete", 9)
    assert "9 of the 10" in n.reason
    log = pipeline.run.log_text()
    assert "dropped partition" in log and "bad_version" in log  # the garbage was reported


def test_duplicate_deliveries_add_no_rows_and_no_second_notification(
    pipeline: Any, tools: Any, build: Any
) -> None:
    t0 = build.T0 + 2 * 10**9
    rows = [build.candle(i, t0=t0) for i in range(1500)]
    meta = build.metadata("hist-dup-1", start=t0, end=t0 + 1500 * build.MINUTE)
    records = build.request_records("hist-dup-1", rows, meta=meta)
    # Two ingestors deliver the same request back to back (usually one micro-batch).
    pipeline.kafka.send(pipeline.run.batches_topic, records + records)
    _, first = _notification(pipeline, tools, "hist-dup-1")
    # A replay of the whole range later (another micro-batch), then a sentinel
    # request on the same partition: once it is notified, the replay is processed.
    pipeline.kafka.send(pipeline.run.batches_topic, records)
    sentinel = build.request_records("hist-dup-sentinel", [build.candle(0, t0=t0 - 10**8)])
    pipeline.kafka.send(pipeline.run.batches_topic, sentinel)
    _notification(pipeline, tools, "hist-dup-sentinel")

    assert len(pipeline.sub.matching(tools.is_notification("hist-dup-1"))) == 1
    assert (first.status, first.row_count) == (Status.OK, 1500)
    stored = pipeline.lake.rows("ohlc", _range_filter(build, t0, meta.end_time_ms))
    keys = [r["open_time"] for r in stored]
    assert len(keys) == 1500 and len(set(keys)) == 1500


def test_the_warm_up_writes_the_history_path_once_and_leaves_no_table(pipeline: Any) -> None:
    from pyarrow import fs

    [warmed] = [line for line in pipeline.run.log_text().splitlines() if "warmed up" in line]
    assert all(step in warmed for step in ("append", "job", "drop")), warmed
    assert pipeline.lake.table_names() == {
        "ohlc", "ticks", "requests", "markets", "book_snapshots", "gaps", "book_deltas",
        "trade_bars",
    }  # fmt: skip
    # Nor its files: the scratch table sat beside ohlc, under warmup_<8 hex digits>.
    namespace = pipeline.lake.table("ohlc").location().removeprefix("s3://").rsplit("/", 1)[0]
    s3 = fs.S3FileSystem(**pipeline.run.endpoints.s3_filesystem_options())
    listed = s3.get_file_info(fs.FileSelector(namespace, recursive=True))
    left = [i.path for i in listed if i.type == fs.FileType.File and "/warmup_" in i.path]
    assert left == [], left


def test_stored_answers_are_counted_at_their_snapshot(
    pipeline: Any, tools: Any, build: Any
) -> None:
    """An answer from storage (a final marker alone) announces the candles its range holds
    at the notified snapshot: across files that cross the range's edges and a file a
    MERGE left deletes for, counted on the driver (pyiceberg)."""
    t0 = build.T0 + 3 * 10**9
    first = [build.candle(i, t0=t0) for i in range(1200)]
    meta = build.metadata("hist-st-a", start=t0, end=t0 + 1200 * build.MINUTE)
    pipeline.kafka.send(
        pipeline.run.batches_topic, build.request_records("hist-st-a", first, meta=meta)
    )
    _notification(pipeline, tools, "hist-st-a")
    # Overlaps the first and goes beyond it, with other prices: a MERGE (deletes).
    second = [build.candle(i, t0=t0, close=1.0) for i in range(1000, 1500)]
    start, end = t0 + 1000 * build.MINUTE, t0 + 1500 * build.MINUTE
    meta = build.metadata("hist-st-b", start=start, end=end)
    pipeline.kafka.send(
        pipeline.run.batches_topic, build.request_records("hist-st-b", second, meta=meta)
    )
    _notification(pipeline, tools, "hist-st-b")
    third = [build.candle(i, t0=t0) for i in range(2000, 2100)]  # alone in its range: one file
    start, end = t0 + 2000 * build.MINUTE, t0 + 2100 * build.MINUTE
    meta = build.metadata("hist-st-c", start=start, end=end)
    pipeline.kafka.send(
        pipeline.run.batches_topic, build.request_records("hist-st-c", third, meta=meta)
    )
    _notification(pipeline, tools, "hist-st-c")
    present = {*range(1500), *range(2000, 2100)}

    ranges = {
        "hist-st-1": (100, 1300),
        "hist-st-2": (0, 1500),
        "hist-st-3": (1490, 1600),
        "hist-st-4": (2000, 2100),
    }
    for request_id, (lo, hi) in ranges.items():
        start, end = t0 + lo * build.MINUTE, t0 + hi * build.MINUTE
        final = build.metadata(request_id, start=start, end=end)
        final.status = Status.OK
        final.source = HistorySource.SOURCE_STORAGE
        final.expected_candles = hi - lo
        marker = OHLCBatch(request_id=request_id, metadata=final, is_final=True)
        pipeline.kafka.send(pipeline.run.batches_topic, [envelope.encode_record(marker)])
        _, n = _notification(pipeline, tools, request_id)
        stored = pipeline.lake.rows("ohlc", _range_filter(build, start, end), n.snapshot_id)
        expected = len(present & set(range(lo, hi)))
        assert (n.status, n.row_count) == (Status.OK, expected) == (Status.OK, len(stored))
        assert n.exchange_gaps == (hi - lo) - n.row_count
    log = pipeline.run.log_text()
    # The empty-range probe (on the driver) let the first and third write append; the
    # second overlaps the first and MERGEd (a wrong "empty" would have duplicated rows).
    assert "MERGEing instead" not in log  # no append's commit failed
    assert re.search(r"history batch \d+: .*, merge \d+ ms", log), log
    assert len(re.findall(r"history batch \d+: .*, append \d+ ms", log)) >= 2, log
    # Notified ahead of the history query (stored_answers), which recorded each once it
    # came to the marker (it has, once a later request on the partition is notified).
    sentinel = build.metadata("hist-st-sentinel", start=t0, end=t0 + build.MINUTE)
    pipeline.kafka.send(
        pipeline.run.batches_topic,
        build.request_records("hist-st-sentinel", first[:1], meta=sentinel),
    )
    _notification(pipeline, tools, "hist-st-sentinel")
    # A race by design: the query's micro-batch may reach a marker before this thread
    # does and then answers it itself, once either way (seen on a busy machine).
    early = 0
    for request_id in ranges:
        assert len(pipeline.sub.matching(tools.is_notification(request_id))) == 1
        [row] = pipeline.lake.rows("requests", f"request_id = '{request_id}'")
        early += row["batch_id"] == EARLY_BATCH
    assert early >= 1
    assert pipeline.run.log_text().count("ahead of the history query (stored answer)") == early


def test_ticks_become_candles_published_and_stored(pipeline: Any, tools: Any, build: Any) -> None:
    ticker = "BINANCE:ETH/USDT"
    b = 1_704_067_200_000  # 2024-01-01T00:00:00Z: 1- and 5-minute aligned

    def t(trade_id: int, price: float, at_s: int, amount: float = 1.0) -> Tick:
        return build.tick(trade_id, price, b + at_s * 1000, amount=amount, ticker=ticker)

    def send(*ticks: Tick) -> None:
        values = [envelope.encode_record(x) for x in ticks]
        pipeline.kafka.send(pipeline.run.ticks_topic, values, key=ticker)

    # Arrival order is not trade-time order: the earliest trade of minute 0 (id 1)
    # and the next-to-last (id 5) arrive late, at most 4 s behind the newest trade,
    # inside the 5 s watermark. first()/last() would give open 101 and close 103.
    minute0 = [
        t(2, 101.0, 10, 0.5),
        t(1, 100.0, 7),
        t(3, 104.0, 30, 2.0),
        t(4, 98.0, 40),
        t(6, 102.0, 59, 1.5),
        t(5, 103.0, 56, 0.25),
        t(3, 104.0, 30, 2.0),  # re-delivered trade: counts once
    ]
    minute1 = [t(7, 110.0, 62, 3.0), t(8, 90.0, 75), t(9, 95.0, 71)]
    advance = t(10, 96.0, 370)  # event time 00:06:10: closes minutes 0-1 and 00:00-00:05
    send(*minute0)
    send(*minute1)
    send(advance)

    def closed(period: int, open_s: int) -> Any:
        def check(m: Any) -> bool:
            msg = m.message
            return (
                isinstance(msg, OHLC)
                and msg.closed
                and msg.ticker == ticker
                and (msg.period_seconds, msg.open_time_ms) == (period, b + open_s * 1000)
            )

        return check

    def values(msg: OHLC) -> tuple[float, ...]:
        return (msg.open, msg.high, msg.low, msg.close, msg.volume, msg.trade_count)

    [m0] = [x.message for x in pipeline.sub.wait_for(closed(60, 0))]
    [m1] = [x.message for x in pipeline.sub.wait_for(closed(60, 60))]
    [f0] = [x.message for x in pipeline.sub.wait_for(closed(300, 0))]
    # Minute 0 by trade time: 7 s 100, 10 s 101, 30 s 104, 40 s 98, 56 s 103, 59 s 102.
    assert values(m0) == (100.0, 104.0, 98.0, 102.0, 6.25, 6)
    # Minute 1: 62 s 110, 71 s 95, 75 s 90.
    assert values(m1) == (110.0, 110.0, 90.0, 90.0, 5.0, 3)
    # 00:00-00:05 holds trades 1-9.
    assert values(f0) == (100.0, 110.0, 90.0, 90.0, 11.25, 9)
    reference = {
        (c.period_seconds, c.open_time_ms): c
        for c in aggregate([*minute0, *minute1, advance], [60, 300])
    }
    for msg in (m0, m1, f0):
        ref = reference[(msg.period_seconds, msg.open_time_ms)]
        assert values(msg) == (ref.open, ref.high, ref.low, ref.close, ref.volume, ref.trade_count)

    assert not any(m.correction for m in (m0, m1, f0))

    # Updating candles (closed=false) were published for the same windows (a batch's
    # previews go out before the closes it causes).
    def update(period: int, open_s: int) -> Any:
        def check(m: Any) -> bool:
            msg = m.message
            return (
                isinstance(msg, OHLC)
                and not msg.closed
                and msg.ticker == ticker
                and (msg.period_seconds, msg.open_time_ms) == (period, b + open_s * 1000)
            )

        return check

    for period, open_s in ((60, 0), (60, 60), (300, 0)):
        pipeline.sub.wait_for(update(period, open_s))
    # Every distinct trade was published once on the tick topic.
    published = pipeline.sub.wait_for(lambda m: m.topic == f"{ticker}|tick", count=10)
    assert sorted(int(m.message.trade_id) for m in published) == list(range(1, 11))

    # A trade later than the watermark misses its (closed) candle but is kept as a tick.
    send(t(11, 500.0, 12))
    send(t(12, 97.0, 700))  # closes minute 6; processed after trade 11 (same partition)
    pipeline.sub.wait_for(closed(60, 360))
    assert len(pipeline.sub.matching(closed(60, 0))) == 1

    def stored_candles() -> dict[tuple[int, int], dict[str, Any]]:
        return {
            (r["period_seconds"], int(r["open_time"].timestamp() * 1000)): r
            for r in pipeline.lake.rows("ohlc", f"ticker = '{ticker}'")
        }

    wanted = {(m.period_seconds, m.open_time_ms) for m in (m0, m1, f0)}
    deadline = time.monotonic() + tools.WAIT_S
    while not wanted <= (stored := stored_candles()).keys():
        assert time.monotonic() < deadline, "closed candles not stored"
        time.sleep(0.5)  # candles-store MERGEs what the live engine published
    for msg in (m0, m1, f0):
        row = stored[(msg.period_seconds, msg.open_time_ms)]
        assert row["source"] == "live"
        assert (row["open"], row["high"], row["low"], row["close"]) == values(msg)[:4]
        assert (row["volume"], row["trade_count"]) == values(msg)[4:]

    # A trade within the lateness (5 s here) of an already closed candle amends it: the
    # candle is published again, marked as a correction, and the stored row updated.
    send(t(13, 99.0, 719), t(14, 95.0, 721))  # 721 s closes minute 11 (660-720 s)
    [first] = [x.message for x in pipeline.sub.wait_for(closed(60, 660))]
    assert not first.correction
    assert values(first) == (97.0, 99.0, 97.0, 99.0, 2.0, 2)  # trades 12 (700 s) and 13
    send(t(15, 50.0, 718))  # 3 s behind the newest trade, after minute 11 was published
    got = pipeline.sub.wait_for(closed(60, 660), count=2)
    fixed = got[-1].message
    assert fixed.correction
    assert values(fixed) == (97.0, 99.0, 50.0, 99.0, 3.0, 3)

    def stored_row(period: int, open_s: int) -> dict[str, Any] | None:
        rows = pipeline.lake.rows("ohlc", f"ticker = '{ticker}' and period_seconds = {period}")
        found = [r for r in rows if int(r["open_time"].timestamp()) == b // 1000 + open_s]
        return found[0] if found else None

    deadline = time.monotonic() + tools.WAIT_S
    while (row := stored_row(60, 660)) is None or row["low"] != 50.0:
        assert time.monotonic() < deadline, f"the correction was not stored: {row}"
        time.sleep(1)  # the MERGE follows the publication
    assert (row["open"], row["high"], row["close"], row["trade_count"]) == (97.0, 99.0, 99.0, 3)

    def stored_trades() -> list[int]:
        return sorted(
            int(r["trade_id"]) for r in pipeline.lake.rows("ticks", f"ticker = '{ticker}'")
        )

    deadline = time.monotonic() + tools.WAIT_S
    while stored_trades() != list(range(1, 16)) and time.monotonic() < deadline:
        time.sleep(1)  # poll: ticks-persist commits every 2 s
    assert stored_trades() == list(range(1, 16))  # each trade once, the late ones too


def test_live_candles_across_a_feed_gap_are_stored_incomplete_until_history_replaces_them(
    pipeline: Any, tools: Any, build: Any
) -> None:
    """Ticks marked `gap_before` (the feed's first trade; trade ids skipped) make the
    candles they span `incomplete`, published and stored so; a history request over
    the range replaces them, even a candle whose values equal the exchange's."""
    ticker = "BINANCE:GAPS/USDT"
    b = 1_704_153_600_000  # 2024-01-02T00:00:00Z: 1- and 5-minute aligned

    def t(trade_id: int, price: float, at_s: int, *, gap: bool = False) -> Tick:
        tick = build.tick(trade_id, price, b + at_s * 1000, ticker=ticker)
        tick.gap_before = gap
        return tick

    feed = [
        t(1, 100.0, 70, gap=True),  # the feed's first trade: minute 1 began before it
        t(2, 101.0, 100),
        t(3, 102.0, 130),
        t(4, 103.0, 170),
        t(5, 104.0, 190),  # minute 3's only trade seen
        t(9, 105.0, 250, gap=True),  # ids 6-8 lost (190-250 s): minutes 3 and 4
        t(10, 106.0, 310),  # closes minute 4 and the first 5 minutes
    ]
    pipeline.kafka.send(
        pipeline.run.ticks_topic, [envelope.encode_record(x) for x in feed], key=ticker
    )
    wanted = {(60, 60): True, (60, 120): False, (60, 180): True, (60, 240): True, (300, 0): True}

    def closed(m: Any) -> bool:
        msg = m.message
        return isinstance(msg, OHLC) and msg.closed and msg.ticker == ticker

    got = pipeline.sub.wait_for(closed, count=len(wanted))
    published = {
        (m.message.period_seconds, (m.message.open_time_ms - b) // 1000): m.message.incomplete
        for m in got
    }
    assert published == wanted

    def stored() -> dict[tuple[int, int], dict[str, Any]]:
        return {
            (r["period_seconds"], int(r["open_time"].timestamp() * 1000 - b) // 1000): r
            for r in pipeline.lake.rows("ohlc", f"ticker = '{ticker}'")
        }

    deadline = time.monotonic() + tools.WAIT_S
    while not wanted.keys() <= (rows := stored()).keys():
        assert time.monotonic() < deadline, f"live candles not stored: {rows}"
        time.sleep(0.5)  # poll: candles-store MERGEs what the live engine published
    assert {k: (rows[k]["source"], rows[k]["incomplete"]) for k in wanted} == {
        k: ("live", flag) for k, flag in wanted.items()
    }

    # A history request over minutes 1-4: the exchange's candles; minute 3's values
    # equal the incomplete live candle's (it missed no price, only trades).
    history = [build.candle(i, ticker=ticker, t0=b + 60_000) for i in range(4)]
    minute3 = history[2]
    minute3.open = minute3.high = minute3.low = minute3.close = 104.0
    minute3.volume, minute3.trade_count = 1.0, 1
    meta = build.metadata("hist-gaps", ticker=ticker, start=b + 60_000, end=b + 300_000)
    pipeline.kafka.send(
        pipeline.run.batches_topic, build.request_records("hist-gaps", history, meta=meta)
    )
    _, n = _notification(pipeline, tools, "hist-gaps")
    assert (n.status, n.row_count) == (Status.OK, 4)
    replaced = {
        int(r["open_time"].timestamp() * 1000 - b) // 1000: (r["source"], r["incomplete"])
        for r in pipeline.lake.rows(
            "ohlc", _range_filter(build, b + 60_000, b + 300_000, ticker), n.snapshot_id
        )
    }
    assert replaced == {60: ("history", None), 120: ("history", None), 180: ("history", None),
                        240: ("history", None)}  # fmt: skip


def test_tables_from_an_older_pipeline_are_migrated_at_start(
    make_run: Any, tools: Any, build: Any
) -> None:
    """Tables an older pipeline created are migrated, not refused (one start for both):
    ALTER TABLE adds ohlc's volume columns and live candles' ``incomplete`` note (old
    rows read null) and the requests table's integrity report."""
    from pyiceberg.catalog import load_catalog

    from pipeline.history_notices import REQUESTS_SCHEMA
    from pipeline.lake import OHLC_ADDED_COLUMNS
    from pipeline.lake import REQUESTS_ADDED_COLUMNS as ADDED_COLUMNS
    from pipeline.records import OHLC_SCHEMA

    run = make_run(  # the history query alone: the others would only load the cores
        PIPELINE_LIVE__ENABLED="false",
        PIPELINE_CEP__ENABLED="false",
        PIPELINE_MARKETS__ENABLED="false",
        PIPELINE_GAPS__ENABLED="false",
    )
    e = run.endpoints
    catalog = load_catalog(e.catalog_name, **e.pyiceberg_catalog_properties())
    catalog.create_namespace(run.namespace)
    old_ohlc = pa.schema([f for f in OHLC_SCHEMA if f.name not in OHLC_ADDED_COLUMNS])
    old = catalog.create_table(f"{run.namespace}.ohlc", schema=old_ohlc)
    old_row = {f.name: None for f in old_ohlc}
    old_row.update(
        ticker=build.TICKER, period_seconds=60, open_time=pa.scalar(0, pa.timestamp("us", "UTC"))
    )
    old.append(pa.Table.from_pylist([old_row], schema=old_ohlc))
    old_requests = pa.schema([f for f in REQUESTS_SCHEMA if f.name not in ADDED_COLUMNS])
    catalog.create_table(f"{run.namespace}.requests", schema=old_requests)
    sub = tools.Subscriber(run.pub_endpoint)
    run.start()
    try:
        run.wait_ready()
        kafka = tools.Kafka(e.kafka_bootstrap)
        lake = tools.Lake(e, run.namespace)

        candle = build.candle(0)
        candle.quote_volume = 12.5
        meta = build.metadata("hist-evolved", start=build.T0, end=build.T0 + build.MINUTE)
        kafka.send(run.batches_topic, build.request_records("hist-evolved", [candle], meta=meta))
        # 100 slots on a ticker of their own: 90 candles, 5 minutes without trades, 5 the
        # ingestor could not fetch.
        t0, other = build.T0, "BINANCE:INTEGRITY/USDT"
        rows = [build.candle(i, t0=t0, ticker=other) for i in range(100) if i % 20 not in (3, 4)]
        meta = build.metadata("hist-integrity", ticker=other, start=t0, end=t0 + 100 * build.MINUTE)
        meta.expected_candles, meta.expected_gaps = 100, 5
        kafka.send(run.batches_topic, build.request_records("hist-integrity", rows, meta=meta))

        sub.wait_for(tools.is_notification("hist-evolved"))
        by_time = {
            int(r["open_time"].timestamp() * 1000): r
            for r in lake.rows("ohlc", f"ticker = '{build.TICKER}'")
        }
        assert by_time[0]["quote_volume"] is None  # written before the column existed
        assert by_time[0]["incomplete"] is None
        assert by_time[build.T0]["quote_volume"] == 12.5
        assert by_time[build.T0]["taker_buy_volume"] is None

        [got] = sub.wait_for(tools.is_notification("hist-integrity"))
        n = got.message
        assert (n.status, n.row_count) == (Status.OK, 90)
        assert (n.expected_candles, n.exchange_gaps, n.missing_candles) == (100, 5, 5)
        assert n.source == HistorySource.SOURCE_EXCHANGE
        [row] = lake.rows("requests", "request_id = 'hist-integrity'")
        assert (row["expected_candles"], row["missing_candles"], row["source"]) == (
            100,
            5,
            "SOURCE_EXCHANGE",
        )
    finally:
        sub.close()
        run.stop()


def test_market_records_become_one_row_per_ticker(pipeline: Any, tools: Any) -> None:
    """market.markets -> Iceberg markets: latest updated_at wins, tombstones delete."""
    from mdproto.messages import Market

    topic = pipeline.run.markets_topic

    def send(ticker: str, updated_at_ms: int | None, **fields: Any) -> None:
        value = None
        if updated_at_ms is not None:
            exchange, _, symbol = ticker.partition(":")
            base, _, quote = symbol.partition("/")
            fields = {"active": True, **fields}
            record = Market(
                ticker=ticker, exchange=exchange, symbol=base + quote, base=base, quote=quote,
                updated_at_ms=updated_at_ms, **fields,
            )  # fmt: skip
            value = envelope.encode_record(record)
        pipeline.kafka.send(topic, [value], key=ticker)

    def stored() -> dict[str, dict[str, Any]]:
        return {r["ticker"]: r for r in pipeline.lake.rows("markets")}

    def wait_for(check: Any, what: str) -> dict[str, dict[str, Any]]:
        deadline = time.monotonic() + tools.WAIT_S
        rows = stored()
        while not check(rows):
            assert time.monotonic() < deadline, f"{what}: {rows}"
            time.sleep(1)  # poll: the markets query triggers every 2 s here
            rows = stored()
        return rows

    send("BINANCE:BTC/USDT", 1_000, min_amount=0.1, price_precision=0.01)
    send("BINANCE:ETH/USDT", 1_000, min_amount=0.5)
    send("BINANCE:BTC/USDT", 2_000, min_amount=0.2, price_precision=0.01)
    rows = wait_for(lambda r: {"BINANCE:BTC/USDT", "BINANCE:ETH/USDT"} <= r.keys(), "first rows")
    btc = rows["BINANCE:BTC/USDT"]
    assert (btc["min_amount"], btc["price_precision"], btc["symbol"]) == (0.2, 0.01, "BTCUSDT")
    assert btc["active"] is True and btc["updated_at"].timestamp() == 2.0

    send("BINANCE:BTC/USDT", 1_500, min_amount=9.9)  # older than the row: ignored
    send("BINANCE:ETH/USDT", None)  # tombstone: delisted
    send("KRAKEN:SOL/EUR", 3_000, active=False)
    rows = wait_for(lambda r: "KRAKEN:SOL/EUR" in r and "BINANCE:ETH/USDT" not in r, "second batch")
    assert rows["BINANCE:BTC/USDT"]["min_amount"] == 0.2
    assert rows["KRAKEN:SOL/EUR"]["active"] is False
    assert len(rows) == 2

    # The SDK reads what Spark wrote (mdclient markets BINANCE).
    from mdclient.frames import IcebergReader

    e = pipeline.run.endpoints
    reader = IcebergReader(e.pyiceberg_catalog_properties(), catalog_name=e.catalog_name)
    sdk = reader.read_markets(f"{pipeline.run.namespace}.markets", "BINANCE").to_pylist()
    assert [(r["ticker"], r["min_amount"], r["active"]) for r in sdk] == [
        ("BINANCE:BTC/USDT", 0.2, True)
    ]


# -- order books: market.book -> live engine -> PUB; snapshots -> book_snapshots ----------


def _book_snapshot(
    ticker: str, seq: int, reset: int, at_ms: int, mid: float = 100.0
) -> BookSnapshot:
    return BookSnapshot(
        ticker=ticker,
        bids=levels_message([(mid - 1, 1.0), (mid - 2, 2.0), (mid - 3, 3.0)]),
        asks=levels_message([(mid + 1, 1.5), (mid + 2, 2.5), (mid + 3, 3.5)]),
        depth=3,
        exchange_sequence=seq,
        exchange_time_ms=at_ms,
        ingested_at_ms=at_ms + 5,
        reset=reset,  # type: ignore[arg-type]
        reason="" if reset == BookReset.BOOK_RESET_NONE else "test",
    )


def _book_delta(ticker: str, seq: int, bids: list[Any], asks: list[Any]) -> BookDelta:
    return BookDelta(
        ticker=ticker,
        bids=levels_message(bids),
        asks=levels_message(asks),
        exchange_sequence=seq,
        exchange_prev_sequence=seq - 1,
        ingested_at_ms=int(time.time() * 1000),
    )


def _order_book(message: BookSnapshot) -> OrderBook:
    book = OrderBook(message.ticker)
    book.replace(message)
    return book


def test_books_are_published_and_a_late_joiner_gets_the_current_book(pipeline: Any) -> None:
    ticker = "BINANCE:BOOK/USDT"
    topic = f"{ticker}|book"
    now = int(time.time() * 1000)
    before = _book_delta(ticker, 9, [(50.0, 1.0)], [])  # no snapshot yet: not published
    start = _book_snapshot(ticker, 10, BookReset.BOOK_RESET_START, now)
    deltas = [
        _book_delta(ticker, 11, [(99.0, 0.0), (99.5, 4.0)], []),
        _book_delta(ticker, 12, [], [(101.0, 0.75), (104.0, 1.0)]),
    ]
    values = [envelope.encode_record(r) for r in (before, start, *deltas)]
    pipeline.kafka.send(pipeline.run.book_topic, values, key=ticker)
    expected = _order_book(start)
    for d in deltas:
        expected.apply(d)

    def periodic_of_whole_book(m: Any) -> bool:
        msg = m.message
        return (
            m.topic == topic
            and isinstance(msg, BookSnapshot)
            and msg.reset == BookReset.BOOK_RESET_NONE
            and msg.exchange_sequence == 12
        )

    [periodic] = pipeline.sub.wait_for(periodic_of_whole_book)
    on_topic = [m.message for m in pipeline.sub.matching(lambda m: m.topic == topic)]
    # The delta before the first snapshot never went out (it would have come first).
    assert isinstance(on_topic[0], BookSnapshot) and on_topic[0].reset == BookReset.BOOK_RESET_START
    assert [m.sequence for m in on_topic] == list(range(1, len(on_topic) + 1))
    published = [m.exchange_sequence for m in on_topic if isinstance(m, BookDelta)]
    assert published == [11, 12]
    assert _order_book(periodic.message) == expected
    assert periodic.message.sequence == on_topic[-1].sequence  # nothing changed since

    # A new subscription gets the current book numbered as the topic's last message.
    late = Subscriber(pipeline.run.pub_endpoint, [topic.encode()], wait_s=60)
    try:
        [first] = late.wait_for(lambda m: m.topic == topic)
        assert isinstance(first.message, BookSnapshot)
        assert first.message.reset == BookReset.BOOK_RESET_NONE
        assert first.message.sequence == periodic.message.sequence
        assert first.message.publisher_epoch == periodic.message.publisher_epoch
        assert _order_book(first.message) == expected
        # ... and then the stream goes on where that number left off.
        nxt = _book_delta(ticker, 13, [(95.0, 1.0)], [])
        pipeline.kafka.send(pipeline.run.book_topic, [envelope.encode_record(nxt)], key=ticker)
        [after] = late.wait_for(lambda m: isinstance(m.message, BookDelta))
        assert after.message.sequence == first.message.sequence + 1
    finally:
        late.close()


def test_snapshots_are_stored_and_rebuild_the_book_of_a_past_time(
    pipeline: Any, tools: Any
) -> None:
    """market.book -> book_snapshots (a record delivered twice adds nothing) -> the SDK's
    book of a past time: the newest snapshot at or before it, and the deltas after it
    (here the one delta is stored at its ingestor's time, now: after every time asked;
    test_stack_book_history has the deltas)."""
    from mdclient.book_history import read_book_at
    from mdclient.config import ClientSettings
    from mdclient.frames import IcebergReader

    ticker = "KRAKEN:BOOK/EUR"
    t0 = 1_704_067_200_000  # 2024-01-01T00:00:00Z
    first = _book_snapshot(ticker, 1, BookReset.BOOK_RESET_START, t0, mid=100.0)
    later = _book_snapshot(ticker, 50, BookReset.BOOK_RESET_NONE, t0 + 10_000, mid=200.0)
    reset = _book_snapshot(ticker, 90, BookReset.BOOK_RESET_CHECKSUM, t0 + 15_000, mid=300.0)
    values = [
        envelope.encode_record(first),
        envelope.encode_record(_book_delta(ticker, 2, [(99.0, 0.0)], [])),
        envelope.encode_record(later),
        envelope.encode_record(reset),
        envelope.encode_record(later),  # delivered twice: stored once
    ]
    pipeline.kafka.send(pipeline.run.book_topic, values, key=ticker)

    def stored() -> list[dict[str, Any]]:
        try:
            return pipeline.lake.rows("book_snapshots", f"ticker = '{ticker}'")
        except Exception:
            return []

    deadline = time.monotonic() + tools.WAIT_S
    rows = stored()
    while len(rows) < 3:
        assert time.monotonic() < deadline, f"book snapshots not stored: {rows}"
        time.sleep(1)  # poll: book-store triggers every second here
        rows = stored()
    assert len(rows) == 3
    by_reset = {r["reset"]: r for r in rows}
    assert set(by_reset) == {"START", "NONE", "CHECKSUM"}
    start = by_reset["START"]
    assert (start["exchange"], start["symbol"], start["depth"]) == ("KRAKEN", "BOOK/EUR", 3)
    assert start["snapshot_time"].timestamp() * 1000 == t0
    assert start["bids"][0] == {"price": 99.0, "amount": 1.0}
    assert [a["price"] for a in start["asks"]] == [101.0, 102.0, 103.0]

    e = pipeline.run.endpoints
    reader = IcebergReader(e.pyiceberg_catalog_properties(), catalog_name=e.catalog_name)
    settings = ClientSettings(
        book_snapshots_table=f"{pipeline.run.namespace}.book_snapshots",
        book_deltas_table=f"{pipeline.run.namespace}.book_deltas",
    )
    assert read_book_at(reader, settings, ticker, t0 + 9_999) == _order_book(first)
    assert read_book_at(reader, settings, ticker, t0 + 10_000) == _order_book(later)
    past = read_book_at(reader, settings, ticker, t0 + 60_000)
    assert past == _order_book(reset) and past.exchange_time_ms == t0 + 15_000


def test_a_sigterm_to_the_whole_process_group_stops_it_cleanly(pipeline: Any) -> None:
    """Last in this file: it stops the module's pipeline. `make stop` (and systemd)
    signal the whole group, so Spark's JVM stops itself beside the driver, whose own
    stop then met a dead py4j gateway: a traceback from `spark.stop()` and status 1.
    (Threads inside a py4j call at that moment still log the lost gateway.)"""
    run = pipeline.run
    assert run.sigterm_group() == 0, run.tail()
    log = run.log_file.read_text(errors="replace")
    assert 'pipeline/app.py", line' not in log, run.tail()  # no traceback through stop()
