"""Ingestor liveness, the exchange breaker and dynamic exchanges.

The pure rule (relay.ingestors.Liveness) with a hand-driven clock, then a running relay
on real sockets with fake ingestors that send IngestorStatus on :5556 (where expiry is
the subject, the relay runs on a clock the test moves: no result depends on how fast
the machine is).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from mdproto.messages import (
    DataRequest,
    ExchangeHealth,
    IngestorStatus,
    OHLCRequest,
    Response,
    Status,
    SubmitHistoricalRequest,
    SubmitResponse,
)
from relay.ingestors import BadStatusError, Liveness, State, Verdict

if TYPE_CHECKING:
    from conftest import FakeClock, RelayFactory, RunningRelay

HOUR = 3_600_000
DOWN = ExchangeHealth(
    exchange="BINANCE",
    healthy=False,
    consecutive_failures=3,
    error_code="exchange_unavailable",
    reason="503 Service Unavailable",
)
UP = ExchangeHealth(exchange="BINANCE", healthy=True)


def status(ingestor_id: str, *health: ExchangeHealth, interval_ms: int = 1000) -> IngestorStatus:
    return IngestorStatus(ingestor_id=ingestor_id, exchanges=health, interval_ms=interval_ms)


def submit(request_id: str, ticker: str = "BINANCE:BTC/USDT") -> SubmitHistoricalRequest:
    return SubmitHistoricalRequest(
        request_id=request_id,
        client_id="c1",
        ticker=ticker,
        period_seconds=60,
        start_time_ms=1_700_000_000_000,
        end_time_ms=1_700_000_000_000 + HOUR,
    )


# --- the rule, pure ---------------------------------------------------------------


def test_a_subscription_alone_serves_until_an_ingestor_reports_the_exchange() -> None:
    live = Liveness(expiry_intervals=3)
    assert live.verdict("BINANCE:", subscribed=False, now=0).error_code == "no_ingestor"
    assert live.verdict("BINANCE:", subscribed=True, now=0).state is State.SERVED  # old ingestor
    live.status(status("a", UP), now=0)
    assert live.verdict("BINANCE:", True, now=3.0) == live.verdict("BINANCE:", True, now=0)
    late = live.verdict("BINANCE:", True, now=3.01)  # three intervals of 1 s without a status
    assert (late.state, late.error_code) == (State.UNSERVED, "no_ingestor")
    assert "3.0 s ago" in late.reason and "BINANCE" in late.reason
    assert live.verdict("COINBASE:", True, now=10).state is State.SERVED  # nobody reports it
    live.unsubscribed("BINANCE:")  # every ingestor of it left: back to trusting subscriptions
    assert live.verdict("BINANCE:", True, now=10).state is State.SERVED


def test_breaker_opens_only_when_every_live_ingestor_reports_the_exchange_unhealthy() -> None:
    live = Liveness(expiry_intervals=3)
    live.status(status("a", DOWN), now=0)
    opened = live.verdict("BINANCE:", True, now=1)
    assert (opened.state, opened.error_code, opened.alive) == (
        State.BREAKER_OPEN,
        "exchange_unavailable",
        1,
    )
    assert "BINANCE" in opened.reason and "a: 3 failed calls" in opened.reason
    assert "503 Service Unavailable" in opened.reason
    live.status(status("b", UP), now=1)
    assert live.verdict("BINANCE:", True, now=2).state is State.SERVED  # b can do it
    assert live.verdict("BINANCE:", True, now=2).alive == 2
    # b dies (no status for 3 intervals) while a still reports the exchange down
    live.status(status("a", DOWN), now=3)
    assert live.verdict("BINANCE:", True, now=4.5).state is State.BREAKER_OPEN
    live.status(status("a", UP), now=5)
    assert live.verdict("BINANCE:", True, now=5).state is State.SERVED


def test_an_exchange_is_refused_while_no_ingestor_of_it_can_write_to_kafka() -> None:
    live = Liveness(expiry_intervals=3)
    cut_off = status("a", UP)
    cut_off.kafka_error = "1/1 brokers are down (kafka:9092)"
    live.status(cut_off, now=0)
    refused = live.verdict("BINANCE:", True, now=1)
    assert (refused.state, refused.error_code) == (State.CANNOT_STORE, "kafka_unavailable")
    assert "no ingestor of BINANCE can write to Kafka" in refused.reason
    assert "a: 1/1 brokers are down (kafka:9092)" in refused.reason
    live.status(status("b", DOWN), now=1)  # b stores, but its exchange is down: the breaker
    assert live.verdict("BINANCE:", True, now=1).state is State.BREAKER_OPEN
    live.status(status("b", UP), now=2)
    assert live.verdict("BINANCE:", True, now=2).state is State.SERVED
    live.status(status("a", UP), now=3)  # a's Kafka is back: both serve
    assert live.verdict("BINANCE:", True, now=3) == Verdict(State.SERVED, alive=2)


@pytest.mark.parametrize(
    "bad",
    [
        status("", UP),
        status("a", ExchangeHealth(exchange="binance")),
        status("a", ExchangeHealth(exchange="BINANCE:")),
    ],
)
def test_unusable_statuses_are_refused(bad: IngestorStatus) -> None:
    with pytest.raises(BadStatusError):
        Liveness(expiry_intervals=3).status(bad, now=0)


def test_ingestors_silent_for_long_are_forgotten_but_the_exchange_stays_unserved() -> None:
    live = Liveness(expiry_intervals=3, forget_after_s=60)
    live.status(status("a", UP), now=0)
    assert live.forget_dead(now=60) == []
    assert live.forget_dead(now=61) == ["a"]
    assert live.verdict("BINANCE:", True, now=61).state is State.UNSERVED  # still hung


# --- a running relay, real sockets -------------------------------------------------


def heard(relay: RunningRelay, count: int) -> None:
    relay.wait_until(
        lambda: relay.sample("relay_ingestor_statuses_total") >= count,
        what=f"{count} IngestorStatus processed",
    )


def test_a_hung_ingestor_leads_to_no_ingestor_after_three_intervals(
    make_relay: RelayFactory, clock: FakeClock
) -> None:
    """SIGSTOP keeps the TCP subscription; only the missing heartbeats tell. On the
    relay's own clock: accepted up to 3 intervals after the last status, refused after."""
    relay = make_relay(clock=clock)
    ingestor = relay.ingestor()
    client = relay.client()
    ingestor.report("ing-1", interval_ms=200)
    heard(relay, 1)  # at 0 s
    assert relay.request(client, submit("r1"), SubmitResponse).status == Status.OK
    assert relay.sample("relay_ingestors_alive", prefix="BINANCE:") == 1

    clock.advance(0.59)  # the ingestor "hangs": no more statuses
    assert relay.request(client, submit("r2"), SubmitResponse).status == Status.OK
    clock.advance(0.02)  # 0.61 s: past 3 x 200 ms
    reply = relay.request(client, submit("r3"), SubmitResponse)
    assert (reply.status, reply.error_code) == (Status.REJECTED, "no_ingestor")
    assert "BINANCE" in reply.reason and "no ingestor of BINANCE is alive" in reply.reason
    assert "0.6 s ago" in reply.reason
    refused = relay.request(client, _legacy("l1"), Response)
    assert (refused.status, refused.error_code) == (Status.REJECTED, "no_ingestor")
    clock.advance(1.0)  # past the next stats turn, where the gauges follow
    relay.wait_until(lambda: relay.sample("relay_exchange_served", prefix="BINANCE:") == 0)
    assert relay.sample("relay_ingestors_alive", prefix="BINANCE:") == 0

    ingestor.report("ing-1", interval_ms=200)  # SIGCONT: it reports again
    heard(relay, 2)
    assert relay.request(client, submit("r4"), SubmitResponse).status == Status.OK
    assert relay.sample("relay_exchange_served", prefix="BINANCE:") == 1


def test_an_ingestor_without_status_is_served_after_a_reporting_one_left(
    make_relay: RelayFactory, clock: FakeClock
) -> None:
    """Compatibility: ingestors that never send IngestorStatus are judged by their
    subscription, also after a reporting ingestor of the exchange came and went."""
    relay = make_relay(clock=clock)
    client = relay.client()
    first = relay.ingestor()
    first.report("new-ingestor", interval_ms=100)
    heard(relay, 1)
    first.work.close()  # it exits: its subscription goes
    relay.wait_until(lambda: relay.sample("relay_exchange_served", prefix="BINANCE:") == 0)
    relay.ingestor()  # an old ingestor: subscribes, never reports
    relay.wait_until(lambda: relay.sample("relay_exchange_served", prefix="BINANCE:") == 1)
    clock.advance(10.0)  # 100 of the first one's intervals: nothing expires
    assert relay.request(client, submit("r1"), SubmitResponse).status == Status.OK


def _legacy(request_id: str) -> OHLCRequest:
    return OHLCRequest(
        request_id=request_id,
        ticker="BINANCE:BTC/USDT",
        period_seconds=60,
        start_time_ms=1_700_000_000_000,
        end_time_ms=1_700_000_000_000 + HOUR,
    )


def test_breaker_opens_on_unhealthy_reports_and_closes_on_a_healthy_one(
    relay: RunningRelay,
) -> None:
    ingestor = relay.ingestor()
    client = relay.client()
    ingestor.report("ing-1", DOWN)
    heard(relay, 1)
    reply = relay.request(client, submit("r1"), SubmitResponse)
    assert (reply.status, reply.error_code) == (Status.REJECTED, "exchange_unavailable")
    assert "exchange BINANCE is failing" in reply.reason
    assert "ing-1" in reply.reason and "503 Service Unavailable" in reply.reason
    legacy = relay.request(client, _legacy("l1"), Response)
    assert (legacy.status, legacy.error_code) == (Status.REJECTED, "exchange_unavailable")
    assert relay.sample("relay_exchange_breaker_open", prefix="BINANCE:") == 1
    assert relay.sample("relay_exchange_served", prefix="BINANCE:") == 1  # alive, exchange down
    assert relay.sample("relay_published_total", kind="historical") == 0
    rejected = relay.sample(
        "relay_rejections_total", type="submit", error_code="exchange_unavailable"
    )
    assert rejected == 1

    second = relay.ingestor()  # a healthy one next to it: served again
    second.report("ing-2", UP)
    heard(relay, 2)
    assert relay.request(client, submit("r2"), SubmitResponse).status == Status.OK
    assert relay.sample("relay_exchange_breaker_open", prefix="BINANCE:") == 0
    assert relay.sample("relay_ingestors_alive", prefix="BINANCE:") == 2

    second.report("ing-2", DOWN)
    heard(relay, 3)
    again = relay.request(client, submit("r3"), SubmitResponse)
    assert again.error_code == "exchange_unavailable"
    ingestor.report("ing-1", UP)  # the exchange came back for ing-1: closes at once
    heard(relay, 4)
    assert relay.request(client, submit("r4"), SubmitResponse).status == Status.OK
    assert relay.sample("relay_exchange_breaker_open", prefix="BINANCE:") == 0


def test_a_malformed_status_is_counted_not_applied(relay: RunningRelay) -> None:
    ingestor = relay.ingestor()
    ingestor.report("", DOWN)
    relay.wait_until(
        lambda: (
            relay.sample("relay_bad_frames_total", socket="ingestor", error_code="bad_status") == 1
        )
    )
    client = relay.client()
    assert relay.request(client, submit("r1"), SubmitResponse).status == Status.OK


# --- dynamic exchanges ---------------------------------------------------------------


def test_without_a_static_list_any_exchange_an_ingestor_serves_is_accepted(
    relay: RunningRelay,
) -> None:
    assert relay.settings.known_exchanges == []  # the default
    client = relay.client()
    unserved = relay.request(client, submit("k1", "KRAKEN:BTC/USD"), SubmitResponse)
    assert (unserved.status, unserved.error_code) == (Status.REJECTED, "no_ingestor")
    assert "KRAKEN" in unserved.reason
    kraken = relay.ingestor("KRAKEN:")
    relay.wait_until(lambda: relay.sample("relay_exchange_served", prefix="KRAKEN:") == 1)
    assert relay.request(client, submit("k2", "KRAKEN:BTC/USD"), SubmitResponse).status == Status.OK
    topic, work = kraken.next_work(DataRequest.HISTORICAL)
    assert (topic, work.request_id) == ("KRAKEN:", "k2")
    relay.subscriber("KRAKEN:BTC/USD|tick")  # live data of a dynamic exchange starts too
    _, live = kraken.next_work(DataRequest.REALTIME)
    assert live.ticker == "KRAKEN:BTC/USD"


def test_a_static_list_still_restricts(make_relay: RelayFactory) -> None:
    relay = make_relay(known_exchanges=["BINANCE"])
    relay.ingestor("KRAKEN:")  # serving it does not make it allowed
    client = relay.client()
    reply = relay.request(client, submit("k1", "KRAKEN:BTC/USD"), SubmitResponse)
    assert (reply.status, reply.error_code) == (Status.REJECTED, "unknown_exchange")
    assert "BINANCE" in reply.reason
