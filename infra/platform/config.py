"""What `make run` starts and where: service ports, exchange source, data dir.

Defaults are the spec's ports (docs/protocol.md); tests use `ServicePorts.free()`.
Environment overrides use the `PLATFORM_` prefix, e.g. `PLATFORM_EXCHANGES=okx`,
`PLATFORM_EXCHANGE=real`, `PLATFORM_PORTS__CLIENT_REQUEST=15559`, `PLATFORM_CRASH_LIMIT=5`
or `PLATFORM_LIVENESS_PERIOD_S=5`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from infra.localstack.config import REPO_ROOT, free_ports
from ingestor.venues import venue_for
from mdproto import contracts

#: ccxt ids whose wire format the bundled simulator speaks (infra/exchange_sim).
SIMULATED_EXCHANGES = ("binance", "bybit", "coinbaseexchange", "kraken", "okx")


class ServicePorts(BaseModel):
    """Ports of the services (the stack's own ports live in `infra.localstack.Ports`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ingestor_work: int = contracts.INGESTOR_WORK_PORT
    ingestor_response: int = contracts.INGESTOR_RESPONSE_PORT
    pipeline_pub: int = contracts.PIPELINE_PUB_PORT
    market_data: int = contracts.MARKET_DATA_PORT
    client_request: int = contracts.CLIENT_REQUEST_PORT
    ingestor_control: int = contracts.INGESTOR_CONTROL_PORT
    #: The relay's bound XSUB port for the extra live engines (`LIVE_ENGINES`).
    relay_engines: int = contracts.ENGINES_PORT
    #: Each service's `GET /metrics` and `/healthz` (compose's ports, docs/docker.md).
    relay_metrics: int = 9560
    ingestor_metrics: int = 9561
    pipeline_metrics: int = 9562
    gateway_metrics: int = 9563
    #: Extra live engine 2's (`LIVE_ENGINES`); engine n serves on this + n - 2.
    live_engine_metrics: int = 9564
    exchange_sim: int = 8765
    gateway: int = 8090

    @classmethod
    def free(cls) -> ServicePorts:
        """A set of currently free loopback ports (for tests running side by side)."""
        names = list(cls.model_fields)
        return cls(**dict(zip(names, free_ports(len(names)), strict=True)))


class PlatformConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PLATFORM_", env_nested_delimiter="__")

    data_dir: Path = REPO_ROOT / ".data"
    ports: ServicePorts = Field(default_factory=ServicePorts)
    #: ccxt ids of the exchanges to serve (`okx,kraken`); tickers use each
    #: exchange's prefix (`OKX:BTC/USDT`, see services/ingestor/README.md).
    exchanges: Annotated[list[str], NoDecode] = Field(default_factory=lambda: ["binance"])
    #: `simulator`: the bundled exchange simulator (it speaks Binance, Bybit, Coinbase,
    #: Kraken and OKX);
    #: `real`: the real exchanges when reachable (falling back to the simulator,
    #: saying so, when one is not and the simulator speaks them all);
    #: `binance`: the old name of `real`.
    exchange: Literal["simulator", "real", "binance"] = "simulator"
    #: Markets (BASE/QUOTE) recorded on every served exchange whether or not a client
    #: subscribes, trades and books (docs/protocol.md "Recording"); empty: none.
    #: `PLATFORM_RECORD=BTC/USDT,ETH/USDT` or `PLATFORM_RECORD=` from the environment.
    record: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["BTC/USDT", "ETH/USDT", "SOL/USDT"]
    )
    #: Spark master for the pipeline in local mode.
    spark_master: str = "local[2]"
    #: Seconds each service may take to become ready (Spark needs the most): as the tests'
    #: platforms and the compose start period, since a pipeline restarted on a loaded
    #: machine can need more than 300 s (docs/soak.md, run 1).
    start_timeout_s: float = 600.0
    #: Extra environment for the services, e.g. {"PIPELINE_LIVE__WATERMARK_S": "2"}.
    service_env: dict[str, str] = Field(default_factory=dict)
    #: `run` restarts a component that crashes, unless it crashed `crash_limit` times
    #: within `crash_window_s` seconds: then it stops everything (1: at the first crash).
    crash_limit: int = Field(default=3, ge=1)
    #: Live engine processes in one consumer group (ADR 0014): the pipeline's own (1)
    #: and K-1 more `python -m pipeline.engine` (`make run LIVE_ENGINES=K`).
    live_engines: int = Field(default=1, ge=1)
    crash_window_s: float = Field(default=300.0, gt=0)
    #: ... and one that hangs: each service with a `/healthz` is probed every
    #: `liveness_period_s`; after `liveness_failures` probes in a row without an answer
    #: (within 3 s) it is killed and restarted, counted as a crash (Kubernetes' liveness
    #: defaults: a hang is noticed 20-35 s after it began; infra.platform.liveness).
    liveness_period_s: float = Field(default=10.0, gt=0)
    liveness_failures: int = Field(default=3, ge=1)

    @field_validator("exchanges", mode="before")
    @classmethod
    def _split_exchanges(cls, value: Any) -> Any:
        """Accept a list, a JSON list or `okx,kraken` from the environment."""
        if isinstance(value, str):
            text = value.strip()
            value = json.loads(text) if text.startswith("[") else text.split(",")
        return value

    @field_validator("record", mode="before")
    @classmethod
    def _split_record(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [v.strip() for v in text.split(",") if v.strip()]
        return value

    @field_validator("exchanges")
    @classmethod
    def _some_exchanges(cls, value: list[str]) -> list[str]:
        ids = [v.strip().lower() for v in value if v.strip()]
        if not ids:
            raise ValueError("configure at least one exchange (ccxt ids, e.g. binance,okx)")
        return ids

    @property
    def prefixes(self) -> list[str]:
        """The platform prefixes of `exchanges` (tickers `PREFIX:BASE/QUOTE`)."""
        return [venue_for(i).platform_prefix(i) for i in self.exchanges]

    def not_simulated(self) -> list[str]:
        """The configured exchanges whose wire format the simulator does not speak."""
        return [i for i in self.exchanges if i not in SIMULATED_EXCHANGES]
