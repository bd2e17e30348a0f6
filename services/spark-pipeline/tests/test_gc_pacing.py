"""The live engine's collections: young ones at batch ends, a full one when due."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from pipeline.gc_pacing import MIDDLE_EVERY, YOUNG_LIMIT, GcPacing


@pytest.fixture
def collections() -> Iterator[list[int]]:
    """The generation of every collection that starts while the test runs."""
    seen: list[int] = []

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            seen.append(info["generation"])

    gc.callbacks.append(on_gc)
    yield seen
    gc.callbacks.remove(on_gc)


def test_a_batch_ends_with_a_young_collection_and_every_tenth_with_a_middle_one(
    collections: list[int],
) -> None:
    pacing = GcPacing(full_every_s=60, clock=lambda: 1000.0)
    pacing.start()
    try:
        collections.clear()
        for _ in range(MIDDLE_EVERY):
            pacing.batch_done()
        assert collections == [0] * (MIDDLE_EVERY - 1) + [1]
    finally:
        pacing.stop()


def test_a_full_collection_runs_once_its_period_has_passed(collections: list[int]) -> None:
    now = [1000.0]
    pacing = GcPacing(full_every_s=60, clock=lambda: now[0])
    pacing.start()
    try:
        collections.clear()
        now[0] += 59.9
        pacing.batch_done()
        now[0] += 0.1
        pacing.batch_done()
        pacing.batch_done()
        assert collections == [0, 2, 0]
        assert pacing.full_collections == 1
    finally:
        pacing.stop()


def test_no_automatic_collection_within_a_batch_and_the_process_gets_its_settings_back(
    collections: list[int],
) -> None:
    before = gc.get_threshold()
    pacing = GcPacing(clock=lambda: 1000.0)
    pacing.start()
    try:
        assert gc.get_threshold()[0] == YOUNG_LIMIT
        collections.clear()
        batch = [(i, str(i)) for i in range(YOUNG_LIMIT // 10)]  # a batch's tuples
        assert collections == []
        del batch
    finally:
        pacing.stop()
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
