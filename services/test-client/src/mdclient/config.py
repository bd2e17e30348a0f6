"""Client settings: defaults < YAML file < environment (MDCLIENT_*) < explicit overrides.

The YAML file is the one named by `--config` (or `config_path`), else the
`CONFIG_PATH` environment variable, else none. Unknown keys are an error so a
typo never silently falls back to a default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import SettingsConfigDict

from mdclient.errors import ConfigError
from mdproto import contracts
from mdproto.runtime import settings as runtime
from mdproto.runtime.settings import CatalogSettings

NotifyName = Literal["per_client", "per_request"]


class ClientSettings(runtime.FileSettings):
    """Every knob of the SDK and CLI; README "Configuration" lists them with defaults."""

    model_config = SettingsConfigDict(env_prefix="MDCLIENT_", extra="forbid")
    renamed = {"s3_access_key_id": "s3_access_key", "s3_secret_access_key": "s3_secret_key"}

    # Relay (ZeroMQ). An explicit endpoint wins over host + port. Several relays
    # (active/active, docs/protocol.md "Failover and chaining"): comma-separated hosts
    # or endpoints; the client subscribes on all and submits to one at a time.
    relay_host: str = "127.0.0.1"
    request_port: int = Field(default=contracts.CLIENT_REQUEST_PORT, gt=0, lt=65536)
    market_data_port: int = Field(default=contracts.MARKET_DATA_PORT, gt=0, lt=65536)
    request_endpoint: str = ""
    market_data_endpoint: str = ""
    # CURVE (docs/protocol.md, "Security"): both or neither. This client's key pair
    # (a NAME.key_secret from `relay keys generate`; its NAME.key goes on the relay's
    # allow-list) and the relay's public NAME.key. Empty: plain ZMTP (loopback relays).
    curve_secret_key_file: str = ""
    curve_server_key_file: str = ""

    # Identity and notification pattern.
    client_id: str = ""  # empty: a fresh random id per Client
    notify: NotifyName = "per_client"

    # Timeouts and retries.
    connect_timeout_s: float = Field(default=5.0, gt=0)
    submit_timeout_s: float = Field(default=30.0, gt=0)  # spec: REQ/REP 30 s
    # With several relays: a relay silent this long gets the same request resent to the next.
    failover_timeout_s: float = Field(default=2.0, gt=0)
    history_timeout_s: float = Field(default=120.0, gt=0)  # per attempt
    attempts: int = Field(default=3, ge=1)
    subscribe_settle_ms: int = Field(default=25, ge=0)
    legacy_timeout_s: float = Field(default=35.0, gt=0)  # relay waits 30 s for ingestors
    legacy_attempts: int = Field(default=1, ge=1)
    progress_interval_s: float = Field(default=0.2, gt=0)
    live_queue_size: int = Field(default=10_000, ge=1)
    #: `replay_into_live` waits this long at each topic's seam for the store to hold its
    #: first live message: above the pipeline's ticks write interval
    #: (``live.persist_trigger_s``, 60 s) and its commit; then `ReplaySeamTimeout`.
    replay_seam_timeout_s: float = Field(default=120.0, gt=0)
    # A gap's closed candles are read from Iceberg this long after it is seen: the
    # pipeline stores a closed candle ~2-3 s after publishing it (docs/protocol.md).
    live_recovery_delay_s: float = Field(default=4.0, ge=0)

    # Iceberg (REST catalog + S3), as `catalog` below. Empty S3 settings: those the
    # catalog hands out (the platform's catalog tells clients its S3 endpoint, region
    # and keys). Flat keys, unlike the services' `catalog:` section: they are the SDK's
    # public names (YAML, MDCLIENT_* and flags).
    catalog_name: str = "rest"
    catalog_uri: str = "http://127.0.0.1:8181"
    warehouse: str = ""
    s3_endpoint: str = ""
    s3_access_key: str = ""
    s3_secret_key: str = ""
    s3_region: str = ""
    ohlc_table: str = contracts.ICEBERG_OHLC
    requests_table: str = contracts.ICEBERG_REQUESTS
    recover_from_table: bool = True  # after a wait times out, ask requests_table first
    markets_table: str = contracts.ICEBERG_MARKETS
    book_snapshots_table: str = contracts.ICEBERG_BOOK_SNAPSHOTS
    book_deltas_table: str = contracts.ICEBERG_BOOK_DELTAS  # `book_at`: the changes between
    #: How far before the asked time `book_at` (and `book_samples` before its start) looks
    #: for a stored snapshot.
    book_lookback_s: float = Field(default=3600.0, gt=0)
    ticks_table: str = contracts.ICEBERG_TICKS  # `recording`: the stored trades
    gaps_table: str = contracts.ICEBERG_GAPS  # `recording`: the recorded markets' gaps
    pin_snapshot: bool = True

    @model_validator(mode="after")
    def _curve_pair(self) -> ClientSettings:
        if bool(self.curve_secret_key_file) != bool(self.curve_server_key_file):
            raise ValueError(
                "curve_secret_key_file and curve_server_key_file go together (this client's "
                "key pair and the relay's public key)"
            )
        return self

    @property
    def request_addresses(self) -> list[str]:
        """Every relay's request endpoint, in the order submits try them."""
        return _endpoints(self.request_endpoint, self.relay_host, self.request_port)

    @property
    def market_data_addresses(self) -> list[str]:
        """Every relay's market-data endpoint (the SUB connects to all)."""
        return _endpoints(self.market_data_endpoint, self.relay_host, self.market_data_port)

    @property
    def request_address(self) -> str:
        return ", ".join(self.request_addresses)

    @property
    def market_data_address(self) -> str:
        return ", ".join(self.market_data_addresses)

    @property
    def catalog(self) -> CatalogSettings:
        """The catalog keys as the section every service reads the catalog with."""
        return CatalogSettings(
            name=self.catalog_name,
            uri=self.catalog_uri,
            warehouse=self.warehouse,
            s3_endpoint=self.s3_endpoint,
            s3_region=self.s3_region,
            s3_access_key=self.s3_access_key,
            s3_secret_key=self.s3_secret_key,
        )

    def catalog_properties(self) -> dict[str, str]:
        """Properties for pyiceberg `load_catalog` (REST catalog, S3 FileIO)."""
        return self.catalog.properties()


def _endpoints(explicit: str, hosts: str, port: int) -> list[str]:
    """`tcp://a:1,tcp://b:1` as given, else one endpoint per comma-separated host."""
    if explicit:
        return [e.strip() for e in explicit.split(",") if e.strip()]
    return [f"tcp://{h.strip()}:{port}" for h in hosts.split(",") if h.strip()]


def load_settings(config_path: str | Path | None = None, **overrides: Any) -> ClientSettings:
    """Settings from the YAML file, the environment and `overrides` (None values skipped)."""
    given = {key: value for key, value in overrides.items() if value is not None}
    try:
        return runtime.load_settings(ClientSettings, config_path, **given)
    except FileNotFoundError as exc:
        raise ConfigError(f"cannot read config file: {exc}") from None
    except ValidationError as exc:
        raise ConfigError(_describe(exc, config_path)) from None
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _describe(exc: ValidationError, path: str | Path | None) -> str:
    where = f" (file {path}, env MDCLIENT_*, or flags)" if path else " (env MDCLIENT_* or flags)"
    problems = "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'config'}: {err['msg']}" for err in exc.errors()
    )
    return f"invalid configuration{where}: {problems}"
