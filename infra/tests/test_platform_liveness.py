"""`make run`'s liveness probes without processes: a fake clock and a fake platform
(a real hung relay: test_stack_platform_restart.py)."""

from __future__ import annotations

import signal
import socket
import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from infra.localstack.config import LOOPBACK
from infra.localstack.stack import ComponentStatus
from infra.platform.__main__ import supervise
from infra.platform.config import PlatformConfig
from infra.platform.liveness import Hung, LivenessPolicy, healthz
from mdproto.runtime.metrics_http import Health, MetricsServer

TIMED_OUT = "GET http://relay/healthz failed: timed out"


class Clock:
    """Time that moves only when a test says so."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_component_is_hung_after_three_failed_probes_in_a_row() -> None:
    clock = Clock()
    liveness = LivenessPolicy(period_s=10, failures=3, clock=clock)
    assert not liveness.due("relay")  # first seen: one period before its first probe
    clock.now += 9.9
    assert not liveness.due("relay")
    clock.now += 0.1
    assert liveness.due("relay")
    assert liveness.probed("relay", TIMED_OUT) is None
    assert not liveness.due("relay")
    clock.now += 10
    assert liveness.probed("relay", TIMED_OUT) is None
    clock.now += 10
    assert liveness.probed("relay", TIMED_OUT) == Hung("relay", 3, 20.0, TIMED_OUT)


def test_one_answer_clears_the_count_and_components_are_counted_apart() -> None:
    clock = Clock()
    liveness = LivenessPolicy(period_s=10, failures=2, clock=clock)
    assert liveness.probed("relay", TIMED_OUT) is None
    assert liveness.probed("relay", None) is None  # a slow moment, not a hang
    assert liveness.probed("gateway", TIMED_OUT) is None
    assert liveness.probed("relay", TIMED_OUT) is None
    clock.now += 10
    assert liveness.probed("relay", "refused") == Hung("relay", 2, 10.0, "refused")
    liveness.forget("relay")  # restarted: counted afresh, one period before its probe
    assert not liveness.due("relay")
    assert liveness.probed("relay", TIMED_OUT) is None


def test_nonsense_is_refused_and_the_probe_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ValueError):
        LivenessPolicy(period_s=0, failures=3)
    with pytest.raises(ValueError):
        LivenessPolicy(period_s=10, failures=0)
    assert (PlatformConfig().liveness_period_s, PlatformConfig().liveness_failures) == (10.0, 3)
    monkeypatch.setenv("PLATFORM_LIVENESS_PERIOD_S", "2")
    monkeypatch.setenv("PLATFORM_LIVENESS_FAILURES", "5")
    assert (PlatformConfig().liveness_period_s, PlatformConfig().liveness_failures) == (2.0, 5)


def test_healthz_passes_any_answer_and_fails_on_no_answer() -> None:
    """A 503 is a service that runs and says what it lacks (a dependency it retries);
    only silence is a hang."""
    server = MetricsServer(LOOPBACK, 0, CollectorRegistry(), lambda: Health(False, {}))
    server.start()
    try:
        assert healthz(f"http://{LOOPBACK}:{server.port}") is None
    finally:
        server.close()
    # A frozen process: the kernel accepts the connection, nothing ever answers.
    with socket.create_server((LOOPBACK, 0)) as frozen:
        failure = healthz(f"http://{LOOPBACK}:{frozen.getsockname()[1]}")
    assert failure is not None and "timed out" in failure
    with socket.create_server((LOOPBACK, 0)) as gone:
        port = gone.getsockname()[1]
    failure = healthz(f"http://{LOOPBACK}:{port}")  # nothing listens: refused
    assert failure is not None and failure.startswith(f"GET http://{LOOPBACK}:{port}/healthz")


class HangingPlatform:
    """A relay that never answers its liveness probe; kafka (no /healthz) runs on."""

    def __init__(self, tmp_path: Path, clock: Clock) -> None:
        self.config = PlatformConfig(
            data_dir=tmp_path, crash_limit=2, liveness_period_s=10, liveness_failures=3
        )
        self.clock = clock
        self.log_file = tmp_path / "relay.log"
        self.log_file.write_text("relay serving\nlast words\n")
        self.killed: list[tuple[str, signal.Signals]] = []
        self.restarts = 0

    def status(self, *, memory: bool = True) -> list[ComponentStatus]:
        assert not memory, "the supervisor's loop never walks every process for memory"
        self.clock.now += 5  # one poll every 5 s
        return [
            ComponentStatus("kafka", "running", 7, "", {}, 0, self.log_file),
            ComponentStatus("relay", "running", 4242, "", {}, 0, self.log_file),
        ]

    def metrics_urls(self) -> dict[str, str]:
        return {"relay": "http://relay"}

    def kill(self, name: str, sig: signal.Signals = signal.SIGKILL) -> int:
        self.killed.append((name, sig))
        return 4242

    def restart(self, name: str) -> None:
        self.restarts += 1


def test_supervise_kills_and_restarts_a_hung_component_counting_it_as_a_crash(
    tmp_path: Path,
) -> None:
    clock = Clock()
    platform = HangingPlatform(tmp_path, clock)
    probed: list[str] = []

    def probe(url: str) -> str:
        probed.append(url)
        return TIMED_OUT

    said: list[str] = []
    reason = supervise(
        platform,  # type: ignore[arg-type]
        threading.Event(),
        clock,
        say=said.append,
        poll_s=0,
        probe=probe,
    )
    # Hung twice (3 failed probes each); the second is crash 2 of 2: the platform stops.
    assert reason == (
        "relay crashed 2 times within 300 s; giving up"
        " (PLATFORM_CRASH_LIMIT, PLATFORM_CRASH_WINDOW_S)"
    )
    assert probed == ["http://relay"] * 6  # only the services with a /healthz
    assert platform.killed == [("relay", signal.SIGKILL)] * 2
    assert platform.restarts == 1
    assert said[0].startswith(
        "[platform] relay is hung (/healthz unanswered 3 times in a row over 20 s,"
        f" last: {TIMED_OUT}); killed it; last lines of {platform.log_file}:"
    )
    assert "  | last words" in said[0]
    assert said[1] == "[platform] restarting relay (crash 1 within 300 s; at 2 the platform stops)"
    assert said[2] == "[platform] relay is ready again"
    assert said[3].startswith("[platform] relay is hung (/healthz unanswered 3 times")
    assert len(said) == 4
