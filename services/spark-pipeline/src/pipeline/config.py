"""Pipeline configuration: defaults < YAML file (``CONFIG_PATH``) < ``PIPELINE_*`` env vars.

Nested keys use ``__`` in the environment, e.g. ``PIPELINE_KAFKA__BOOTSTRAP_SERVERS=host:9092``
or ``PIPELINE_LIVE__PERIODS='[60, 300]'``. Every default is listed in the README.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import SettingsConfigDict

from mdproto import contracts
from mdproto.runtime import settings as runtime

ENV_PREFIX = "PIPELINE_"


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class KafkaConfig(_Section):
    bootstrap_servers: str = "127.0.0.1:9092"
    topic_ohlc_batches: str = contracts.KAFKA_OHLC_BATCHES
    topic_ticks: str = contracts.KAFKA_TICKS
    #: Closed live candles, from the live engine to the candles-store query.
    topic_live_candles: str = contracts.KAFKA_LIVE_CANDLES
    topic_live_corrections: str = contracts.KAFKA_LIVE_CORRECTIONS
    #: Compacted topic of CEPTriggerRequest records, key trigger_id (created compacted).
    topic_cep_triggers: str = contracts.KAFKA_CEP_TRIGGERS
    #: Compacted topic of Market records, key ticker (the ``markets`` query's source).
    topic_markets: str = contracts.KAFKA_MARKETS
    #: BookSnapshot and BookDelta records, key ticker (live books; snapshots to Iceberg).
    topic_book: str = contracts.KAFKA_BOOK
    #: The ingestors' recording records (compacted): the ``gaps`` query keeps the TradeGaps.
    topic_recording: str = contracts.KAFKA_RECORDING
    #: Where a query starts when its checkpoint is new; later runs resume from the checkpoint.
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    #: Spark's failOnDataLoss: stop (rather than skip) when retention deleted unread records.
    fail_on_data_loss: bool = True
    #: Create missing topics at startup (Spark's Kafka source fails on a missing topic).
    ensure_topics: bool = True
    #: market.ticks and market.book must have the same count, a multiple of every
    #: live-engine count run (1, 2, 3 or 6 share 6 evenly; ADR 0014).
    topic_partitions: int = Field(default=6, ge=1)
    replication_factor: int = Field(default=1, ge=1)
    #: Checked before Spark starts, so a dead broker is a one-line error, not a stack trace.
    connect_timeout_s: float = Field(default=5.0, gt=0)
    #: Extra ``kafka.*`` consumer options for the Spark source.
    options: dict[str, str] = Field(default_factory=dict)


class CatalogConfig(_Section):
    #: Spark catalog name: tables are ``{name}.{namespace}.{table}`` in SQL.
    name: str = "lake"
    uri: str = "http://127.0.0.1:8181"
    warehouse: str = "s3://warehouse/lake"
    namespace: str = contracts.ICEBERG_NAMESPACE
    s3_endpoint: str = "http://127.0.0.1:8333"
    s3_access_key: str = "localstack"
    s3_secret_key: str = "localstack-secret"
    s3_region: str = "us-east-1"
    connect_timeout_s: float = Field(default=5.0, gt=0)
    ohlc_table: str = "ohlc"
    ticks_table: str = "ticks"
    requests_table: str = "requests"
    markets_table: str = "markets"
    book_snapshots_table: str = "book_snapshots"
    gaps_table: str = "gaps"
    book_deltas_table: str = "book_deltas"
    #: Appends (candles, trades, requests) of at most this many rows are written by
    #: pyiceberg on the driver, larger ones by Spark's executors; 0: every append is a
    #: Spark job. MERGEs are Spark's either way (`write_paths.WriteRule`, ADR 0017).
    driver_append_max_rows: int = Field(default=2_000_000, ge=0)
    #: ticks-persist and book-store micro-batches of at least this many Kafka records
    #: (counted from the query's offset log before any is fetched) are decoded, checked
    #: against the stored keys and appended by Spark's executors ("executor-append");
    #: smaller ones on the driver. 0: never (ADR 0021).
    executor_append_min_records: int = Field(default=1_000_000, ge=0)

    def pyiceberg_properties(self) -> dict[str, str]:
        """The same catalog and S3 store for a pyiceberg client (`arrow_appends`)."""
        store = {"s3_endpoint", "s3_region", "warehouse", "s3_access_key", "s3_secret_key"}
        return runtime.pyiceberg_properties(self.uri, **self.model_dump(include=store))


class HistoryConfig(_Section):
    enabled: bool = True
    #: A request's last records wait up to this long for their micro-batch.
    trigger_s: float = Field(default=0.1, ge=0)
    max_offsets_per_trigger: int | None = Field(default=None, gt=0)
    #: Notify a request answered wholly from storage as its final marker reaches Kafka,
    #: ahead of the history query's micro-batch (`stored_answers`).
    stored_answers_early: bool = True
    #: Before the queries start, write one synthetic candle to a scratch table (dropped
    #: after): the first answer after a start then finds warm code (`history.warm_up`).
    warm_up: bool = True


class LiveConfig(_Section):
    enabled: bool = True
    periods: list[int] = Field(default_factory=lambda: list(contracts.LIVE_PERIODS))
    #: Accepted lateness of a trade behind its ticker's newest: within it a trade still
    #: amends its closed candle (a correction); later it misses its candles.
    watermark_s: float = Field(default=10.0, ge=0)
    #: Quiet time (processing time) after which a ticker's event time is taken to run on
    #: with the wall clock, closing the window of an idle ticker.
    close_idle_s: float = Field(default=1.0, gt=0)
    #: Nice value of the PUB server process (live engine, forwarding): negative = ahead
    #: of Spark for the CPU; needs CAP_SYS_NICE, else a warning. 0 leaves it alone.
    relay_niceness: int = Field(default=-10, ge=-20, le=19)
    #: How often the live engine snapshots its offsets and open candles (what a restart
    #: reads again is at most this much).
    snapshot_s: float = Field(default=2.0, gt=0)
    #: Candle previews (closed=false) of a window at most this often, its latest values:
    #: their cost follows the windows, not the consume() batches (ADR 0020). 0: every batch.
    preview_interval_s: float = Field(default=0.25, ge=0)
    #: The engine collects cyclic garbage at batch ends, and its whole heap this often: a
    #: pause as long as its state is big (`gc_pacing`, ADR 0020).
    gc_full_s: float = Field(default=60.0, gt=0)
    #: Once a tick is there, the engine's batch takes in what else arrives this long: the
    #: most the engine holds a tick before handling it, and what keeps a steady stream
    #: from paying the per-batch work for every few ticks (docs/pipeline-benchmarks.md).
    gather_s: float = Field(default=0.01, ge=0, le=0.05)
    #: The Kafka consumer group of the live engines: every engine (the pipeline's own
    #: and `python -m pipeline.engine`) with this id shares the ``market.ticks`` and
    #: ``market.book`` partitions. Empty: ``live-engine.<kafka.topic_ticks>``.
    group_id: str = ""
    #: Where each ticks partition's state is saved for its next owner (ADR 0014):
    #: ``s3://bucket/prefix`` (the catalog's S3 settings) or a local path. Empty: the
    #: warehouse bucket's ``live-engine/`` prefix.
    state_location: str = ""
    #: An engine silent this long leaves the group; its partitions go to the others.
    session_timeout_s: float = Field(default=6.0, ge=1)
    #: Extra engines only (`python -m pipeline.engine`): the relays' bound engine ports
    #: their XPUB connects to (relay ``engines_port``, e.g. ``tcp://relay:5561``).
    relay_engine_endpoints: list[str] = Field(default_factory=list)
    #: Extra engines only: their own GET /metrics and /healthz on `metrics_host`; 0 = off.
    #: One per engine process on a host: `make run LIVE_ENGINES=K` gives engine n (2..K)
    #: port 9562 + n (9564, 9565, ...). The pipeline's own engine is on its /metrics.
    metrics_port: int = Field(default=0, ge=0, le=65535)
    #: Order books: a BookSnapshot of each book that changed is published this often,
    #: so a subscriber that lost a delta heals within it (docs/protocol.md "Order books").
    book_snapshot_s: float = Field(default=1.0, gt=0)
    #: book-store: the ingestor's periodic and reset snapshots into ``book_snapshots``,
    #: its deltas into ``book_deltas``.
    book_store_trigger_s: float = Field(default=15.0, ge=0)
    #: book-store's micro-batches hold at most this many records (a backlog is stored in
    #: several): a books batch of 2,000,000 ran the executors out of the default 2 GiB
    #: heap, 1,500,000 passed (docs/adr/0021, "Books"); a 15 s batch is ~15,000.
    book_store_max_records: int = Field(default=1_000_000, gt=0)
    #: ticks-persist: every trigger is a MERGE whose cost hardly depends on its rows, and
    #: Kafka holds the ticks meanwhile: a slow trigger keeps the pipeline's cost at rest low.
    persist_trigger_s: float = Field(default=60.0, ge=0)
    #: candles-store: closed candles from Kafka into ``ohlc`` (publication does not wait).
    store_trigger_s: float = Field(default=2.0, ge=0)
    max_offsets_per_trigger: int | None = Field(default=None, gt=0)

    @field_validator("periods")
    @classmethod
    def _periods(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("live.periods needs at least one period")
        if any(p <= 0 for p in v):
            raise ValueError(f"live.periods must be positive seconds, got {v}")
        if len(set(v)) != len(v):
            raise ValueError(f"live.periods has duplicates: {v}")
        return sorted(v)


class CepConfig(_Section):
    """CEP triggers (docs/cep.md), evaluated in the live engine over the trigger topic and
    the ticks."""

    enabled: bool = True
    #: Where CEP starts reading ticks without saved state: "latest" never evaluates old
    #: ticks against triggers (trigger records are always read from the beginning).
    ticks_starting_offsets: Literal["earliest", "latest"] = "latest"
    #: Expiries and idle candles are checked this often between batches.
    timer_s: float = Field(default=1.0, gt=0)
    #: A candle with no later tick closes this long after its end (processing time).
    candle_grace_s: float = Field(default=2.0, ge=0)
    #: Trade ids remembered per watched ticker to drop Kafka re-deliveries.
    dedupe_capacity: int = Field(default=10_000, ge=1)
    #: Engine snapshots kept in <checkpoint_dir>/live-engine/cep (local, or the S3 store).
    snapshots_kept: int = Field(default=3, ge=2)


class UpkeepConfig(_Section):
    """Snapshot expiry and compaction of the tables (pipeline/upkeep.py)."""

    enabled: bool = True
    #: Seconds between rounds; the first round runs one interval after start.
    interval_s: float = Field(default=900.0, gt=0)
    #: Snapshots younger than this stay readable (clients read notified snapshots).
    snapshot_retain_s: float = Field(default=3600.0, ge=0)
    retain_last_snapshots: int = Field(default=5, ge=1)
    #: Compact a partition once it has this many small files (or delete files).
    min_input_files: int = Field(default=5, ge=2)
    #: Rewrite a data file that has this many delete files against it.
    delete_file_threshold: int = Field(default=3, ge=1)


class MarketsConfig(_Section):
    """Market metadata -> Iceberg ``markets``. Markets change rarely, but an idle trigger
    only asks Kafka for offsets: a short one stores an ingestor's markets within seconds
    of its start (`make run` waits for them before it says it is running)."""

    enabled: bool = True
    trigger_s: float = Field(default=5.0, ge=0)
    max_offsets_per_trigger: int | None = Field(default=None, gt=0)


class GapsConfig(_Section):
    """TradeGap records -> Iceberg ``gaps``; a REPAIRED gap's live candles rebuilt from
    ``ticks`` (pipeline/gaps.py, pipeline/gap_rebuilds.py)."""

    enabled: bool = True
    #: Gap records are few: a trigger every few seconds keeps ``gaps`` current at no cost.
    trigger_s: float = Field(default=5.0, ge=0)
    max_offsets_per_trigger: int | None = Field(default=None, gt=0)
    #: Pending rebuilds are looked at again this often (their trades may not be stored yet).
    retry_s: float = Field(default=10.0, gt=0)
    #: A REPAIRED gap whose trades are still not all in ``ticks`` after this long is given
    #: up (a warning and ``pipeline_gap_rebuilds_total{outcome="gave_up"}``).
    ticks_wait_s: float = Field(default=900.0, gt=0)
    #: A window is rebuilt once a stored trade of its ticker is ``live.watermark_s`` past
    #: its end (the live engine is done with it), or this long after its end on the wall
    #: clock (a quiet market).
    settle_s: float = Field(default=300.0, ge=0)
    #: Rebuilt candles that ended within this long are published again as corrections
    #: (subscribers may still hold them); 0: none.
    correction_s: float = Field(default=300.0, ge=0)


class RestartConfig(_Section):
    """A failed streaming query restarts from its checkpoint in-process (pipeline/restarts.py).

    Every writer survives a replayed micro-batch (README "Exactly once per writer"),
    so a restart loses and duplicates nothing; only a query that keeps failing
    stops the process (exit 1, for a supervisor to see).
    """

    #: Restarts of one query allowed within ``window_s``; its next failure there gives up.
    max_restarts: int = Field(default=5, ge=0)
    window_s: float = Field(default=300.0, gt=0)
    #: Wait before a restart: initial, doubled per earlier failure in the window, capped.
    #: 1, 2, 4, 8, 16 s: five restarts spread over 31 s plus the failing batches' own time.
    backoff_initial_s: float = Field(default=1.0, ge=0)
    backoff_max_s: float = Field(default=60.0, ge=0)


class SparkConfig(_Section):
    #: Ignored under spark-submit, where --master decides.
    master: str = "local[*]"
    app_name: str = "spark-pipeline"
    #: Jars for spark.jars (Kafka source, Iceberg runtime, AWS bundle); see README.
    jars: list[str] = Field(default_factory=list)
    #: Every ``*.jar`` in this directory is added to ``jars`` (e.g. ``.cache/spark``).
    jars_dir: str | None = None
    driver_memory: str = "2g"
    #: A driver we start keeps its scratch (spark.local.dir: the jars it serves, block
    #: files) in ``driver-<pid>`` here; a start removes the scratch of dead drivers.
    scratch_dir: str = ".state/spark-pipeline/scratch"
    #: Fixed by the first run of a stateful query's checkpoint: changing it needs a new one.
    shuffle_partitions: int = Field(default=2, ge=1)
    #: Any other Spark setting, applied last.
    conf: dict[str, str] = Field(default_factory=dict)


class Settings(runtime.FileSettings):
    """Everything the pipeline reads at startup."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid",
    )
    renamed = {
        "kafka.bootstrap": "kafka.bootstrap_servers",
        "kafka.ohlc_batches_topic": "kafka.topic_ohlc_batches",
        "kafka.ticks_topic": "kafka.topic_ticks",
        "kafka.create_topics": "kafka.ensure_topics",
        "kafka.topic_replication": "kafka.replication_factor",
        "cep.trigger_topic": "kafka.topic_cep_triggers",
    }
    retired = {
        **{
            f"live.{key}": "live candles are the live engine's (pipeline/live_engine.py)"
            for key in (
                "close_mode",
                "publisher",
                "publish_trigger_s",
                "candle_update_trigger_s",
                "candle_close_trigger_s",
            )
        },
        **{
            f"cep.{key}": "CEP runs in the live engine, not in a Spark query (docs/cep.md)"
            for key in ("trigger_s", "max_offsets_per_trigger")
        },
        "catalog.driver_appends": (
            "one rule picks each append's engine: catalog.driver_append_max_rows "
            "(0: every append a Spark job; docs/adr/0017)"
        ),
    }

    kafka: KafkaConfig = Field(default_factory=KafkaConfig)
    catalog: CatalogConfig = Field(default_factory=CatalogConfig)
    spark: SparkConfig = Field(default_factory=SparkConfig)
    history: HistoryConfig = Field(default_factory=HistoryConfig)
    live: LiveConfig = Field(default_factory=LiveConfig)
    cep: CepConfig = Field(default_factory=CepConfig)
    upkeep: UpkeepConfig = Field(default_factory=UpkeepConfig)
    markets: MarketsConfig = Field(default_factory=MarketsConfig)
    gaps: GapsConfig = Field(default_factory=GapsConfig)
    restart: RestartConfig = Field(default_factory=RestartConfig)
    #: One sub-directory per query; a local path or ``s3a://bucket/prefix`` (the catalog's
    #: S3 store, `session.s3a_conf`). The engine's own and CEP's snapshots and the pending
    #: gap rebuilds go beside them (docs/adr/0022).
    checkpoint_dir: str = ".state/spark-pipeline/checkpoints"
    #: The pipeline's PUB (the relay's XSUB connects here); ``tcp://127.0.0.1:*`` picks a port.
    pub_endpoint: str = f"tcp://*:{contracts.PIPELINE_PUB_PORT}"
    pub_sndhwm: int = Field(default=100_000, ge=0)
    #: PipelineStatus on PIPELINE:status this often; relays refuse history and triggers
    #: after a few seconds without one (docs/protocol.md "Pipeline liveness").
    heartbeat_s: float = Field(default=1.0, gt=0)
    #: If set, a JSON file written once every query runs (bound PUB endpoint, query ids).
    ready_file: str | None = None
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0  # GET /metrics and /healthz; 0 = off (compose: 9562)

    @property
    def enabled_queries(self) -> list[str]:
        names: list[str] = []
        if self.history.enabled:
            names.append("history")
        if self.live.enabled:
            names += ["ticks-persist", "candles-store", "book-store"]
        if self.markets.enabled:
            names.append("markets")
        if self.gaps.enabled:
            names.append("gaps")
        return names

    @property
    def live_group_id(self) -> str:
        return self.live.group_id or f"live-engine.{self.kafka.topic_ticks}"

    def checkpoint_for(self, query: str) -> str:
        return f"{self.checkpoint_dir.rstrip('/')}/{query}"

    def table(self, name: str) -> str:
        """Spark SQL identifier of one of our tables, e.g. ``lake.market.ohlc``."""
        return f"{self.catalog.name}.{self.catalog.namespace}.{name}"


def load_settings(config_path: str | Path | None = None, **overrides: Any) -> Settings:
    """Settings from the YAML at ``config_path`` (or ``$CONFIG_PATH``), env and overrides."""
    return runtime.load_settings(Settings, config_path, **overrides)
