"""Ingestor configuration: YAML file at CONFIG_PATH, then INGESTOR_* environment overrides.

Nested keys are overridden with `__`, e.g.
`INGESTOR_KAFKA__BOOTSTRAP_SERVERS=127.0.0.1:9092` or
`INGESTOR_EXCHANGES__BINANCE__API_BASE_URL=http://127.0.0.1:8900`.
`LOG_LEVEL` sets the log level.

API keys are read only from the environment
(`INGESTOR_<CCXT ID>_API_KEY`, `_SECRET`, `_PASSWORD`), held as SecretStr and
never logged; the YAML file cannot carry them (unknown keys are rejected).

A few keys change while running (`runtime_update`, from the relay's CONFIG_UPDATE).
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from ingestor.retry import RetryPolicy
from ingestor.venues import venue_for
from mdproto import contracts
from mdproto.runtime import settings as runtime
from mdproto.runtime.settings import CatalogSettings

log = logging.getLogger(__name__)

#: Kafka topic of ingestor claims (docs/protocol.md); not yet in mdproto.contracts.
KAFKA_INGEST_CLAIMS = contracts.KAFKA_INGEST_CLAIMS

_PREFIX = re.compile(r"^[A-Z][A-Z0-9_]*$")


def _default_ingestor_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ExchangeSettings(_Section):
    """One exchange served by this ingestor, keyed by its ccxt id (`binance`)."""

    # Platform prefix without colon, e.g. BINANCE; None: the venue's (BINANCE,
    # OKX, BYBIT, KRAKEN, COINBASE; the ccxt id in upper case otherwise).
    prefix: str | None = None
    api_base_url: str | None = None  # point every API URL here (simulator), see urls.py
    ws_base_url: str | None = None  # websocket base when it differs from api_base_url
    enable_rate_limit: bool = True
    rate_limit_ms: int | None = None  # ccxt rateLimit override (ms between calls)
    timeout_ms: int = 10_000
    page_limit: int = Field(default=1000, gt=0)  # candles per call (capped by the venue's page cap)
    # Windows of at most page_limit periods per call. None: as the venue needs
    # (ingestor.venues); true forces them; false is refused for venues that
    # return a window's newest candles (it would lose the oldest).
    bounded_pages: bool | None = None
    markets: list[str] = Field(default_factory=list)  # BASE/QUOTE to publish; empty = all
    live: bool = True  # accept REALTIME requests
    # ccxt.pro keeps this many trades per symbol between two watch_trades calls;
    # a burst larger than that between calls loses trades (ccxt's default is 1000).
    trades_cache: int = Field(default=10_000, gt=0)
    # The exchange numbers a symbol's trades 1, 2, 3, ...: a skipped id is a lost trade
    # and marks the next tick `gap_before` (and, recorded, a SKIPPED_IDS gap). False
    # where numeric ids jump on their own: every reconnect and restart is a gap there.
    consecutive_trade_ids: bool = True
    ccxt_options: dict[str, Any] = Field(
        default_factory=lambda: {"fetchMarkets": {"types": ["spot"]}}
    )

    @field_validator("prefix")
    @classmethod
    def _check_prefix(cls, value: str | None) -> str | None:
        if value is not None and not _PREFIX.match(value):
            raise ValueError(f"prefix {value!r} must be upper case like BINANCE (no colon)")
        return value

    @field_validator("api_base_url", "ws_base_url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is not None and "://" not in value:
            raise ValueError(f"{value!r} is not an absolute URL (scheme://host:port)")
        return value


class KafkaSettings(_Section):
    bootstrap_servers: str = "127.0.0.1:9092"
    topic_ohlc_batches: str = contracts.KAFKA_OHLC_BATCHES
    topic_ticks: str = contracts.KAFKA_TICKS
    topic_markets: str = contracts.KAFKA_MARKETS
    topic_book: str = contracts.KAFKA_BOOK
    topic_claims: str = KAFKA_INGEST_CLAIMS
    topic_recording: str = contracts.KAFKA_RECORDING
    ensure_topics: bool = True  # create missing topics at start (claims: one partition)
    topic_partitions: int = 6  # topics it creates, claims excepted; ADR 0014 sizing
    replication_factor: int = 1
    delivery_timeout_s: float = 30.0  # librdkafka message.timeout.ms
    poll_interval_s: float = 0.02  # how often the event loop serves delivery callbacks, idle
    producer: dict[str, str] = Field(default_factory=dict)  # extra librdkafka settings


class HistorySettings(_Section):
    batch_size: int = Field(default=500, gt=0)  # rows per OHLCBatch record
    max_concurrent: int = Field(default=4, gt=0)  # historical requests fetched at once
    page_concurrency: int = Field(default=4, gt=0)  # exchange pages of one request in flight
    legacy_max_candles: int = Field(default=50_000, gt=0)  # cap for an inline DataResponse
    # A period the exchange does not serve: answered with bars the pipeline builds from
    # recorded trades (SOURCE_TRADES) instead of an ERROR unsupported_period (ADR 0015).
    bars_from_trades: bool = True


class RetrySettings(_Section):
    max_attempts: int = Field(default=8, gt=0)
    base_delay_s: float = Field(default=0.5, ge=0)
    max_delay_s: float = Field(default=30.0, ge=0)
    max_retry_after_s: float = Field(default=300.0, ge=0)
    jitter: float = Field(default=0.2, ge=0, le=1)

    def policy(self) -> RetryPolicy:
        return RetryPolicy(
            self.max_attempts,
            self.base_delay_s,
            self.max_delay_s,
            self.max_retry_after_s,
            self.jitter,
        )


class LiveSettings(_Section):
    realtime_lease_s: float = Field(
        default=30.0, gt=0
    )  # stop a feed not re-announced for this long
    sweep_interval_s: float = Field(default=1.0, gt=0)
    dedupe_capacity: int = Field(default=20_000, gt=0)  # trade ids remembered per ticker
    reconnect_base_s: float = Field(default=0.5, ge=0)
    reconnect_max_s: float = Field(default=30.0, ge=0)
    # Failed tries in a row before any data that make a feed FAILED (exchange down).
    start_attempts: int = Field(default=4, ge=1)


class BookSettings(_Section):
    """Order-book feeds (docs/protocol.md "Order books")."""

    depth: int = Field(default=100, gt=0)  # levels per side kept and published
    store_interval_s: float = Field(default=10.0, gt=0)  # a BookSnapshot (reset NONE) this often


class ClaimSettings(_Section):
    enabled: bool = True
    lookback_s: float = Field(default=600.0, gt=0)  # claims read back at start, and kept in memory
    wait_timeout_s: float = Field(default=10.0, gt=0)  # no verdict by then: fetch anyway (harmless)
    heartbeat_s: float = Field(default=1.0, gt=0)  # holder's sign of life for its requests
    # A holder silent this long has its requests taken over (a false alarm costs a refetch).
    takeover_after_s: float = Field(default=4.0, gt=0)
    # A request whose holders died this many times in a row is ended with an ERROR marker.
    max_takeovers: int = Field(default=3, ge=0)


class MarketSettings(_Section):
    refresh_s: float = Field(
        default=3600.0, ge=0
    )  # republish Market records; 0 = only on CONFIG_UPDATE


class HealthSettings(_Section):
    """IngestorStatus to the relay (liveness, and the breaker's input; docs/protocol.md)."""

    status_interval_ms: int = Field(default=2000, ge=0)  # heartbeat period; 0 = send none
    failure_threshold: int = Field(default=3, gt=0)  # failed calls in a row -> unhealthy
    probe_interval_s: float = Field(default=3.0, gt=0)  # probe an unhealthy exchange this often


def _default_exchanges() -> dict[str, ExchangeSettings]:
    return {"binance": ExchangeSettings(prefix="BINANCE")}


class CoverageSettings(_Section):
    """Answer stored ranges from Iceberg: reads `market.requests` (ingestor/coverage.py)."""

    enabled: bool = False  # on in `make run` and compose; off: every range is fetched
    catalog: CatalogSettings = Field(default_factory=CatalogSettings)
    requests_table: str = contracts.ICEBERG_REQUESTS


Channel = Literal["trades", "book"]


class RecordedMarkets(_Section):
    """What to record of one exchange (docs/protocol.md "Recording")."""

    # BASE/QUOTE symbols, or "all": every active spot market the exchange lists.
    markets: list[str] | Literal["all"] = Field(default_factory=list)
    quote: str | None = None  # with "all": only markets quoted in this currency
    # With "all": only the `top` markets by 24 h quote volume (the exchange's tickers,
    # read once at the ingestor's start).
    top: int | None = Field(default=None, gt=0)
    channels: list[Channel] = Field(default_factory=lambda: list[Channel](["trades"]))

    @model_validator(mode="after")
    def _filters_need_all(self) -> RecordedMarkets:
        if self.markets != "all" and (self.quote is not None or self.top is not None):
            raise ValueError("quote and top filter `markets: all`; a list is recorded as given")
        return self


class RepairSettings(_Section):
    """The gap repairer: pages the exchange's trade history (ingestor.repair)."""

    enabled: bool = True
    page_limit: int = Field(default=1000, gt=0)  # trades per call (capped by the venue)
    max_pages: int = Field(default=2000, gt=0)  # one gap's pages before it is left open
    concurrency: int = Field(default=1, gt=0)  # gaps of one exchange repaired at once
    retry_s: float = Field(default=10.0, gt=0)  # an open gap whose repair failed is retried


class RecordingSettings(_Section):
    """Markets recorded whether or not a client subscribes (ingestor.recorder)."""

    # ccxt id -> what to record; an exchange this ingestor does not serve is skipped.
    exchanges: dict[str, RecordedMarkets] = Field(default_factory=dict)
    group_prefix: str = "mdp-recorders"  # consumer group per exchange: {prefix}-{PREFIX}
    # A dead recorder's markets move to another ingestor after this (Kafka's session
    # timeout: the broker's group.min.session.timeout.ms, 6 s by default, is the floor).
    session_timeout_s: float = Field(default=6.0, gt=0)
    checkpoint_interval_s: float = Field(default=1.0, gt=0)  # the newest delivered trade
    repair: RepairSettings = Field(default_factory=lambda: RepairSettings())


class Settings(runtime.FileSettings):
    model_config = SettingsConfigDict(
        env_prefix="INGESTOR_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )
    renamed = {"live.realtime_lease_secs": "live.realtime_lease_s"}

    ingestor_id: str = Field(default_factory=_default_ingestor_id)
    log_level: str = "INFO"  # the LOG_LEVEL variable, when set, wins
    # Several relays (active/active, docs/protocol.md "Failover and chaining"): a YAML
    # list or comma-separated endpoints, relay by relay in the same order for all three.
    relay_work_endpoint: str = f"tcp://127.0.0.1:{contracts.INGESTOR_WORK_PORT}"
    relay_control_endpoint: str = f"tcp://127.0.0.1:{contracts.INGESTOR_CONTROL_PORT}"
    relay_response_endpoint: str = f"tcp://127.0.0.1:{contracts.INGESTOR_RESPONSE_PORT}"
    zmq_heartbeat_ivl_ms: int = 5000  # notice a vanished relay and reconnect
    max_payload_bytes: int = 1024 * 1024  # larger work messages are malformed
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0  # GET /metrics and /healthz; 0 = off (compose: 9561)
    exchanges: dict[str, ExchangeSettings] = Field(default_factory=_default_exchanges)
    # ccxt ids this ingestor serves (`okx,kraken` from the environment); None:
    # every entry of `exchanges`. An id without an `exchanges` entry gets the
    # defaults and its venue's prefix, so INGESTOR_SERVE=okx alone is an OKX
    # ingestor, whatever the file lists.
    serve: Annotated[list[str], NoDecode] | None = None
    kafka: KafkaSettings = Field(default_factory=lambda: KafkaSettings())
    history: HistorySettings = Field(default_factory=lambda: HistorySettings())
    retry: RetrySettings = Field(default_factory=lambda: RetrySettings())
    live: LiveSettings = Field(default_factory=lambda: LiveSettings())
    book: BookSettings = Field(default_factory=lambda: BookSettings())
    claims: ClaimSettings = Field(default_factory=lambda: ClaimSettings())
    market_metadata: MarketSettings = Field(default_factory=lambda: MarketSettings())
    health: HealthSettings = Field(default_factory=lambda: HealthSettings())
    coverage: CoverageSettings = Field(default_factory=lambda: CoverageSettings())
    recording: RecordingSettings = Field(default_factory=lambda: RecordingSettings())

    @field_validator("serve", mode="before")
    @classmethod
    def _split_serve(cls, value: Any) -> Any:
        """Accept a YAML list, a JSON list or `okx,kraken`; an empty string is None."""
        if isinstance(value, str):
            text = value.strip()
            if not text:
                return None
            return json.loads(text) if text.startswith("[") else text.split(",")
        return value

    @field_validator(
        "relay_work_endpoint", "relay_control_endpoint", "relay_response_endpoint", mode="before"
    )
    @classmethod
    def _join_relays(cls, value: Any) -> Any:
        """A YAML list of relays is kept as `a,b` (what the environment gives)."""
        return ",".join(value) if isinstance(value, list) else value

    @model_validator(mode="after")
    def _check_relays(self) -> Settings:
        counts = {len(self.relays(k)) for k in ("work", "control", "response")}
        if counts != {len(self.relays("work"))} or 0 in counts:
            raise ValueError(
                "relay_work_endpoint, relay_control_endpoint and relay_response_endpoint "
                "must name the same relays, in the same order"
            )
        return self

    def relays(self, socket: str) -> list[str]:
        """Every relay's endpoint for one socket: work, control or response."""
        value: str = getattr(self, f"relay_{socket}_endpoint")
        return [e.strip() for e in value.split(",") if e.strip()]

    @model_validator(mode="after")
    def _check_served(self) -> Settings:
        served = self.served()
        if not served:
            raise ValueError("configure at least one exchange")
        prefixes = [e.prefix for e in served.values()]
        if len(set(prefixes)) != len(prefixes):
            raise ValueError(f"two exchanges share a prefix: {prefixes}")
        return self

    def served(self) -> dict[str, ExchangeSettings]:
        """The exchanges to open, by ccxt id, each with its prefix filled in."""
        ids = list(self.exchanges) if self.serve is None else [i.strip() for i in self.serve]
        result = {}
        for exchange_id in filter(None, ids):
            cfg = self.exchanges.get(exchange_id) or ExchangeSettings()
            prefix = cfg.prefix or venue_for(exchange_id).platform_prefix(exchange_id)
            result[exchange_id] = cfg.model_copy(update={"prefix": prefix})
        return result


@dataclass(frozen=True, slots=True)
class RuntimeUpdate:
    """What an `IngestorControl{CONFIG_UPDATE}` changes while running; None: unchanged."""

    batch_size: int | None = None
    realtime_lease_s: float | None = None
    log_level: str | None = None


def runtime_update(config: Mapping[str, str]) -> RuntimeUpdate:
    """The runtime keys of a CONFIG_UPDATE: `batch_size`, `realtime_lease_s` (or its old
    name `realtime_lease_secs`), `log_level`; other keys and bad values are logged and
    ignored (the rest of the settings need a restart)."""
    update: dict[str, Any] = {}
    for key, value in config.items():
        try:
            if key == "batch_size" and int(value) > 0:
                update["batch_size"] = int(value)
            elif key in ("realtime_lease_s", "realtime_lease_secs") and float(value) > 0:
                update["realtime_lease_s"] = float(value)
            elif key == "log_level":
                if value.upper() not in logging.getLevelNamesMapping():
                    raise ValueError(value)
                update["log_level"] = value.upper()
            else:
                log.warning("CONFIG_UPDATE key %r not applied", key)
                continue
            log.info("CONFIG_UPDATE %s=%s applied", key, value)
        except ValueError:
            log.warning("CONFIG_UPDATE %s=%r is not a valid value", key, value)
    return RuntimeUpdate(**update)


def load_settings(**overrides: Any) -> Settings:
    """The YAML file at CONFIG_PATH (if set), then INGESTOR_* variables, then `overrides`."""
    return runtime.load_settings(Settings, **overrides)


class Credentials(BaseModel):
    """API credentials for one exchange, from the environment only."""

    model_config = ConfigDict(frozen=True)

    api_key: SecretStr | None = None
    secret: SecretStr | None = None
    password: SecretStr | None = None

    def ccxt_config(self) -> dict[str, str]:
        pairs = {"apiKey": self.api_key, "secret": self.secret, "password": self.password}
        return {k: v.get_secret_value() for k, v in pairs.items() if v is not None}


def credentials_for(exchange_id: str, environ: Mapping[str, str] | None = None) -> Credentials:
    """INGESTOR_<ID>_API_KEY / _SECRET / _PASSWORD, e.g. INGESTOR_BINANCE_API_KEY."""
    env = os.environ if environ is None else environ
    stem = f"INGESTOR_{exchange_id.upper()}_"

    def get(name: str) -> SecretStr | None:
        value = env.get(stem + name)
        return SecretStr(value) if value else None

    return Credentials(api_key=get("API_KEY"), secret=get("SECRET"), password=get("PASSWORD"))
