"""`make run`'s restart policy and supervision loop, without processes: a fake clock
and a fake platform (the real one: test_stack_platform_restart.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from infra.localstack.process import PidFile, StackError
from infra.localstack.stack import ComponentStatus
from infra.platform.__main__ import (
    SUPERVISOR_PID_FILE,
    _interrupt,
    _stop_supervisor,
    describe_exit,
    supervise,
)
from infra.platform.config import PlatformConfig
from infra.platform.restarts import GiveUp, Restart, RestartPolicy


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_component_is_restarted_until_its_third_crash_within_the_window() -> None:
    clock = Clock()
    policy = RestartPolicy(limit=3, window_s=300, clock=clock)
    assert policy.crashed("relay") == Restart("relay", crashes=1, limit=3)
    clock.now += 100
    assert policy.crashed("relay") == Restart("relay", crashes=2, limit=3)
    clock.now += 199
    assert policy.crashed("relay") == GiveUp("relay", crashes=3, window_s=300)


def test_crashes_further_apart_than_the_window_are_restarted_forever() -> None:
    clock = Clock()
    policy = RestartPolicy(limit=3, window_s=300, clock=clock)
    actions = []
    for _ in range(10):
        actions.append(policy.crashed("ingestor"))
        clock.now += 150  # two crashes per window at most: the one 300 s ago is forgotten
    assert all(isinstance(a, Restart) for a in actions)
    assert [a.crashes for a in actions] == [1, 2, 2, 2, 2, 2, 2, 2, 2, 2]


def test_crashes_are_counted_per_component() -> None:
    policy = RestartPolicy(limit=2, window_s=60, clock=Clock())
    assert isinstance(policy.crashed("relay"), Restart)
    assert isinstance(policy.crashed("kafka"), Restart)
    assert policy.crashed("relay") == GiveUp("relay", crashes=2, window_s=60)


def test_a_limit_of_one_stops_at_the_first_crash_and_nonsense_is_refused() -> None:
    assert RestartPolicy(limit=1, window_s=1, clock=Clock()).crashed("x") == GiveUp("x", 1, 1)
    with pytest.raises(ValueError):
        RestartPolicy(limit=0, window_s=300)
    with pytest.raises(ValueError):
        RestartPolicy(limit=3, window_s=0)


def test_the_limits_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (PlatformConfig().crash_limit, PlatformConfig().crash_window_s) == (3, 300.0)
    monkeypatch.setenv("PLATFORM_CRASH_LIMIT", "5")
    monkeypatch.setenv("PLATFORM_CRASH_WINDOW_S", "60")
    assert (PlatformConfig().crash_limit, PlatformConfig().crash_window_s) == (5, 60.0)


def test_exit_statuses_are_said_plainly() -> None:
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(None).startswith("exit status unknown")


class CrashingPlatform:
    """Its `component` is dead; each restart fails (a start that crashes at once)."""

    def __init__(self, log_file: Path, limit: int) -> None:
        self.config = PlatformConfig(data_dir=log_file.parent, crash_limit=limit)
        self.log_file = log_file
        self.restarts = 0

    def status(self, *, memory: bool = True) -> list[ComponentStatus]:
        assert not memory, "the supervisor's loop never walks every process for memory"
        return [ComponentStatus("relay", "stale pid file", 4242, "", {}, 0, self.log_file)]

    def exit_status(self, pid: int) -> int | None:
        return 1

    def metrics_urls(self) -> dict[str, str]:
        return {}  # no liveness probes: test_platform_liveness.py

    def restart(self, name: str) -> None:
        self.restarts += 1
        raise StackError(f"{name} failed to start: process exited (code 1)")


def test_supervise_gives_up_saying_why_when_restarts_keep_failing(tmp_path: Path) -> None:
    log = tmp_path / "relay.log"
    log.write_text("".join(f"line {i}\n" for i in range(30)) + "ValueError: bad config\n")
    platform = CrashingPlatform(log, limit=3)
    said: list[str] = []
    reason = supervise(platform, threading.Event(), Clock(), say=said.append, poll_s=0)  # type: ignore[arg-type]
    assert reason == (
        "relay crashed 3 times within 300 s; giving up"
        " (PLATFORM_CRASH_LIMIT, PLATFORM_CRASH_WINDOW_S)"
    )
    assert platform.restarts == 2
    died = said[0]
    assert died.startswith(f"[platform] relay died (exit code 1); last lines of {log}:")
    assert "  | ValueError: bad config" in died and "line 21" in died and "line 20" not in died
    assert said[1] == "[platform] restarting relay (crash 1 within 300 s; at 3 the platform stops)"
    assert said[2].startswith("[platform] relay did not start again: relay failed to start")


def test_supervise_ends_when_asked_or_when_a_component_was_stopped_elsewhere(
    tmp_path: Path,
) -> None:
    platform = CrashingPlatform(tmp_path / "relay.log", limit=3)
    stop = threading.Event()
    stop.set()
    assert supervise(platform, stop, say=pytest.fail) == ""  # type: ignore[arg-type]
    platform.status = lambda memory=True: [  # type: ignore[method-assign,misc]
        ComponentStatus("relay", "stopped", None, "", {}, 0, tmp_path / "relay.log")
    ]
    reason = supervise(platform, threading.Event(), say=pytest.fail, poll_s=0)  # type: ignore[arg-type]
    assert reason == "relay was stopped by another process"
    assert platform.restarts == 0


def test_sigterm_interrupts_supervise_at_once(tmp_path: Path) -> None:
    """`make run` waits in `supervise`; SIGTERM (its handler raises KeyboardInterrupt,
    like Ctrl-C) must end the wait, not the next poll an hour later."""
    platform = CrashingPlatform(tmp_path / "relay.log", limit=3)
    platform.status = lambda memory=True: []  # type: ignore[method-assign,misc]
    previous = signal.signal(signal.SIGTERM, _interrupt)
    timer = threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGTERM))
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            timer.start()
            supervise(platform, threading.Event(), poll_s=3600)  # type: ignore[arg-type]
    finally:
        timer.cancel()
        signal.signal(signal.SIGTERM, previous)
    assert time.monotonic() - t0 < 30


def test_stop_signals_the_supervising_run_process_and_waits_for_it(tmp_path: Path) -> None:
    """`make stop` first SIGTERMs `make run`, which then stops everything itself (rather
    than restarting what `down` stops under it)."""
    from infra.localstack.process import ProcessRecord, _proc_start_ticks

    run = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        ticks = _proc_start_ticks(run.pid)
        assert ticks is not None
        record = ProcessRecord("platform", run.pid, ticks, {}, "", [])
        PidFile(tmp_path / "run" / SUPERVISOR_PID_FILE).write(record)
        _stop_supervisor(tmp_path, timeout_s=30)
        assert run.wait(timeout=1) == -signal.SIGTERM
    finally:
        run.kill()
        run.wait()
    _stop_supervisor(tmp_path / "nothing-runs-here")  # no pid file: nothing to do
