"""Fault points are armed only by PIPELINE_CRASH_AT / PIPELINE_FAIL_AT / PIPELINE_HOLD_AT,
with known names."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from pipeline import faults
from pipeline.preflight import StartupError


@pytest.fixture(autouse=True)
def _unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(faults.CRASH_ENV, raising=False)
    monkeypatch.delenv(faults.FAIL_ENV, raising=False)
    monkeypatch.delenv(faults.HOLD_ENV, raising=False)


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


def test_a_hold_point_waits_for_its_pipe_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fifo = tmp_path / "hold"
    os.mkfifo(fifo)
    monkeypatch.setenv(faults.HOLD_ENV, "history-after-publish")
    monkeypatch.setenv(faults.HOLD_FIFO_ENV, str(fifo))
    hook = faults.armed(jvm_pid=None)
    assert hook is not None
    hook("history-after-ohlc-commit")  # not the hold point: returns
    passed = threading.Event()

    def batch() -> None:
        hook("history-after-publish")
        passed.set()

    held = threading.Thread(target=batch, daemon=True)
    held.start()
    with fifo.open("wb"):  # opens once the batch holds at the point
        assert not passed.is_set()
    held.join(30)
    assert passed.is_set()
    hook("history-after-publish")  # once: the replay is not held (no writer: it would block)


def test_a_hold_without_its_pipe_refuses_the_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(faults.HOLD_ENV, "history-after-publish")
    monkeypatch.setenv(faults.HOLD_FIFO_ENV, str(tmp_path / "missing"))
    with pytest.raises(StartupError, match="named pipe"):
        faults.armed(jvm_pid=None)
