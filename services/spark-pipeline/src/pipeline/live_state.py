"""The live engine's state per ``market.ticks`` partition, where any engine host reads it.

One JSON object per partition, ``<live.state_location>/<group id>/<topic>/<partition>.json``
(default location: the warehouse bucket's ``live-engine/`` prefix, through the
pipeline's own S3 settings), replaced whole by each save (an S3 PUT is atomic; a
local path, for tests and one-host runs, is written and renamed). Why S3 and not a
changelog topic: docs/adr/0014-sharded-live-engine.md. Its shape, values elided:

    {"format": 3, "topic": "market.ticks", "partition": 0, "offset": 1234,
     "candles": {"BINANCE:BTC/USDT": {...TickerCandles.to_dict()...}},
     "recent": [["BINANCE:BTC/USDT", "trade-id"], ...]}

A saved object of another format is ignored with a warning (the partition starts
at ``kafka.starting_offsets``), so a format change never misreads an old one.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from pyarrow import fs

from pipeline.config import Settings

log = logging.getLogger(__name__)

FORMAT = 3
#: The newest dedupe keys saved with a partition: a redelivered trade (an ingestor's
#: reconnect) follows its first copy within seconds, well inside this many.
RECENT_SAVED = 10_000


class StateStoreError(RuntimeError):
    """The state location cannot be used."""


@dataclass
class PartitionState:
    """What a new owner of a ticks partition resumes from."""

    topic: str
    partition: int
    #: The next offset to read.
    offset: int
    #: Each of the partition's tickers' open windows (`TickerCandles.to_dict`).
    candles: dict[str, Any] = field(default_factory=dict)
    #: The newest (ticker, trade id) published, oldest first.
    recent: list[tuple[str, str]] = field(default_factory=list)

    def encode(self) -> bytes:
        body = {
            "format": FORMAT,
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "candles": self.candles,
            "recent": [list(k) for k in self.recent[-RECENT_SAVED:]],
        }
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes, where: str) -> PartitionState | None:
        body = json.loads(data)
        if body.get("format") != FORMAT:
            log.warning("%s: state format %s is not ours: ignored", where, body.get("format"))
            return None
        return cls(
            body["topic"],
            int(body["partition"]),
            int(body["offset"]),
            body["candles"],
            [(str(t), str(i)) for t, i in body["recent"]],
        )


class StateStore:
    """Partition states under one root of a pyarrow file system (S3 or local)."""

    def __init__(self, filesystem: fs.FileSystem, root: str) -> None:
        self._fs = filesystem
        self._root = root.rstrip("/")
        self._local = isinstance(filesystem, fs.LocalFileSystem)

    @classmethod
    def for_settings(cls, settings: Settings) -> StateStore:
        location = settings.live.state_location or _default_location(settings)
        root = f"{location.rstrip('/')}/{settings.live_group_id}"
        parsed = urlparse(root)
        if parsed.scheme == "s3":
            c = settings.catalog
            endpoint = urlparse(c.s3_endpoint)
            s3 = fs.S3FileSystem(
                access_key=c.s3_access_key,
                secret_key=c.s3_secret_key,
                region=c.s3_region,
                endpoint_override=endpoint.netloc or None,
                scheme=endpoint.scheme or "https",
                connect_timeout=c.connect_timeout_s,
                # A state object is a few KB: a store that hangs is given up soon, and
                # the engine's live path (same thread) goes on (`_Run.save`).
                request_timeout=5,
                retry_strategy=fs.AwsStandardS3RetryStrategy(max_attempts=2),
            )
            return cls(s3, f"{parsed.netloc}{parsed.path}")
        if parsed.scheme in ("", "file"):
            return cls(fs.LocalFileSystem(), parsed.path if parsed.scheme else root)
        raise StateStoreError(
            f"live.state_location must be s3:// or a local path, not {location!r}"
        )

    @property
    def root(self) -> str:
        return self._root

    def _path(self, topic: str, partition: int) -> str:
        return f"{self._root}/{topic}/{partition}.json"

    def load(self, topic: str, partition: int) -> PartitionState | None:
        """The partition's saved state, or None (none saved, or another format)."""
        path = self._path(topic, partition)
        try:
            with self._fs.open_input_stream(path) as stream:
                data = stream.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StateStoreError(f"cannot read the live engine's state {path}: {exc}") from exc
        return PartitionState.decode(data, path)

    def save(self, state: PartitionState) -> None:
        path = self._path(state.topic, state.partition)
        data = state.encode()
        try:
            if self._local:
                self._fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
                tmp = f"{path}.tmp"
                with self._fs.open_output_stream(tmp) as out:
                    out.write(data)
                self._fs.move(tmp, path)
            else:
                with self._fs.open_output_stream(path) as out:
                    out.write(data)
        except OSError as exc:
            raise StateStoreError(f"cannot write the live engine's state {path}: {exc}") from exc


def _default_location(settings: Settings) -> str:
    """The warehouse bucket's ``live-engine`` prefix (s3://warehouse/lake -> s3://warehouse/live-engine)."""
    warehouse = urlparse(settings.catalog.warehouse)
    if warehouse.scheme in ("s3", "s3a"):
        return f"s3://{warehouse.netloc}/live-engine"
    return f"{settings.checkpoint_for('live-engine')}/state"
