"""The driver's set of recorded request ids: when a miss may skip the table lookup."""

from __future__ import annotations

from pipeline.known_requests import KnownRequests


def test_everything_is_looked_up_until_the_ids_are_read() -> None:
    known = KnownRequests()
    known.added(["r1"])
    assert known.to_look_up(["r1", "r2"]) == ["r1", "r2"]
    assert not known.complete


def test_once_read_only_recorded_ids_are_looked_up() -> None:
    known = KnownRequests()
    known.added(["late"])  # committed while the read ran: the read may not hold it
    known.loaded(["r1"])
    known.added(["r3"])
    assert known.complete
    assert known.to_look_up(["r1", "r2", "r3", "late", "new"]) == ["r1", "r3", "late"]


def test_a_failed_write_makes_every_miss_doubtful_again() -> None:
    known = KnownRequests()
    known.loaded([])
    known.write_failed()
    known.loaded(["r1"])  # a read finishing afterwards does not restore trust
    assert not known.complete
    assert known.to_look_up(["r2"]) == ["r2"]
