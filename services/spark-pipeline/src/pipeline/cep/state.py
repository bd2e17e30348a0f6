"""CEP engine snapshots under <checkpoint_dir>/live-engine/cep, one per saved batch id.

The live engine records, with its offsets, the id of the batch whose state it
saved; after a crash it reads again from those offsets with the next id. So the
state to resume from before batch N is the newest snapshot with an id below N:
one written for N or later belongs to records that are read again. Snapshots
are replaced whole (`blobs`: locally a temporary file renamed, atomic on POSIX; on
the S3 store one PUT), and the last `keep` are kept. The folder is local or in
the S3 store, where the checkpoint_dir is (docs/adr/0022).
"""

from __future__ import annotations

import logging
import pickle
import re
from dataclasses import dataclass
from pathlib import Path

from pipeline.blobs import Folder
from pipeline.cep.engine import Engine

log = logging.getLogger(__name__)

FORMAT = 2
_NAME = re.compile(r"^(\d{20})\.(?P<defs>[0-9a-f]+-\d+)\.snapshot$")


@dataclass(frozen=True)
class EngineSnapshot:
    """An engine's state after a batch, encoded; `definitions` None when already stored."""

    batch_id: int
    defs: str
    state: bytes
    definitions: bytes | None


class SnapshotStore:
    """`<batch>.<definitions id>.snapshot` (engine state) + `<definitions id>.defs` (specs).

    The specs are written only when the set of triggers changed, so a batch
    with 10,000 unchanged triggers writes only the small state part.
    """

    def __init__(self, directory: Path | Folder, *, keep: int = 3) -> None:
        self.folder = directory if isinstance(directory, Folder) else Folder.local(directory)
        self.keep = max(2, keep)
        #: The definitions id whose specs are known to be stored (`write`'s).
        self._stored_defs: str | None = None

    def _snapshots(self) -> list[tuple[int, str]]:
        found = []
        for name in self.folder.names():
            match = _NAME.match(name)
            if match:
                found.append((int(match[1]), match["defs"]))
        return sorted(found)

    def _snapshot_name(self, batch_id: int, defs: str) -> str:
        return f"{batch_id:020d}.{defs}.snapshot"

    def save(self, batch_id: int, engine: Engine) -> int:
        """Write the state after `batch_id`; returns the bytes written."""
        return self.write(self.encode(batch_id, engine))

    def encode(self, batch_id: int, engine: Engine) -> EngineSnapshot:
        """The state after `batch_id` as bytes, taken where the engine is not changing
        (the live engine's loop); `write` may then run on another thread. The specs are
        included until a write stored them."""
        defs = engine.definitions_id
        return EngineSnapshot(
            batch_id,
            defs,
            pickle.dumps({"format": FORMAT, "batch_id": batch_id, "engine": engine}, 5),
            None if defs == self._stored_defs else pickle.dumps(engine.definitions(), 5),
        )

    def write(self, snapshot: EngineSnapshot) -> int:
        """Store an encoded snapshot (its specs first), prune; returns the bytes written."""
        written = 0
        defs_blob = self.folder.child(f"{snapshot.defs}.defs")
        if snapshot.definitions is not None and not defs_blob.exists():
            defs_blob.write(snapshot.definitions)
            written += len(snapshot.definitions)
        self._stored_defs = snapshot.defs
        self.folder.child(self._snapshot_name(snapshot.batch_id, snapshot.defs)).write(
            snapshot.state
        )
        written += len(snapshot.state)
        self._prune(snapshot.batch_id)
        return written

    def _prune(self, batch_id: int) -> None:
        snapshots = self._snapshots()
        # Ids above this batch are from a run whose Spark checkpoint is gone: stale.
        stale = [s for s in snapshots if s[0] > batch_id]
        old = [s for s in snapshots if s[0] <= batch_id][: -self.keep]
        for snapshot_id, defs in stale + old:
            self.folder.child(self._snapshot_name(snapshot_id, defs)).delete()
        used = {defs for _, defs in self._snapshots()}
        for name in self.folder.names():
            if name.endswith(".defs") and name[: -len(".defs")] not in used:
                self.folder.child(name).delete()

    def load_before(self, batch_id: int) -> tuple[int, Engine] | None:
        """The newest readable snapshot with an id below `batch_id`, or None. A store
        that cannot be read (OSError: the S3 store away) is no torn file: raised."""
        for snapshot_id, defs in reversed(self._snapshots()):
            if snapshot_id >= batch_id:
                continue
            state = self.folder.child(self._snapshot_name(snapshot_id, defs)).read()
            definitions = self.folder.child(f"{defs}.defs").read()
            try:
                if state is None or definitions is None:
                    raise ValueError("pruned while listed, or its definitions are gone")
                payload = pickle.loads(state)
                engine = payload["engine"]
                if payload.get("format") != FORMAT or not isinstance(engine, Engine):
                    raise ValueError(f"unknown snapshot format {payload.get('format')!r}")
                engine.restore_definitions(pickle.loads(definitions))
            except Exception as exc:  # a torn or foreign file: try the one before
                log.error("CEP snapshot %d unreadable (%s); trying an older one", snapshot_id, exc)
                continue
            return snapshot_id, engine
        return None
