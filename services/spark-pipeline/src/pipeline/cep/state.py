"""CEP engine snapshots under <checkpoint_dir>/live-engine/cep, one per saved batch id.

The live engine records, with its offsets, the id of the batch whose state it
saved; after a crash it reads again from those offsets with the next id. So the
state to resume from before batch N is the newest snapshot with an id below N:
one written for N or later belongs to records that are read again. Snapshots
are written to a temporary file and renamed (atomic on POSIX), and the last
`keep` are kept. Only local paths (or file: URIs) are supported.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
from pathlib import Path
from urllib.parse import urlparse

from pipeline.cep.engine import Engine

log = logging.getLogger(__name__)

FORMAT = 2
_NAME = re.compile(r"^(\d{20})\.(?P<defs>[0-9a-f]+-\d+)\.snapshot$")


class SnapshotError(RuntimeError):
    """The snapshot directory cannot be used."""


def local_path(location: str) -> Path:
    """A checkpoint location as a local path; other file systems are refused."""
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return Path(parsed.path if parsed.scheme else location)
    raise SnapshotError(
        f"engine snapshots (cep, live) need a local checkpoint_dir, not {location!r} "
        f"({parsed.scheme}:// is not supported)"
    )


def replace_file(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically (a temporary file, fsync, rename)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(path)


class SnapshotStore:
    """`<batch>.<definitions id>.snapshot` (engine state) + `<definitions id>.defs` (specs).

    The specs are written only when the set of triggers changed, so a batch
    with 10,000 unchanged triggers writes only the small state part.
    """

    def __init__(self, directory: Path, *, keep: int = 3) -> None:
        self.directory = directory
        self.keep = max(2, keep)
        directory.mkdir(parents=True, exist_ok=True)

    def _snapshots(self) -> list[tuple[int, str]]:
        found = []
        for entry in self.directory.iterdir():
            match = _NAME.match(entry.name)
            if match:
                found.append((int(match[1]), match["defs"]))
        return sorted(found)

    def _snapshot_path(self, batch_id: int, defs: str) -> Path:
        return self.directory / f"{batch_id:020d}.{defs}.snapshot"

    def _defs_path(self, defs: str) -> Path:
        return self.directory / f"{defs}.defs"

    def save(self, batch_id: int, engine: Engine) -> int:
        """Write the state after `batch_id`; returns the bytes written."""
        defs = engine.definitions_id
        written = 0
        defs_path = self._defs_path(defs)
        if not defs_path.exists():
            data = pickle.dumps(engine.definitions(), 5)
            replace_file(defs_path, data)
            written += len(data)
        state = pickle.dumps({"format": FORMAT, "batch_id": batch_id, "engine": engine}, 5)
        replace_file(self._snapshot_path(batch_id, defs), state)
        written += len(state)
        self._prune(batch_id)
        return written

    def _prune(self, batch_id: int) -> None:
        snapshots = self._snapshots()
        # Ids above this batch are from a run whose Spark checkpoint is gone: stale.
        stale = [s for s in snapshots if s[0] > batch_id]
        old = [s for s in snapshots if s[0] <= batch_id][: -self.keep]
        for snapshot_id, defs in stale + old:
            self._snapshot_path(snapshot_id, defs).unlink(missing_ok=True)
        used = {defs for _, defs in self._snapshots()}
        for entry in self.directory.glob("*.defs"):
            if entry.name[: -len(".defs")] not in used:
                entry.unlink(missing_ok=True)

    def load_before(self, batch_id: int) -> tuple[int, Engine] | None:
        """The newest readable snapshot with an id below `batch_id`, or None."""
        for snapshot_id, defs in reversed(self._snapshots()):
            if snapshot_id >= batch_id:
                continue
            try:
                payload = pickle.loads(self._snapshot_path(snapshot_id, defs).read_bytes())
                engine = payload["engine"]
                if payload.get("format") != FORMAT or not isinstance(engine, Engine):
                    raise ValueError(f"unknown snapshot format {payload.get('format')!r}")
                engine.restore_definitions(pickle.loads(self._defs_path(defs).read_bytes()))
            except Exception as exc:  # a torn or foreign file: try the one before
                log.error("CEP snapshot %d unreadable (%s); trying an older one", snapshot_id, exc)
                continue
            return snapshot_id, engine
        return None
