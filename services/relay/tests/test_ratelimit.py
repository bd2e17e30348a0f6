"""Per-client token buckets, with an injected clock."""

from __future__ import annotations

from relay.client_requests import TokenBuckets


def test_burst_then_refusal_then_refill() -> None:
    buckets = TokenBuckets(rate=10.0, burst=3, max_keys=100)
    assert [buckets.take(b"a", 0.0)[0] for _ in range(4)] == [True, True, True, False]
    assert buckets.take(b"b", 0.0) == (True, False)  # other clients are unaffected
    assert buckets.take(b"a", 0.05) == (False, False)  # refusal episode already reported
    assert buckets.take(b"a", 0.1)[0]  # 0.1 s at 10/s = one token
    assert not buckets.take(b"a", 0.1)[0]


def test_first_refusal_of_each_episode_is_flagged() -> None:
    buckets = TokenBuckets(rate=1.0, burst=1, max_keys=100)
    assert buckets.take(b"a", 0.0) == (True, False)
    assert buckets.take(b"a", 0.0) == (False, True)
    assert buckets.take(b"a", 0.5) == (False, False)
    assert buckets.take(b"a", 2.0) == (True, False)
    assert buckets.take(b"a", 2.0) == (False, True)


def test_zero_rate_disables_limiting() -> None:
    buckets = TokenBuckets(rate=0.0, burst=1, max_keys=1)
    assert all(buckets.take(b"a", 0.0)[0] for _ in range(1000))
    assert len(buckets) == 0


def test_table_is_bounded_lru() -> None:
    buckets = TokenBuckets(rate=1.0, burst=1, max_keys=2)
    buckets.take(b"a", 0.0)
    buckets.take(b"b", 0.0)
    assert not buckets.take(b"a", 0.0)[0]  # a is empty and now the most recent
    buckets.take(b"c", 0.0)  # evicts b, the least recent
    assert len(buckets) == 2
    assert not buckets.take(b"a", 0.0)[0]  # a was kept: still empty
    assert buckets.take(b"b", 0.0)[0]  # b was forgotten: starts over with a full bucket
