"""The ticker -> partition rule is librdkafka's consistent_random: CRC-32 of the key
(the standard CRC-32, check value 0xCBF43926 for "123456789") modulo the count. That
the broker-side placement agrees is checked against real Kafka in
services/spark-pipeline/tests/test_stack_live_shards.py."""

from __future__ import annotations

import pytest

from mdproto.partitioning import partition_of


def test_the_rule_is_crc32_modulo_the_partition_count() -> None:
    assert partition_of("123456789", 1 << 31) == 0xCBF43926 % (1 << 31)
    assert partition_of("123456789", 7) == 0xCBF43926 % 7


def test_every_partition_is_reached_and_none_beyond() -> None:
    found = {partition_of(f"BINANCE:C{i}/USDT", 4) for i in range(64)}
    assert found == {0, 1, 2, 3}


def test_a_topic_without_partitions_is_refused() -> None:
    with pytest.raises(ValueError):
        partition_of("BINANCE:BTC/USDT", 0)
