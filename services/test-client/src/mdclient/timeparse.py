"""Human time and period formats -> epoch milliseconds and seconds (pure).

Accepted times (UTC unless an offset is given):

- ``now``, ``today`` (00:00 UTC), ``yesterday``
- relative to now: ``-24h``, ``-15m``, ``-7d``, ``-1h30m``, ``+5m`` (units s m h d w)
- ISO 8601: ``2026-11-20``, ``2026-11-20T10:00``, ``2026-11-20 10:00:30``,
  ``2026-11-20T10:00Z``, ``2026-11-20T10:00+01:00``
- epoch milliseconds: ``1795132800000`` (digits only; values that look like
  epoch *seconds* are refused rather than silently read as 1970)

Periods: ``60`` (seconds), ``30s``, ``1m``, ``5m``, ``1h``, ``4h``, ``1d``, ``1w``.
Steps (`parse_step_ms`, book samples): ``100ms``, ``250`` (milliseconds), ``1s``, ``5m``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_RELATIVE = re.compile(r"^(?P<sign>[+-])(?P<parts>(?:\d+[smhdw])+)$")
_PART = re.compile(r"(\d+)([smhdw])")
_PERIOD = re.compile(r"^(?P<n>\d+)(?P<unit>[smhdw]?)$")
#: Digits below this are far more likely epoch seconds than ms (1973-03-03).
_MIN_EPOCH_MS = 100_000_000_000


class TimeFormatError(ValueError):
    """A time or period the user typed that we cannot read; the message says why."""


def parse_period(text: str | int) -> int:
    """`1m` -> 60, `60` -> 60, `1h` -> 3600. Always a positive whole number of seconds."""
    if isinstance(text, int):
        seconds = text
    else:
        match = _PERIOD.match(text.strip().lower())
        if match is None:
            raise TimeFormatError(
                f"period {text!r} is not a number of seconds or N followed by s/m/h/d/w (e.g. 1m)"
            )
        seconds = int(match["n"]) * _UNIT_SECONDS[match["unit"] or "s"]
    if seconds <= 0:
        raise TimeFormatError(f"period must be positive, got {text!r}")
    return seconds


_STEP_MS = re.compile(r"^(?P<n>\d+)ms$")


def parse_step_ms(text: str | int) -> int:
    """`100ms` -> 100, `250` -> 250 (bare digits: milliseconds), `1s` -> 1000, `5m` ->
    300000: a positive whole number of milliseconds."""
    if isinstance(text, int):
        step = text
    else:
        value = text.strip().lower()
        match = _STEP_MS.match(value)
        if match is not None:
            step = int(match["n"])
        elif value.isdigit():
            step = int(value)
        else:
            try:
                step = parse_period(value) * 1000
            except TimeFormatError:
                raise TimeFormatError(
                    f"step {text!r} is not N ms (250, 100ms) or N followed by s/m/h/d/w (1s)"
                ) from None
    if step <= 0:
        raise TimeFormatError(f"step must be positive, got {text!r}")
    return step


def format_period(seconds: int) -> str:
    """60 -> `1m`, 3600 -> `1h`, 90 -> `90s`: the shortest exact spelling."""
    for unit in ("w", "d", "h", "m"):
        size = _UNIT_SECONDS[unit]
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def parse_time(text: str, *, now_ms: int) -> int:
    """One human time -> epoch milliseconds (UTC)."""
    value = text.strip()
    lowered = value.lower()
    if not value:
        raise TimeFormatError("empty time")
    if lowered == "now":
        return now_ms
    if lowered in ("today", "yesterday"):
        midnight = (now_ms // 86_400_000) * 86_400_000
        return midnight - (86_400_000 if lowered == "yesterday" else 0)
    relative = _RELATIVE.match(lowered)
    if relative is not None:
        seconds = sum(int(n) * _UNIT_SECONDS[u] for n, u in _PART.findall(relative["parts"]))
        return now_ms + (seconds * 1000 if relative["sign"] == "+" else -seconds * 1000)
    if value.isdigit():
        ms = int(value)
        if ms < _MIN_EPOCH_MS:
            raise TimeFormatError(
                f"{value!r} looks like epoch seconds or a typo; give epoch milliseconds "
                f"(e.g. {ms * 1000}) or an ISO date"
            )
        return ms
    return _parse_iso(value)


def parse_range(start: str, end: str, *, now_ms: int) -> tuple[int, int]:
    """Both ends of a half-open range [start, end); start must be before end."""
    start_ms = parse_time(start, now_ms=now_ms)
    end_ms = parse_time(end, now_ms=now_ms)
    if start_ms >= end_ms:
        raise TimeFormatError(
            f"start {format_ms(start_ms)} is not before end {format_ms(end_ms)} "
            f"(the range is [start, end))"
        )
    return start_ms, end_ms


def to_ms(value: int | datetime | str, *, now_ms: int) -> int:
    """SDK convenience: epoch ms, an aware/naive (UTC) datetime, or a human string."""
    if isinstance(value, bool):
        raise TimeFormatError("a bool is not a time")
    if isinstance(value, int):
        return value
    if isinstance(value, datetime):
        return _datetime_ms(value)
    return parse_time(value, now_ms=now_ms)


def format_ms(ms: int) -> str:
    """Epoch ms -> `2026-11-20T10:00:00Z` (milliseconds shown only when present)."""
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if ms % 1000:
        text += f".{ms % 1000:03d}"
    return text + "Z"


def _parse_iso(value: str) -> int:
    text = value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise TimeFormatError(
            f"cannot read time {value!r}: use now, -24h, 2026-11-20, 2026-11-20T10:00 "
            f"or epoch milliseconds"
        ) from None
    return _datetime_ms(moment)


def _datetime_ms(moment: datetime) -> int:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
    return delta // timedelta(milliseconds=1)
