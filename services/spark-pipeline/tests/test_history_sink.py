"""The history sink's `requests` lookups, with the lake faked: a new request reads no table
once the recorded ids are known, a recorded one still does, a failed write stops trusting;
what the stored-answers path notified early is recorded, never published again; and a
batch replayed after its publish (a failed checkpoint commit) publishes nothing again."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

import pyarrow as pa
import pytest

from mdproto import envelope
from mdproto.messages import HistorySource, OHLCBatch, Status
from pipeline.history import HistorySink
from pipeline.history_notices import CompletedRequest
from pipeline.lake import TableNames, Written
from pipeline.notifier import EARLY_BATCH, HistoryNotifier
from pipeline.streams import QueryIdentity
from pipeline.trade_bars import BarReport


class Inline(Executor):
    """Runs each task when submitted: the sink's background work, in order."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as exc:
            future.set_exception(exc)
        return future


class FakeLake:
    names = TableNames("lake", "market")

    def __init__(self) -> None:
        self.requests: dict[str, CompletedRequest] = {}
        self.looked_up: list[list[str]] = []
        self.fail_record = False

    def find_requests(self, session: Any, ids: list[str]) -> dict[str, CompletedRequest]:
        self.looked_up.append(list(ids))
        return {i: self.requests[i] for i in ids if i in self.requests}

    def request_ids(self) -> list[str]:
        return list(self.requests)

    def write_history(self, session: Any, candles: pa.Table) -> Written:
        return Written("append", 8) if candles.num_rows else Written("none")

    def snapshot_id(self, table: str) -> int:
        return 7

    def count_request_rows(
        self, session: Any, snapshot_id: int, requests: list[CompletedRequest]
    ) -> dict[str, int]:
        return {r.request_id: r.row_count for r in requests}

    def record_requests(self, session: Any, requests: list[CompletedRequest]) -> None:
        if self.fail_record:
            raise RuntimeError("CommitStateUnknownException")
        self.requests |= {r.request_id: r for r in requests}


class Batch:
    """What foreachBatch hands the sink: Kafka rows behind select(...).toArrow()."""

    sparkSession = None  # noqa: N815 (PySpark's name)

    def __init__(self, kafka: pa.Table) -> None:
        self._kafka = kafka

    def select(self, *columns: str) -> Batch:
        return self

    def toArrow(self) -> pa.Table:  # noqa: N802 (PySpark's name)
        return self._kafka


@pytest.fixture
def run(
    build: Any, notifier: HistoryNotifier, publisher: Any
) -> tuple[Callable[[int, str], None], FakeLake, Any]:
    lake, identity = FakeLake(), QueryIdentity()
    identity.set("query-1")
    sink = HistorySink(lake, notifier, identity, lambda _: None, pool=Inline())  # type: ignore[arg-type]

    def batch(batch_id: int, request_id: str) -> None:
        rows = [build.candle(i) for i in range(3)]
        meta = build.metadata(request_id, end=build.T0 + 3 * build.MINUTE)
        values = build.request_records(request_id, rows, meta=meta)
        sink(Batch(build.kafka_table(values, first_offset=batch_id * 10)), batch_id)  # type: ignore[arg-type]

    return batch, lake, publisher


def test_new_requests_read_no_table_once_the_ids_are_read_at_start(run: Any) -> None:
    batch, lake, publisher = run
    batch(0, "r1")
    batch(1, "r2")
    batch(2, "r3")
    assert lake.looked_up == []
    assert publisher.sent == ["r1", "r2", "r3"]
    assert set(lake.requests) == {"r1", "r2", "r3"}


def test_an_answer_names_the_snapshot_its_own_append_made(run: Any) -> None:
    """The append's snapshot holds every row of the answer: no catalog read for a newer
    one (the fake's current snapshot is 7, its append's 8)."""
    batch, lake, publisher = run
    batch(0, "r1")
    (note,) = publisher.messages
    assert note.snapshot_id == 8
    assert lake.requests["r1"].snapshot_id == 8


def test_a_recorded_request_is_still_read_and_not_notified_again(run: Any) -> None:
    batch, lake, publisher = run
    batch(0, "r1")
    batch(1, "r2")
    batch(2, "r2")  # a second ingestor's copy, later
    assert lake.looked_up == [["r2"]]
    assert publisher.sent == ["r1", "r2"]


def test_after_a_failed_requests_write_every_request_is_read_again(run: Any) -> None:
    batch, lake, publisher = run
    batch(0, "r1")
    lake.fail_record = True
    with pytest.raises(RuntimeError):
        batch(1, "r2")
    lake.fail_record = False
    batch(2, "r3")
    assert lake.looked_up == [["r3"]]
    assert publisher.sent == ["r1", "r3"]


def test_an_early_notice_is_recorded_by_the_query_and_not_published_again(
    run: Any, notifier: HistoryNotifier, build: Any
) -> None:
    batch, lake, publisher = run
    assert notifier.notify_early("r1", lambda: build.early_answer("r1"))
    assert publisher.sent == ["r1"]  # by the stored-answers path, ahead of the query
    batch(0, "r1")
    assert publisher.sent == ["r1"]
    recorded = lake.requests["r1"]
    assert (recorded.query_id, recorded.batch_id) == ("query-1", EARLY_BATCH)
    assert notifier.claims == 0  # recorded: known, no claim left
    assert notifier.notify_early("r1", lambda: build.early_answer("r1")) is None
    batch(1, "r1")  # a replay, or another copy: a duplicate
    assert publisher.sent == ["r1"]


def test_the_query_notifies_what_it_claimed_first(
    run: Any, notifier: HistoryNotifier, build: Any
) -> None:
    batch, lake, publisher = run
    batch(0, "r1")
    assert notifier.notify_early("r1", lambda: build.early_answer("r1")) is None  # recorded
    assert publisher.sent == ["r1"]
    assert lake.requests["r1"].batch_id == 0


def test_a_failed_batch_keeps_the_early_notice_for_its_replay(
    run: Any, notifier: HistoryNotifier, build: Any
) -> None:
    batch, lake, publisher = run
    assert notifier.notify_early("r1", lambda: build.early_answer("r1"))
    lake.fail_record = True
    with pytest.raises(RuntimeError):
        batch(0, "r1")
    lake.fail_record = False
    batch(0, "r1")  # Spark replays the batch
    assert publisher.sent == ["r1"]
    assert lake.requests["r1"].batch_id == EARLY_BATCH


def test_a_batch_replayed_after_a_failed_checkpoint_commit_notifies_nothing_again(
    run: Any, notifier: HistoryNotifier, build: Any
) -> None:
    batch, lake, publisher = run
    batch(0, "r1")
    # The sink returned; Spark's commit of batch 0 failed: the restarted query replays it.
    batch(0, "r1")
    assert publisher.sent == ["r1"]
    assert lake.requests["r1"].batch_id == 0
    assert notifier.claims == 0
    batch(1, "r2")
    assert publisher.sent == ["r1", "r2"]


def test_after_a_kill_the_replay_notifies_again(build: Any, publisher: Any) -> None:
    """A new process does not know what the dead one sent: at least once in that window."""
    lake, identity = FakeLake(), QueryIdentity()
    identity.set("query-1")
    rows = [build.candle(i) for i in range(3)]
    meta = build.metadata("r1", end=build.T0 + 3 * build.MINUTE)
    values = build.request_records("r1", rows, meta=meta)
    for _process in range(2):
        notifier = HistoryNotifier(publisher)
        sink = HistorySink(lake, notifier, identity, lambda _: None, pool=Inline())  # type: ignore[arg-type]
        sink(Batch(build.kafka_table(values)), 0)  # type: ignore[arg-type]
    assert publisher.sent == ["r1", "r1"]


def test_the_warm_up_candle_is_a_valid_ohlc_row() -> None:
    from pipeline.history import warm_up_candles
    from pipeline.records import OHLC_SCHEMA

    candles = warm_up_candles()
    assert candles.num_rows == 1 and candles.schema == OHLC_SCHEMA


def test_a_from_trades_marker_is_answered_with_its_bars_and_not_counted(
    run: Any, build: Any, notifier: HistoryNotifier, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sink builds the bars (`trade_bars.answer`) before the snapshot and publishes
    their report as the notification; their row count needs no count in Iceberg."""
    _, lake, publisher = run
    asked: list[tuple[str, int]] = []

    def answer(lake_: Any, session: Any, meta: Any, request_id: str) -> BarReport:
        asked.append((request_id, meta.period_seconds))
        return BarReport(Status.OK, "12 bars from recorded trades", "", 12, 12, 0, 0)

    monkeypatch.setattr("pipeline.history.trade_bars.answer", answer)
    counted: list[list[str]] = []
    count = lake.count_request_rows
    monkeypatch.setattr(
        lake,
        "count_request_rows",
        lambda s, snap, reqs: counted.append([r.request_id for r in reqs]) or count(s, snap, reqs),
    )
    meta = build.metadata("bars-1", period=5, end=build.T0 + build.MINUTE)
    meta.status = Status.OK
    meta.source = HistorySource.SOURCE_TRADES
    marker = OHLCBatch(request_id="bars-1", sequence=0, metadata=meta, is_final=True)
    sink = HistorySink(lake, notifier, _identity(), lambda _: None, pool=Inline())
    sink(Batch(build.kafka_table([envelope.encode_record(marker)])), 0)  # type: ignore[arg-type]
    assert asked == [("bars-1", 5)]
    assert counted == []  # the bars' own count is the row count
    (note,) = publisher.messages
    assert (note.status, note.row_count, note.snapshot_id) == (Status.OK, 12, 7)
    assert note.source == HistorySource.SOURCE_TRADES
    assert note.reason == "12 bars from recorded trades"
    assert lake.requests["bars-1"].row_count == 12


def _identity() -> QueryIdentity:
    identity = QueryIdentity()
    identity.set("query-1")
    return identity
