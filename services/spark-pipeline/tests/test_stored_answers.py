"""Stored answers ahead of the history query: which markers qualify, what the Kafka
messages decode to, and the claims that let exactly one side publish."""

from __future__ import annotations

import threading
from typing import Any

import confluent_kafka
import pytest

from mdproto import envelope
from mdproto.messages import HistorySource, OHLCBatch, Status
from pipeline import records
from pipeline.early_notices import EarlyNotices
from pipeline.history_notices import CompletedRequest
from pipeline.known_requests import KnownRequests
from pipeline.stored_answers import kafka_table, stored_only


def _marker(build: Any, request_id: str, source: int, status: int = Status.OK) -> bytes:
    meta = build.metadata(request_id)
    meta.status, meta.source = status, source
    return envelope.encode_record(OHLCBatch(request_id=request_id, metadata=meta, is_final=True))


def _messages(values: list[bytes]) -> list[confluent_kafka.Message]:
    return [
        confluent_kafka.Message(
            topic="market.ohlc.batches",
            partition=2,
            offset=40 + i,
            key=b"BINANCE:BTC/USDT",
            value=value,
            timestamp=(confluent_kafka.TIMESTAMP_CREATE_TIME, 1_700_000_000_000 + i),
        )
        for i, value in enumerate(values)
    ]


def test_only_ok_markers_of_wholly_stored_answers_go_early(build: Any) -> None:
    rows = build.request_records("fetched", [build.candle(0)], meta=build.metadata("fetched"))
    values = [
        _marker(build, "stored", HistorySource.SOURCE_STORAGE),
        _marker(build, "partly", HistorySource.SOURCE_STORAGE_AND_EXCHANGE),
        _marker(build, "refused", HistorySource.SOURCE_STORAGE, status=Status.NOT_FOUND),
        *rows,  # a request fetched from the exchange: rows, then its marker
        b"\x00not a record",
    ]
    decoded = records.decode_history(kafka_table(_messages(values)))
    assert {m.request_id for m in decoded.finals} == {"stored", "partly", "refused", "fetched"}
    [early] = stored_only(decoded.finals)
    assert (early.request_id, early.partition, early.offset) == ("stored", 2, 40)
    assert len(decoded.rejects) == 1  # the bad record is reported, as the query would


@pytest.fixture
def early() -> EarlyNotices:
    notices = EarlyNotices()
    known = KnownRequests()
    known.loaded(["recorded"])
    notices.follow(known)
    return notices


def test_nothing_goes_early_before_the_recorded_ids_are_read() -> None:
    notices = EarlyNotices()
    assert not notices.claim("r1")  # no history sink yet
    notices.follow(KnownRequests())
    assert not notices.claim("r1")  # its ids not read yet: "r1" may be recorded


def test_a_recorded_or_claimed_request_does_not_go_early(early: EarlyNotices) -> None:
    assert not early.claim("recorded")
    assert early.claim("r1")
    assert not early.claim("r1")  # another copy of the marker
    assert early.take(["r2"]) == {}
    assert not early.claim("r2")  # the query's now


def test_the_query_waits_for_an_early_notice_under_way(early: EarlyNotices, build: Any) -> None:
    assert early.claim("r1")
    taken: dict[str, CompletedRequest] = {}
    query = threading.Thread(target=lambda: taken.update(early.take(["r1", "r2"])))
    query.start()
    query.join(0.2)
    assert query.is_alive()  # still waiting for the early path's outcome
    early.published(build.early_answer("r1"))
    query.join(5)
    assert list(taken) == ["r1"]


def test_an_early_failure_leaves_the_request_to_the_query(early: EarlyNotices) -> None:
    assert early.claim("r1")
    early.failed("r1")
    assert early.take(["r1"]) == {}


def test_a_stuck_early_notice_fails_the_querys_batch(early: EarlyNotices) -> None:
    assert early.claim("r1")
    with pytest.raises(RuntimeError, match="under way"):
        early.take(["r1"], timeout_s=0.05)


def test_claims_go_when_recorded_and_early_ones_wait_for_a_replay(
    early: EarlyNotices, build: Any
) -> None:
    assert early.claim("r1")
    early.published(build.early_answer("r1"))
    assert list(early.take(["r1", "r2"])) == ["r1"]
    early.finish(["r1", "r2"], recorded=False)  # the batch failed
    assert early.claims == 1
    assert list(early.take(["r1", "r2"])) == ["r1"]  # its replay records r1
    early.finish(["r1", "r2"], recorded=True)
    assert early.claims == 0
