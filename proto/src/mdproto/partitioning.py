"""Which partition of a ticker-keyed Kafka topic holds a ticker: one rule, one home.

Records of ``market.ticks`` and ``market.book`` are keyed by ticker and placed by
librdkafka's ``consistent_random`` partitioner: CRC-32 of the key bytes modulo the
partition count. The ingestor pins that partitioner (its producer settings cannot
change it), and the live engines compute the same rule to decide which engine owns a
ticker before any of its ticks arrived (docs/adr/0014-sharded-live-engine.md: the
owner publishes a CEP trigger's expiry). An engine that sees a ticker's tick on
another partition logs it: the rule and the producer drifted apart.
"""

from __future__ import annotations

import zlib

#: The librdkafka partitioner `partition_of` reproduces (its `partitioner` setting).
PARTITIONER = "consistent_random"


def partition_of(key: str, partitions: int) -> int:
    """The partition a record keyed `key` goes to among `partitions`."""
    if partitions <= 0:
        raise ValueError(f"a topic has at least one partition, not {partitions}")
    return zlib.crc32(key.encode()) % partitions
