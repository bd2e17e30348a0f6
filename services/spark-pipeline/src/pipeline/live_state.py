"""The live engine's state per ``market.ticks`` partition, where any engine host reads it.

One object per partition, ``<live.state_location>/<group id>/<topic>/<partition>.json``
(default location: the warehouse bucket's ``live-engine/`` prefix, through the
pipeline's own S3 settings), replaced whole by each save (a local path, for tests
and one-host runs, is written and renamed). Why S3 and not a changelog topic:
docs/adr/0014-sharded-live-engine.md. Its shape, values elided: a header line, then
the JSON body it describes:

    {"format": 4, "bytes": 5678, "sha256": "<hex of the body>"}
    {"topic": "market.ticks", "partition": 0, "offset": 1234,
     "candles": {"BINANCE:BTC/USDT": {...TickerCandles.to_dict()...}},
     "recent": [["BINANCE:BTC/USDT", "trade-id"], ...],
     "cep": {"BINANCE:BTC/USDT": {...cep Engine.ticker_states()...}}}

The checksum is there because not every S3 store makes a replaced object's GET
atomic: SeaweedFS has served a reader half of an object being written. A read that
does not match its header (`TornState`) is read again a few times; one that never
matches, like an object of another format (format 3 had no header line), is ignored
with a warning and the partition starts at ``kafka.starting_offsets``, so a format
change never misreads an old one.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import orjson
from pyarrow import fs

from pipeline.blobs import S3_SCHEMES, s3_filesystem
from pipeline.config import Settings

log = logging.getLogger(__name__)

FORMAT = 4
#: Reads of an object that does not match its header before it is given up, and the
#: pause between them (a writer's replace takes milliseconds).
READS = 4
REREAD_S = 0.2
#: The newest dedupe keys saved with a partition: a redelivered trade (an ingestor's
#: reconnect) follows its first copy within seconds, well inside this many.
RECENT_SAVED = 10_000


class StateStoreError(RuntimeError):
    """The state location cannot be used."""


class TornState(StateStoreError):  # noqa: N818 (reads as the verdict it is)
    """An object whose body does not match its header: read while being replaced, or
    damaged."""


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
    #: Each of the partition's tickers' CEP state (`cep.engine.Engine.ticker_states`).
    cep: dict[str, Any] = field(default_factory=dict)

    def encode(self) -> bytes:
        """Header line + body. orjson: the body is the JSON `json.dumps` would write
        (tuples as arrays, integer keys as strings), in a fraction of its time."""
        body = orjson.dumps(
            {
                "topic": self.topic,
                "partition": self.partition,
                "offset": self.offset,
                "candles": self.candles,
                "recent": self.recent[-RECENT_SAVED:],
                "cep": self.cep,
            },
            option=orjson.OPT_NON_STR_KEYS,
        )
        header = {"format": FORMAT, "bytes": len(body), "sha256": hashlib.sha256(body).hexdigest()}
        return orjson.dumps(header) + b"\n" + body

    @classmethod
    def decode(cls, data: bytes, where: str) -> PartitionState | None:
        """The state in `data`; None for another format (logged); `TornState` when the
        body does not match its header."""
        first, newline, body = data.partition(b"\n")
        try:
            header = orjson.loads(first)
        except orjson.JSONDecodeError as exc:
            raise TornState(f"{where}: unreadable header ({len(data)} bytes): {exc}") from exc
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            found = header.get("format") if isinstance(header, dict) else None
            log.warning("%s: state format %s is not ours: ignored", where, found)
            return None
        if (
            not newline
            or len(body) != header["bytes"]
            or hashlib.sha256(body).hexdigest() != header["sha256"]
        ):
            raise TornState(f"{where}: body of {len(body)} bytes does not match its header")
        d = orjson.loads(body)
        return cls(
            d["topic"],
            int(d["partition"]),
            int(d["offset"]),
            d["candles"],
            [(str(t), str(i)) for t, i in d["recent"]],
            d["cep"],
        )


class StateStore:
    """Partition states under one root of a pyarrow file system (S3 or local)."""

    def __init__(
        self,
        filesystem: fs.FileSystem,
        root: str,
        *,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._fs = filesystem
        self._sleep = sleep
        self._root = root.rstrip("/")
        self._local = isinstance(filesystem, fs.LocalFileSystem)

    @classmethod
    def for_settings(cls, settings: Settings) -> StateStore:
        location = settings.live.state_location or _default_location(settings)
        root = f"{location.rstrip('/')}/{settings.live_group_id}"
        parsed = urlparse(root)
        if parsed.scheme in S3_SCHEMES:
            s3 = s3_filesystem(settings.catalog, request_timeout_s=5)
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
        """The partition's saved state, or None (none saved, another format, or torn
        at every one of `READS` reads: logged)."""
        path = self._path(topic, partition)
        torn: TornState | None = None
        for attempt in range(READS):
            if attempt:
                log.warning("live engine state read again: %s", torn)
                self._sleep(REREAD_S)  # a writer replacing it is done within milliseconds
            data = self._read(path)
            if data is None:
                return None
            try:
                return PartitionState.decode(data, path)
            except TornState as exc:
                torn = exc
        log.error("live engine state ignored after %d reads: %s", READS, torn)
        return None

    def _read(self, path: str) -> bytes | None:
        try:
            with self._fs.open_input_stream(path) as stream:
                data: bytes = stream.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StateStoreError(f"cannot read the live engine's state {path}: {exc}") from exc
        return data

    def save(self, state: PartitionState) -> int:
        """Write the partition's state; its size in bytes (the engine's state metric)."""
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
        return len(data)


def _default_location(settings: Settings) -> str:
    """The warehouse bucket's ``live-engine`` prefix (s3://warehouse/lake -> s3://warehouse/live-engine)."""
    warehouse = urlparse(settings.catalog.warehouse)
    if warehouse.scheme in ("s3", "s3a"):
        return f"s3://{warehouse.netloc}/live-engine"
    return f"{settings.checkpoint_for('live-engine')}/state"
