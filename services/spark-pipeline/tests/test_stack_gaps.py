"""Recording gaps on the real stack: TradeGap records -> Iceberg ``gaps``, repaired ticks
kept out of the live engine, and the live candles over a REPAIRED gap rebuilt from
``ticks`` (an exchange candle left alone), published again as corrections."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

import pyarrow as pa
import pytest
from candle_oracle import aggregate

from mdproto import envelope
from mdproto.messages import OHLC, RecordingCheckpoint, Tick, TradeGap
from pipeline import records

pytestmark = [pytest.mark.stack, pytest.mark.spark, pytest.mark.heavy(seconds=150)]

TICKER = "BINANCE:REPAIR/USDT"
B = 1_704_240_000_000  # 2024-01-03T00:00:00Z: 1- and 5-minute aligned
GAP_ID = f"{TICKER}|3|10"
_T = TypeVar("_T")


def trade(
    trade_id: int,
    price: float,
    at_s: int,
    amount: float = 1.0,
    *,
    repaired: bool = False,
    gap_before: bool = False,
) -> Tick:
    return Tick(
        ticker=TICKER,
        trade_id=str(trade_id),
        price=price,
        amount=amount,
        timestamp_ms=B + at_s * 1000,
        repaired=repaired,
        gap_before=gap_before,
    )


def gap_record(gap_id: str, ticker: str, state: int, updated_at_ms: int, **fields: Any) -> bytes:
    values: dict[str, Any] = {
        "gap_id": gap_id,
        "ticker": ticker,
        "from_trade_id": "3",
        "to_trade_id": "10",
        "from_time_ms": B + 50_000,
        "to_time_ms": B + 140_000,
        "detected_at_ms": B + 141_000,
        "cause": TradeGap.SKIPPED_IDS,
        "missing_ids": 6,
        "ingestor_id": "ingestor-a",
        "state": state,
        "updated_at_ms": updated_at_ms,
    }
    values.update(fields)
    return envelope.encode_record(TradeGap(**values))


def poll(what: str, check: Callable[[], _T | None], timeout_s: float) -> _T:
    deadline = time.monotonic() + timeout_s
    while (got := check()) is None:
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s"
        time.sleep(0.5)  # poll: the queries commit every second or two here
    return got


def test_gaps_are_stored_and_a_repaired_gaps_candles_rebuilt(
    make_run: Any, tools: Any, build: Any
) -> None:
    run = make_run(
        PIPELINE_HISTORY__ENABLED="false",
        PIPELINE_CEP__ENABLED="false",
        PIPELINE_MARKETS__ENABLED="false",
        PIPELINE_GAPS__TICKS_WAIT_S="20",
        PIPELINE_GAPS__CORRECTION_S="1e10",  # candles of 2024 count as recent: corrections
    )
    sub = tools.Subscriber(run.pub_endpoint)
    run.start()
    run.wait_ready()
    kafka = tools.Kafka(run.endpoints.kafka_bootstrap)
    lake = tools.Lake(run.endpoints, run.namespace)
    tools.confirm_subscription(sub, kafka, run.ticks_topic)

    def send_ticks(*ticks: Tick) -> None:
        kafka.send(run.ticks_topic, [envelope.encode_record(t) for t in ticks], key=TICKER)

    def ohlc_rows() -> dict[tuple[int, int], dict[str, Any]]:
        return {
            (r["period_seconds"], int(r["open_time"].timestamp()) - B // 1000): r
            for r in lake.rows("ohlc", f"ticker = '{TICKER}'")
        }

    # The live feed: trades 4-9 (55-130 s) lost; 10 comes with gap_before.
    live = [
        trade(1, 100.0, 20),
        trade(2, 101.0, 50, 0.5),  # the same millisecond as 3, the gap's start
        trade(3, 99.0, 50),
        trade(10, 98.0, 140, gap_before=True),
        trade(11, 100.5, 170),
        trade(12, 102.0, 290),
        trade(13, 103.0, 400),  # closes every window before 6 min
    ]
    send_ticks(*live)
    incomplete = {(60, 0): True, (60, 120): True, (60, 240): False, (300, 0): True}
    stored = poll(
        "the live candles stored",
        lambda: rows if incomplete.keys() <= (rows := ohlc_rows()).keys() else None,
        tools.WAIT_S,
    )
    assert {k: stored[k]["incomplete"] for k in incomplete} == incomplete
    assert (60, 60) not in stored  # no live trade in minute 1

    # The exchange's candle of minute 1 (a history request's): it stays.
    exchange = {
        **{c: None for c in records.OHLC_SCHEMA.names},
        **dict(ticker=TICKER, exchange="BINANCE", symbol="REPAIR/USDT", period_seconds=60),
        **dict(open_time=pa.scalar((B + 60_000) * 1000, records.UTC_US), source="history"),
        **dict(open=1.0, high=2.0, low=0.5, close=1.5, volume=9.0, trade_count=3),
    }
    lake.table("ohlc").append(pa.Table.from_pylist([exchange], schema=records.OHLC_SCHEMA))

    # The repair: trades 4-9 (and 3 again, which the live feed had) arrive late, repaired.
    repaired = [
        trade(3, 99.0, 50, repaired=True),
        trade(4, 105.0, 55, repaired=True),
        trade(5, 110.0, 65, 2.0, repaired=True),
        trade(6, 95.0, 80, repaired=True),
        trade(7, 97.0, 115, 0.25, repaired=True),
        trade(8, 120.0, 125, repaired=True),
        trade(9, 96.0, 130, repaired=True),
    ]
    # 14: live, after them in the partition; a window of its own (an idle-closed one
    # would get a correction from it)
    send_ticks(*repaired, trade(14, 104.0, 1000))
    sub.wait_for(lambda m: getattr(m.message, "trade_id", "") == "14")
    published = {m.message.trade_id for m in sub.matching(lambda m: m.topic == f"{TICKER}|tick")}
    assert published == {"1", "2", "3", "10", "11", "12", "13", "14"}
    assert not sub.matching(lambda m: isinstance(m.message, OHLC) and m.message.correction)

    # The ingestor's records: the gap's states, a checkpoint (not a gap), a gap still
    # OPEN, and a REPAIRED one whose trades never reach ticks (given up after 20 s).
    other = "BINANCE:OTHER/USDT"
    values = [
        gap_record(GAP_ID, TICKER, TradeGap.OPEN, B + 141_000),
        gap_record(GAP_ID, TICKER, TradeGap.REPAIRING, B + 142_000),
        gap_record(GAP_ID, TICKER, TradeGap.REPAIRED, B + 150_000, trades_recovered=6),
    ]
    kafka.send(run.recording_topic, values, key=f"gap:{GAP_ID}")
    checkpoint = RecordingCheckpoint(ticker=TICKER, last_trade_id="14", ingestor_id="a")
    kafka.send(run.recording_topic, [envelope.encode_record(checkpoint)], key=TICKER)
    for gap_id, state in ((f"{other}|1|9", TradeGap.OPEN), (f"{other}|20|90", TradeGap.REPAIRED)):
        record = gap_record(gap_id, other, state, B, trades_recovered=50, cause=TradeGap.RESTART)
        kafka.send(run.recording_topic, [record], key=f"gap:{gap_id}")

    def gaps() -> dict[str, dict[str, Any]] | None:
        rows = {r["gap_id"]: r for r in lake.rows("gaps")}
        return rows if len(rows) == 3 and rows[GAP_ID]["status"] == "REPAIRED" else None

    rows = poll("three gaps stored", gaps, tools.WAIT_S)
    g = rows[GAP_ID]
    assert (g["ticker"], g["exchange"], g["cause"]) == (TICKER, "BINANCE", "SKIPPED_IDS")
    assert (g["from_trade_id"], g["to_trade_id"], g["trades_recovered"]) == ("3", "10", 6)
    assert int(g["updated_at"].timestamp() * 1000) == B + 150_000
    assert {r["status"] for r in rows.values()} == {"REPAIRED", "OPEN"}
    assert rows[f"{other}|1|9"]["cause"] == "RESTART"

    # The rebuild: every window over 50-140 s from all the trades, complete.
    windows = [(60, 0), (60, 120), (300, 0)]
    rebuilt = poll(
        "the candles rebuilt",
        lambda: r if not any((r := ohlc_rows())[k]["incomplete"] for k in windows) else None,
        tools.WAIT_S,
    )
    reference = {
        (c.period_seconds, (c.open_time_ms - B) // 1000): c
        for c in aggregate([*live, *repaired, trade(14, 104.0, 1000)], [60, 300])
    }
    for key in windows:
        row, ref = rebuilt[key], reference[key]
        assert (row["source"], row["incomplete"]) == ("live", False)
        assert (row["open"], row["high"], row["low"], row["close"]) == (
            ref.open,
            ref.high,
            ref.low,
            ref.close,
        )
        assert (row["volume"], row["trade_count"]) == (pytest.approx(ref.volume), ref.trade_count)
    assert rebuilt[(300, 0)]["trade_count"] == 12  # trades 1-12, trade 3 once
    assert rebuilt[(60, 60)]["source"] == "history"  # the exchange's candle wins
    assert rebuilt[(60, 60)]["open"] == 1.0
    assert rebuilt[(60, 240)]["incomplete"] is False  # outside the gap: as it was

    # The live engine's minute 0 stored after the rebuild (candles-store behind, or an
    # engine replaying from less state): fewer trades than the rebuild's, so it is an
    # older view and the rebuilt row stays. Minute 20's candle, after it in the same
    # partition, tells when candles-store has read it.
    def closed(start_s: int, close: float, volume: float, count: int, **more: Any) -> OHLC:
        return OHLC(ticker=TICKER, period_seconds=60, open_time_ms=B + start_s * 1000,
                    open=close, high=close, low=close, close=close, volume=volume,
                    trade_count=count, closed=True, **more)  # fmt: skip

    old_view = closed(0, 99.0, 2.5, 3, incomplete=True)  # trades 1-3, as the feed had them
    values = [envelope.encode_record(c) for c in (old_view, closed(1200, 7.0, 1.0, 1))]
    kafka.send(f"{run.ticks_topic}.live-candles", values, key=TICKER)
    after = poll(
        "minute 20's candle stored",
        lambda: r if (60, 1200) in (r := ohlc_rows()) else None,
        tools.WAIT_S,
    )
    assert after[(60, 0)] == rebuilt[(60, 0)]

    corrections = sub.wait_for(
        lambda m: isinstance(m.message, OHLC) and m.message.correction, count=4
    )
    assert {
        (m.message.period_seconds, (m.message.open_time_ms - B) // 1000) for m in corrections
    } == {
        *windows,
        (60, 60),  # published like the live engine's candles: they never consult history
    }
    assert not any(m.message.incomplete for m in corrections)

    # /metrics: the table by status, one rebuild done, one given up.
    def metrics() -> dict[str, float] | None:
        url = f"http://127.0.0.1:{run.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        samples = {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line and not line.startswith("#")
        }
        return samples if samples.get('pipeline_gap_rebuilds_total{outcome="gave_up"}') else None

    samples = poll("the second gap given up", metrics, 120)
    assert samples['pipeline_gap_rebuilds_total{outcome="done"}'] == 1
    assert samples['pipeline_gaps{status="REPAIRED"}'] == 2
    assert samples['pipeline_gaps{status="OPEN"}'] == 1
    assert samples["pipeline_gap_rebuilt_candles_total"] == 4
    assert samples["pipeline_gap_rebuilds_pending"] == 0
    assert "candle rebuild given up: ticks hold 0 of 50 recovered trades" in run.log_text()
    with urllib.request.urlopen(
        f"http://127.0.0.1:{run.metrics_port}/healthz", timeout=10
    ) as response:
        assert "gaps" in json.loads(response.read())["queries"]
    sub.close()
    run.stop()
