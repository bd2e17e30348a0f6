"""The `cep` streaming query: cep.triggers + market.ticks -> engine (driver) -> PUB.

    cep.triggers (earliest: every registration) --+
                                                    +--> union --> foreachBatch: CepRunner
    market.ticks (latest on a new checkpoint) -----+        |-> CEPTriggerEvent -> PUB :5557
                                                            |-> tombstones -> cep.triggers
                                                            '-> engine snapshot -> checkpoint
    timer thread (cep.timer_s): expiries and idle candles between micro-batches

Both topics are sources of ONE query, so the trigger records' offsets are
committed with the ticks' and a re-run batch sees the same records in the same
order. See docs/cep.md for why the engine runs on the driver rather than in
applyInPandasWithState.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from mdproto import contracts
from mdproto.runtime.kafka import ensure_topics, spec
from pipeline.cep import kafka
from pipeline.cep.engine import Engine
from pipeline.cep.runner import CepRunner
from pipeline.cep.state import SnapshotStore, local_path
from pipeline.config import Settings
from pipeline.pub_server import Publisher
from pipeline.session import FAST_POOL
from pipeline.streams import kafka_source, start_query

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger(__name__)

QUERY_NAME = "cep"
COLUMNS = ("topic", "key", "value", "timestamp", "partition", "offset")


class CepQuery:
    """The running query with its runner, timer and tombstone producer."""

    def __init__(
        self,
        query: StreamingQuery,
        runner: CepRunner,
        writer: kafka.TombstoneWriter,
        timer_s: float,
    ) -> None:
        self.query = query
        self.runner = runner
        self._writer = writer
        self._stop = threading.Event()
        self._timer = threading.Thread(
            target=self._tick, args=(timer_s,), name="cep-timer", daemon=True
        )
        self._timer.start()

    def _tick(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.runner.on_timer()
            except Exception:  # keep the timer alive; the next batch retries
                log.exception("cep timer failed")

    def stop(self) -> None:
        self._stop.set()
        self._timer.join(timeout=5)
        self._writer.close()


def start(spark: SparkSession, settings: Settings, publisher: Publisher) -> CepQuery:
    cep = settings.cep
    k = settings.kafka
    ensure_topics(
        k.bootstrap_servers,
        [spec(contracts.KAFKA_CEP_TRIGGERS, k.topic_cep_triggers)],
        partitions=k.topic_partitions,
        replication=k.replication_factor,
        timeout_s=k.connect_timeout_s,
    )
    store = SnapshotStore(
        local_path(settings.checkpoint_for(QUERY_NAME)) / "engine", keep=cep.snapshots_kept
    )
    writer = kafka.TombstoneWriter(k.bootstrap_servers, k.topic_cep_triggers)

    def new_engine() -> Engine:
        return Engine(
            candle_grace_ms=round(cep.candle_grace_s * 1000), dedupe_capacity=cep.dedupe_capacity
        )

    runner = CepRunner(
        store=store,
        trigger_topic=k.topic_cep_triggers,
        publish=publisher.publish_many,
        retire=writer.retire,
        bootstrap=lambda: kafka.read_all(k.bootstrap_servers, k.topic_cep_triggers),
        new_engine=new_engine,
    )
    triggers = kafka_source(
        spark,
        settings,
        k.topic_cep_triggers,
        None,
        starting_offsets="earliest",  # every registration, whatever the checkpoint's age
        fail_on_data_loss=False,  # compaction removes offsets by design
        large_fetches=False,
    ).select(*COLUMNS)
    ticks = kafka_source(
        spark,
        settings,
        k.topic_ticks,
        cep.max_offsets_per_trigger,
        starting_offsets=cep.ticks_starting_offsets,
        large_fetches=False,
    ).select(*COLUMNS)

    def batch(batch_df: DataFrame, batch_id: int) -> None:
        runner(batch_df.toArrow(), batch_id)

    query = start_query(
        triggers.unionByName(ticks),
        name=QUERY_NAME,
        settings=settings,
        function=batch,
        trigger_s=cep.trigger_s,
        pool=FAST_POOL,  # latency-critical: its tasks go before the Iceberg writers'
    )
    return CepQuery(query, runner, writer, cep.timer_s)
