"""Relay configuration: YAML file at CONFIG_PATH, then RELAY_* environment overrides.

The protocol's relay config file (docs/adr/0005: `bind_address`, the five ports,
`flink_market_data_endpoint`, `request_timeout_secs`, `high_water_mark`) is a
valid config as it stands (its `request_timeout_secs` is read as
`request_timeout_s`, without a warning: the spec's names are not outdated);
every other key has a default. Unknown keys are rejected so a typo is
an error, not a silently ignored setting.

Precedence: environment (`RELAY_<KEY>`, e.g. `RELAY_CLIENT_REQUEST_PORT=15559`,
nested with `__`: `RELAY_KAFKA__BOOTSTRAP_SERVERS`) over the YAML file over the
defaults below, which are also
`services/relay/config.yaml`. A ZeroMQ port of 0 binds an ephemeral port (tests);
a `metrics_port` of 0 disables the HTTP endpoint.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from mdproto import contracts
from mdproto.envelope import DEFAULT_MAX_PAYLOAD
from mdproto.runtime import settings as runtime

DEFAULT_CONFIG_PATH = "/config/config.yaml"
_EXCHANGE = re.compile(r"^[A-Z][A-Z0-9_]*$")

Port = Annotated[int, Field(ge=0, le=65535)]


class KafkaSettings(BaseModel):
    """CEP triggers live in a compacted topic; market metadata is read from another.
    An empty bootstrap keeps the logging sink (triggers are acknowledged but never
    evaluated) and checks no symbols."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bootstrap_servers: str = ""
    topic_cep_triggers: str = contracts.KAFKA_CEP_TRIGGERS
    # Market records (compacted, key ticker): symbols are checked against it; "" = off.
    topic_markets: str = contracts.KAFKA_MARKETS
    topic_partitions: int = Field(default=6, ge=1)  # as the pipeline's (ADR 0014)
    replication_factor: int = Field(default=1, ge=1)


class RelaySettings(runtime.FileSettings):
    model_config = SettingsConfigDict(
        env_prefix="RELAY_", env_nested_delimiter="__", extra="forbid", frozen=True
    )
    aliases = {"request_timeout_secs": "request_timeout_s"}  # the spec's name (spec 000)
    renamed = {
        "realtime_grace_secs": "realtime_grace_s",
        "realtime_refresh_secs": "realtime_refresh_s",
        "stats_interval_secs": "stats_interval_s",
        "trigger_kafka_bootstrap": "kafka.bootstrap_servers",
        "trigger_topic": "kafka.topic_cep_triggers",
        "trigger_topic_partitions": "kafka.topic_partitions",
        "trigger_topic_replication": "kafka.replication_factor",
    }

    # --- the protocol's keys (docs/adr/0005) -----------------------------------
    bind_address: str = "tcp://*"
    client_request_port: Port = contracts.CLIENT_REQUEST_PORT
    market_data_pub_port: Port = contracts.MARKET_DATA_PORT
    ingestor_work_port: Port = contracts.INGESTOR_WORK_PORT
    ingestor_response_port: Port = contracts.INGESTOR_RESPONSE_PORT
    flink_market_data_endpoint: str = f"tcp://127.0.0.1:{contracts.PIPELINE_PUB_PORT}"
    request_timeout_s: float = Field(default=30.0, gt=0)  # legacy sync flow only
    high_water_mark: int = Field(default=10_000, ge=0)  # SNDHWM/RCVHWM of every data socket

    # --- additions --------------------------------------------------------------
    ingestor_control_port: Port = contracts.INGESTOR_CONTROL_PORT  # spec said 5557: taken
    # Extra live engines' XPUBs connect here (`python -m pipeline.engine`, ADR 0014): the
    # XSUB binds it beside its connection to the pipeline, so engines come and go with no
    # relay or client setting. Bound only by a relay that takes the pipeline
    # (flink_market_data_endpoint set). Compose and `make run` set it (5561,
    # contracts.ENGINES_PORT); null: not bound, so a relay started with other ports
    # never collides on it.
    engines_port: Port | None = None
    # Exchange prefixes requests may name; empty = any exchange an ingestor serves.
    known_exchanges: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # An ingestor that sent IngestorStatus is dead after this many of its
    # interval_ms without one (docs/protocol.md, "Ingestor liveness").
    ingestor_expiry_intervals: float = Field(default=3.0, gt=1)
    metrics_host: str = "0.0.0.0"
    metrics_port: Port = 9560  # /metrics and /healthz; 0 disables
    # Client ROUTER :5559. Frames above max_message_size make libzmq drop the
    # connection (no reply possible); payloads above max_request_payload get a
    # `too_large` error reply.
    max_message_size: int = Field(default=1024 * 1024, ge=-1)
    max_request_payload: int = Field(default=64 * 1024, ge=1)
    # Ingestor ROUTER :5556 (legacy DataResponses carry candles).
    ingestor_max_message_size: int = Field(default=2 * DEFAULT_MAX_PAYLOAD, ge=-1)
    ingestor_max_payload: int = Field(default=DEFAULT_MAX_PAYLOAD, ge=1)
    max_pending_requests: int = Field(default=10_000, ge=1)  # legacy pending map bound
    # Live data: cancel a ticker this long after its last subscriber left, and
    # re-announce active tickers this often (PUB loses messages to late joiners).
    realtime_grace_s: float = Field(default=30.0, ge=0)
    realtime_refresh_s: float = Field(default=10.0, gt=0)
    # Live candle periods the pipeline serves (its live.periods): a subscription to
    # `{ticker}|ohlc:{p}` for another p is REFUSED on `{ticker}|status` and starts nothing.
    live_periods: Annotated[list[int], NoDecode] = Field(
        default_factory=lambda: list(contracts.LIVE_PERIODS)
    )
    # LOST/FAILED/REFUSED statuses are published again this often while they hold, so a
    # client that subscribes after another one (no subscription edge reaches the relay) learns them.
    status_repeat_s: float = Field(default=1.0, gt=0)
    # Per-client (ROUTER identity) token bucket on :5559; rate 0 disables it.
    client_rate_limit: float = Field(default=500.0, ge=0)
    client_rate_burst: int = Field(default=1000, ge=1)
    max_tracked_clients: int = Field(default=10_000, ge=1)
    # Accepted history request ids this relay remembers (RequestStatusQuery: "in progress"
    # vs "never seen" until market.requests has the outcome): the newest N, each for at
    # most accepted_ids_s (docs/protocol.md "Request status"). 0 remembers none.
    accepted_ids: int = Field(default=100_000, ge=0)
    accepted_ids_s: float = Field(default=86_400.0, gt=0)
    # Historical request sanity limits.
    max_candles_per_request: int = Field(default=10_000_000, ge=1)
    max_future_ms: int = Field(default=24 * 3600 * 1000, ge=0)
    # ZMTP heartbeats on every socket (0 disables); the XSUB also sends TTL so the
    # pipeline's PUB drops a vanished relay.
    heartbeat_ivl_ms: int = Field(default=1000, ge=0)
    heartbeat_timeout_ms: int = Field(default=5000, ge=0)
    heartbeat_ttl_ms: int = Field(default=10_000, ge=0)
    # Upstream XSUB -> pipeline PUB.
    upstream_reconnect_ivl_ms: int = Field(default=100, ge=0)
    upstream_reconnect_ivl_max_ms: int = Field(default=2000, ge=0)
    # SNDHWM of the XSUB: it bounds how many subscriptions libzmq resends after
    # the upstream reconnects (libzmq #2258); the default of 1000 loses the rest.
    upstream_subscription_hwm: int = Field(default=1_000_000, ge=0)
    # More upstreams for the XSUB: other relays' market-data XPUBs (:5558), which makes
    # this relay a branch of a relay tree (relay/upstream.py). With them,
    # flink_market_data_endpoint may be "" (no pipeline connection of its own).
    upstream_market_data: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # Parents whose :5558 requires CURVE (a tree across sites): this relay's key pair (its
    # NAME.key on the parents' allow-list) and the parents' public NAME.key. The XSUB then
    # speaks CURVE to every upstream, so it takes no pipeline (flink_market_data_endpoint "").
    upstream_curve_secret_key_file: str = ""
    upstream_curve_server_key_file: str = ""
    stats_interval_s: float = Field(default=1.0, gt=0)  # proxy STATISTICS poll
    # History submits and trigger registrations are refused `pipeline_unavailable` when
    # no PipelineStatus heartbeat came from upstream for this long (docs/protocol.md,
    # "Pipeline liveness"); 0 accepts them without one.
    pipeline_heartbeat_timeout_s: float = Field(default=5.0, ge=0)
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    # CURVE on the client sockets :5558/:5559 (relay/curve.py, docs/protocol.md "Security"):
    # on when curve_secret_key_file is set; then curve_client_keys_dir is the allow-list.
    curve_secret_key_file: str = ""  # the relay's NAME.key_secret (`relay keys generate`)
    curve_client_keys_dir: str = ""  # *.key public files of the clients allowed in
    # Where the client ports are reachable when that differs from bind_address (a
    # container's published ports; compose passes MDP_BIND). Beyond loopback the
    # relay refuses to start without CURVE.
    published_host: str = ""

    @field_validator("known_exchanges", "live_periods", "upstream_market_data", mode="before")
    @classmethod
    def _split_list(cls, value: Any) -> Any:
        """Accept a YAML list, a JSON list or `BINANCE,COINBASE` (`60,300`) from the environment."""
        if isinstance(value, str):
            text = value.strip()
            if not text:
                return []
            return json.loads(text) if text.startswith("[") else text.split(",")
        return value

    @field_validator("known_exchanges")
    @classmethod
    def _exchange_names(cls, value: list[str]) -> list[str]:
        names = [name.strip().upper().rstrip(":") for name in value if name.strip()]
        bad = [name for name in names if not _EXCHANGE.match(name)]
        if bad:
            raise ValueError(f"exchange names must look like BINANCE: {bad}")
        return names

    @field_validator("live_periods")
    @classmethod
    def _periods(cls, value: list[int]) -> list[int]:
        if not value or any(p <= 0 for p in value):
            raise ValueError(f"live_periods must be positive seconds, at least one: {value}")
        return sorted(set(value))

    @field_validator("bind_address")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        if "://" not in value:
            raise ValueError(f"{value!r} is not a ZeroMQ endpoint such as tcp://host")
        return value

    @model_validator(mode="after")
    def _upstreams(self) -> RelaySettings:
        bad = [e for e in self.upstreams if "://" not in e]
        if bad:
            raise ValueError(f"upstream endpoints must look like tcp://host:port: {bad}")
        if not self.upstreams:
            raise ValueError(
                "no upstream: set flink_market_data_endpoint (the pipeline) and/or "
                "upstream_market_data (other relays' market-data ports)"
            )
        return self

    @model_validator(mode="after")
    def _upstream_curve(self) -> RelaySettings:
        if bool(self.upstream_curve_secret_key_file) != bool(self.upstream_curve_server_key_file):
            raise ValueError(
                "upstream_curve_secret_key_file and upstream_curve_server_key_file go together "
                "(this relay's key pair and the parent relays' public key)"
            )
        if self.upstream_curve_secret_key_file and self.flink_market_data_endpoint:
            raise ValueError(
                "upstream CURVE applies to every upstream of the XSUB: the pipeline's PUB "
                'speaks plain ZMTP, so set flink_market_data_endpoint to "" (parents only)'
            )
        return self

    @model_validator(mode="after")
    def _curve_pair(self) -> RelaySettings:
        if bool(self.curve_secret_key_file) != bool(self.curve_client_keys_dir):
            raise ValueError(
                "curve_secret_key_file and curve_client_keys_dir go together (CURVE needs "
                "the relay's key pair and an allow-list of client keys)"
            )
        return self

    @property
    def upstreams(self) -> list[str]:
        """Every endpoint the XSUB connects to: the pipeline first, then parent relays."""
        first = [self.flink_market_data_endpoint.strip()] if self.flink_market_data_endpoint else []
        return first + [e.strip() for e in self.upstream_market_data if e.strip()]

    @property
    def curve_on(self) -> bool:
        return bool(self.curve_secret_key_file)

    @classmethod
    def loopback(cls, upstream: str, **overrides: Any) -> RelaySettings:
        """Every ZeroMQ port ephemeral on 127.0.0.1, metrics off: tests and benchmarks.

        No pipeline heartbeat is required unless `pipeline_heartbeat_timeout_s` is
        passed: most such relays face a fake pipeline or none."""
        ports = {name: 0 for name in cls.model_fields if name.endswith("_port")}
        address = {"bind_address": "tcp://127.0.0.1", "flink_market_data_endpoint": upstream}
        return cls(**{**address, **ports, "pipeline_heartbeat_timeout_s": 0, **overrides})

    def endpoint(self, port: int) -> str:
        """Bind endpoint for one of the relay's ports (0 = ephemeral)."""
        return f"{self.bind_address}:{port or '*'}"


def config_path_from_env() -> tuple[Path, bool]:
    """(path, explicit): CONFIG_PATH if set, else the container default."""
    value = os.environ.get("CONFIG_PATH")
    return Path(value or DEFAULT_CONFIG_PATH), bool(value)


def load_settings(path: Path | None = None, *, required: bool = True) -> RelaySettings:
    """Settings from a YAML file plus environment overrides.

    With `required=False` a missing file means the packaged defaults (the
    container default path is optional; an explicit CONFIG_PATH is not).
    """
    return runtime.load_settings(RelaySettings, path, required=required)
