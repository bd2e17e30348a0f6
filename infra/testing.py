"""Small helpers for tests and benchmarks against the local stack (no sleeps: poll with
deadlines)."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa
    import zmq
    from confluent_kafka import Consumer, Message
    from google.protobuf.message import Message as ProtoMessage

    from infra.localstack import StackEndpoints
    from mdclient import HistoryResult


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pipeline_env(
    endpoints: StackEndpoints,
    *,
    namespace: str,
    batches_topic: str,
    ticks_topic: str,
    checkpoint_dir: Path,
    pub_endpoint: str,
    ready_file: Path,
) -> dict[str, str]:
    """The environment of a `python -m pipeline` on the stack with its own namespace,
    topics, checkpoints and PUB: this process's, without its PIPELINE_* variables."""
    from infra.artifacts import spark_jars

    e = endpoints
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    env.update(
        {
            "PYSPARK_PYTHON": sys.executable,
            "PIPELINE_KAFKA__BOOTSTRAP_SERVERS": e.kafka_bootstrap,
            "PIPELINE_KAFKA__TOPIC_OHLC_BATCHES": batches_topic,
            "PIPELINE_KAFKA__TOPIC_TICKS": ticks_topic,
            **e.catalog_env("PIPELINE_CATALOG__"),
            "PIPELINE_CATALOG__NAMESPACE": namespace,
            "PIPELINE_SPARK__MASTER": "local[2]",
            "PIPELINE_SPARK__JARS": json.dumps([str(j) for j in spark_jars()]),
            "PIPELINE_CHECKPOINT_DIR": str(checkpoint_dir),
            "PIPELINE_PUB_ENDPOINT": pub_endpoint,
            "PIPELINE_READY_FILE": str(ready_file),
        }
    )
    return env


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


def exchange_rows(symbol: str, start: int, end: int) -> list[tuple[float, ...]]:
    """The simulator's 1-minute candles for [start, end) as (open_ms, o, h, l, c, v)."""
    from infra.exchange_sim import expected_klines

    return [
        tuple(float(v) for v in k.ohlcv())
        for k in expected_klines(symbol, "1m", start, end)
        if k.open_time < end
    ]


def result_rows(result: HistoryResult) -> list[tuple[float, ...]]:
    """A history answer's rows in the same shape as `exchange_rows`."""
    return table_rows(result.table)


def table_rows(t: pa.Table) -> list[tuple[float, ...]]:
    """Candle frame rows (mdclient.frames) in the same shape as `exchange_rows`."""
    times = [int(ts.timestamp() * 1000) for ts in t.column("open_time").to_pylist()]
    columns = [t.column(name).to_pylist() for name in ("open", "high", "low", "close", "volume")]
    return [(float(ms), *values) for ms, *values in zip(times, *columns, strict=True)]


def notified_request_ids(sub: zmq.Socket[bytes], quiet_ms: int = 1000) -> list[str]:
    """The request_ids of the HistoryReadyNotifications queued on `sub`, read until it
    stays quiet for `quiet_ms`; closes the socket. Call it after a barrier request on
    the same topic, so any duplicate of an earlier notification is already queued."""
    from mdproto import envelope
    from mdproto.messages import HistoryReadyNotification

    seen: list[str] = []
    while sub.poll(timeout=quiet_ms):
        _, message = envelope.decode_sub(sub.recv_multipart())
        assert isinstance(message, HistoryReadyNotification)
        seen.append(message.request_id)
    sub.close(linger=0)
    return seen


@dataclass(frozen=True)
class Received:
    at: float  # time.time() when the SUB received it
    topic: str
    message: ProtoMessage


class Subscriber:
    """A SUB on a PUB (the pipeline's, the relay's) recording every message under `prefixes`
    (default: everything) on its own thread; tests and benchmarks wait on it with deadlines.

    Like any client it drops duplicates by sequence number (docs/protocol.md "Sequence
    numbers and recovery"): the last values the XPUB re-sends when another SUB
    subscribes; they are counted in `duplicates`.
    """

    def __init__(
        self, endpoint: str, prefixes: Sequence[bytes] = (b"",), *, wait_s: float = 240.0
    ) -> None:
        import zmq

        self.wait_s = wait_s  # wait_for's default deadline
        self._socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
        for prefix in prefixes:
            self._socket.setsockopt(zmq.SUBSCRIBE, prefix)
        self._socket.setsockopt(zmq.RCVHWM, 0)
        self._socket.setsockopt(zmq.RCVTIMEO, 200)
        self._socket.connect(endpoint)
        self._messages: list[Received] = []
        self._last: dict[str, tuple[int, int]] = {}  # topic -> (epoch, sequence)
        self.duplicates = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import zmq

        from mdproto import envelope

        while not self._stop.is_set():
            try:
                frames = self._socket.recv_multipart()
            except zmq.Again:
                continue
            topic, message = envelope.decode_sub(frames)
            if self._duplicate(topic, message):
                continue
            with self._cond:
                self._messages.append(Received(time.time(), topic, message))
                self._cond.notify_all()

    def _duplicate(self, topic: str, message: ProtoMessage) -> bool:
        sequence = getattr(message, "sequence", 0)
        if not sequence:
            return False
        epoch = message.publisher_epoch  # type: ignore[attr-defined]
        last = self._last.get(topic)
        if last is not None and last[0] == epoch and sequence <= last[1]:
            self.duplicates += 1
            return True
        self._last[topic] = (epoch, sequence)
        return False

    @property
    def received(self) -> list[Received]:
        """Everything recorded so far, in arrival order."""
        with self._cond:
            return list(self._messages)

    def matching(self, predicate: Callable[[Received], bool]) -> list[Received]:
        with self._cond:
            return [m for m in self._messages if predicate(m)]

    def wait_for(
        self, predicate: Callable[[Received], bool], count: int = 1, timeout_s: float | None = None
    ) -> list[Received]:
        """The first `count` matching messages; AssertionError after the deadline."""
        timeout_s = self.wait_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                found = [m for m in self._messages if predicate(m)]
                if len(found) >= count:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    topics = sorted({m.topic for m in self._messages})
                    raise AssertionError(
                        f"{len(found)}/{count} matching messages in {timeout_s} s; topics seen: "
                        f"{topics[:20]}"
                    )
                self._cond.wait(min(left, 1.0))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._socket.close(0)
