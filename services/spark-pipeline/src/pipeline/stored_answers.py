"""Stored answers without a micro-batch: notified as their final marker reaches Kafka.

A request the ingestor answers wholly from storage writes one record, its final
marker (source STORAGE): its rows are in Iceberg already, committed before the
``requests`` row that told the ingestor so. All the history query would add is
its fixed cost per answer: the trigger wait, Spark's Kafka fetch of the one
record and the ``requests`` append, most of a stored answer's time
(figures: docs/adr/0010-history-notification-publishers.md). This thread reads
the topic itself, counts the range's rows at the ``ohlc`` snapshot on the
driver's JVM and has the notifier publish it at once; the history query records
it when its micro-batch comes (`notifier`).

Anything this path skips (another status or source, an id the sink may have
recorded, a failure here) is the history query's, as before: this thread only
ever makes a notification earlier.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pyiceberg.exceptions import RESTError

from mdproto.messages import HistorySource, Status
from mdproto.runtime.kafka import assigned_consumer_config, consume_ready
from pipeline import history_notices, records
from pipeline.config import Settings
from pipeline.lake import Lake
from pipeline.notifier import EARLY_BATCH, HistoryNotifier

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pipeline.faults import CrashPoint

#: What leaves a stored answer to the history query: the catalog (its REST errors) or
#: S3 (OSError, as are requests' connection errors) unreachable while answering.
LAKE_AWAY = (OSError, RESTError)

log = logging.getLogger(__name__)
#: A failed read of the topic (Kafka down) is tried again after this long.
RETRY_S = 2.0


class TopicUnavailableError(RuntimeError):
    """The batches topic is not there (yet): Kafka lists it without partitions."""


def stored_only(markers: Sequence[records.FinalMarker]) -> list[records.FinalMarker]:
    """The OK final markers of requests answered wholly from storage."""
    return [
        m
        for m in history_notices.choose(markers)
        if m.metadata is not None
        and m.metadata.source == HistorySource.SOURCE_STORAGE
        and history_notices.outcome(m.metadata)[0] == Status.OK
    ]


class StoredAnswers:
    """The driver thread that notifies stored answers ahead of the history query."""

    def __init__(
        self,
        settings: Settings,
        spark: SparkSession,
        lake: Lake,
        notifier: HistoryNotifier,
        crash_point: CrashPoint | None = None,
    ) -> None:
        self._settings = settings
        self._crash_point = crash_point or (lambda _: None)
        self._spark = spark
        self._lake = lake
        self._notifier = notifier
        self._stop = threading.Event()
        self._reading = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stored-answers", daemon=True)
        self.notified = 0

    def start(self) -> None:
        self._thread.start()

    def wait_ready(self, timeout_s: float) -> bool:
        """True once a marker written from now on is answered early: the topic's end is
        known and the history sink can vouch for new ids (its ids were read)."""
        deadline = time.monotonic() + timeout_s
        if not self._reading.wait(timeout_s):
            return False
        return self._notifier.wait_vouching(max(0.0, deadline - time.monotonic()))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        from confluent_kafka import KafkaException

        while not self._stop.is_set():
            try:
                self._read()
            except (KafkaException, TopicUnavailableError) as exc:  # the query answers meanwhile
                log.warning("stored answers: reading Kafka failed, again in %g s: %s", RETRY_S, exc)
                self._stop.wait(RETRY_S)
            except BaseException:
                log.exception("stored answers stopped: history is notified by the query alone")
                raise

    def _read(self) -> None:
        from confluent_kafka import Consumer, TopicPartition

        s = self._settings
        topic = s.kafka.topic_ohlc_batches
        consumer = Consumer(
            assigned_consumer_config(s.kafka.bootstrap_servers, "pipeline-stored-answers")
        )
        try:
            meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
            if meta is None or meta.error is not None or not meta.partitions:
                raise TopicUnavailableError(f"topic {topic} lists no partitions")
            # From the end, resolved now: what came before is the history query's (it
            # reads it anyway), and nothing written after `wait_ready` is missed.
            ends = []
            for p in meta.partitions:
                _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                ends.append(TopicPartition(topic, p, high))
            consumer.assign(ends)
            self._reading.set()
            while not self._stop.is_set():
                messages = [m for m in consume_ready(consumer, 500, 0.2) if m.error() is None]
                if messages:
                    self._answer_all(messages)
        finally:
            consumer.close()

    def _answer_all(self, messages: Sequence[Any]) -> None:
        # Markers alone: a request fetched from the exchange passes here whole, and its
        # candles are the history query's to decode (a year's are 525,600).
        markers = records.final_markers((m.value(), m.partition(), m.offset()) for m in messages)
        for marker in stored_only(markers):
            t0 = time.monotonic()
            try:
                request = self._notifier.notify_early(
                    marker.request_id, functools.partial(self._answer, marker)
                )
            except LAKE_AWAY as exc:  # the history query answers it, as without this path
                log.warning(
                    "stored answer %s left to the history query: %s", marker.request_id, exc
                )
                continue
            if request is None:
                continue
            self._crash_point("stored-answer-after-publish")
            self.notified += 1
            log.info(
                "notified %s on %s ahead of the history query (stored answer): %s, %d rows, "
                "snapshot %d, %.0f ms after its marker was read",
                request.request_id,
                request.notification_topic,
                Status.Name(request.status),  # type: ignore[arg-type]
                request.row_count,
                request.snapshot_id,
                (time.monotonic() - t0) * 1000,
            )

    def _answer(self, marker: records.FinalMarker) -> history_notices.CompletedRequest:
        """The request's notification as the query would build it, at the current snapshot."""
        names = self._lake.names
        snapshot = self._lake.snapshot_id(names.ohlc)
        request = history_notices.complete(
            marker,
            iceberg_table=names.ohlc_for_clients,
            snapshot_id=snapshot,
            completed_at_ms=_now_ms(),
            query_id="",  # the history query's, stamped when it records the row
            batch_id=EARLY_BATCH,
        )
        if history_notices.needs_count(request):
            counts = self._lake.count_request_rows(self._spark, snapshot, [request])
            request = history_notices.reconcile(request, counts[request.request_id])
        return request


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
