"""Configuration of the local platform stack: defaults, YAML file, env overrides.

Precedence (highest first): constructor arguments, ``INFRA_STACK_*`` environment
variables (nested with ``__``, e.g. ``INFRA_STACK_PORTS__KAFKA=19092``), the YAML
file named by ``INFRA_STACK_CONFIG`` (or ``--config``), then the defaults below.
"""

from __future__ import annotations

import os
import random
import socket
import threading
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import SettingsConfigDict

from mdproto.runtime import settings as runtime

REPO_ROOT = Path(__file__).resolve().parents[2]
ENV_PREFIX = "INFRA_STACK_"
CONFIG_FILE_ENV = "INFRA_STACK_CONFIG"
LOOPBACK = "127.0.0.1"
#: Where `free_ports` picks when the kernel's ephemeral range cannot be read.
EPHEMERAL_LOW = 32768
#: How many ports below the ephemeral range `free_ports` picks from.
PICK_SPAN = 12_000
#: ``K/N``: `free_ports` picks only in the K-th of N equal parts of its span. Set per
#: pytest-xdist worker (infra/pytest_plugin.py), so that no two workers ever pick the
#: same port: a check that a port is free says nothing about the port another worker
#: picked a second ago and binds a minute later, when its platform's service starts
#: (seen in CI: two workers' SeaweedFS admin ports).
PORT_SLICE_ENV = "MDP_PORT_SLICE"


def ephemeral_low() -> int:
    """The lowest port the kernel hands out to outgoing connections (Linux: 32768)."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return EPHEMERAL_LOW


def pick_range(high: int, span: int, slice_spec: str | None) -> range:
    """The ports `free_ports` picks from: ``span`` ports below ``high`` (not below 1024),
    narrowed to the ``K/N`` part ``slice_spec`` names (`PORT_SLICE_ENV`)."""
    low = max(1024, high - span)
    if not slice_spec:
        return range(low, high)
    try:
        index, parts = (int(x) for x in slice_spec.split("/"))
    except ValueError:
        raise ValueError(f"{PORT_SLICE_ENV}={slice_spec!r}: expected K/N, e.g. 1/3") from None
    if not 0 <= index < parts:
        raise ValueError(f"{PORT_SLICE_ENV}={slice_spec!r}: K must be in 0..N-1")
    width = (high - low) // parts
    return range(low + index * width, low + (index + 1) * width)


def free_ports(count: int, rng: random.Random | None = None) -> list[int]:
    """``count`` distinct loopback ports free now, picked below the ephemeral range.

    Why not bind port 0: the kernel picks from the ephemeral range, where every
    outgoing connection on the machine also takes its local port. A server's port
    picked there can be taken by any client socket before the server binds it, or
    while a test restarts the server on it (seen: SeaweedFS's admin and gRPC ports
    under parallel test workers). Below the range only servers bind, and parallel
    test workers each pick in their own part of it (`PORT_SLICE_ENV`).

    Within a process the picks walk the part from a random start (``rng``) and never
    hand out a port twice until they have gone round it: a port picked for one
    server and not bound yet is not free to the next call (seen: a platform's relay
    and its stack, picked by two calls, got the same port).
    """
    ports = pick_range(ephemeral_low(), PICK_SPAN, os.environ.get(PORT_SLICE_ENV))
    with _CURSOR_LOCK:
        start = _CURSORS.get(ports)
        if start is None:
            start = (rng or random.SystemRandom()).randrange(len(ports))
        chosen: list[int] = []
        for step in range(len(ports)):
            port = ports[(start + step) % len(ports)]
            if not _bindable(port):
                continue  # a server listens there
            chosen.append(port)
            if len(chosen) == count:
                _CURSORS[ports] = (start + step + 1) % len(ports)
                return chosen
    raise RuntimeError(f"fewer than {count} free ports in {ports.start}-{ports.stop - 1}")


#: Where the next `free_ports` call of this process starts, per range picked from.
_CURSORS: dict[range, int] = {}
_CURSOR_LOCK = threading.Lock()


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


class Ports(BaseModel):
    """Every TCP port the stack listens on (all bound to 127.0.0.1).

    SeaweedFS ``weed mini`` runs master, volume, filer, S3 and admin servers in
    one process, each with an HTTP and a gRPC port; all are pinned here so that
    several stacks can share a machine.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kafka: int = 9092
    kafka_controller: int = 9093
    s3: int = 8333
    catalog: int = 8181
    catalog_db: int = 5433
    weed_s3_grpc: int = 18333
    weed_master: int = 9333
    weed_master_grpc: int = 19333
    weed_volume: int = 9340
    weed_volume_grpc: int = 19340
    weed_filer: int = 8888
    weed_filer_grpc: int = 18888
    weed_admin: int = 23646
    weed_admin_grpc: int = 33646

    @field_validator("*")
    @classmethod
    def _valid_port(cls, v: int) -> int:
        if not 1 <= v <= 65535:
            raise ValueError(f"port {v} is outside 1..65535")
        return v

    def model_post_init(self, __context: Any) -> None:
        values = list(self.model_dump().values())
        dupes = sorted({p for p in values if values.count(p) > 1})
        if dupes:
            raise ValueError(f"ports must be distinct, duplicated: {dupes}")

    @classmethod
    def free(cls) -> Ports:
        """Free loopback ports for every field (tests running side by side): `free_ports`."""
        return cls(**dict(zip(cls.model_fields, free_ports(len(cls.model_fields)), strict=True)))


class KafkaSettings(BaseModel):
    """Broker settings worth changing for a single-node development cluster."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: = the services' kafka.topic_partitions (6: shared evenly by 1, 2, 3 or 6 live
    #: engines, ADR 0014) for topics made by auto-creation.
    num_partitions: int = Field(default=6, ge=1)
    auto_create_topics: bool = True
    # __consumer_offsets partitions: Kafka's 50 slow down the first group join.
    offsets_topic_partitions: int = Field(default=5, ge=1)
    heap: str = "512m"
    extra_properties: dict[str, str] = Field(default_factory=dict)


class StackConfig(runtime.FileSettings):
    """Where the stack keeps its data, which ports it uses, and component knobs."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid",
    )

    data_dir: Path = REPO_ROOT / ".data"
    ports: Ports = Field(default_factory=Ports)
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    s3_access_key: str = "localstack"
    s3_secret_key: str = "localstack-secret"
    s3_region: str = "us-east-1"
    warehouse_bucket: str = "warehouse"
    warehouse_prefix: str = "lake"
    catalog_name: str = "lake"
    catalog_heap: str = "384m"
    # The catalog's PostgreSQL database: its user and password (loopback only).
    catalog_db_user: str = "iceberg"
    catalog_db_password: str = "localstack-catalog"
    # Both JVMs: C1-only JIT and serial GC start ~2x faster on 2 busy cores and
    # use less memory; set to [] for broker throughput benchmarks.
    jvm_options: list[str] = Field(
        default_factory=lambda: ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
    )
    # Artifact cache (None: $INFRA_CACHE_DIR or .cache/ at the repository root).
    cache_dir: Path | None = None
    start_timeout_s: float = Field(default=90.0, gt=0)
    stop_timeout_s: float = Field(default=20.0, gt=0)

    @field_validator("data_dir", "cache_dir")
    @classmethod
    def _absolute(cls, v: Path | None) -> Path | None:
        return None if v is None else v.expanduser().resolve()

    @classmethod
    def load(cls, config_file: Path | None = None, **overrides: Any) -> StackConfig:
        """Build a config from the optional YAML file (or ``$INFRA_STACK_CONFIG``)."""
        return runtime.load_settings(cls, config_file, path_env=CONFIG_FILE_ENV, **overrides)
