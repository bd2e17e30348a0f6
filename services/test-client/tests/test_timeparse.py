"""Human time and period formats (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mdclient.timeparse import (
    TimeFormatError,
    format_ms,
    format_period,
    parse_period,
    parse_range,
    parse_step_ms,
    parse_time,
    to_ms,
)

NOW = 1_795_170_600_000  # 2026-11-20T10:30:00Z
DAY = 86_400_000


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("now", NOW),
        ("NOW", NOW),
        ("today", NOW - 10 * 3_600_000 - 30 * 60_000),
        ("yesterday", NOW - 10 * 3_600_000 - 30 * 60_000 - DAY),
        ("-24h", NOW - DAY),
        ("-15m", NOW - 15 * 60_000),
        ("-7d", NOW - 7 * DAY),
        ("-1w", NOW - 7 * DAY),
        ("-1h30m", NOW - 90 * 60_000),
        ("+5m", NOW + 5 * 60_000),
        ("-30s", NOW - 30_000),
        ("2026-11-20", 1_795_132_800_000),
        ("2026-11-20T10:00", 1_795_168_800_000),
        ("2026-11-20 10:00", 1_795_168_800_000),
        ("2026-11-20T10:00:30", 1_795_168_830_000),
        ("2026-11-20T10:00Z", 1_795_168_800_000),
        ("2026-11-20T11:00+01:00", 1_795_168_800_000),
        ("2026-11-20T10:00:00.250Z", 1_795_168_800_250),
        ("1795132800000", 1_795_132_800_000),
        ("  -24h ", NOW - DAY),
    ],
)
def test_parse_time(text: str, expected: int) -> None:
    assert parse_time(text, now_ms=NOW) == expected


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        ("", "empty"),
        ("yesterdayish", "cannot read"),
        ("-24", "cannot read"),
        ("-24x", "cannot read"),
        ("1795132800", "epoch seconds"),  # seconds, not ms: refused, not read as 1970
        ("2026-13-01", "cannot read"),
        ("20/11/2026", "cannot read"),
    ],
)
def test_parse_time_rejects_with_a_clear_message(text: str, hint: str) -> None:
    with pytest.raises(TimeFormatError, match=hint):
        parse_time(text, now_ms=NOW)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("60", 60), ("1m", 60), ("5m", 300), ("1h", 3600), ("4H", 14400), ("1d", 86400),
     ("30s", 30), ("1w", 604800), (900, 900)],
)  # fmt: skip
def test_parse_period(text: str | int, seconds: int) -> None:
    assert parse_period(text) == seconds


@pytest.mark.parametrize("text", ["0", "0m", "-1m", "1y", "m", "1.5m", "", 0, -60])
def test_parse_period_rejects(text: str | int) -> None:
    with pytest.raises(TimeFormatError):
        parse_period(text)


@given(st.integers(min_value=1, max_value=10 * 604800))
def test_format_period_round_trips(seconds: int) -> None:
    assert parse_period(format_period(seconds)) == seconds


def test_format_period_is_short() -> None:
    assert [format_period(s) for s in (60, 300, 3600, 86400, 90)] == ["1m", "5m", "1h", "1d", "90s"]


def test_parse_range_is_half_open_and_ordered() -> None:
    assert parse_range("-1h", "now", now_ms=NOW) == (NOW - 3_600_000, NOW)
    with pytest.raises(TimeFormatError, match="not before"):
        parse_range("now", "-1h", now_ms=NOW)
    with pytest.raises(TimeFormatError, match="not before"):
        parse_range("now", "now", now_ms=NOW)


def test_to_ms_accepts_datetimes_ints_and_strings() -> None:
    aware = datetime(2026, 11, 20, 11, 0, tzinfo=timezone(timedelta(hours=1)))
    assert to_ms(aware, now_ms=NOW) == 1_795_168_800_000
    assert to_ms(datetime(2026, 11, 20, 10, 0), now_ms=NOW) == 1_795_168_800_000  # naive = UTC
    assert to_ms(123, now_ms=NOW) == 123
    assert to_ms("-1m", now_ms=NOW) == NOW - 60_000
    with pytest.raises(TimeFormatError):
        to_ms(True, now_ms=NOW)


@given(st.datetimes(min_value=datetime(1980, 1, 1), max_value=datetime(2100, 1, 1)))
def test_format_ms_round_trips_through_parse_time(moment: datetime) -> None:
    ms = int(moment.replace(tzinfo=UTC).timestamp() * 1000)
    assert parse_time(format_ms(ms), now_ms=NOW) == ms


@pytest.mark.parametrize(
    ("text", "ms"), [("100ms", 100), ("250", 250), (" 1s ", 1000), ("5m", 300_000), (7, 7)]
)
def test_a_step_is_milliseconds_or_a_period(text: str | int, ms: int) -> None:
    assert parse_step_ms(text) == ms


@pytest.mark.parametrize("text", ["0", "0ms", "1.5s", "fast", -1])
def test_a_bad_step_is_refused(text: str | int) -> None:
    with pytest.raises(TimeFormatError):
        parse_step_ms(text)
