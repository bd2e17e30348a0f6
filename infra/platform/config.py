"""What `make run` starts and where: service ports, exchange source, data dir.

Defaults are the spec's ports (docs/protocol.md); tests use `ServicePorts.free()`.
Environment overrides use the `PLATFORM_` prefix, e.g. `PLATFORM_EXCHANGE=binance`
or `PLATFORM_PORTS__CLIENT_REQUEST=15559`.
"""

from __future__ import annotations

import socket
from contextlib import ExitStack
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from infra.localstack.config import REPO_ROOT
from mdproto import contracts


class ServicePorts(BaseModel):
    """Ports of the services (the stack's own ports live in `infra.localstack.Ports`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ingestor_work: int = contracts.INGESTOR_WORK_PORT
    ingestor_response: int = contracts.INGESTOR_RESPONSE_PORT
    pipeline_pub: int = contracts.PIPELINE_PUB_PORT
    market_data: int = contracts.MARKET_DATA_PORT
    client_request: int = contracts.CLIENT_REQUEST_PORT
    ingestor_control: int = contracts.INGESTOR_CONTROL_PORT
    relay_metrics: int = 9560
    exchange_sim: int = 8765

    @classmethod
    def free(cls) -> ServicePorts:
        """A set of currently free loopback ports (for tests running side by side)."""
        names = list(cls.model_fields)
        with ExitStack() as stack:
            ports = []
            for _ in names:
                sock = stack.enter_context(socket.socket())
                sock.bind(("127.0.0.1", 0))
                ports.append(sock.getsockname()[1])
        return cls(**dict(zip(names, ports, strict=True)))


class PlatformConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PLATFORM_", env_nested_delimiter="__")

    data_dir: Path = REPO_ROOT / ".data"
    ports: ServicePorts = Field(default_factory=ServicePorts)
    #: `simulator`: the bundled exchange simulator; `binance`: the real exchange when
    #: reachable (falls back to the simulator, saying so, when it is not).
    exchange: Literal["simulator", "binance"] = "simulator"
    #: Spark master for the pipeline in local mode.
    spark_master: str = "local[2]"
    #: Seconds each service may take to become ready (Spark needs the most).
    start_timeout_s: float = 300.0
    #: Extra environment for the services, e.g. {"PIPELINE_LIVE__WATERMARK_S": "2"}.
    service_env: dict[str, str] = Field(default_factory=dict)
