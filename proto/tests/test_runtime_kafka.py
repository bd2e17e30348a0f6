"""The topic registry: one layout per topic, whatever name a service configures."""

from __future__ import annotations

from mdproto import contracts
from mdproto.runtime.kafka import TOPICS, consume_ready, spec


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


class FakeConsumer:
    """poll/consume as librdkafka's: consume(n, 0) hands over what is fetched already."""

    def __init__(self, fetched: list[str]) -> None:
        self.fetched = fetched
        self.calls: list[tuple[str, int | None, float]] = []

    def poll(self, timeout: float) -> str | None:
        self.calls.append(("poll", None, timeout))
        return self.fetched.pop(0) if self.fetched else None

    def consume(self, num_messages: int, timeout: float) -> list[str]:
        self.calls.append(("consume", num_messages, timeout))
        taken, self.fetched = self.fetched[:num_messages], self.fetched[num_messages:]
        return taken


def test_consume_ready_waits_for_one_record_then_takes_what_came_with_it() -> None:
    consumer = FakeConsumer(["a", "b", "c", "d"])
    assert consume_ready(consumer, 3, 0.1) == ["a", "b", "c"]
    # Never a consume() that waits: it would wait for all 3 (or the timeout).
    assert consumer.calls == [("poll", None, 0.1), ("consume", 2, 0)]
    assert consume_ready(consumer, 3, 0.1) == ["d"]
    assert consume_ready(consumer, 3, 0.1) == []
    assert consume_ready(FakeConsumer(["x", "y"]), 1, 0.1) == ["x"]


def test_consume_ready_gathers_for_its_window_only_once_a_record_is_there() -> None:
    consumer = FakeConsumer(["a", "b"])
    assert consume_ready(consumer, 100, 0.05, gather_s=0.01) == ["a", "b"]
    assert consume_ready(consumer, 100, 0.05, gather_s=0.01) == []
    assert consumer.calls == [("poll", None, 0.05), ("consume", 99, 0.01), ("poll", None, 0.05)]
