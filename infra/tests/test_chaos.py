"""The chaos soak's pure parts (infra.chaos): its fault plan over an injected clock, and
its checks against synthetic histories; the report's detail (infra.chaos_soak)."""

from __future__ import annotations

import itertools

from infra.chaos import (
    COMPONENTS,
    EXCHANGE,
    Fault,
    FaultPlan,
    HistoryOutcome,
    Row,
    check_candles,
    check_trades,
    compose_faults,
    crossed_above,
    fault_cycle,
    grade_history,
    grade_trigger,
    history_row,
    live_trades,
    settled_rows,
    verdict,
)
from infra.chaos_soak import SoakResult


def test_every_component_goes_through_every_kind_and_the_exchange_is_cut() -> None:
    faults = list(itertools.islice(fault_cycle(freeze_s=5, cut_s=20), 4 * (len(COMPONENTS) + 1)))
    kinds = {(f.target, f.kind) for f in faults}
    for component in ("spark-pipeline", "ingestor", "relay", "gateway"):
        assert {(component, k) for k in ("kill", "freeze", "restart", "hang")} <= kinds
    # The catalog has no /healthz: its "hang" is a cut (SIGSTOP, SIGCONT after cut_s).
    assert ("iceberg-rest", "hang") not in kinds
    assert Fault("iceberg-rest", "cut", 20) in faults
    assert faults.count(Fault(EXCHANGE, "cut", 20)) == 4
    assert all(f.hold_s == 5 for f in faults if f.kind == "freeze")


def test_faults_come_one_at_a_time_gap_s_after_the_last_recovered() -> None:
    plan = FaultPlan(gap_s=15, first_at=60.0)
    assert plan.next(59.0) is None  # the clients warm up first
    first = plan.next(60.0)
    assert first is not None
    assert plan.next(100.0) is None  # the first is not done yet
    plan.done(40.0)
    assert plan.next(54.9) is None
    assert plan.next(55.0) is not None


def test_the_plan_never_spends_the_whole_crash_budget_of_a_component() -> None:
    """crash_limit 3 within 300 s: at most 2 restarts of one component in any 300 s, so
    the supervisor never gives up on the soak's account (a real crash still fits)."""
    plan = FaultPlan(crash_limit=3, crash_window_s=300, gap_s=1)
    now, taken = 0.0, []
    while now < 3600:
        fault = plan.next(now)
        if fault is not None:
            taken.append((now, fault))
            plan.done(now)
        now += 1
    restarts = [(t, f.target) for t, f in taken if f.restarts]
    for t, target in restarts:
        window = [x for x, y in restarts if y == target and t <= x < t + 300]
        assert len(window) <= 2, (target, t, window)
    # A restart the budget forbids became a freeze; each kind still comes round.
    assert any(f.kind == "freeze" for _, f in taken)
    assert {f.target for _, f in taken if f.kind == "kill"} == set(COMPONENTS)
    assert len(restarts) < len([f for _, f in taken if f.kind != "cut"])


def test_a_crash_limit_of_one_leaves_only_faults_without_restarts() -> None:
    plan = FaultPlan(crash_limit=1, gap_s=0, freeze_s=3)
    got = []
    for now in range(40):
        fault = plan.next(float(now))
        if fault is not None:
            got.append(fault)
            plan.done(float(now))
    assert got and not any(f.restarts for f in got)
    assert {f.target for f in got if f.kind == "freeze"} == set(COMPONENTS)


TRADED = {
    "10": (100.0, 1.0, 60_000),
    "11": (101.0, 2.0, 60_500),
    "12": (99.0, 0.5, 120_100),
    "13": (98.0, 0.5, 120_200),
}


def test_trades_all_stored_once_pass() -> None:
    check = check_trades("X:A/B", TRADED, [(i, *v) for i, v in TRADED.items()])
    assert (check.lost, check.duplicated, check.wrong, check.stored) == (0, [], [], 4)


def test_trades_missing_twice_and_wrong_are_told_apart() -> None:
    stored = [
        ("10", 100.0, 1.0, 60_000),
        ("10", 100.0, 1.0, 60_000),  # twice
        ("12", 99.5, 0.5, 120_100),  # another price
        ("99", 1.0, 1.0, 1),  # never traded
    ]
    check = check_trades("X:A/B", TRADED, stored)
    assert check.missing == ["11", "13"]
    assert check.duplicated == ["10"]
    assert check.wrong == ["12", "99"]


def test_trades_in_an_unrepairable_gap_are_lost_but_listed_apart() -> None:
    stored = [("10", 100.0, 1.0, 60_000), ("13", 98.0, 0.5, 120_200)]
    check = check_trades("X:A/B", TRADED, stored, unrepairable=[(10, 13)])
    assert check.missing == []
    assert check.unrepairable == ["11", "12"]
    assert check.lost == 2


TRADES = [(p, q, ms) for p, q, ms in TRADED.values()]


def test_candles_one_per_traded_minute_with_its_values() -> None:
    candles = [(60_000, 101.0, 3.0, 2), (120_000, 98.0, 1.0, 2)]
    check = check_candles("X:A/B", TRADES, candles, 60_000, 180_000)
    assert (check.expected, check.stored, check.missing, check.duplicated, check.wrong) == (
        2,
        2,
        [],
        [],
        [],
    )


def test_candles_missing_duplicated_and_wrong() -> None:
    candles = [(120_000, 98.0, 1.0, 2), (120_000, 98.0, 1.0, 2), (240_000, 1.0, 1.0, 1)]
    check = check_candles("X:A/B", TRADES, candles, 0, 300_000)
    assert check.missing == [60_000]
    assert check.duplicated == [120_000]
    assert check.wrong == [240_000]  # a candle of a minute without trades
    short = check_candles("X:A/B", TRADES, [(60_000, 101.0, 2.0, None)], 60_000, 120_000)
    assert short.wrong == [60_000]  # volume 2 where 3 was traded
    assert short.why == {60_000: "stored (101.0, 2.0, None) vs traded (101.0, 3.0, 2)"}
    assert check.why[240_000] == "stored (1.0, 1.0, 1) vs no trades"


def test_candles_outside_the_window_are_not_checked() -> None:
    check = check_candles("X:A/B", TRADES, [(120_000, 5.0, 5.0, 5)], 60_000, 120_000)
    assert check.missing == [60_000] and check.wrong == [] and check.stored == 0


def test_history_refused_within_10_s_of_its_fault_counts_as_refused() -> None:
    faults = [100.0, 200.0]
    quick = HistoryOutcome(95.0, 108.0, "refused", reason="pipeline_unavailable: frozen")
    assert grade_history(quick, faults) == "refused"  # 8 s after the fault at 100
    slow = HistoryOutcome(95.0, 150.0, "refused", reason="pipeline_unavailable: frozen")
    assert grade_history(slow, faults) == "late"
    after = HistoryOutcome(205.0, 214.0, "refused", reason="x")
    assert grade_history(after, faults) == "refused"  # 9 s after it was sent
    assert grade_history(HistoryOutcome(1.0, 121.0, "unanswered"), faults) == "lost"
    assert grade_history(HistoryOutcome(1.0, 50.0, "ok", rows=60), faults) == "ok"
    twice = HistoryOutcome(1.0, 50.0, "ok", rows=60, repeated_rows=1)
    assert grade_history(twice, faults) == "duplicated"


def test_history_row_counts_late_refusals_as_lost() -> None:
    outcomes = [
        HistoryOutcome(0.0, 30.0, "ok", rows=10),
        HistoryOutcome(95.0, 101.0, "refused", reason="pipeline_unavailable: x"),
        HistoryOutcome(95.0, 150.0, "refused", reason="ingestor_unavailable: y"),
    ]
    row = history_row(outcomes, [100.0])
    assert (row.items, row.ok, row.refused, row.lost, row.duplicated) == (3, 1, 1, 1, 0)
    assert "pipeline_unavailable x1" in row.note and "later than 10 s" in row.note
    assert not verdict([row])


def test_crossing_above_needs_an_edge() -> None:
    assert crossed_above([99.0, 101.0], 100.0, None)
    assert not crossed_above([101.0, 102.0], 100.0, None)  # no previous at or below
    assert crossed_above([101.0], 100.0, 100.0)  # the price before counts
    assert not crossed_above([101.0, 102.0], 100.0, 100.5)  # registered above: waits
    assert crossed_above([101.0, 99.0, 100.5], 100.0, 100.5)


def test_a_one_shot_trigger_fires_once_redeliveries_aside() -> None:
    assert grade_trigger([1], due=True) == "once"
    assert grade_trigger([1, 1], due=True) == "once"  # at-least-once: same fire_count
    assert grade_trigger([1, 2], due=True) == "duplicated"
    assert grade_trigger([], due=True) == "lost"
    assert grade_trigger([], due=False) == "not_due"


def test_wrong_values_do_not_fail_the_soak_but_keep_it_waiting() -> None:
    rows = [Row("1m candles X:A/B", items=6, ok=4, wrong=2)]
    assert verdict(rows) and not settled_rows(rows)
    assert not verdict([Row("ticks X:A/B", items=6, ok=5, lost=1)])


def test_a_crossing_only_inside_a_repaired_gap_is_not_due() -> None:
    """Triggers see live trades only: the ids strictly between a gap's ends came by repair."""
    trades = [{"id": i, "price": p} for i, p in enumerate([99.0, 99.5, 101.0, 99.0, 99.2], 1)]
    live = live_trades(trades, [(2, 4)])  # 3 (the crossing) was repaired; 2 and 4 were live
    assert [t["id"] for t in live] == [1, 2, 4, 5]
    assert not crossed_above([float(t["price"]) for t in live], 100.0, None)
    assert crossed_above([float(t["price"]) for t in trades], 100.0, None)
    assert live_trades(trades, []) == trades


def test_the_compose_plan_breaks_every_part_once_with_every_kind_and_ends() -> None:
    """The 5-minute plan: each kind, each component, the pipeline only frozen (its
    restart is a Spark start), and then nothing more: the soak's faults are over."""
    faults = list(compose_faults(freeze_s=8, cut_s=20))
    assert {f.kind for f in faults} == {"kill", "freeze", "restart", "hang", "cut"}
    assert {f.target for f in faults} == {*COMPONENTS, EXCHANGE}
    assert not [f for f in faults if f.target == "spark-pipeline" and f.restarts]
    assert faults[0] == Fault("ingestor", "hang")  # the longest recovery first
    plan = FaultPlan(gap_s=10, faults=compose_faults())
    taken, now = [], 0.0
    while not plan.exhausted:
        fault = plan.next(now)
        if fault is not None:
            taken.append(fault)
            plan.done(now)
        now += 1
    assert taken == list(compose_faults())  # within the budget: none became a freeze
    assert plan.next(now + 3600) is None


def test_the_report_names_each_wrong_candle_with_the_window_gaps() -> None:
    """A CI log must tell a candle over a gap not yet rebuilt from a wrong rebuild."""
    gap = {
        "ticker": "X:A/B", "cause": "RESTART", "status": "REPAIRED", "from_time": "t0",
        "to_time": "t1", "trades_recovered": "3", "updated_at": "t2",
    }  # fmt: skip
    markets = {"X:A/B": {"candles": {"why": {60_000: "stored (1.0, 1.0, 1) vs no trades"}}}}
    result = SoakResult(
        rows=[], faults=[], window=(0, 120_000), restarted=[], not_ready=[], aborted="",
        detail={"markets": markets | {"gaps": [gap]}},
    )  # fmt: skip
    assert result.wrong_candles() == [
        "wrong candle X:A/B 1970-01-01T00:01:00+00:00: stored (1.0, 1.0, 1) vs no trades",
        "  gap X:A/B RESTART REPAIRED [t0, t1] recovered 3 updated t2",
    ]
    markets["X:A/B"]["candles"]["why"] = {}
    assert result.wrong_candles() == []  # no gaps listed when every candle is right
