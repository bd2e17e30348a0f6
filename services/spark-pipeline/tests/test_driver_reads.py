"""The driver reads' pure part: the timestamp values their Iceberg expressions carry."""

from __future__ import annotations

from pipeline.driver_reads import timestamp_value


def test_timestamps_are_iso_strings_exact_to_the_microsecond_at_any_time() -> None:
    # An int below 2**31 would reach Java as an Integer, which Iceberg will not bind.
    assert timestamp_value(60_000_000) == "1970-01-01T00:01:00.000000+00:00"
    assert timestamp_value(0) == "1970-01-01T00:00:00.000000+00:00"
    assert timestamp_value(1_795_132_800_000_001) == "2026-11-20T00:00:00.000001+00:00"
    assert timestamp_value(-1) == "1969-12-31T23:59:59.999999+00:00"
