"""Final markers -> notifications: status mapping, topic, dedupe plan, table round trip."""

from __future__ import annotations

from typing import Any

import pytest

from mdproto.messages import BatchMetadata, HistorySource, Status
from pipeline import history_notices
from pipeline.history_notices import CompletedRequest
from pipeline.records import FinalMarker

TABLE = "market.ohlc"


def marker(
    build: Any, request_id: str, status: int = Status.OK, rows: int = 10, **kw: Any
) -> FinalMarker:
    meta = build.metadata(request_id, **kw)
    meta.status = status
    meta.total_rows = rows
    return FinalMarker(request_id, meta, partition=kw.get("partition", 0), offset=rows)


def plan_q1_batch3(
    markers: list[FinalMarker], existing: dict[str, CompletedRequest], **kw: Any
) -> history_notices.Plan:
    """The plan of batch 3 of query q1 (snapshot 9, completed at 8)."""
    return history_notices.plan(
        markers,
        existing,
        iceberg_table=TABLE,
        snapshot_id=9,
        completed_at_ms=8,
        query_id="q1",
        batch_id=3,
        **kw,
    )


def complete(m: FinalMarker, **kw: Any) -> CompletedRequest:
    args = {
        "iceberg_table": TABLE,
        "snapshot_id": 77,
        "completed_at_ms": 5,
        "query_id": "q1",
        "batch_id": 3,
    }
    args.update(kw)
    return history_notices.complete(m, **args)


def test_ok_marker_becomes_ok_notification_on_the_client_topic(build: Any) -> None:
    request = complete(marker(build, "r1", rows=43_200, client_id="c9"))

    n = request.notification()
    assert request.notification_topic == "RESPONSE:c9"
    assert (n.request_id, n.client_id, n.status) == ("r1", "c9", Status.OK)
    assert (n.row_count, n.iceberg_table, n.snapshot_id) == (43_200, TABLE, 77)
    assert (n.ticker, n.period_seconds) == (build.TICKER, 60)
    assert (n.start_time_ms, n.end_time_ms) == (build.T0, build.T0 + 10 * build.MINUTE)
    assert n.completed_at_ms == 5


def test_per_request_topic_when_there_is_no_client(build: Any) -> None:
    request = complete(marker(build, "r1", client_id="", topic=""))
    assert request.notification_topic == "HISTORY_READY:r1"


def test_marker_topic_that_is_not_a_notification_topic_is_not_trusted(build: Any) -> None:
    request = complete(marker(build, "r1", client_id="c1", topic="BINANCE:BTC/USDT|tick"))
    assert request.notification_topic == "RESPONSE:c1"


@pytest.mark.parametrize(
    ("status", "rows", "reason", "code", "expected"),
    [
        (Status.OK, 0, "", "", (Status.NOT_FOUND, "no candles in the range", "", 0, 0)),
        (Status.NOT_FOUND, 0, "", "", (Status.NOT_FOUND, "no candles in the range", "", 0, 0)),
        (
            Status.ERROR,
            0,
            "",
            "",
            (Status.ERROR, "the ingestor reported an error", "ingestor_error", 0, 0),
        ),
        (Status.ERROR, 5, "429", "rate_limited", (Status.ERROR, "429", "rate_limited", 0, 0)),
        (
            Status.REJECTED,
            5,
            "",
            "",
            (Status.ERROR, "final marker has status REJECTED", "bad_marker", 0, 0),
        ),
    ],
)
def test_status_mapping(
    build: Any, status: int, rows: int, reason: str, code: str, expected: tuple[Any, ...]
) -> None:
    m = marker(build, "r1", status=status, rows=rows)
    assert m.metadata is not None
    m.metadata.reason, m.metadata.error_code = reason, code

    r = complete(m)

    assert (r.status, r.reason, r.error_code, r.row_count, r.snapshot_id) == expected


def test_marker_without_metadata_is_an_error_on_the_request_topic() -> None:
    r = complete(FinalMarker("r1", None, 0, 0))
    assert (r.status, r.error_code, r.notification_topic) == (
        Status.ERROR,
        "bad_marker",
        "HISTORY_READY:r1",
    )


def test_choose_prefers_ok_then_kafka_order(build: Any) -> None:
    err = marker(build, "r1", status=Status.ERROR, rows=1)
    ok_late = FinalMarker("r1", marker(build, "r1").metadata, 0, 99)
    ok_early = FinalMarker("r1", marker(build, "r1").metadata, 0, 50)
    other = marker(build, "r2")

    chosen = history_notices.choose([err, ok_late, other, ok_early])

    assert [(m.request_id, m.offset) for m in chosen] == [("r2", 10), ("r1", 50)]


def test_plan_records_new_republishes_own_batch_and_skips_duplicates(build: Any) -> None:
    markers = [marker(build, "new"), marker(build, "mine"), marker(build, "older")]
    existing = {
        "mine": complete(marker(build, "mine"), batch_id=3, completed_at_ms=1),
        "older": complete(marker(build, "older"), batch_id=2),
    }

    plan = plan_q1_batch3(markers, existing)

    assert [r.request_id for r in plan.record] == ["new"]
    assert [r.request_id for r in plan.publish] == ["new", "mine"]
    assert plan.publish[1] is existing["mine"]  # re-published byte for byte
    assert plan.republished == ["mine"]
    assert plan.duplicates == ["older"]


def test_a_replay_of_a_batch_that_failed_after_its_publish_stays_silent(build: Any) -> None:
    """Spark's checkpoint commit failed (the S3 store was down) after the batch published:
    the replay finds the request recorded by it and sent by this process."""
    markers = [marker(build, "sent"), marker(build, "unsent")]
    existing = {m.request_id: complete(m, batch_id=3) for m in markers}

    plan = plan_q1_batch3(markers, existing, sent={"sent"})

    assert plan.record == []
    assert [r.request_id for r in plan.publish] == ["unsent"]  # the send that failed
    assert plan.republished == ["unsent"]
    assert plan.sent_before == ["sent"]


def test_same_batch_id_of_another_query_is_a_duplicate(build: Any) -> None:
    existing = {"r1": complete(marker(build, "r1"), query_id="old-checkpoint", batch_id=3)}

    plan = plan_q1_batch3([marker(build, "r1")], existing)

    assert plan.publish == [] and plan.duplicates == ["r1"]


def test_reconcile_reports_what_the_client_will_read(build: Any) -> None:
    request = complete(marker(build, "r1", rows=100))

    assert history_notices.reconcile(request, 100).row_count == 100
    assert history_notices.reconcile(request, 130).row_count == 130  # overlapping data
    short = history_notices.reconcile(request, 97)
    assert (short.status, short.error_code, short.row_count) == (Status.ERROR, "incomplete", 97)
    assert "97 of the 100" in short.reason
    failed = complete(marker(build, "r2", status=Status.ERROR))
    assert history_notices.reconcile(failed, 0) is failed


def test_requests_table_round_trip(build: Any) -> None:
    requests = [
        complete(marker(build, "r1", rows=5)),
        complete(FinalMarker("r2", None, 1, 2), snapshot_id=0),
        complete(marker(build, "r3", start=-5, end=2**62)),
    ]

    table = history_notices.to_table(requests)
    assert table.schema == history_notices.REQUESTS_SCHEMA

    back = history_notices.from_table(table)
    assert back == {r.request_id: r for r in requests}
    assert back["r1"].notification() == requests[0].notification()


def test_status_names_are_stored_readably(build: Any) -> None:
    table = history_notices.to_table([complete(marker(build, "r1"))])
    assert table["status"].to_pylist() == ["OK"]


def test_metadata_type_is_the_protocol_one() -> None:
    assert history_notices.outcome(BatchMetadata(status=Status.OK, total_rows=3))[0] == Status.OK


def integrity_marker(build: Any, request_id: str, status: int, rows: int, **meta: int) -> Any:
    m = marker(build, request_id, status=status, rows=rows)
    assert m.metadata is not None
    for name, value in meta.items():
        setattr(m.metadata, name, value)
    return m


def test_integrity_report_counts_exchange_gaps_apart_from_missing_candles(build: Any) -> None:
    gaps_only = complete(
        integrity_marker(build, "r1", Status.OK, 90, expected_candles=100, expected_gaps=10)
    )
    n = history_notices.reconcile(gaps_only, 90).notification()
    assert (n.expected_candles, n.exchange_gaps, n.missing_candles) == (100, 10, 0)
    assert n.source == HistorySource.SOURCE_EXCHANGE
    failed_page = complete(
        integrity_marker(build, "r2", Status.ERROR, 1000, expected_candles=3000, expected_gaps=0)
    )
    n = failed_page.notification()
    assert (n.status, n.row_count, n.missing_candles) == (Status.ERROR, 0, 2000)
    dropped = history_notices.reconcile(
        complete(integrity_marker(build, "r3", Status.OK, 100, expected_candles=100)), 97
    )
    assert (dropped.error_code, dropped.missing_candles) == ("incomplete", 3)
    overlapping = history_notices.reconcile(
        complete(integrity_marker(build, "r4", Status.OK, 100, expected_candles=100)), 130
    )
    assert overlapping.missing_candles == 0


def test_a_marker_from_an_older_ingestor_reports_no_integrity_numbers(build: Any) -> None:
    n = complete(marker(build, "r1", rows=5)).notification()  # no expected_candles: unknown
    assert (n.expected_candles, n.missing_candles) == (0, 0)


def test_requests_table_keeps_the_integrity_report(build: Any) -> None:
    request = complete(
        integrity_marker(build, "r1", Status.OK, 90, expected_candles=100, expected_gaps=10)
    )
    table = history_notices.to_table([request])
    assert table["source"].to_pylist() == ["SOURCE_EXCHANGE"]
    assert history_notices.from_table(table)["r1"] == request


def test_an_answer_from_storage_is_counted_not_sent(build: Any) -> None:
    stored = integrity_marker(
        build, "r1", Status.OK, 0, expected_candles=100, source=HistorySource.SOURCE_STORAGE
    )
    request = complete(stored)
    assert (request.status, request.source) == (Status.OK, HistorySource.SOURCE_STORAGE)
    n = history_notices.reconcile(request, 97).notification()
    assert (n.status, n.row_count, n.exchange_gaps, n.missing_candles) == (Status.OK, 97, 3, 0)
    empty = history_notices.reconcile(request, 0)
    assert (empty.status, empty.snapshot_id) == (Status.NOT_FOUND, 0)


def test_accepted_rows_give_the_count_once_every_record_was_seen(build: Any) -> None:
    accepted = history_notices.AcceptedRows()
    done = marker(build, "r1", rows=25)
    assert done.metadata is not None
    done.metadata.total_batches = 3
    accepted.add([("r1", 0, 10), ("r1", 2, 5)])
    assert accepted.total(done) is None  # sequence 1 came before this process started
    accepted.add([("r1", 1, 10), ("r1", 1, 10)])  # a replayed record is not added twice
    assert accepted.total(done) == 25
    accepted.add([("r1", 3, 7)])  # a record beyond the marker's (a dead holder's) is not its
    assert history_notices.known_counts([done], accepted) == {"r1": 25}
    accepted.forget(["r1"])
    assert accepted.total(done) is None


def test_answers_from_storage_are_never_derived_and_old_requests_are_evicted(build: Any) -> None:
    accepted = history_notices.AcceptedRows(capacity=2)
    stored = marker(build, "r1", rows=0)
    assert stored.metadata is not None
    stored.metadata.source = HistorySource.SOURCE_STORAGE_AND_EXCHANGE
    stored.metadata.total_batches = 1
    accepted.add([("r1", 0, 10), ("r2", 0, 1), ("r3", 0, 1)])
    assert history_notices.known_counts([stored], accepted) == {}  # stored rows have no record
    fresh = marker(build, "r2", rows=1)
    assert fresh.metadata is not None
    fresh.metadata.total_batches = 1
    assert history_notices.known_counts([fresh], accepted) == {"r2": 1}
    accepted.add([("r4", 0, 1)])  # capacity 2: r2, the oldest, is forgotten
    assert history_notices.known_counts([fresh], accepted) == {}


def test_a_derived_count_below_the_announced_rows_is_incomplete(build: Any) -> None:
    m = marker(build, "r1", rows=10)
    assert m.metadata is not None
    m.metadata.total_batches = 1
    accepted = history_notices.AcceptedRows()
    accepted.add([("r1", 0, 9)])  # a row Iceberg cannot hold was dropped
    plan = history_notices.plan(
        [m], {}, iceberg_table=TABLE, snapshot_id=7, completed_at_ms=1, query_id="q", batch_id=1
    )
    fixed = history_notices.apply_counts(plan, history_notices.known_counts([m], accepted))
    [request] = fixed.publish
    assert (request.status, request.error_code, request.row_count) == (
        Status.ERROR,
        "incomplete",
        9,
    )
