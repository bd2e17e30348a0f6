"""Table upkeep: compact small data files, delete files and manifests; expire old snapshots.

Why: every history request and every live micro-batch commits. Merge-on-read
MERGEs leave position-delete files, small requests leave small data files, and
each commit adds a snapshot and manifests. Without upkeep, storage and the
planning and read time of every scan grow with the number of requests, not
with the data. Iceberg's Spark procedures do the work; this module only
decides what to run, when, and reports it.

Safety: upkeep commits like any writer. A commit that races a streaming
MERGE fails Iceberg's conflict check on one side and is retried (the writers
retry; upkeep waits for its next round). Snapshots younger than
`snapshot_retain_s` stay, so a client can still read the snapshot its
notification names (the SDK falls back to the current one, with a warning).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from pipeline.config import UpkeepConfig
from pipeline.lake import TableNames, pipeline_tables
from pipeline.session import BACKGROUND_POOL

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Step:
    table: str  # namespace.table, as the procedures take it
    action: str  # the procedure: rewrite_data_files, ..., expire_snapshots (see `plan`)
    sql: str


def plan(names: TableNames, cfg: UpkeepConfig, now_ms: int) -> list[Step]:
    """The procedure calls of one round, per table: compact files, then manifests, then
    expire.

    Compaction writes new snapshots; expiring afterwards drops the files it
    replaced in the same round.
    """
    catalog = names.catalog
    cutoff = datetime.fromtimestamp((now_ms - cfg.snapshot_retain_s * 1000) / 1000, tz=UTC)
    older_than = cutoff.strftime("%Y-%m-%d %H:%M:%S.%f")
    steps: list[Step] = []
    # Every table the pipeline writes (markets: every ingestor refresh MERGEs each row
    # again, new updated_at: delete files; gaps likewise, at each change of a gap's state).
    for full in pipeline_tables(names):
        table = full.removeprefix(f"{catalog}.")
        steps += [
            Step(
                table,
                "rewrite_data_files",
                f"CALL {catalog}.system.rewrite_data_files(table => '{table}', options => map("
                f"'min-input-files', '{cfg.min_input_files}', "
                f"'delete-file-threshold', '{cfg.delete_file_threshold}', "
                "'partial-progress.enabled', 'true'))",
            ),
            Step(
                table,
                "rewrite_position_delete_files",
                f"CALL {catalog}.system.rewrite_position_delete_files(table => '{table}', "
                f"options => map('min-input-files', '{cfg.min_input_files}'))",
            ),
            # The rewrites leave their replaced files as DELETED manifest entries and
            # many small manifests: scan planning reads them all until this.
            Step(
                table,
                "rewrite_manifests",
                f"CALL {catalog}.system.rewrite_manifests(table => '{table}')",
            ),
            Step(
                table,
                "expire_snapshots",
                f"CALL {catalog}.system.expire_snapshots(table => '{table}', "
                f"older_than => TIMESTAMP '{older_than}+00:00', "
                f"retain_last => {cfg.retain_last_snapshots})",
            ),
        ]
    return steps


@dataclass(frozen=True, slots=True)
class StepResult:
    step: Step
    ok: bool
    seconds: float
    detail: str  # the procedure's result row, or the error


Report = Callable[[StepResult], None]


class Upkeep:
    """Runs `plan` every `interval_s` on its own thread until stopped."""

    def __init__(
        self,
        spark: SparkSession,
        names: TableNames,
        cfg: UpkeepConfig,
        report: Report | None = None,
    ) -> None:
        self._spark = spark
        self._names = names
        self._cfg = cfg
        self._report = report
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.rounds = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="table-upkeep", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def run_once(self) -> list[StepResult]:
        """One round over every table; a failed step is reported, the round goes on."""
        # A pool of its own (per thread): the streaming queries' tasks are not queued behind it.
        self._spark.sparkContext.setLocalProperty("spark.scheduler.pool", BACKGROUND_POOL)
        results = [self._run(self._spark, step) for step in self._steps()]
        self.rounds += 1
        return results

    def _steps(self) -> Sequence[Step]:
        return plan(self._names, self._cfg, int(time.time() * 1000))

    def _run(self, session: SparkSession, step: Step) -> StepResult:
        started = time.monotonic()
        try:
            rows = session.sql(step.sql).collect()
            result = StepResult(step, True, time.monotonic() - started, _describe(rows))
        except Exception as exc:  # a conflict with a streaming commit: next round
            detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            result = StepResult(step, False, time.monotonic() - started, detail)
        level = logging.INFO if result.ok else logging.WARNING
        log.log(
            level,
            "upkeep %s %s: %s in %.1f s (%s)",
            step.action,
            step.table,
            "done" if result.ok else "failed",
            result.seconds,
            result.detail,
        )
        if self._report is not None:
            self._report(result)
        return result

    def _loop(self) -> None:
        while not self._stop.wait(self._cfg.interval_s):
            try:
                self.run_once()
            except Exception:  # the session itself is gone: the pipeline is stopping
                log.exception("table upkeep round failed")


def _describe(rows: Sequence[object]) -> str:
    if not rows:
        return "nothing to do"
    as_dict = getattr(rows[0], "asDict", None)
    return ", ".join(f"{k}={v}" for k, v in as_dict().items()) if as_dict else str(rows[0])
