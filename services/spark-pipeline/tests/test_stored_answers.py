"""Stored answers ahead of the history query: which markers qualify, what the Kafka
messages decode to, the notifier's claims that let exactly one side have a request, and
its memory of what it sent."""

from __future__ import annotations

import threading
from typing import Any

import confluent_kafka
import pytest
from pyiceberg.exceptions import ServiceUnavailableError

from mdproto import envelope
from mdproto.messages import HistorySource, OHLCBatch, Status
from pipeline import records
from pipeline.config import Settings
from pipeline.history_notices import CompletedRequest
from pipeline.known_requests import KnownRequests
from pipeline.lake import TableNames
from pipeline.notifier import EarlyNoticeStuckError, HistoryNotifier
from pipeline.stored_answers import StoredAnswers, stored_only


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
    markers = records.final_markers(
        (m.value(), m.partition(), m.offset()) for m in _messages(values)
    )
    assert {m.request_id for m in markers} == {"stored", "partly", "refused", "fetched"}
    [early] = stored_only(markers)
    assert (early.request_id, early.partition, early.offset) == ("stored", 2, 40)


@pytest.fixture
def early(notifier: HistoryNotifier) -> HistoryNotifier:
    """The notifier of a history sink whose ids are read: ``recorded`` is in ``requests``."""
    known = KnownRequests()
    known.loaded(["recorded"])
    notifier.follow(known)
    return notifier


class Held:
    """An early answer that waits until released: a count on the driver under way."""

    def __init__(self, build: Any, request_id: str) -> None:
        self.request: CompletedRequest = build.early_answer(request_id)
        self.entered, self.release = threading.Event(), threading.Event()

    def __call__(self) -> CompletedRequest:
        self.entered.set()
        assert self.release.wait(10)
        return self.request

    def start(self, notifier: HistoryNotifier) -> threading.Thread:
        early = threading.Thread(target=notifier.notify_early, args=(self.request.request_id, self))
        early.start()
        assert self.entered.wait(10)
        return early


def test_nothing_goes_early_before_the_recorded_ids_are_read(
    notifier: HistoryNotifier, publisher: Any, build: Any
) -> None:
    answer = lambda: build.early_answer("r1")  # noqa: E731
    assert notifier.notify_early("r1", answer) is None  # no history sink yet
    notifier.follow(KnownRequests())
    assert notifier.notify_early("r1", answer) is None  # its ids not read yet: may be recorded
    assert publisher.sent == []


def test_a_recorded_or_claimed_request_does_not_go_early(
    early: HistoryNotifier, publisher: Any, build: Any
) -> None:
    assert early.notify_early("recorded", lambda: build.early_answer("recorded")) is None
    assert early.notify_early("r1", lambda: build.early_answer("r1")) is not None
    assert early.notify_early("r1", lambda: build.early_answer("r1")) is None  # another copy
    assert early.take(["r2"]) == {}
    assert early.notify_early("r2", lambda: build.early_answer("r2")) is None  # the query's now
    assert publisher.sent == ["r1"]


def test_the_query_waits_for_an_early_notice_under_way(
    early: HistoryNotifier, publisher: Any, build: Any
) -> None:
    held = Held(build, "r1")
    early_path = held.start(early)
    taken: dict[str, CompletedRequest] = {}
    query = threading.Thread(target=lambda: taken.update(early.take(["r1", "r2"])))
    query.start()
    query.join(0.2)
    assert query.is_alive()  # still waiting for the early path's outcome
    held.release.set()
    query.join(5)
    early_path.join(5)
    assert list(taken) == ["r1"]
    assert publisher.sent == ["r1"]


def test_an_early_failure_leaves_the_request_to_the_query(
    early: HistoryNotifier, publisher: Any
) -> None:
    def failing() -> CompletedRequest:
        raise RuntimeError("the count failed")

    with pytest.raises(RuntimeError, match="count failed"):
        early.notify_early("r1", failing)
    assert early.take(["r1"]) == {}
    assert publisher.sent == []


def test_a_stuck_early_notice_fails_the_querys_batch(early: HistoryNotifier, build: Any) -> None:
    held = Held(build, "r1")
    early_path = held.start(early)
    with pytest.raises(EarlyNoticeStuckError, match="under way"):
        early.take(["r1"], timeout_s=0.05)
    held.release.set()
    early_path.join(5)


def test_claims_go_when_recorded_and_early_ones_wait_for_a_replay(
    early: HistoryNotifier, build: Any
) -> None:
    assert early.notify_early("r1", lambda: build.early_answer("r1"))
    assert list(early.take(["r1", "r2"])) == ["r1"]
    early.finish(["r1", "r2"], recorded=False)  # the batch failed
    assert early.claims == 1
    assert list(early.take(["r1", "r2"])) == ["r1"]  # its replay records r1
    early.finish(["r1", "r2"], recorded=True)
    assert early.claims == 0


class LakeAway:
    """The catalog refusing every load: what a restart or an outage looks like to the lake."""

    names = TableNames("lake", "md")

    def __init__(self, error: Exception) -> None:
        self.error = error

    def snapshot_id(self, table: str) -> int:
        raise self.error


@pytest.mark.parametrize(
    "error", [ServiceUnavailableError("503: catalog restarting"), ConnectionRefusedError(111)]
)
def test_a_stored_answer_the_lake_cannot_give_is_left_to_the_query(
    early: HistoryNotifier, publisher: Any, build: Any, error: Exception
) -> None:
    answers = StoredAnswers(Settings(), None, LakeAway(error), early)  # type: ignore[arg-type]
    answers._answer_all(_messages([_marker(build, "r1", HistorySource.SOURCE_STORAGE)]))
    assert publisher.sent == [] and answers.notified == 0
    assert early.take(["r1"]) == {}  # unclaimed: the history query answers it


def test_a_bug_in_a_stored_answer_is_not_taken_for_an_outage(
    early: HistoryNotifier, build: Any
) -> None:
    answers = StoredAnswers(Settings(), None, LakeAway(KeyError("ohlc")), early)  # type: ignore[arg-type]
    with pytest.raises(KeyError):
        answers._answer_all(_messages([_marker(build, "r1", HistorySource.SOURCE_STORAGE)]))


def test_the_reader_retries_only_while_kafka_is_away(
    early: HistoryNotifier, monkeypatch: pytest.MonkeyPatch
) -> None:
    answers = StoredAnswers(Settings(), None, LakeAway(KeyError("ohlc")), early)  # type: ignore[arg-type]
    failures = iter([confluent_kafka.KafkaException("broker down"), KeyError("a bug")])

    def read() -> None:
        raise next(failures)

    monkeypatch.setattr(answers, "_read", read)
    monkeypatch.setattr(answers._stop, "wait", lambda _: False)  # no pause between tries
    with pytest.raises(KeyError):
        answers._run()  # tried again after Kafka's error; a bug stops the thread


class FailingOn:
    """A publisher whose send of one request fails (the PUB server took nothing)."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.sent: list[str] = []

    def publish_many(self, messages: Any) -> None:
        for _, message in messages:
            if message.request_id == self.request_id:
                raise RuntimeError("the PUB server took no message for 5000 ms")
            self.sent.append(message.request_id)


def test_what_went_out_before_a_failed_send_is_remembered_and_the_rest_is_not(
    early: HistoryNotifier, build: Any
) -> None:
    publisher = FailingOn("r2")
    notifier = HistoryNotifier(publisher)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="took no message"):
        notifier.notify_recorded([build.early_answer(i) for i in ("r1", "r2", "r3")])
    assert publisher.sent == ["r1"]
    assert notifier.sent(["r1", "r2", "r3"]) == {"r1"}  # the replay sends r2 and r3
    assert early.notify_early("r4", lambda: build.early_answer("r4"))
    assert early.sent(["r4"]) == {"r4"}  # the early path's sends are remembered too
