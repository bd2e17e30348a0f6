"""Fault points are armed only by PIPELINE_CRASH_AT / PIPELINE_FAIL_AT, with known names."""

from __future__ import annotations

import pytest

from pipeline import faults
from pipeline.preflight import StartupError


@pytest.fixture(autouse=True)
def _unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(faults.CRASH_ENV, raising=False)
    monkeypatch.delenv(faults.FAIL_ENV, raising=False)


def test_unset_means_no_hook() -> None:
    assert faults.armed(jvm_pid=None) is None


def test_an_unknown_point_refuses_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(faults.CRASH_ENV, "history-after-lunch")
    with pytest.raises(StartupError, match="history-after-lunch"):
        faults.armed(jvm_pid=None)


def test_an_armed_hook_passes_other_points(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(faults.CRASH_ENV, "history-after-publish")
    hook = faults.armed(jvm_pid=None)
    assert hook is not None
    hook("history-after-ohlc-commit")  # not the armed point: returns (this test lives on)


def test_an_unknown_fail_point_refuses_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(faults.FAIL_ENV, "live-after-ticks-commit,live-after-lunch")
    with pytest.raises(StartupError, match="PIPELINE_FAIL_AT='live-after-lunch'"):
        faults.armed(jvm_pid=None)


def test_each_fail_point_raises_once_then_lets_the_replay_through(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(faults.FAIL_ENV, "history-after-ohlc-commit, live-after-ticks-commit")
    hook = faults.armed(jvm_pid=None)
    assert hook is not None
    hook("history-after-publish")  # not armed
    with pytest.raises(faults.InjectedFailureError, match="history-after-ohlc-commit"):
        hook("history-after-ohlc-commit")
    hook("history-after-ohlc-commit")  # the restarted query's replay gets through
    with pytest.raises(faults.InjectedFailureError):
        hook("live-after-ticks-commit")
    hook("live-after-ticks-commit")
