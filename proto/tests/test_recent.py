"""Bounded key memory (replayed trades, repeated requests, Kafka re-deliveries), without I/O."""

from __future__ import annotations

import pytest

from mdproto.recent import RecentKeys


def test_repeats_within_capacity_are_recognised() -> None:
    keys: RecentKeys[str] = RecentKeys(3)
    assert [keys.first_time(x) for x in ["a", "b", "a", "c", "b"]] == [
        True,
        True,
        False,
        True,
        False,
    ]


def test_memory_is_bounded_and_forgets_the_oldest() -> None:
    keys: RecentKeys[tuple[str, str]] = RecentKeys(2)
    assert keys.first_time(("T", "1"))
    assert keys.first_time(("T", "2"))
    assert keys.first_time(("U", "1"))  # evicts ("T", "1")
    assert len(keys) == 2
    assert keys.first_time(("T", "1"))  # forgotten, so new again
    assert not keys.first_time(("U", "1"))


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity"):
        RecentKeys(0)


def test_newest_keys_come_oldest_first() -> None:
    keys = RecentKeys[int](5)
    for k in range(8):
        keys.first_time(k)
    assert keys.newest(3) == [5, 6, 7]
    assert keys.newest(10) == [3, 4, 5, 6, 7] == list(keys)
