"""A micro-batch's record count from Spark's offset log, as Spark writes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.batch_offsets import (
    OffsetLogError,
    batch_records,
    parse_initial_offsets,
    parse_offset_log_entry,
    records_between,
)
from pipeline.blobs import Folder

# Copied from a ticks-persist checkpoint of this pipeline (Spark 4.0.4), conf shortened.
ENTRY = (
    "v1\n"
    '{"batchWatermarkMs":0,"batchTimestampMs":1796034377286,"conf":'
    '{"spark.sql.shuffle.partitions":"2"}}\n'
    '{"market.ticks":{"0":%d,"1":0,"2":0,"3":0,"4":0,"5":%d}}'
)
INITIAL = '\x00v1\n{"market.ticks":{"0":0,"1":0,"2":0,"3":0,"4":0,"5":0}}'


def _checkpoint(tmp_path: Path, entries: list[tuple[int, int]]) -> Path:
    (tmp_path / "offsets").mkdir(parents=True)
    (tmp_path / "sources" / "0").mkdir(parents=True)
    (tmp_path / "sources" / "0" / "0").write_text(INITIAL)
    for batch_id, (p0, p5) in enumerate(entries):
        (tmp_path / "offsets" / str(batch_id)).write_text(ENTRY % (p0, p5))
    return tmp_path


def test_a_batch_reads_from_where_the_one_before_ended(tmp_path: Path) -> None:
    checkpoint = _checkpoint(tmp_path, [(0, 52), (10, 52), (310, 1052)])
    folder = Folder.local(checkpoint)
    assert batch_records(folder, 0) == 52  # from the initial offsets
    assert batch_records(folder, 1) == 10
    assert batch_records(folder, 2) == 300 + 1000


def test_a_partition_new_in_a_batch_counts_from_its_start() -> None:
    start = parse_offset_log_entry(ENTRY % (5, 5))
    end = {**start, ("market.ticks", 6): 40}
    assert records_between(start, end) == 40
    assert parse_initial_offsets(INITIAL)[("market.ticks", 5)] == 0


def test_a_batch_that_was_not_planned_is_an_error(tmp_path: Path) -> None:
    checkpoint = Folder.local(_checkpoint(tmp_path, [(0, 52)]))
    with pytest.raises(OffsetLogError, match="batch 1 was not planned"):
        batch_records(checkpoint, 1)
    (tmp_path / "offsets" / "1").write_text("garbage")
    with pytest.raises(OffsetLogError, match="not an offset log entry"):
        batch_records(checkpoint, 1)


def test_ticks_persist_reads_the_count_where_its_checkpoint_is(tmp_path: Path) -> None:
    """The threshold on: the count of ticks-persist's batches from its own offset log; off:
    none is read."""
    from pipeline.config import load_settings
    from pipeline.live import offset_log_records

    _checkpoint(tmp_path / "ticks-persist", [(7, 3)])
    on = load_settings(None, checkpoint_dir=str(tmp_path))
    count = offset_log_records(on, "ticks-persist")
    assert count is not None and count(0) == 10
    off = load_settings(
        None, checkpoint_dir=str(tmp_path), catalog={"executor_append_min_records": 0}
    )
    assert offset_log_records(off, "ticks-persist") is None
