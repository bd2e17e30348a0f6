"""The relay's per-exchange word for waiting clients: `ExchangeServing` on
`INGESTORS:{exchange}|status`, served false once no live ingestor of the exchange is
left (docs/protocol.md "Ingestor liveness", requests in flight).

The rule (relay.exchange_serving.ServingReports over relay.ingestors.Liveness) with a
hand-driven clock, then the publication through the adapter, then a real relay and
the SDK whose request's only ingestor (a stand-in speaking its heartbeat protocol)
hangs or dies after the ack: the call ends `no_ingestor` (awaited, never timed; the
time taken is printed, `pytest -s`).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import pytest
import zmq

from mdclient import Client, ClientSettings, IngestorUnavailable
from mdproto import envelope, topics
from mdproto.error_codes import NO_INGESTOR
from mdproto.messages import DataRequest, ExchangeHealth, ExchangeServing, IngestorStatus
from relay import RelaySettings
from relay.exchange_serving import ExchangeServingReports, serving_report
from relay.ingestors import Ingestors, Liveness, State, Verdict
from relay.log_throttle import LogThrottle
from relay.metrics import RelayMetrics

if TYPE_CHECKING:
    from conftest import FakeClock, FakeIngestor, RelayFactory, RunningRelay
    from relay.sockets import Context

UP = ExchangeHealth(exchange="BINANCE", healthy=True)
SICK = ExchangeHealth(exchange="BINANCE", healthy=False, error_code="exchange_unavailable")


def status(ingestor_id: str, health: ExchangeHealth = UP) -> IngestorStatus:
    return IngestorStatus(ingestor_id=ingestor_id, exchanges=[health], interval_ms=2000)


def reported(live: Liveness, now: float) -> ExchangeServing:
    verdict = live.verdict("BINANCE:", subscribed=True, now=now)
    return serving_report("BINANCE:", verdict, wall_ms=int(now * 1000), interval_ms=1000)


def test_an_exchange_never_served_since_start_is_not_reported(
    ctx: Context, clock: FakeClock
) -> None:
    """Nothing was accepted for it here: a report could only end another relay's requests.
    An exchange served for a moment between two refreshes is remembered all the same."""
    ingestors = Ingestors(
        RelaySettings.loopback("tcp://127.0.0.1:9"), RelayMetrics(), LogThrottle(),
        ctx.socket(zmq.XPUB), ctx.socket(zmq.XPUB), clock=clock, wall_ms=lambda: 0,
        wake=lambda: None,
    )  # fmt: skip
    ingestors.on_work_subscription([b"\x01OKX:"])
    ingestors.on_work_subscription([b"\x00OKX:"])  # gone before any status
    assert ingestors.served_once_verdicts(clock.now) == [
        ("OKX:", ingestors.verdicts(clock.now)[0][1])
    ]  # served by its subscription alone, for a moment
    assert ingestors.served_once_verdicts(clock.now)[0][1].error_code == NO_INGESTOR
    ingestors.on_status(status("a", ExchangeHealth(exchange="BYBIT", healthy=True)), clock.now)
    clock.advance(60)  # BYBIT reported, never subscribed: never served
    assert [p for p, _ in ingestors.verdicts(clock.now)] == ["BYBIT:", "OKX:"]
    assert [p for p, _ in ingestors.served_once_verdicts(clock.now)] == ["OKX:"]


def test_served_while_one_ingestor_lives_then_down_once_the_last_goes_silent() -> None:
    live = Liveness(expiry_intervals=3)
    live.status(status("a"), now=0.0)
    live.status(status("b"), now=1.0)
    assert reported(live, now=1.0) == ExchangeServing(
        exchange="BINANCE", served=True, alive=2, sent_at_ms=1000, interval_ms=1000
    )
    # a hangs (silent 6 s: three of its 2 s intervals); b still lives and takes a's claims over
    assert (reported(live, now=6.5).served, reported(live, now=6.5).alive) == (True, 1)
    assert reported(live, now=7.0).served
    down = reported(live, now=7.01)  # b's last status was 6.01 s ago
    assert (down.served, down.alive, down.error_code) == (False, 0, NO_INGESTOR)
    assert down.reason.startswith("relay: no ingestor of BINANCE is alive")
    assert "6.0 s ago" in down.reason
    live.status(status("b"), now=9.0)  # back: served again, the reason gone
    back = reported(live, now=9.0)
    assert (back.served, back.error_code, back.reason) == (True, "", "")


def test_an_ingestor_that_left_its_subscription_is_reported_down_at_once() -> None:
    """A killed ingestor's connection closes: its last subscription goes with it."""
    live = Liveness(expiry_intervals=3)
    live.status(status("a"), now=0.0)
    assert reported(live, now=0.5).served
    live.unsubscribed("BINANCE:")
    gone = serving_report("BINANCE:", live.verdict("BINANCE:", False, now=0.6), 600, 1000)
    assert not gone.served and gone.error_code == NO_INGESTOR
    assert "none is subscribed to its work queue" in gone.reason


def test_an_open_breaker_is_still_served() -> None:
    """A live ingestor ends such a request itself (its ERROR marker): nothing to report."""
    live = Liveness(expiry_intervals=3)
    live.status(status("a", SICK), now=0.0)
    assert live.verdict("BINANCE:", True, now=0.0).state is State.BREAKER_OPEN
    sick = reported(live, now=0.0)
    assert sick.served and sick.alive == 1


def test_the_adapter_publishes_each_exchange_on_its_topic_and_counts_downs() -> None:
    sent: list[list[bytes]] = []

    def publish(frames: list[bytes]) -> bool:
        sent.append(frames)
        return True

    metrics = RelayMetrics()
    reports = ExchangeServingReports(metrics, publish, wall_ms=lambda: 42)
    down = Verdict(State.UNSERVED, 0, NO_INGESTOR, "no ingestor of BINANCE is alive")
    reports.refresh([("BINANCE:", Verdict(State.SERVED, 1)), ("OKX:", Verdict(State.SERVED))])
    reports.refresh([("BINANCE:", down)])
    decoded = [envelope.decode_sub(frames) for frames in sent]
    assert [topic for topic, _ in decoded] == [
        topics.ingestors_status_topic(name) for name in ("BINANCE", "OKX", "BINANCE")
    ]
    assert [m.served for _, m in decoded if isinstance(m, ExchangeServing)] == [True, True, False]
    assert metrics.sample("relay_ingestor_down_reports_total", {"prefix": "BINANCE:"}) == 1


# --- a real relay, the SDK, and the only ingestor stopping after the ack -------------------


class Heartbeats:
    """The stand-in ingestor's IngestorStatus every 200 ms, from a thread that owns its
    DEALER from here on, until `stop` (a hang: the process keeps its connections)."""

    def __init__(self, ingestor: FakeIngestor, ingestor_id: str) -> None:
        self._ingestor = ingestor
        self._id = ingestor_id
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ingestor-status", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(0.2):  # the status interval, not a synchronisation
            self._ingestor.report(self._id, interval_ms=200)

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()


class HistoryCall:
    """One SDK history call against the relay, run on a thread of its own."""

    def __init__(self, relay: RunningRelay) -> None:
        self._settings = ClientSettings(
            request_endpoint=relay.endpoints.client_request,
            market_data_endpoint=relay.endpoints.market_data,
            history_timeout_s=120.0,  # the wait must end long before this
            attempts=1,
            recover_from_table=False,  # no catalog here
        )
        self.error: BaseException | None = None
        self.ended = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sdk-call", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with Client(settings=self._settings) as client:
            try:
                client.history("BINANCE:BTC/USDT", "1m", 1_700_000_000_000, 1_700_003_600_000)
            except BaseException as exc:  # handed to the test thread
                self.error = exc
            self.ended.set()

    def outcome(self) -> IngestorUnavailable:
        assert self.ended.wait(60), "the SDK call did not end"
        self._thread.join()
        assert isinstance(self.error, IngestorUnavailable), self.error
        return self.error


def standin(relay: RunningRelay, ingestor_id: str) -> tuple[FakeIngestor, Heartbeats]:
    """An ingestor of BINANCE the relay counts alive, sending its status every 200 ms."""
    alive = relay.sample("relay_ingestors_alive", prefix="BINANCE:")
    ingestor = relay.ingestor()
    ingestor.report(ingestor_id, interval_ms=200)
    beats = Heartbeats(ingestor, ingestor_id)
    relay.wait_until(
        lambda: relay.sample("relay_ingestors_alive", prefix="BINANCE:") == alive + 1,
        what=f"the relay to count {ingestor_id} alive",
    )
    return ingestor, beats


def stop(ingestor: FakeIngestor, beats: Heartbeats, how: str) -> None:
    """`hangs`: no status any more, connections kept; `dies`: the connections close too."""
    beats.stop()
    if how == "dies":
        for sock in (ingestor.work, ingestor.control, ingestor.dealer):
            sock.close(linger=0)


@pytest.mark.parametrize("how", ["hangs", "dies"])
def test_a_request_in_flight_ends_no_ingestor_when_its_only_ingestor_stops(
    make_relay: RelayFactory, how: str
) -> None:
    relay = make_relay()
    ingestor, beats = standin(relay, "standin")
    call = HistoryCall(relay)
    _, work = ingestor.next_work(DataRequest.HISTORICAL, timeout=30)  # acknowledged, held
    stop(ingestor, beats, how)
    stopped_at = time.monotonic()
    error = call.outcome()
    took_s = time.monotonic() - stopped_at
    assert error.error_code == NO_INGESTOR and error.request_id == work.request_id
    assert "in flight" in error.reason and "relay: no ingestor" in error.reason
    print(f"\nthe only ingestor {how} after the ack: the SDK call ended {took_s:.2f} s later")


def test_while_another_ingestor_serves_the_exchange_nothing_ends(
    make_relay: RelayFactory,
) -> None:
    """The survivor takes the claim over (services/ingestor claims): the call waits on.
    Only once the relay has said "served, 1 alive" after the first one died, and the call
    is still waiting, does the second stop: then it ends."""
    relay = make_relay()
    first, first_beats = standin(relay, "first")
    second, second_beats = standin(relay, "second")
    words = relay.subscriber(topics.ingestors_status_topic("BINANCE"))
    call = HistoryCall(relay)
    first.next_work(DataRequest.HISTORICAL, timeout=30)
    stop(first, first_beats, "dies")
    while True:  # the relay's word once it has seen the first one go
        _, word = envelope.decode_sub(relay.recv(words, timeout=30))
        assert isinstance(word, ExchangeServing) and word.served, word
        if word.alive == 1 and relay.sample("relay_ingestors_alive", prefix="BINANCE:") == 1:
            break
    assert not call.ended.is_set(), call.error  # served by the second: the call waits on
    stop(second, second_beats, "hangs")
    assert call.outcome().error_code == NO_INGESTOR
