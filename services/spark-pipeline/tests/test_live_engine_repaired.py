"""Repaired ticks (``Tick.repaired``: fetched over REST to fill a recorded market's gap)
are no live trades: the live engine's loop, fed by a fake consumer, publishes them not
on ``{ticker}|tick``, counts them in no candle (no preview, no correction, no
incomplete mark) and hands them to no trigger. ticks-persist stores them like any trade."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import fake_kafka
from google.protobuf.message import Message
from pyarrow import fs

from mdproto import envelope
from mdproto.messages import OHLC, Tick
from pipeline import records
from pipeline.config import Settings
from pipeline.live_engine import _Run, live_only
from pipeline.live_saves import Snapshot, SnapshotFile
from pipeline.live_state import StateStore

T = "BINANCE:ETH/USDT"
TOPIC = "market.ticks"
B = 1_704_067_200_000  # 2024-01-01T00:00:00Z


def tick(
    trade_id: str, price: float, at_ms: int, *, repaired: bool = False, gap: bool = False
) -> Tick:
    return Tick(
        ticker=T,
        trade_id=trade_id,
        price=price,
        amount=1.0,
        timestamp_ms=at_ms,
        repaired=repaired,
        gap_before=gap,
    )


def run_engine(tmp_path: Path, *batches: list[Tick]) -> tuple[list[Message], _Run]:
    settings = Settings.model_validate(
        {
            "checkpoint_dir": str(tmp_path),
            "kafka": {"topic_ticks": TOPIC},
            "live": {"periods": [60], "watermark_s": 10, "close_idle_s": 3600},
            "cep": {"enabled": False},
        }
    )
    sent: list[Message] = []

    def send_many(items: Any) -> int:
        sent.extend(m for _, m in items)
        return len(sent)

    stop = threading.Event()
    script: list[fake_kafka.Step] = [fake_kafka.Assign([0])]
    script += [fake_kafka.Ticks(0, batch) for batch in batches]
    consumer = fake_kafka.GroupConsumer(TOPIC, script, stop, at_ms=B)
    store = StateStore(fs.LocalFileSystem(), str(tmp_path / "state"))
    file = SnapshotFile(tmp_path / "snapshot.json")
    run = _Run(settings, consumer, fake_kafka.Producer(), store, file, Snapshot(), None, send_many)
    run.start()
    run.loop(stop)
    return sent, run


def test_repaired_ticks_are_neither_published_nor_counted(tmp_path: Path) -> None:
    live = [
        tick("1", 100.0, B + 10_000),
        tick("2", 101.0, B + 50_000),
        tick("3", 102.0, B + 65_000),
    ]
    repaired = [
        tick("r1", 500.0, B + 58_000, repaired=True),  # within the lateness of a closed window
        tick("r2", 1.0, B + 70_000, repaired=True, gap=True),  # in the open window
    ]
    sent, run = run_engine(tmp_path, live, repaired)

    assert [m.trade_id for m in sent if isinstance(m, Tick)] == ["1", "2", "3"]
    candles = [m for m in sent if isinstance(m, OHLC)]
    assert not any(c.correction or c.incomplete for c in candles)
    [closed] = [c for c in candles if c.closed]
    assert (closed.open_time_ms, closed.high, closed.trade_count) == (B, 101.0, 2)
    previews = [c for c in candles if not c.closed]
    assert [(c.open_time_ms, c.trade_count) for c in previews] == [(B, 2), (B + 60_000, 1)]
    assert [(c.open_time_ms, c.correction) for c in run.producer.produced] == [(B, False)]
    assert run.candles is not None
    windows = run.candles.tickers[T].windows
    assert [(w.count, w.high, w.low, w.incomplete) for w in windows.values()] == [
        (2, 101.0, 100.0, False),
        (1, 102.0, 102.0, False),
    ]


def test_live_only_keeps_the_live_ticks_and_their_order() -> None:
    ticks = [tick("1", 1.0, B), tick("2", 1.0, B, repaired=True), tick("3", 1.0, B)]
    coordinates = [(B, 0, i) for i in range(3)]
    assert [t.trade_id for t, _ in live_only(list(zip(ticks, coordinates, strict=True)))] == [
        "1",
        "3",
    ]


def test_ticks_persist_stores_a_repaired_tick_like_any_trade(build: Any) -> None:
    values = [envelope.encode_record(tick("r1", 100.0, B, repaired=True))]
    rows, rejects = records.kafka_ticks_table(build.kafka_table(values))
    assert rejects == [] and rows.column("trade_id").to_pylist() == ["r1"]
