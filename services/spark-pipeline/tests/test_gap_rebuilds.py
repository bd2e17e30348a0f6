"""Candle rebuilds over REPAIRED gaps: the readiness rule, the windows and when they
settle, the rows and corrections written (pure), and the pending rebuilds driven by a
clock with the two Spark reads replaced (probe, aggregate). The candle values Spark
computes are checked against the oracle in test_stack_gaps.py."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pyarrow as pa
import pytest

from mdproto.messages import OHLC
from pipeline import gap_rebuilds, records
from pipeline.config import Settings
from pipeline.gap_rebuilds import (
    GapRebuilds,
    Pending,
    PendingFile,
    Probe,
    Rules,
    Step,
    candle_rows,
    corrections,
    counted_by_id,
    gap_windows,
    next_step,
    settled,
    ticks_complete,
)
from pipeline.gaps import Gap
from pipeline.lake import TableNames
from pipeline.live import live_ohlc_rows

T = "BINANCE:BTC/USDT"
B = 1_704_067_200_000  # 2024-01-01T00:00:00Z: aligned to 1, 5 and 60 minutes
S = 1000


def probe(inside: int, frontier_ms: int | None, *, has_to: bool = True) -> Probe:
    """A probe where both counts agree (no other trade shares an end's millisecond)."""
    return Probe(has_to, inside, inside, frontier_ms)


RULES = Rules(
    periods=(60, 300, 3600),
    lateness_ms=10 * S,
    settle_ms=300 * S,
    ticks_wait_ms=900 * S,
    correction_ms=300 * S,
)
#: From a trade 50 s into the first minute to one 10 s into the third; 9 trades between.
GAP = Gap(f"{T}|100|110", T, "100", "110", B + 50 * S, B + 130 * S, 9, B + 140 * S)


def test_the_windows_are_those_of_every_period_overlapping_the_gap() -> None:
    assert gap_windows(GAP, RULES.periods) == [
        (60, B),
        (60, B + 60 * S),
        (60, B + 120 * S),
        (300, B),
        (3600, B),
    ]
    # The trade after the gap opens a window: that window holds it, so it is rebuilt too.
    at_edge = Gap("g", T, "1", "2", B + 10 * S, B + 120 * S, 0, 0)
    assert gap_windows(at_edge, (60,)) == [(60, B), (60, B + 60 * S), (60, B + 120 * S)]


def test_ticks_are_complete_with_the_trade_after_the_gap_and_every_recovered_one() -> None:
    assert ticks_complete(GAP, probe(9, None))
    assert not ticks_complete(GAP, probe(8, None))
    assert not ticks_complete(GAP, probe(9, None, has_to=False))
    nothing_missing = Gap("g", T, "1", "2", B, B + S, 0, 0)
    assert ticks_complete(nothing_missing, probe(0, None))


def test_the_stored_trades_are_counted_as_the_repair_counted_them() -> None:
    """Ids 101-109 (consecutive numbers): the repair counted those ids, so the trades in
    trade order between the ends; live trades sharing an end's millisecond (by time)
    must not stand in for repaired ones not stored yet. Other ids: the repair counted
    every trade of the ends' time range but the ends, so the stored ones are too."""
    assert counted_by_id(GAP)
    assert not ticks_complete(GAP, Probe(True, by_order=8, by_time=11, frontier_ms=None))
    assert ticks_complete(GAP, Probe(True, by_order=9, by_time=11, frontier_ms=None))
    by_time = Gap("g", T, "a7f", "c01", GAP.from_time_ms, GAP.to_time_ms, 9, 0)
    assert not counted_by_id(by_time)
    assert ticks_complete(by_time, Probe(True, by_order=7, by_time=9, frontier_ms=None))
    assert not ticks_complete(by_time, Probe(True, by_order=7, by_time=8, frontier_ms=None))
    not_consecutive = Gap("g", T, "100", "250", GAP.from_time_ms, GAP.to_time_ms, 9, 0)
    assert not counted_by_id(not_consecutive)


def test_a_window_settles_by_a_stored_trade_past_its_lateness_or_by_the_wall_clock() -> None:
    minute = (60, B)
    early = B + 61 * S
    assert settled(minute, probe(9, B + 70 * S), early, RULES)
    assert not settled(minute, probe(9, B + 70 * S - 1), early, RULES)
    assert not settled(minute, probe(9, None), early, RULES)
    assert settled(minute, probe(9, None), B + 360 * S, RULES)  # a quiet market


def test_the_steps_of_a_gap_wait_rebuild_what_settled_then_finish() -> None:
    pending = Pending(GAP, deadline_ms=B + 1000 * S)
    missing = probe(4, B + 140 * S)
    assert next_step(pending, missing, B + 140 * S, RULES) == Step(deferred=True)
    ready = probe(9, B + 150 * S)
    first = next_step(pending, ready, B + 150 * S, RULES)
    assert first == Step(windows=((60, B), (60, B + 60 * S)))
    pending.done.update(first.windows)
    later = probe(9, B + 310 * S)
    assert next_step(pending, later, B + 320 * S, RULES) == Step(
        windows=((60, B + 120 * S), (300, B))
    )
    pending.done.update([(60, B + 120 * S), (300, B)])
    hour_over = probe(9, B + 3610 * S)
    assert next_step(pending, hour_over, B + 3620 * S, RULES) == Step(
        windows=((3600, B),), finished=True
    )


def test_a_gap_whose_trades_never_all_arrive_is_given_up_at_its_deadline() -> None:
    pending = Pending(GAP, deadline_ms=B + 1000 * S)
    stuck = probe(4, B + 50 * S, has_to=False)
    assert next_step(pending, stuck, B + 999 * S, RULES).deferred
    step = next_step(pending, stuck, B + 1000 * S, RULES)
    assert step.gave_up == "ticks hold 4 of 9 recovered trades, not to_trade_id 110"
    assert step.windows == () and not step.finished


def aggregates(windows: list[tuple[int, int]]) -> pa.Table:
    """What `rebuilt_candles` returns from Spark for these windows (values made up)."""
    n = len(windows)
    return pa.table(
        {
            "ticker": [T] * n,
            "exchange": ["BINANCE"] * n,
            "symbol": ["BTC/USDT"] * n,
            "open_time_us": pa.array([start * 1000 for _, start in windows], pa.int64()),
            "period_seconds": pa.array([p for p, _ in windows], pa.int32()),
            "open": [100.0 + i for i in range(n)],
            "high": [110.0 + i for i in range(n)],
            "low": [90.0 + i for i in range(n)],
            "close": [105.0 + i for i in range(n)],
            "volume": [2.5] * n,
            "trade_count": pa.array([7] * n, pa.int64()),
        }
    )


def test_rebuilt_rows_are_complete_live_candles_and_recent_ones_corrections() -> None:
    rows = candle_rows(aggregates([(60, B), (300, B)]))
    stored = live_ohlc_rows(rows)
    assert stored.schema == records.OHLC_SCHEMA
    first = stored.to_pylist()[0]
    assert (first["ticker"], first["period_seconds"], first["open_time"].timestamp() * 1000) == (
        T,
        60,
        B,
    )
    assert (first["open"], first["close"], first["volume"], first["trade_count"]) == (
        100.0,
        105.0,
        2.5,
        7,
    )
    assert (first["source"], first["incomplete"], first["request_id"]) == ("live", False, None)
    # The 1-minute candle ended 360 s ago: subscribers have let it go; the 5-minute one
    # ended 120 s ago: published again as the live engine publishes a correction.
    [(topic, message)] = corrections(rows, B + 420 * S, 300 * S)
    assert topic == f"{T}|ohlc:300"
    assert message == OHLC(
        ticker=T,
        period_seconds=300,
        open_time_ms=B,
        open=101.0,
        high=111.0,
        low=91.0,
        close=106.0,
        volume=2.5,
        trade_count=7,
        closed=True,
        correction=True,
        incomplete=False,
    )
    assert corrections(rows, B + 420 * S, 0) == []


def test_the_pending_file_round_trips_and_ignores_a_foreign_format(tmp_path: Path) -> None:
    file = PendingFile(tmp_path / "gap-rebuilds" / "pending.json")
    assert file.load() == []
    file.save([Pending(GAP, 0, {(60, B), (300, B)})])
    assert file.load() == [(GAP, {(60, B), (300, B)})]
    Path(file.blob.path).write_text('{"format": 99}')
    assert file.load() == []


class FakeLake:
    """``ticks`` gets a new snapshot before every probe unless ``snapshot`` is set."""

    names = TableNames("lake", "market")

    def __init__(self, snapshot: int | None = None) -> None:
        self.written: list[pa.Table] = []
        self.snapshot = snapshot
        self._snapshots = 0

    def snapshot_id(self, table: str) -> int:
        assert table == "lake.market.ticks"
        self._snapshots += 1
        return self._snapshots if self.snapshot is None else self.snapshot

    def write_live(self, session: Any, candles: pa.Table) -> str:
        self.written.append(candles)
        return "merge"


class Report:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *args: self.calls.append((name, *args))


class Clock:
    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


@pytest.fixture
def spark_reads(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The two Spark reads, replaced: `probe` answers (one Probe for every gap, or a dict
    by gap id), `probed` records each probe's gaps, `asked` each rebuild's windows."""
    reads: dict[str, Any] = {"probe": None, "probed": [], "asked": []}

    def fake_probe(session: Any, table: str, gaps: Any) -> dict[str, Probe]:
        assert table == "lake.market.ticks"
        reads["probed"].append([gap.gap_id for gap, _ in gaps])
        answer = reads["probe"]
        return {
            gap.gap_id: answer[gap.gap_id] if isinstance(answer, dict) else answer
            for gap, _until in gaps
        }

    def candles(session: Any, table: str, windows: Any) -> pa.Table:
        asked = {ticker: sorted(w) for ticker, w in windows.items()}
        reads["asked"].append(asked[T] if list(asked) == [T] else asked)
        return aggregates([w for ticker in sorted(asked) for w in asked[ticker]])

    monkeypatch.setattr(gap_rebuilds, "probe_ticks", fake_probe)
    monkeypatch.setattr(gap_rebuilds, "rebuilt_candles", candles)
    return reads


def settings(tmp_path: Path) -> Settings:
    return Settings.model_validate(
        {
            "checkpoint_dir": str(tmp_path / "checkpoints"),
            "live": {"periods": [60, 300], "watermark_s": 10},
            "gaps": {"ticks_wait_s": 900, "settle_s": 300, "correction_s": 300},
        }
    )


def make(tmp_path: Path, lake: FakeLake, **options: Any) -> GapRebuilds:
    """GapRebuilds over fakes: no Spark session (its two reads are replaced)."""
    return GapRebuilds(settings(tmp_path), cast(Any, None), cast(Any, lake), **options)


def test_a_rebuild_waits_for_its_ticks_survives_a_restart_and_finishes(
    tmp_path: Path, spark_reads: dict[str, Any]
) -> None:
    clock, lake, report, sent = Clock(B + 140 * S), FakeLake(), Report(), []

    def rebuilds() -> GapRebuilds:
        def publish(items: Any) -> int:
            sent.extend(items)
            return len(sent)

        r = make(tmp_path, lake, publish=publish, report=report, clock=clock)
        r.restore()
        return r

    first = rebuilds()
    first.merged([GAP])
    spark_reads["probe"] = probe(3, B + 140 * S, has_to=False)
    first.run_once()
    assert ("deferred",) in report.calls and lake.written == []

    clock.now_ms = B + 150 * S  # ticks-persist committed the repaired trades
    spark_reads["probe"] = probe(9, B + 150 * S)
    first.run_once()
    assert spark_reads["asked"] == [[(60, B), (60, B + 60 * S)]]
    assert [c.open_time_ms for _, c in sent] == [B, B + 60 * S]  # recent: corrections
    assert first.pending[GAP.gap_id].done == {(60, B), (60, B + 60 * S)}

    second = rebuilds()  # a restart: the pending file has the gap and its progress
    assert second.pending[GAP.gap_id].done == {(60, B), (60, B + 60 * S)}
    clock.now_ms = B + 320 * S
    spark_reads["probe"] = probe(9, B + 315 * S)
    second.run_once()
    assert spark_reads["asked"][1] == [(60, B + 120 * S), (300, B)]
    assert second.pending == {} and rebuilds().pending == {}
    assert ("rebuilt", "done") in report.calls
    assert ("candles", 2) in report.calls
    assert all(t.column("incomplete").to_pylist() == [False, False] for t in lake.written)


def test_a_rebuild_is_given_up_with_a_warning_after_its_wait(
    tmp_path: Path, spark_reads: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    clock, lake, report = Clock(B + 140 * S), FakeLake(), Report()
    r = make(tmp_path, lake, report=report, clock=clock)
    r.merged([GAP])
    spark_reads["probe"] = probe(5, B + 200 * S)
    r.run_once()
    clock.now_ms = B + 140 * S + 900 * S
    with caplog.at_level(logging.WARNING, logger="pipeline.gap_rebuilds"):
        r.run_once()
    assert r.pending == {} and lake.written == []
    assert ("rebuilt", "gave_up") in report.calls
    assert "candle rebuild given up: ticks hold 5 of 9 recovered trades" in caplog.text


def test_without_the_live_path_nothing_is_queued(tmp_path: Path) -> None:
    r = make(tmp_path, FakeLake(), rebuild=False)
    r.merged([GAP])
    assert r.pending == {}
    assert not (tmp_path / "checkpoints" / "gap-rebuilds").exists()


def test_every_pending_gap_is_probed_and_rebuilt_in_one_round_each_window_once(
    tmp_path: Path, spark_reads: dict[str, Any]
) -> None:
    """Two gaps of one ticker sharing a minute and a gap of another ticker: one probe of
    the three, one rebuild of their settled windows (the shared minute asked once)."""
    other = "BINANCE:ETH/USDT"
    late = Gap(f"{T}|111|115", T, "111", "115", B + 100 * S, B + 110 * S, 3, B + 140 * S)
    eth = Gap(f"{other}|7|9", other, "7", "9", B + 10 * S, B + 20 * S, 1, B + 140 * S)
    clock, lake = Clock(B + 320 * S), FakeLake()
    r = make(tmp_path, lake, clock=clock)
    r.merged([GAP, late, eth])
    spark_reads["probe"] = {
        GAP.gap_id: probe(9, B + 315 * S),
        late.gap_id: probe(3, B + 315 * S),
        eth.gap_id: probe(1, B + 315 * S),
    }
    r.run_once()
    assert spark_reads["probed"] == [[GAP.gap_id, late.gap_id, eth.gap_id]]
    assert spark_reads["asked"] == [
        {
            other: [(60, B), (300, B)],
            T: [(60, B), (60, B + 60 * S), (60, B + 120 * S), (300, B)],
        }
    ]
    assert len(lake.written) == 1 and r.pending == {}


def test_the_thread_ends_quietly_once_sparks_jvm_has_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """`make stop` signals the whole process group: the JVM's shutdown hook may end it
    before the pipeline stops this thread. Its next Spark call is refused; that is the
    end of the rebuilds (the pending file keeps the gap), not an ERROR every 10 s."""

    def refused(*_args: Any) -> dict[str, Probe]:
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(gap_rebuilds, "probe_ticks", refused)
    spark = SimpleNamespace(sparkContext=SimpleNamespace(setLocalProperty=lambda *_: None))
    r = GapRebuilds(settings(tmp_path), cast(Any, spark), cast(Any, FakeLake()))
    r.merged([GAP])
    with caplog.at_level(logging.INFO, logger="pipeline.gap_rebuilds"):
        r.start()
        assert r._thread is not None
        r._thread.join(timeout=30)  # ends by itself: no stop() was called
    assert not r._thread.is_alive()
    assert {rec.levelname for rec in caplog.records} == {"INFO"}
    assert "Spark's JVM has gone" in caplog.text
    after = make(tmp_path, FakeLake())
    after.restore()
    assert list(after.pending) == [GAP.gap_id]


def test_no_probe_while_ticks_has_no_new_snapshot(
    tmp_path: Path, spark_reads: dict[str, Any]
) -> None:
    """A gap waiting on ticks-persist is probed again only once ``ticks`` changed; the
    wall clock still moves it on (its windows settle, its wait ends)."""
    clock, lake = Clock(B + 140 * S), FakeLake(snapshot=7)
    r = make(tmp_path, lake, clock=clock)
    r.merged([GAP])
    spark_reads["probe"] = probe(3, B + 140 * S, has_to=False)
    r.run_once()
    r.run_once()
    assert len(spark_reads["probed"]) == 1

    lake.snapshot = 8  # ticks-persist committed the repaired trades
    spark_reads["probe"] = probe(9, B + 150 * S)
    clock.now_ms = B + 150 * S
    r.run_once()
    assert len(spark_reads["probed"]) == 2
    assert spark_reads["asked"] == [[(60, B), (60, B + 60 * S)]]

    clock.now_ms = B + 700 * S  # the rest settle by the wall clock: no new probe needed
    r.run_once()
    assert len(spark_reads["probed"]) == 2
    assert spark_reads["asked"][1] == [(60, B + 120 * S), (300, B)]
    assert r.pending == {}
