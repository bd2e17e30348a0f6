"""Bounded id memory (repeated history requests, replayed trades), without I/O."""

from __future__ import annotations

import pytest

from ingestor.dedupe import RecentIds


def test_recent_ids_dedupes() -> None:
    ids = RecentIds(3)
    assert [ids.add(x) for x in ["a", "b", "a", "c", "b"]] == [True, True, False, True, False]


def test_recent_ids_memory_is_bounded_and_forgets_the_oldest() -> None:
    ids = RecentIds(3)
    for x in "abcd":
        ids.add(x)
    assert len(ids) == 3
    assert ids.add("a")  # forgotten, so new again
    assert not ids.add("d")


def test_recent_ids_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity"):
        RecentIds(0)
