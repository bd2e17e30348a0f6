"""Small helpers for tests against the local stack (no sleeps: poll with deadlines)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from confluent_kafka import Consumer, Message


def consume(consumer: Consumer, count: int, timeout_s: float = 60.0) -> list[Message]:
    """Poll until ``count`` messages arrived; fail with the count seen after ``timeout_s``.

    Partition-EOF events are skipped; any other consumer error fails the test.
    """
    from confluent_kafka import KafkaError

    got: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"only {len(got)}/{count} messages within {timeout_s} s")
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                continue
            raise AssertionError(f"consumer error: {err}")
        got.append(msg)
    return got
