"""Crash points are armed only by PIPELINE_CRASH_AT, and only with a known point's name."""

from __future__ import annotations

import pytest

from pipeline import faults
from pipeline.preflight import StartupError


def test_unset_means_no_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(faults.CRASH_ENV, raising=False)
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
