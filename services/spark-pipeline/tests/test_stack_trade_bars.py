"""Bars from recorded trades on the real stack: trades in an Iceberg ``ticks`` table ->
the history sink's from-trades path (Spark aggregation, MERGE into ``ohlc``) -> the
notification. 5-second bars equal a pandas resample of the same trades, 60-second bars
the candles the live way defines (`candle_oracle`), gaps and the recording's edges
show in the integrity report."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow as pa
import pytest
from candle_oracle import aggregate
from count_bars_oracle import count_bars

from infra.localstack import LocalStack
from mdproto import envelope, rules
from mdproto.messages import (
    BatchMetadata,
    HistorySource,
    OHLCBatch,
    Status,
    TakerSide,
    Tick,
    TradeGap,
)
from pipeline import gaps, records
from pipeline.arrow_appends import ArrowAppends
from pipeline.history import HistorySink
from pipeline.lake import Lake, TableNames
from pipeline.notifier import HistoryNotifier
from pipeline.streams import QueryIdentity

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.stack, pytest.mark.spark, pytest.mark.heavy(seconds=150)]

TICKER = "BINANCE:BARS/USDT"
B = 1_704_240_000_000  # 2024-01-03T00:00:00Z
S = 1000
MINUTES = 20


def recorded_trades() -> list[Tick]:
    """~2,400 trades over 20 minutes: several per millisecond at times, ids across digit
    boundaries (9 -> 10, 99 -> 100: trade order is by length, then id), quiet stretches
    (5-second windows without trades), both sides; one trade at +25 min closes them all."""
    rng = random.Random(43)
    ticks: list[Tick] = []
    at = B
    trade_id = 1
    while at < B + MINUTES * 60 * S:
        for _ in range(rng.choice((1, 1, 1, 2, 3))):  # same-millisecond trades
            ticks.append(
                Tick(
                    ticker=TICKER,
                    trade_id=str(trade_id),
                    price=round(100 + rng.uniform(-5, 5), 2),
                    amount=round(rng.uniform(0.001, 2), 3),
                    timestamp_ms=at,
                    side=rng.choice((TakerSide.BUY, TakerSide.SELL)),
                )
            )
            trade_id += 1
        at += rng.choice((50, 200, 700, 1500)) if rng.random() > 0.01 else 12_000
    ticks.append(Tick(ticker=TICKER, trade_id=str(trade_id), price=100.0, amount=1.0,
                      timestamp_ms=B + 25 * 60 * S, side=TakerSide.BUY))  # fmt: skip
    rng.shuffle(ticks)  # stored order is not trade order
    return ticks


def resample(ticks: Iterable[Tick], rule: str, start_ms: int, end_ms: int) -> pd.DataFrame:
    """The reference: pandas' resample of the trades in trade order (time, id length, id)."""
    frame = pd.DataFrame(
        [
            (t.timestamp_ms, len(t.trade_id), t.trade_id, t.price, t.amount, t.side)
            for t in ticks
            if start_ms <= t.timestamp_ms < end_ms
        ],
        columns=["ms", "id_len", "id", "price", "amount", "side"],
    ).sort_values(["ms", "id_len", "id"])
    frame["time"] = pd.to_datetime(frame["ms"], unit="ms", utc=True)
    frame["quote"] = frame["price"] * frame["amount"]
    frame["buy"] = frame["amount"].where(frame["side"] == TakerSide.BUY, 0.0)
    bars = frame.set_index("time").resample(rule, origin="epoch").agg(
        open=("price", "first"), high=("price", "max"), low=("price", "min"),
        close=("price", "last"), volume=("amount", "sum"), trade_count=("price", "count"),
        quote_volume=("quote", "sum"), taker_buy_volume=("buy", "sum"),
    )  # fmt: skip
    bars = bars[bars["trade_count"] > 0]
    bars.index = bars.index.as_unit("ms").asi8
    return bars


class Batch:
    """What foreachBatch hands the sink: the final marker's Kafka row, and the session."""

    def __init__(self, spark: SparkSession, kafka: pa.Table) -> None:
        self.sparkSession = spark  # PySpark's name
        self._kafka = kafka

    def select(self, *columns: str) -> Batch:
        return self

    def toArrow(self) -> pa.Table:  # noqa: N802 (PySpark's name)
        return self._kafka


class Publisher:
    def __init__(self) -> None:
        self.messages: list[Any] = []

    def publish_many(self, messages: Iterable[tuple[str, Any]]) -> None:
        self.messages += [message for _, message in messages]


def marker(
    request_id: str, period: int, start_ms: int, end_ms: int, offset: int, bars: str = ""
) -> pa.Table:
    """The ingestor's lone final marker for a period its exchange does not serve, or for
    tick or volume bars (`bars`, period 0)."""
    meta = BatchMetadata(
        request_id=request_id, client_id="quant", ticker=TICKER, period_seconds=period,
        start_time_ms=start_ms, end_time_ms=end_ms, notification_topic="RESPONSE:quant",
        status=Status.OK, source=HistorySource.SOURCE_TRADES, ingestor_id="ingestor-a",
        bars=bars,
    )  # fmt: skip
    value = envelope.encode_record(
        OHLCBatch(request_id=request_id, sequence=0, metadata=meta, is_final=True)
    )
    return pa.table(
        {
            "key": pa.array([TICKER.encode()], pa.binary()),
            "value": pa.array([value], pa.binary()),
            "partition": pa.array([0], pa.int32()),
            "offset": pa.array([offset], pa.int64()),
            "timestamp": pa.array([B], pa.timestamp("ms")),
        }
    )


def stored_bars(spark: SparkSession, lake: Lake, period: int) -> pd.DataFrame:
    rows = spark.sql(
        f"SELECT unix_millis(open_time) AS ms, * FROM {lake.names.ohlc} "
        f"WHERE ticker = '{TICKER}' AND period_seconds = {period} ORDER BY open_time"
    ).toPandas()
    return rows.set_index("ms")


def recorded(
    spark: SparkSession, local_stack: LocalStack, prefix: str
) -> tuple[TableNames, Lake, list[Tick], Publisher, HistorySink]:
    """Fresh tables holding `recorded_trades`, and a history sink over them."""
    names = TableNames(local_stack.endpoints.catalog_name, f"{prefix}_{uuid.uuid4().hex[:8]}")
    e = local_stack.endpoints
    lake = Lake(spark, names, ArrowAppends(e.catalog_name, e.pyiceberg_catalog_properties()))
    lake.ensure_tables()
    ticks = recorded_trades()
    assert lake.write_ticks(spark, records.ticks_to_table(ticks, [B] * len(ticks))).startswith(
        "append"
    )
    spark.catalog.refreshTable(names.ticks)  # appended by pyiceberg: not in Spark's cache
    identity = QueryIdentity()
    identity.set("query-1")
    publisher = Publisher()
    notifier = HistoryNotifier(publisher)  # type: ignore[arg-type]
    sink = HistorySink(lake, notifier, identity, lambda _: None)
    return names, lake, ticks, publisher, sink


def test_bars_from_recorded_trades(local_stack: LocalStack, spark: SparkSession) -> None:
    _, lake, ticks, publisher, sink = recorded(spark, local_stack, "bars")
    end = B + MINUTES * 60 * S

    # 5-second bars (Binance serves 1 s and 1 m, not 5 s) equal pandas' resample.
    sink(Batch(spark, marker("bars-5s", 5, B, end, 0)), 0)  # type: ignore[arg-type]
    (note,) = publisher.messages
    want = resample(ticks, "5s", B, end)
    got = stored_bars(spark, lake, 5)
    assert note.status == Status.OK, note.reason
    assert note.source == HistorySource.SOURCE_TRADES and note.snapshot_id != 0
    assert (note.row_count, note.expected_candles) == (len(want), MINUTES * 12)
    assert 0 < note.exchange_gaps == MINUTES * 12 - len(want)  # quiet windows: no trades
    assert note.missing_candles == 0
    assert list(got.index) == list(want.index)
    for column in ("open", "high", "low", "close", "trade_count"):
        assert got[column].tolist() == want[column].tolist(), column
    for column in ("volume", "quote_volume", "taker_buy_volume"):
        assert got[column].tolist() == pytest.approx(want[column].tolist(), rel=1e-9), column
    assert set(got["source"]) == {"trades"} and not got["incomplete"].any()

    # An open gap over a minute: 60-second bars equal the live way's candles, the one
    # over the gap marked incomplete; the range starts before the recording.
    gap = TradeGap(
        gap_id=f"{TICKER}|1|2", ticker=TICKER, from_trade_id="1", to_trade_id="2",
        from_time_ms=B + 5 * 60 * S + 10 * S, to_time_ms=B + 5 * 60 * S + 20 * S,
        state=TradeGap.OPEN, updated_at_ms=B, cause=TradeGap.RECONNECT,
    )  # fmt: skip
    lake.merge_gaps(spark, gaps.to_table([gap]))
    sink(Batch(spark, marker("bars-60s", 60, B - 10 * 60 * S, end, 1)), 1)  # type: ignore[arg-type]
    note = publisher.messages[-1]
    live = [c for c in aggregate(ticks, [60]) if c.open_time_ms < end]
    got = stored_bars(spark, lake, 60)
    assert note.status == Status.OK and note.row_count == len(live) == MINUTES
    assert (note.expected_candles, note.exchange_gaps, note.missing_candles) == (30, 0, 10)
    assert "not recorded before 2024-01-03T00:00:00.000+00:00" in note.reason
    assert "1 bars marked incomplete" in note.reason
    assert list(got.index) == [c.open_time_ms for c in live]
    for column in ("open", "high", "low", "close", "trade_count"):
        assert got[column].tolist() == [getattr(c, column) for c in live], column
    assert got["volume"].tolist() == pytest.approx([c.volume for c in live], rel=1e-9)
    assert got.index[got["incomplete"]].tolist() == [B + 5 * 60 * S]

    # Again (a replayed batch, a second request): the same bars, no row added.
    sink(Batch(spark, marker("bars-5s-again", 5, B, end, 2)), 2)  # type: ignore[arg-type]
    assert publisher.messages[-1].row_count == len(want)
    assert len(stored_bars(spark, lake, 5)) == len(want)

    # Before the recording: NOT_FOUND not_recorded, never an empty OK.
    sink(Batch(spark, marker("bars-early", 7, B - 3600 * S, B - 60 * S, 3)), 3)  # type: ignore[arg-type]
    note = publisher.messages[-1]
    assert (note.status, note.error_code, note.row_count) == (Status.NOT_FOUND, "not_recorded", 0)
    assert TICKER in note.reason and note.snapshot_id == 0


def test_tick_and_volume_bars_from_recorded_trades(
    local_stack: LocalStack, spark: SparkSession
) -> None:
    """Tick and volume bars equal the plain-Python reference over the same trades, land
    in ``trade_bars`` (not ``ohlc``), and a repeated request adds no row."""
    names, _, ticks, publisher, sink = recorded(spark, local_stack, "cbars")
    start, end = B + 30 * S, B + MINUTES * 60 * S
    trades = [(t.timestamp_ms, t.trade_id, t.price, t.amount) for t in ticks]
    in_range = [t for t in trades if start <= t[0] < end]
    for offset, bars in enumerate(("50ticks", "25.5vol", "50ticks")):
        sink(Batch(spark, marker(f"cb-{offset}", 0, start, end, offset, bars)), offset)  # type: ignore[arg-type]
        note = publisher.messages[-1]
        want = count_bars(in_range, rules.bars(bars))
        assert note.status == Status.OK, note.reason
        assert (note.bars, note.iceberg_table) == (bars, f"{names.namespace}.trade_bars")
        assert note.source == HistorySource.SOURCE_TRADES and note.snapshot_id != 0
        assert note.row_count == note.expected_candles == len(want) > 10
        got = spark.sql(
            f"SELECT * FROM {names.namespace_id}.trade_bars WHERE ticker = '{TICKER}' "
            f"AND bars = '{bars}' ORDER BY seq"
        ).toPandas()
        assert len(got) == len(want)  # the repeated request added none
        assert got["seq"].tolist() == [b.seq for b in want]
        assert got["first_trade_id"].tolist() == [b.trade_ids[0] for b in want]
        assert got["last_trade_id"].tolist() == [b.trade_ids[-1] for b in want]
        assert got["trade_count"].tolist() == [len(b.trade_ids) for b in want]
        for column in ("open", "high", "low", "close"):
            assert got[column].tolist() == [getattr(b, column) for b in want], column
        assert got["volume"].tolist() == pytest.approx([float(b.volume) for b in want])
        assert not got["incomplete"].any()
    assert spark.sql(f"SELECT count(1) AS n FROM {names.ohlc}").first()["n"] == 0  # type: ignore[index]
