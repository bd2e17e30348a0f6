"""CEP triggers end to end: register on the relay, ticks from the exchange simulator, events
at the client.

Every test trades XYZ/USDT, the simulator's illiquid symbol (price ~0.5, a
few model trades in ~15 % of minutes), with injected prices and amounts far
from anything the model produces, so model trades can neither fire nor
spoil a trigger. "Does not fire" is shown without sleeping: the trades that
must not fire go first, then one that must; the first FIRED event has to be
the last trade's. Each trigger is registered and its ARMED event awaited
before trading, so the pipeline evaluates it from then on.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from infra.exchange_sim.control import SimulatorControl
from infra.platform.faults import Faults
from mdclient import Client, ClientSettings
from mdclient.triggers import TriggerEvents, TriggerRejected
from mdproto.messages import CEPTriggerEvent

pytestmark = [pytest.mark.e2e, pytest.mark.stack, pytest.mark.spark]

SYMBOL = "XYZ/USDT"
TICKER = f"BINANCE:{SYMBOL}"
FIRED, ARMED = CEPTriggerEvent.FIRED, CEPTriggerEvent.ARMED
EXPIRED, CANCELLED = CEPTriggerEvent.EXPIRED, CEPTriggerEvent.CANCELLED
WAIT_S = 90.0


@pytest.fixture(scope="module")
def client(client_settings: ClientSettings, sim: SimulatorControl) -> Iterator[Client]:
    """One client for the module; its tick subscription keeps XYZ/USDT live."""
    with (
        Client(settings=client_settings, client_id=f"e2e-cep-{uuid.uuid4().hex[:6]}") as c,
        c.live(TICKER, ticks=True),
    ):
        sim.wait_for_subscribers(SYMBOL, count=1, timeout_s=WAIT_S)
        yield c


def trade(sim: SimulatorControl, price: float, qty: float = 1.0) -> int:
    """Inject one trade now; its exchange time in ms."""
    [done] = sim.inject_trades(SYMBOL, [{"price": f"{price}", "qty": f"{qty}"}])
    return int(done["time_ms"])


def wait_for_data_path(client: Client, sim: SimulatorControl) -> None:
    """Until a fresh trade reaches the client: the relay is reconnected to the pipeline."""
    deadline = time.monotonic() + WAIT_S
    with client.live(TICKER, ticks=True) as stream:
        while time.monotonic() < deadline:
            [probe] = sim.inject_trades(SYMBOL, [{"price": "0.6", "qty": "1"}])
            end = time.monotonic() + 2.0
            while time.monotonic() < end:
                message = stream.get(timeout_s=0.5)
                if message is not None and getattr(message, "trade_id", "") == str(probe["id"]):
                    return
    pytest.fail("no trade reached the client after the pipeline restart")


def armed(client: Client, *conditions: str, **options: object) -> TriggerEvents:
    events = client.register_trigger(TICKER, list(conditions), **options)  # type: ignore[arg-type]
    assert events.wait_for(ARMED, WAIT_S) is not None, "the pipeline never armed the trigger"
    return events


def next_fire(events: TriggerEvents) -> CEPTriggerEvent:
    event = events.wait_for(FIRED, WAIT_S)
    assert event is not None, "the trigger did not fire"
    return event


def test_price_above_fires_on_the_crossing_trade_only(
    client: Client, sim: SimulatorControl
) -> None:
    with armed(client, "above:10") as events:
        trade(sim, 5.0)
        trade(sim, 9.99)
        trade(sim, 10.0)  # at the threshold is not above
        crossing = trade(sim, 11.0)
        fire = next_fire(events)
    assert fire.event_time_ms == crossing
    assert fire.values["price"] == 11.0 and fire.values["prev_price"] <= 10.0
    assert fire.final and fire.fire_count == 1


def test_price_below_repeating_fires_on_each_crossing(
    client: Client, sim: SimulatorControl
) -> None:
    with armed(client, "below:0.01", repeating=True) as events:
        trade(sim, 0.02)
        first = trade(sim, 0.005)
        trade(sim, 0.02)  # back above: re-armed
        second = trade(sim, 0.009)
        fires = [next_fire(events), next_fire(events)]
        client.cancel_trigger(events.trigger_id)
        assert events.wait_for(CANCELLED, WAIT_S) is not None
    assert [(f.event_time_ms, f.fire_count, f.final) for f in fires] == [
        (first, 1, False),
        (second, 2, False),
    ]


def test_pct_move_fires_only_past_the_threshold(client: Client, sim: SimulatorControl) -> None:
    with armed(client, "pct:1000@60s") as events:
        trade(sim, 0.5)  # the window's low (model prices stay within 0.46-0.86)
        trade(sim, 2.0)  # at most +335 %
        crossing = trade(sim, 20.0)  # at least +2,200 %
        fire = next_fire(events)
    assert fire.event_time_ms == crossing and fire.values["pct"] >= 1000.0
    assert fire.values["ref_price"] <= 0.5


def test_volume_over_fires_when_the_window_sum_crosses(
    client: Client, sim: SimulatorControl
) -> None:
    with armed(client, "volume:1000000@60s") as events:
        trade(sim, 0.5, 600_000)
        crossing = trade(sim, 0.5, 500_000)
        fire = next_fire(events)
    assert fire.event_time_ms == crossing
    assert 1_100_000 <= fire.values["volume"] < 1_200_000


def test_sequence_needs_the_first_condition_first(client: Client, sim: SimulatorControl) -> None:
    with armed(client, "below:0.01", "above:20", within="30s") as events:
        trade(sim, 5.0)
        trade(sim, 25.0)  # the second condition alone: nothing
        first = trade(sim, 0.005)
        trade(sim, 5.0)
        second = trade(sim, 21.0)
        fire = next_fire(events)
    assert fire.event_time_ms == second
    assert fire.values["first_time_ms"] == first and fire.values["first_price"] == 0.005


def test_expired_and_cancelled_triggers_stay_silent(client: Client, sim: SimulatorControl) -> None:
    expires = int(time.time() * 1000) + 3000
    # No ARMED wait for this one: on a loaded machine the pipeline may first see it
    # after it expired, and then announces EXPIRED at once.
    expiring = client.register_trigger(TICKER, ["above:30"], expires=expires)
    with (
        expiring,
        armed(client, "above:30") as cancelled,
        armed(client, "above:30") as barrier,
    ):
        assert expiring.wait_for(EXPIRED, WAIT_S) is not None, "no EXPIRED event"
        client.cancel_trigger(cancelled.trigger_id)
        assert cancelled.wait_for(CANCELLED, WAIT_S) is not None, "no CANCELLED event"
        trade(sim, 5.0)
        crossing = trade(sim, 31.0)
        assert next_fire(barrier).event_time_ms == crossing
        # Same trade, same micro-batch: anything from the other two is here by now.
        assert expiring.get(timeout_s=1.0) is None
        assert cancelled.get(timeout_s=0.1) is None
    # LIST drops the expired and the cancelled one at once; the fired one-shot once the
    # pipeline's tombstone has reached the relay through Kafka.
    gone = {expiring.trigger_id, cancelled.trigger_id, barrier.trigger_id}
    deadline = time.monotonic() + WAIT_S
    while {r.trigger_id for r in client.list_triggers()} & gone:
        assert time.monotonic() < deadline, "finished triggers are still listed"
        time.sleep(0.2)


def test_a_trigger_alone_keeps_its_ticker_live(client: Client, sim: SimulatorControl) -> None:
    """No subscriber to ETH/USDT: the relay starts its feed for the trigger, and stops it
    (after the grace period) once the trigger is cancelled."""
    with client.register_trigger("BINANCE:ETH/USDT", ["above:10000000"]) as events:
        assert events.wait_for(ARMED, WAIT_S) is not None
        sim.wait_for_subscribers("ETH/USDT", count=1, timeout_s=WAIT_S)
        client.cancel_trigger(events.trigger_id)
        assert events.wait_for(CANCELLED, WAIT_S) is not None
    sim.wait_for_subscribers("ETH/USDT", count=0, timeout_s=WAIT_S)


def test_invalid_trigger_is_rejected_with_a_reason(client: Client) -> None:
    from mdproto.messages import CEPCondition

    bad = CEPCondition(kind=CEPCondition.PCT_MOVE, threshold=5.0)  # no window
    with pytest.raises(TriggerRejected) as info:
        client.register_trigger(TICKER, [bad], check=False)
    assert info.value.error_code == "bad_condition" and "window" in info.value.reason


def test_triggers_survive_a_pipeline_restart(
    faults: Faults, client: Client, sim: SimulatorControl
) -> None:
    with armed(client, "above:40", repeating=True) as events:
        listed = [r.trigger_id for r in client.list_triggers()]
        assert events.trigger_id in listed
        faults.kill("spark-pipeline")
        faults.start("spark-pipeline")  # waits until its queries run
        wait_for_data_path(client, sim)
        trade(sim, 5.0)
        crossing = trade(sim, 41.0)
        fire = next_fire(events)
        client.cancel_trigger(events.trigger_id)
    assert fire.event_time_ms == crossing and fire.fire_count == 1
