"""Gateway settings: defaults < YAML file (CONFIG_PATH) < GATEWAY_* environment.

The platform side is the SDK's own configuration (`mdclient.ClientSettings`): the
MDCLIENT_* environment, or the mdclient YAML file named by `client_config`.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from mdclient import ClientSettings
from mdproto import contracts, topics
from mdproto.runtime import settings as runtime


class GatewaySettings(runtime.FileSettings):
    model_config = SettingsConfigDict(
        env_prefix="GATEWAY_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    host: str = "127.0.0.1"
    #: Where the port is reachable when that is not `host`: a container listens on
    #: 0.0.0.0 and compose publishes its port on MDP_BIND. When set it decides the
    #: refusal rule, as the relay's `published_host` does.
    published_host: str = ""
    port: int = Field(default=8090, ge=0, le=65535)  # 0: an ephemeral port (tests)
    #: Bearer token every request needs (`Authorization: Bearer ...`, or `?token=` for
    #: browsers' WebSockets); "" = none, allowed only on a loopback host.
    token: str = ""
    #: GET /metrics and /healthz for operators, on a port of their own; 0 = off
    #: (compose: 9563, scraped by the `monitoring` profile's Prometheus).
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(default=0, ge=0, le=65535)
    client_config: str = ""  # an mdclient YAML file; "" = MDCLIENT_* environment only
    history_timeout_s: float = Field(default=120.0, gt=0)  # per attempt (SDK retries)
    history_workers: int = Field(default=4, ge=1)  # history calls served at once
    client_queue_size: int = Field(default=1000, ge=1)  # per WebSocket; oldest dropped
    #: Levels per side of a `{ticker}|book` ladder sent to WebSocket clients.
    book_levels: int = Field(default=20, ge=1, le=1000)
    #: What the page offers in its pickers (any ticker can still be typed in).
    tickers: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["BINANCE:BTC/USDT", "BINANCE:ETH/USDT"]
    )
    periods: Annotated[list[int], NoDecode] = Field(
        default_factory=lambda: list(contracts.LIVE_PERIODS)
    )

    @field_validator("tickers", "periods", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        return value

    @field_validator("tickers")
    @classmethod
    def _tickers(cls, value: list[str]) -> list[str]:
        for ticker in value:
            topics.parse_ticker(ticker)  # ProtocolError is a ValueError: reported by pydantic
        return value

    def exposed_without_token(self) -> bool:
        """The refusal rule (docs/protocol.md "Gateway"): beyond loopback needs a token."""
        return not self.token and not is_loopback(self.published_host or self.host)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load(path: str | Path | None = None, **overrides: Any) -> GatewaySettings:
    return runtime.load_settings(GatewaySettings, path, **overrides)


def client_settings(settings: GatewaySettings) -> ClientSettings:
    """The SDK's settings: its own file (never the gateway's CONFIG_PATH) and MDCLIENT_*."""
    return runtime.load_settings(
        ClientSettings, settings.client_config or None, path_env="MDCLIENT_CONFIG_PATH"
    )
