"""The live engine's start-up against what a broker answers right after a topic is
created: a listing without partitions yet (a CI run's pipeline died on it at once)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pipeline.live_engine import _partitions


@dataclass
class _TopicMeta:
    partitions: dict[int, object]
    error: object = None


@dataclass
class _Listing:
    topics: dict[str, _TopicMeta]


@dataclass
class _Consumer:
    """Lists `topic` with no partitions `empty_listings` times, then with three."""

    empty_listings: int
    calls: int = 0

    def list_topics(self, topic: str, timeout: float) -> _Listing:
        self.calls += 1
        parts: dict[int, object] = (
            {} if self.calls <= self.empty_listings else {2: None, 0: None, 1: None}
        )
        return _Listing({topic: _TopicMeta(parts)})


def test_partitions_are_waited_for_until_the_metadata_names_them() -> None:
    consumer = _Consumer(empty_listings=3)
    assert _partitions(consumer, "cep.triggers", timeout_s=10) == [0, 1, 2]
    assert consumer.calls == 4


def test_a_topic_that_never_gets_partitions_fails_with_its_name() -> None:
    with pytest.raises(RuntimeError, match=r"cep\.triggers has no partitions after 0\.3 s"):
        _partitions(_Consumer(empty_listings=10**6), "cep.triggers", timeout_s=0.3)
