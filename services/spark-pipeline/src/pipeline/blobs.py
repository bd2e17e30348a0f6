"""Small objects the pipeline replaces whole, in a local folder or in the S3 store.

Why one module: the live engine's partition states (`live_state`), its own snapshot
and CEP's snapshots (`live_saves.SnapshotFile`, `cep.state.SnapshotStore`) and the
pending gap rebuilds (`gap_rebuilds.PendingFile`) all live under a location that is
either a local path or ``s3://`` / ``s3a://`` (where Spark's checkpoints are). The
S3 client is pyarrow's, built from the pipeline's one set of S3 settings
(``catalog.s3_*``), as Spark's s3a settings are (`session.s3a_conf`).

A local write goes to a temporary file, is fsynced and renamed (atomic on POSIX). An
S3 write is one PUT: the object is replaced whole for readers of AWS S3 and MinIO,
but SeaweedFS has served a reader half of an object being replaced (`live_state`
guards its reads with a checksum; the others are read only at a start, when their one
writer is gone).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Self
from urllib.parse import urlparse

from pyarrow import fs

from pipeline.config import CatalogConfig

#: The schemes of the S3 store: pyarrow's and Hadoop's (Spark's checkpoints) name it so.
S3_SCHEMES = ("s3", "s3a")


class BlobError(RuntimeError):
    """The location cannot be used (an unknown scheme)."""


def is_local(location: str) -> bool:
    """Whether `location` is a local path (or a ``file:`` URI)."""
    return urlparse(location).scheme in ("", "file")


def s3_filesystem(catalog: CatalogConfig, *, request_timeout_s: float = 5.0) -> fs.S3FileSystem:
    """pyarrow's S3 client on the pipeline's S3 store (path-style, the catalog's keys).

    The objects here are small: a store that hangs is given up soon (`request_timeout_s`,
    two attempts), and the caller decides what a failed save means."""
    endpoint = urlparse(catalog.s3_endpoint)
    return fs.S3FileSystem(
        access_key=catalog.s3_access_key,
        secret_key=catalog.s3_secret_key,
        region=catalog.s3_region,
        endpoint_override=endpoint.netloc or None,
        scheme=endpoint.scheme or "https",
        connect_timeout=catalog.connect_timeout_s,
        request_timeout=request_timeout_s,
        retry_strategy=fs.AwsStandardS3RetryStrategy(max_attempts=2),
    )


@dataclass(frozen=True)
class _Place:
    """A path on a pyarrow file system (local, or the S3 store's ``bucket/key``)."""

    filesystem: fs.FileSystem
    path: str

    @classmethod
    def local(cls, path: Path) -> Self:
        return cls(fs.LocalFileSystem(), str(path))

    @property
    def is_local(self) -> bool:
        return isinstance(self.filesystem, fs.LocalFileSystem)

    def _below(self, name: str) -> str:
        return f"{self.path.rstrip('/')}/{name}"


class Folder(_Place):
    """A folder of objects."""

    @classmethod
    def at(cls, location: str, catalog: CatalogConfig) -> Folder:
        """The folder a location names: ``s3://`` or ``s3a://bucket/prefix`` (the
        catalog's S3 store), else a local path."""
        parsed = urlparse(location.rstrip("/"))
        if parsed.scheme in S3_SCHEMES:
            return cls(s3_filesystem(catalog), f"{parsed.netloc}{parsed.path}")
        if parsed.scheme in ("", "file"):
            return cls.local(Path(parsed.path if parsed.scheme else location))
        raise BlobError(f"{location!r}: neither a local path nor s3:// or s3a://")

    def child(self, name: str) -> Blob:
        return Blob(self.filesystem, self._below(name))

    def folder(self, name: str) -> Folder:
        return Folder(self.filesystem, self._below(name))

    def names(self) -> list[str]:
        """The names of the objects directly in this folder (none if it does not exist)."""
        selector = fs.FileSelector(self.path, allow_not_found=True, recursive=False)
        infos = self.filesystem.get_file_info(selector)
        return sorted(i.base_name for i in infos if i.type == fs.FileType.File)


class Blob(_Place):
    """One object, read and replaced whole."""

    def read(self) -> bytes | None:
        """The object's bytes; None if there is none. OSError when the store fails."""
        try:
            with self.filesystem.open_input_stream(self.path) as stream:
                data: bytes = stream.read()
        except FileNotFoundError:
            return None
        return data

    def write(self, data: bytes) -> None:
        """Replace the object whole (locally: temporary file, fsync, rename)."""
        if not self.is_local:
            with self.filesystem.open_output_stream(self.path) as out:
                out.write(data)
            return
        path = Path(self.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(path)

    def exists(self) -> bool:
        found: bool = self.filesystem.get_file_info(self.path).type == fs.FileType.File
        return found

    def delete(self) -> None:
        """Remove the object; none there is no error."""
        with contextlib.suppress(FileNotFoundError):
            self.filesystem.delete_file(self.path)

    def __str__(self) -> str:
        return self.path if self.is_local else f"s3://{self.path}"
