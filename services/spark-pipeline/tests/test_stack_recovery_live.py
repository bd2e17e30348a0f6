"""kill -9 of the driver right after a live candle commit and at a random point while
ticks stream: no candle or trade lost, none written twice."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest
from candle_oracle import aggregate

from mdproto import envelope
from mdproto.messages import OHLC

pytestmark = [pytest.mark.stack, pytest.mark.spark, pytest.mark.heavy(seconds=160)]

KILLED = -signal.SIGKILL


def test_live_kill9_loses_and_duplicates_nothing(make_run: Any, tools: Any, build: Any) -> None:
    run = make_run(
        PIPELINE_HISTORY__ENABLED="false",
        PIPELINE_CEP__ENABLED="false",
        PIPELINE_MARKETS__ENABLED="false",
        PIPELINE_GAPS__ENABLED="false",
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
