"""The topic registry: one layout per topic, whatever name a service configures."""

from __future__ import annotations

from mdproto import contracts
from mdproto.runtime.kafka import TOPICS, spec


def test_every_contract_topic_has_one_spec_and_keeps_it_under_another_name() -> None:
    assert set(TOPICS) == {
        contracts.KAFKA_OHLC_BATCHES,
        contracts.KAFKA_TICKS,
        contracts.KAFKA_BOOK,
        contracts.KAFKA_LIVE_CANDLES,
        contracts.KAFKA_LIVE_CORRECTIONS,
        contracts.KAFKA_MARKETS,
        contracts.KAFKA_INGEST_CLAIMS,
        contracts.KAFKA_CEP_TRIGGERS,
        contracts.KAFKA_RECORDING,
    }
    triggers = spec(contracts.KAFKA_CEP_TRIGGERS, "t1.cep")
    assert triggers.name == "t1.cep" and triggers.config["cleanup.policy"] == "compact"
    assert spec(contracts.KAFKA_INGEST_CLAIMS).partitions == 1
    assert spec(contracts.KAFKA_LIVE_CORRECTIONS).partitions == 1  # every engine reads it all
    assert spec(contracts.KAFKA_RECORDING).partitions == contracts.RECORDING_SLOTS
