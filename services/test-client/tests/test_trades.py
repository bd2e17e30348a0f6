"""Trade history without I/O: the integrity report, the range check, the time order of
file groups and of rows, their reads ahead (mdclient.trades, mdclient.frames)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

import pyarrow as pa
import pytest

from mdclient.errors import InvalidRequest
from mdclient.frames import overlap_groups, read_ahead
from mdclient.recording import GapCounts
from mdclient.trades import (
    RangeGap,
    TradeQuery,
    check_columns,
    gaps_from_table,
    in_time_order,
    integrity_report,
    stored_inside,
    to_count,
    trade_range,
)
from mdproto.tables import Gaps, Ticks, arrow_schema

T = "BINANCE:BTC/USDT"
H = 3_600_000


def gap(n: int, status: str, from_ms: int | None, to_ms: int | None, **more: object) -> RangeGap:
    fields: dict[str, object] = {
        "gap_id": f"g{n}", "ticker": T, "cause": "RECONNECT", "from_time_ms": from_ms,
        "to_time_ms": to_ms, "missing_ids": 0, "trades_recovered": 0, "reason": "",
        "status": status,
    }  # fmt: skip
    return RangeGap(**{**fields, **more})  # type: ignore[arg-type]


def test_a_recorded_range_without_gaps_is_complete() -> None:
    r = integrity_report(T, 10 * H, 11 * H, span=(H, 20 * H), gaps=[])
    assert (r.state, r.recorded_since_ms, r.not_recorded_until_ms) == ("complete", H, None)
    assert r.counts == GapCounts() and r.reason == ""


@pytest.mark.parametrize(
    ("span", "why"),
    [
        (None, "never recorded"),
        ((20 * H, 30 * H), "began after the range ends"),
        ((H, 5 * H), "no trade of BINANCE:BTC/USDT is stored after the range starts"),
    ],
)
def test_a_range_with_no_recording_says_so(span: tuple[int, int] | None, why: str) -> None:
    r = integrity_report(T, 10 * H, 11 * H, span=span, gaps=[gap(1, "OPEN", 10 * H, 10 * H + 5)])
    assert r.state == "not_recorded" and why in r.reason
    assert r.not_recorded_until_ms == 11 * H  # the whole range
    assert r.as_dict()["reason"] == r.reason


def test_the_recording_beginning_within_the_range_leaves_its_start_unrecorded() -> None:
    r = integrity_report(T, 10 * H, 12 * H, span=(11 * H, 20 * H), gaps=[])
    assert (r.state, r.not_recorded_until_ms) == ("partial", 11 * H)
    # the recording's first trade exactly at the start: nothing before it is asked for
    r = integrity_report(T, 11 * H, 12 * H, span=(11 * H, 20 * H), gaps=[])
    assert (r.state, r.not_recorded_until_ms) == ("complete", None)


def test_only_the_gaps_that_meet_the_range_count_and_the_worst_state_wins() -> None:
    start, end = 10 * H, 11 * H
    gaps = [
        gap(1, "REPAIRED", 9 * H, start),  # its last trade at start: may share that ms
        gap(2, "UNREPAIRABLE", 5 * H, 6 * H),  # before the range
        gap(3, "OPEN", end, end + 5),  # at the end, which the range excludes
        gap(4, "REPAIRING", 10 * H + 5, 10 * H + 9),
        gap(5, "WHATEVER", None, start + 1),  # unknown status: open; unknown start
    ]
    r = integrity_report(T, start, end, span=(H, 20 * H), gaps=gaps)
    assert [g.gap_id for g in r.gaps or ()] == ["g5", "g1", "g4"]
    assert r.counts == GapCounts(open=1, repairing=1, repaired=1)
    assert r.state == "repairing"
    lost = integrity_report(
        T, start, end, span=(H, 20 * H), gaps=[gap(6, "UNREPAIRABLE", start, start)]
    )
    assert lost.state == "incomplete"
    repaired = integrity_report(T, start, end, span=(11 * H - 1, 20 * H), gaps=[gaps[0]])
    assert repaired.state == "partial"  # repaired gaps do not hide the unrecorded start


def test_unknown_gaps_are_not_complete() -> None:
    r = integrity_report(T, 10 * H, 11 * H, span=(H, 20 * H), gaps=None, gaps_note="no table")
    assert (r.state, r.counts, r.gaps_note) == ("unknown", None, "no table")
    data = r.as_dict()
    assert data["gaps_known"] is False and data["gap_counts"] is None and data["gaps"] == []


def test_the_json_shape_sends_64_bit_values_as_strings() -> None:
    g = gap(0, "UNREPAIRABLE", 10 * H + 1, 10 * H + 2, cause="SKIPPED_IDS", gap_id="g")
    g = dataclasses.replace(g, missing_ids=7, trades_recovered=3, reason="only 60")
    data = integrity_report(T, 10 * H, 11 * H, span=(11 * H - 5, 20 * H), gaps=[g]).as_dict()
    assert data["state"] == "incomplete"
    assert data["recorded_since_ms"] == str(11 * H - 5)
    assert data["not_recorded_until_ms"] == str(11 * H - 5)
    assert data["gap_counts"] == {"open": 0, "repairing": 0, "repaired": 0, "unrepairable": 1}
    assert data["gaps"] == [
        {
            "gap_id": "g", "status": "UNREPAIRABLE", "cause": "SKIPPED_IDS",
            "from_time_ms": str(10 * H + 1), "to_time_ms": str(10 * H + 2),
            "missing_ids": "7", "trades_recovered": "3", "reason": "only 60",
            "trades_stored": None,
        }
    ]  # fmt: skip


def test_a_repaired_gap_whose_trades_are_not_all_stored_yet_is_repairing() -> None:
    waiting = gap(1, "REPAIRED", 10 * H + 1, 10 * H + 9, trades_recovered=3, trades_stored=2)
    stored = gap(2, "REPAIRED", 10 * H + 20, 10 * H + 29, trades_recovered=3, trades_stored=3)
    unchecked = gap(3, "REPAIRED", 10 * H + 30, 10 * H + 39, trades_recovered=3)
    r = integrity_report(T, 10 * H, 11 * H, span=(H, 20 * H), gaps=[waiting, stored, unchecked])
    assert r.counts == GapCounts(repairing=1, repaired=2) and r.state == "repairing"
    assert [g["trades_stored"] for g in r.as_dict()["gaps"]] == ["2", "3", None]
    done = dataclasses.replace(waiting, trades_stored=3)
    assert integrity_report(T, 10 * H, 11 * H, span=(H, 20 * H), gaps=[done]).state == "complete"


def test_only_gaps_repaired_within_the_hour_before_the_newest_trade_are_counted() -> None:
    def repaired(n: int, updated_at_ms: int | None, **more: object) -> RangeGap:
        fields = {"trades_recovered": 2, "updated_at_ms": updated_at_ms, **more}
        return gap(n, "REPAIRED", 5 * H, 5 * H + 10, **fields)

    newest = 20 * H
    gaps = [
        repaired(1, newest - H),  # the oldest counted
        repaired(2, newest - H - 1),  # repaired long before: ticks-persist has stored it
        repaired(3, newest, trades_recovered=0),  # nothing to store
        repaired(4, None),
        gap(5, "REPAIRING", 5 * H, 5 * H + 10, updated_at_ms=newest),
        repaired(6, newest, to_time_ms=None),
    ]
    assert [g.gap_id for g in to_count(gaps, newest)] == ["g1"]
    assert to_count(gaps, None) == []


def ids(*trade_ids: str) -> pa.Table:
    return pa.table({Ticks.TRADE_ID: list(trade_ids), Ticks.TRADE_TIME: [0] * len(trade_ids)})


def test_stored_trades_are_counted_as_the_repair_counted_them() -> None:
    by_id = gap(1, "REPAIRED", 0, 9, trades_recovered=3, from_trade_id="10", to_trade_id="14")
    # ids 11-13 between the ends; a live trade sharing an end's ms (9, 15) is not one
    assert stored_inside(by_id, ids("9", "10", "11", "13", "14", "15")) == 2
    by_time = dataclasses.replace(by_id, from_trade_id="a", to_trade_id="e")
    assert stored_inside(by_time, ids("a", "b", "x", "e")) == 2  # every trade but the ends


def test_gap_rows_become_range_gaps() -> None:
    rows = pa.Table.from_pylist(
        [
            {
                Gaps.GAP_ID: "a", Gaps.TICKER: T, Gaps.STATUS: None, Gaps.CAUSE: None,
                Gaps.REASON: None, Gaps.FROM_TIME: 1_500, Gaps.TO_TIME: None,
                Gaps.MISSING_IDS: None, Gaps.TRADES_RECOVERED: 4,
                Gaps.FROM_TRADE_ID: "7", Gaps.TO_TRADE_ID: None, Gaps.UPDATED_AT: 2_000_000,
            }
        ],
        schema=arrow_schema(Gaps.SCHEMA),
    )  # fmt: skip
    assert gaps_from_table(rows) == [
        gap(0, "OPEN", 1, None, gap_id="a", cause="", trades_recovered=4, from_trade_id="7",
            updated_at_ms=2_000)
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("ticker", "start", "end", "code"),
    [
        ("BTC/USDT", 0, 1, "bad_ticker"),
        (T, 5, 5, "bad_time_range"),
        (T, -1, 5, "bad_time_range"),
        (T, "yesterday-ish", "now", "bad_time"),
    ],
)
def test_a_bad_range_is_refused(ticker: str, start: int | str, end: int | str, code: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        trade_range(ticker, start, end, now_ms=100 * H)
    assert info.value.error_code == code


def test_a_range_is_parsed_like_history() -> None:
    query = trade_range(T, "-1h", "now", now_ms=100 * H, columns=[Ticks.PRICE])
    assert query == TradeQuery(T, 99 * H, 100 * H, (Ticks.PRICE, Ticks.TRADE_TIME))


def test_columns_keep_storage_order_and_always_the_trade_time() -> None:
    assert check_columns(None) == Ticks.SCHEMA.names
    assert check_columns([Ticks.PRICE, Ticks.TRADE_ID]) == (
        Ticks.TRADE_ID, Ticks.PRICE, Ticks.TRADE_TIME,
    )  # fmt: skip
    with pytest.raises(InvalidRequest, match="no column"):
        check_columns(["volume"])


def test_file_groups_are_disjoint_and_in_time_order() -> None:
    spans: list[tuple[int | None, int | None]] = [
        (50, 60),  # 0
        (0, 10),  # 1
        (5, 20),  # 2: overlaps 1
        (30, 40),  # 3
        (20, 25),  # 4: touches 2 at 20 (a trade of 20 in both): same group
        (70, None),  # 5: unknown end swallows what follows
        (80, 90),  # 6
    ]
    assert overlap_groups(spans) == [[1, 2, 4], [3], [0], [5, 6]]
    assert overlap_groups([(None, 5), (100, 200)]) == [[0], [1]]
    assert overlap_groups([]) == []


def test_rows_are_put_in_time_order_stably() -> None:
    schema = arrow_schema(Ticks.SCHEMA, (Ticks.TRADE_ID, Ticks.TRADE_TIME))
    rows = pa.table({Ticks.TRADE_ID: ["c", "a", "b", "d"], Ticks.TRADE_TIME: [3, 1, 3, 2]}, schema)
    assert in_time_order(rows).column(Ticks.TRADE_ID).to_pylist() == ["a", "d", "c", "b"]
    ordered = in_time_order(rows)
    assert in_time_order(ordered) is ordered  # already in order: the same table


def test_files_read_out_of_time_order_are_reordered_stably() -> None:
    """Chunks (files) each in order, read newest first: put in order of their first trade;
    chunks that meet on a tie or overlap are sorted row by row, ties in the order read."""
    schema = arrow_schema(Ticks.SCHEMA, (Ticks.TRADE_ID, Ticks.TRADE_TIME))

    def chunks(*parts: list[tuple[str, int]]) -> pa.Table:
        return pa.Table.from_batches(
            [pa.RecordBatch.from_pylist([{Ticks.TRADE_ID: i, Ticks.TRADE_TIME: t} for i, t in p],
                                        schema) for p in parts],
            schema,
        )  # fmt: skip

    def ids(rows: pa.Table) -> list[str]:
        return [str(i) for i in in_time_order(rows).column(Ticks.TRADE_ID).to_pylist()]

    newest_first = chunks([("e", 5), ("f", 6)], [], [("c", 3), ("d", 4)], [("a", 1), ("b", 2)])
    assert ids(newest_first) == ["a", "b", "c", "d", "e", "f"]
    first = in_time_order(newest_first).column(Ticks.TRADE_ID).chunk(0)
    read = newest_first.column(Ticks.TRADE_ID).chunk(3)
    assert first.buffers()[2].address == read.buffers()[2].address  # reordered, not copied
    tie = chunks([("x", 3), ("y", 4)], [("a", 1), ("b", 3)])  # both hold a trade at 3
    assert ids(tie) == ["a", "x", "b", "y"]  # the stable sort: x was read before b
    overlap = chunks([("c", 2), ("d", 5)], [("a", 1), ("b", 3)])
    assert ids(overlap) == ["a", "c", "b", "d"]
    unordered_chunk = chunks([("c", 3), ("d", 4)], [("b", 2), ("a", 1)])
    assert ids(unordered_chunk) == ["a", "b", "c", "d"]


class Reads:
    """Reads that record which have started; read `i` waits until `i + wait_for` has
    started too (None: waits for nothing), so a test can only pass with reads in flight
    together. A wait that times out raises, never hangs."""

    def __init__(self, n: int, wait_for: int | None = None, fail_at: int | None = None) -> None:
        self.started = [threading.Event() for _ in range(n)]
        self.wait_for, self.fail_at = wait_for, fail_at

    def thunks(self) -> list[Callable[[], int]]:
        return [lambda i=i: self.read(i) for i in range(len(self.started))]  # type: ignore[misc]

    def read(self, i: int) -> int:
        self.started[i].set()
        if self.wait_for is not None and i + self.wait_for < len(self.started):
            assert self.started[i + self.wait_for].wait(2), f"read {i + self.wait_for} never ran"
        if i == self.fail_at:
            raise OSError(f"read {i} failed")
        return i

    def count(self) -> int:
        return sum(e.is_set() for e in self.started)


def test_reads_ahead_run_together_and_come_back_in_order() -> None:
    reads = Reads(6, wait_for=1)  # read i finishes only once read i + 1 has started
    assert list(read_ahead(reads.thunks(), 2)) == list(range(6))
    with pytest.raises(AssertionError, match="never ran"):  # one at a time cannot pass
        list(read_ahead(Reads(2, wait_for=1).thunks(), 0))


def test_no_more_than_depth_reads_ahead_of_the_consumer() -> None:
    reads = Reads(10)
    it = read_ahead(reads.thunks(), 2)
    assert next(it) == 0
    assert reads.count() <= 3  # the one held, and two ahead
    it.close()
    assert reads.count() <= 3  # closing cancels what had not started
    assert list(read_ahead(Reads(3).thunks(), 0)) == [0, 1, 2]  # depth 0: one at a time


def test_a_failed_read_raises_at_its_place_after_the_results_before_it() -> None:
    it = read_ahead(Reads(5, fail_at=3).thunks(), 2)
    assert [next(it), next(it), next(it)] == [0, 1, 2]
    with pytest.raises(OSError, match="read 3 failed"):
        next(it)


def test_the_cli_lists_a_repaired_gap_until_its_trades_are_stored() -> None:
    from mdclient.cli.output import report_lines

    waiting = gap(1, "REPAIRED", 10 * H + 1, 10 * H + 9, trades_recovered=3, trades_stored=1)

    def lines(g: RangeGap) -> list[str]:
        return report_lines(integrity_report(T, 10 * H, 11 * H, span=(H, 20 * H), gaps=[g]))

    *_, last = lines(waiting)
    assert lines(waiting)[0].startswith("integrity: repairing")
    assert last.startswith("  gap repaired:") and "3 recovered, 1 of them stored yet" in last
    done = dataclasses.replace(waiting, trades_stored=3)
    assert not any("gap repaired" in line for line in lines(done))
