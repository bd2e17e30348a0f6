"""Exchange health (the relay breaker's input): the failure counter, pure, and the
outcomes call_with_retry feeds it."""

from __future__ import annotations

import asyncio

import pytest

from ingestor.errors import RequestFailedError
from ingestor.exchange_calls import FetchEnv, call_with_retry
from ingestor.health import HealthBook
from ingestor.model import ExchangeCallError, FaultKind
from ingestor.retry import RetryPolicy

DOWN = ExchangeCallError(FaultKind.UNAVAILABLE, "503 Service Unavailable")
SLOW = ExchangeCallError(FaultKind.TIMEOUT, "read timed out")
BAD_SYMBOL = ExchangeCallError(FaultKind.BAD_SYMBOL, "unknown symbol FOO/BAR")


def test_unhealthy_after_threshold_failures_in_a_row_with_the_last_error() -> None:
    book = HealthBook(["BINANCE", "COINBASE"], threshold=3)
    assert [book.record("BINANCE", DOWN), book.record("BINANCE", DOWN)] == [False, False]
    assert book.healthy("BINANCE")
    assert book.record("BINANCE", SLOW) is True  # the third in a row flips it
    assert not book.healthy("BINANCE") and book.to_probe(now=0) == ["BINANCE"]
    assert book.record("BINANCE", DOWN) is False  # still unhealthy: no change to report
    binance, coinbase = book.status("ing-1", sent_at_ms=5, interval_ms=2000).exchanges
    assert (binance.exchange, binance.healthy, binance.consecutive_failures) == (
        "BINANCE",
        False,
        4,
    )
    assert (binance.error_code, binance.reason) == (
        "exchange_unavailable",
        "503 Service Unavailable",
    )
    assert (coinbase.healthy, coinbase.consecutive_failures, coinbase.error_code) == (True, 0, "")
    assert "4 failed calls in a row, last exchange_unavailable" in book.describe("BINANCE")


def test_any_answer_resets_the_count_a_permanent_fault_included() -> None:
    book = HealthBook(["BINANCE"], threshold=2)
    book.record("BINANCE", DOWN)
    book.record("BINANCE", None)  # one success between failures: never two in a row
    assert book.record("BINANCE", DOWN) is False and book.healthy("BINANCE")
    assert book.record("BINANCE", DOWN) is True
    assert book.record("BINANCE", BAD_SYMBOL) is True  # the exchange answered: it is up
    assert book.healthy("BINANCE") and book.to_probe(now=0) == []
    status = book.status("ing-1", 0, 2000)
    assert status.exchanges[0].consecutive_failures == 0 and status.exchanges[0].reason == ""
    assert (status.ingestor_id, status.interval_ms) == ("ing-1", 2000)


def test_no_probe_before_the_wait_the_exchange_asked_for() -> None:
    book = HealthBook(["BINANCE"], threshold=1)
    banned = ExchangeCallError(FaultKind.RATE_LIMITED, "418 IP banned", retry_after_s=60)
    assert book.record("BINANCE", banned, now=100.0) is True
    assert book.to_probe(now=159.9) == []  # probing during a ban lengthens it
    assert book.to_probe(now=160.0) == ["BINANCE"]
    book.record("BINANCE", None, now=161.0)
    book.record("BINANCE", DOWN, now=200.0)  # no Retry-After: probe at once
    assert book.to_probe(now=200.0) == ["BINANCE"]


def test_call_with_retry_reports_every_attempt() -> None:
    """Each retried attempt counts, so the breaker opens during one request's retries
    instead of after several requests have each given up (about a minute apiece)."""
    seen: list[FaultKind | None] = []
    outcomes = [DOWN, DOWN, SLOW]

    async def call() -> str:
        if outcomes:
            raise outcomes.pop(0)
        return "ok"

    async def no_wait(_: float) -> None:
        return None

    env = FetchEnv(
        policy=RetryPolicy(max_attempts=5),
        sleep=no_wait,
        rand=lambda: 0.5,
        observe=lambda fault: seen.append(fault.kind if fault else None),
    )
    assert asyncio.run(call_with_retry(call, env, "page")) == "ok"
    assert seen == [FaultKind.UNAVAILABLE, FaultKind.UNAVAILABLE, FaultKind.TIMEOUT, None]

    seen.clear()
    outcomes[:] = [BAD_SYMBOL]
    with pytest.raises(RequestFailedError, match="bad_symbol"):
        asyncio.run(call_with_retry(call, env, "page"))
    assert seen == [FaultKind.BAD_SYMBOL]  # not retried, still observed (and resets health)


# --- Kafka: the other reason an ingestor cannot serve a request ---------------------------


def test_the_status_carries_why_kafka_takes_no_records() -> None:
    book = HealthBook(["BINANCE"], threshold=3)
    assert book.status("ing-1", 0, 2000).kafka_error == ""
    status = book.status("ing-1", 0, 2000, kafka_error="1/1 brokers are down")
    assert status.kafka_error == "1/1 brokers are down"


def test_a_sink_without_a_reachable_broker_reports_it_and_a_probe_does_not_clear_it() -> None:
    from infra.testing import free_port
    from ingestor.config import KafkaSettings
    from ingestor.kafka_sink import KafkaSink

    async def scenario() -> tuple[str | None, int, str | None]:
        changes: list[str | None] = []
        changed = asyncio.Event()

        def on_change() -> None:
            changes.append(sink.problem)
            changed.set()

        settings = KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}", poll_interval_s=0.01)
        sink = KafkaSink(settings, "test", on_change)
        await sink.start()
        try:
            async with asyncio.timeout(20):
                await changed.wait()  # librdkafka says so after its first connect fails
            await sink.probe(timeout_s=0.5)
            return sink.problem, len(changes), changes[0]
        finally:
            await sink.close(timeout_s=0.1)

    problem, changed, first = asyncio.run(scenario())
    assert problem is not None and "brokers are down" in problem, problem
    assert changed == 1 and first == problem  # one change: the relay hears it once


def test_a_background_task_that_dies_turns_the_ingestor_unhealthy() -> None:
    """A crashed status or work-intake task was only logged: the relay would go on
    seeing a subscribed ingestor that never answers, and /healthz said ok."""
    from types import SimpleNamespace
    from typing import Any, cast

    from ingestor import metrics
    from ingestor.app import Ingestor
    from ingestor.config import Settings

    async def scenario() -> list[str]:
        ingestor = Ingestor(Settings(ingestor_id="ing-1"))

        async def status_loop() -> None:
            raise RuntimeError("the DEALER was closed")

        async def probes() -> None:
            return None  # ends normally: not a failure

        ingestor._spawn(status_loop(), "status")
        ingestor._spawn(probes(), "health-probes")
        # Their done callbacks (the app's first) have run once gather returns.
        await asyncio.gather(*list(ingestor._tasks), return_exceptions=True)
        return list(ingestor.failed_tasks)

    assert asyncio.run(scenario()) == ["status"]
    running = SimpleNamespace(
        ready=True, stopping=False, feeds=None, prefixes=["BINANCE:"], ingestor_id="ing-1",
        sink=SimpleNamespace(problem="1/1 brokers are down"), failed_tasks=[],
    )  # fmt: skip
    health = metrics.health(cast(Any, running))
    assert health.ok and health.details["kafka_problem"] == "1/1 brokers are down"
    running.failed_tasks = ["status"]
    health = metrics.health(cast(Any, running))
    assert not health.ok and health.details["failed_tasks"] == ["status"]
