"""The producer's delivery callbacks: how soon the event loop serves them."""

from __future__ import annotations

from ingestor.kafka_sink import BUSY_POLL_S, poll_delay


def test_acks_are_served_soon_while_records_are_in_flight_and_idly_otherwise() -> None:
    # A request's final marker waits on its rows' acks: no 20 ms poll in between.
    assert poll_delay(in_flight=3, idle_s=0.02) == BUSY_POLL_S < 0.02
    assert poll_delay(in_flight=0, idle_s=0.02) == 0.02
    # A configured interval shorter than the busy one stays the shorter.
    assert poll_delay(in_flight=1, idle_s=0.001) == 0.001
