"""Shared test helpers: protocol record builders (pure) and, for stack tests, the pipeline run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

from infra.localstack.process import wait_group_gone
from infra.testing import Received, Subscriber, free_port, pipeline_env
from mdproto import envelope, topics
from mdproto.messages import OHLC, BatchMetadata, OHLCBatch, Status, TakerSide, Tick
from pipeline.history_notices import CompletedRequest, complete
from pipeline.notifier import EARLY_BATCH, HistoryNotifier
from pipeline.records import FinalMarker
from pipeline.write_paths import WRITE_PATHS

TICKER = "BINANCE:BTC/USDT"
MINUTE = 60_000
T0 = 1_700_000_040_000  # a minute boundary (2023-11-14T22:14:00Z)


def candle(i: int, *, ticker: str = TICKER, period: int = 60, t0: int = T0, **kw: float) -> OHLC:
    """The i-th 1-minute candle from t0 with distinct, recognisable prices."""
    values = {"open": 100.0 + i, "high": 110.0 + i, "low": 90.0 + i, "close": 105.0 + i}
    values.update(kw)
    return OHLC(
        ticker=ticker,
        period_seconds=period,
        open_time_ms=t0 + i * period * 1000,
        volume=1.5,
        trade_count=7,
        **values,
    )


def metadata(
    request_id: str,
    *,
    client_id: str = "client-1",
    ticker: str = TICKER,
    period: int = 60,
    start: int = T0,
    end: int = T0 + 10 * MINUTE,
    topic: str | None = None,
) -> BatchMetadata:
    return BatchMetadata(
        request_id=request_id,
        client_id=client_id,
        ticker=ticker,
        period_seconds=period,
        start_time_ms=start,
        end_time_ms=end,
        notification_topic=topic
        if topic is not None
        else topics.notification_topic(0, request_id, client_id),
        ingestor_id="ingestor-a",
    )


def request_records(
    request_id: str,
    rows: Sequence[OHLC],
    *,
    per_record: int = 1000,
    status: int = Status.OK,
    meta: BatchMetadata | None = None,
    reason: str = "",
    error_code: str = "",
) -> list[bytes]:
    """The Kafka values an ingestor writes for one request: sequence 0..n, then the marker."""
    meta = meta or metadata(request_id)
    values = []
    chunks = [rows[i : i + per_record] for i in range(0, len(rows), per_record)] or [[]]
    for seq, chunk in enumerate(chunks):
        batch = OHLCBatch(request_id=request_id, sequence=seq, rows=list(chunk))
        if seq == 0:
            batch.metadata.CopyFrom(meta)
        if chunk or seq == 0:
            values.append(envelope.encode_record(batch))
    final = BatchMetadata()
    final.CopyFrom(meta)
    final.status = status  # type: ignore[assignment]
    final.total_rows = len(rows)
    final.total_batches = len(values)
    final.reason = reason
    final.error_code = error_code
    marker = OHLCBatch(request_id=request_id, sequence=len(values), metadata=final, is_final=True)
    values.append(envelope.encode_record(marker))
    return values


def tick(
    trade_id: str | int,
    price: float,
    ts: int,
    *,
    amount: float = 1.0,
    ticker: str = TICKER,
    ingested_at_ms: int = 0,
) -> Tick:
    return Tick(
        ticker=ticker,
        trade_id=str(trade_id),
        price=price,
        amount=amount,
        timestamp_ms=ts,
        side=TakerSide.BUY,
        ingested_at_ms=ingested_at_ms,
    )


def early_answer(request_id: str) -> CompletedRequest:
    """What the stored-answers path publishes for a request (before the query records it)."""
    marker = FinalMarker(request_id, metadata(request_id), partition=0, offset=99)
    return complete(
        marker,
        iceberg_table="market.ohlc",
        snapshot_id=7,
        completed_at_ms=T0,
        query_id="",
        batch_id=EARLY_BATCH,
    )


def kafka_table(
    values: Sequence[bytes | None],
    *,
    key: bytes | None = TICKER.encode(),
    partition: int = 0,
    first_offset: int = 0,
    timestamp_ms: int = T0,
) -> pa.Table:
    """What `batch_df.select(key, value, partition, offset, timestamp).toArrow()` gives."""
    n = len(values)
    return pa.table(
        {
            "key": pa.array([key] * n, pa.binary()),
            "value": pa.array(values, pa.binary()),
            "partition": pa.array([partition] * n, pa.int32()),
            "offset": pa.array(range(first_offset, first_offset + n), pa.int64()),
            "timestamp": pa.array([timestamp_ms * 1000] * n, pa.int64()).cast(
                pa.timestamp("us", tz="UTC")
            ),
        }
    )


class Builders:
    """The helpers above, reachable from tests (importlib mode: conftest is not importable)."""

    TICKER = TICKER
    MINUTE = MINUTE
    T0 = T0
    candle = staticmethod(candle)
    metadata = staticmethod(metadata)
    request_records = staticmethod(request_records)
    tick = staticmethod(tick)
    kafka_table = staticmethod(kafka_table)
    early_answer = staticmethod(early_answer)


class RecordingPublisher:
    """The pipeline's Publisher, keeping what it was handed instead of sending it."""

    def __init__(self) -> None:
        self.sent: list[str] = []  # request ids, in order
        self.messages: list[Any] = []

    def publish_many(self, messages: Iterable[tuple[str, Any]]) -> None:
        listed = [message for _, message in messages]
        self.messages += listed
        self.sent += [message.request_id for message in listed]


@pytest.fixture
def publisher() -> RecordingPublisher:
    return RecordingPublisher()


@pytest.fixture
def notifier(publisher: RecordingPublisher) -> HistoryNotifier:
    return HistoryNotifier(publisher)  # type: ignore[arg-type]


@pytest.fixture
def build() -> type[Builders]:
    return Builders


# --------------------------------------------------------------------------------------
# Stack tests: the pipeline as a real subprocess (`python -m pipeline`), Kafka producer,
# a SUB collecting everything the PUB sends, and pyiceberg as an independent reader.
# --------------------------------------------------------------------------------------

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from infra.localstack import StackEndpoints

WAIT_S = 240.0  # first micro-batches of a cold JVM on a loaded 2-core machine are slow


@dataclass
class PipelineRun:
    """One pipeline configuration (names, checkpoint, PUB port) and its processes."""

    endpoints: StackEndpoints
    workdir: Path
    namespace: str
    batches_topic: str
    ticks_topic: str
    pub_port: int
    markets_topic: str = ""
    recording_topic: str = ""
    extra_env: dict[str, str] = field(default_factory=dict)
    metrics_port: int = field(default_factory=lambda: free_port())
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def pub_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.pub_port}"

    @property
    def book_topic(self) -> str:
        """`infra.testing.pipeline_env`'s book topic for this run."""
        return f"{self.ticks_topic}.book"

    @property
    def ready_file(self) -> Path:
        return self.workdir / "ready.json"

    @property
    def log_file(self) -> Path:
        return self.workdir / f"pipeline-{self.starts}.log"

    def env(self, crash_at: str | None = None) -> dict[str, str]:
        env = pipeline_env(
            self.endpoints,
            namespace=self.namespace,
            batches_topic=self.batches_topic,
            ticks_topic=self.ticks_topic,
            checkpoint_dir=self.workdir / "checkpoints",
            pub_endpoint=self.pub_endpoint,
            ready_file=self.ready_file,
        )
        env.update(
            {
                "LOG_LEVEL": "INFO",
                "PIPELINE_SPARK__DRIVER_MEMORY": "1g",
                "PIPELINE_METRICS_PORT": str(self.metrics_port),
                "PIPELINE_HISTORY__TRIGGER_S": "0.5",
                # ~3 CPU-s per start, for the first answer's latency: tested once, in
                # test_stack_pipeline, which turns it on.
                "PIPELINE_HISTORY__WARM_UP": "false",
                "PIPELINE_LIVE__PERIODS": "[60, 300]",
                "PIPELINE_LIVE__WATERMARK_S": "5",
                "PIPELINE_LIVE__PERSIST_TRIGGER_S": "2",
                "PIPELINE_LIVE__STORE_TRIGGER_S": "1",
                "PIPELINE_LIVE__BOOK_STORE_TRIGGER_S": "1",
                "PIPELINE_MARKETS__TRIGGER_S": "2",
                "PIPELINE_GAPS__TRIGGER_S": "1",
                "PIPELINE_GAPS__RETRY_S": "1",
            }
        )
        if self.markets_topic:
            env["PIPELINE_KAFKA__TOPIC_MARKETS"] = self.markets_topic
        if self.recording_topic:
            env["PIPELINE_KAFKA__TOPIC_RECORDING"] = self.recording_topic
        env.update(self.extra_env)
        if crash_at:
            env["PIPELINE_CRASH_AT"] = crash_at
        return env

    def start(self, crash_at: str | None = None) -> None:
        """Start `python -m pipeline` in its own process group (Python driver + Spark JVM)."""
        assert self.process is None or self.process.poll() is not None, "already running"
        self.ready_file.unlink(missing_ok=True)
        self.starts += 1
        with self.log_file.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "pipeline"],
                env=self.env(crash_at),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_ready(
        self, timeout_s: float = WAIT_S, *, stored_answers: bool = False
    ) -> dict[str, Any]:
        """The ready file's payload; with ``stored_answers``, once it also says stored
        answers go out ahead of the history query (late on a loaded machine)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"pipeline exited {self.process.returncode}:\n{self.tail()}")
            if self.ready_file.exists():
                ready = dict(json.loads(self.ready_file.read_text()))
                if ready["stored_answers"] or not stored_answers:
                    return ready
            time.sleep(0.2)
        raise AssertionError(f"pipeline not ready in {timeout_s} s:\n{self.tail()}")

    def wait_exit(self, timeout_s: float = WAIT_S) -> int:
        assert self.process is not None
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"pipeline still running after {timeout_s} s") from None

    def kill9(self) -> None:
        """kill -9 of the driver: Python and its Spark JVM, no shutdown hooks."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)
        self._reap_group()
        # The PUB process and the JVM may outlive the driver by a moment, holding ports.
        wait_group_gone(self.process.pid, timeout_s=30)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            self._reap_group()
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)
        self._reap_group()

    def sigterm_group(self, timeout_s: float = 60.0) -> int:
        """SIGTERM to the whole process group, as `make stop` sends it (Python, its PUB
        process and the Spark JVM at once); returns the driver's exit status."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGTERM)
        status = self.wait_exit(timeout_s)
        self._reap_group()
        return status

    def _reap_group(self) -> None:
        """The JVM outlives a SIGKILLed Python for a moment: kill what is left of our group."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def tail(self, lines: int = 60) -> str:
        text = self.log_file.read_text(errors="replace") if self.log_file.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def metrics(self) -> dict[str, float]:
        """Its ``GET /metrics`` now: each sample's name with labels -> value."""
        import urllib.request

        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        return {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line and not line.startswith("#")
        }

    def log_text(self) -> str:
        return "\n".join(
            (self.workdir / f"pipeline-{i}.log").read_text(errors="replace")
            for i in range(1, self.starts + 1)
        )


class Kafka:
    """Produces record values to a topic, keyed like the ingestors (by ticker)."""

    def __init__(self, bootstrap: str) -> None:
        from confluent_kafka import Producer

        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})

    def send(self, topic: str, values: Sequence[bytes], key: str = TICKER) -> None:
        for value in values:
            self._producer.produce(topic, key=key.encode(), value=value)
        if self._producer.flush(30) != 0:
            raise AssertionError("Kafka did not acknowledge every record")


class Lake:
    """pyiceberg view of the pipeline's tables: an independent reader."""

    def __init__(self, endpoints: StackEndpoints, namespace: str) -> None:
        from pyiceberg.catalog import load_catalog

        self._catalog = load_catalog(
            endpoints.catalog_name, **endpoints.pyiceberg_catalog_properties()
        )
        self.namespace = namespace

    def table(self, table: str) -> Any:
        return self._catalog.load_table(f"{self.namespace}.{table}")

    def table_names(self) -> set[str]:
        return {name for _, name in self._catalog.list_tables(self.namespace)}

    def rows(
        self, table: str, row_filter: str = "", snapshot_id: int | None = None
    ) -> list[dict[str, Any]]:
        from pyiceberg.expressions import AlwaysTrue

        t = self.table(table)
        scan = t.scan(row_filter=row_filter or AlwaysTrue(), snapshot_id=snapshot_id)
        return list(scan.to_arrow().to_pylist())


def subscriber(endpoint: str) -> Subscriber:
    """infra.testing.Subscriber waiting up to this module's WAIT_S by default."""
    return Subscriber(endpoint, wait_s=WAIT_S)


def is_notification(request_id: str) -> Callable[[Received], bool]:
    def check(m: Received) -> bool:
        return getattr(m.message, "request_id", None) == request_id and m.topic.startswith(
            ("RESPONSE:", "HISTORY_READY:")
        )

    return check


def confirm_subscription(sub: Subscriber, kafka: Kafka, ticks_topic: str) -> None:
    """Prove the SUB is connected: publish probe ticks until one comes back."""
    from mdproto import envelope

    probe = "PROBE:SUB/SCRIBED"
    for attempt in range(1, 200):
        trade_id = f"probe-{uuid.uuid4().hex[:8]}"
        value = envelope.encode_record(tick(trade_id, 1.0, 1_600_000_000_000, ticker=probe))
        kafka.send(ticks_topic, [value], key=probe)
        try:
            sub.wait_for(
                lambda m, t=trade_id: getattr(m.message, "trade_id", "") == t,
                timeout_s=2 if attempt > 1 else WAIT_S,
            )
            return
        except AssertionError:
            continue
    raise AssertionError("the SUB never received a probe tick")


@pytest.fixture(scope="module")
def make_run(
    local_stack: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., PipelineRun]]:
    """Factory of isolated pipeline runs (own namespace, topics, checkpoints, PUB port)."""
    runs: list[PipelineRun] = []

    def make(**extra_env: str) -> PipelineRun:
        tag = uuid.uuid4().hex[:8]
        run = PipelineRun(
            endpoints=local_stack.endpoints,
            workdir=tmp_path_factory.mktemp(f"pipeline-{tag}"),
            namespace=f"pt_{tag}",
            batches_topic=f"pt-{tag}.ohlc.batches",
            ticks_topic=f"pt-{tag}.ticks",
            markets_topic=f"pt-{tag}.markets",
            recording_topic=f"pt-{tag}.recording",
            pub_port=free_port(),
            extra_env=dict(extra_env),
        )
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.stop()


@dataclass
class Harness:
    """A running pipeline and the clients around it."""

    run: PipelineRun
    sub: Subscriber
    kafka: Kafka
    lake: Lake


def iceberg_writes(registry: CollectorRegistry, table: str = "ohlc") -> dict[str, float]:
    """``pipeline_iceberg_writes_total`` of ``table`` by path (counted ones only)."""
    counted = {
        path: registry.get_sample_value(
            "pipeline_iceberg_writes_total", {"table": table, "path": path}
        )
        for path in WRITE_PATHS
    }
    return {path: n for path, n in counted.items() if n}


class StackTools:
    """Stack helpers for tests (conftest is not importable in importlib mode)."""

    WAIT_S = WAIT_S
    Subscriber = staticmethod(subscriber)
    Kafka = Kafka
    Lake = Lake
    Harness = Harness
    is_notification = staticmethod(is_notification)
    confirm_subscription = staticmethod(confirm_subscription)
    iceberg_writes = staticmethod(iceberg_writes)


@pytest.fixture(scope="session")
def tools() -> type[StackTools]:
    return StackTools
