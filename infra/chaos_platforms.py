"""How the chaos soak (infra/chaos_soak.py) breaks a running platform: one interface,
`Breaker`, for `make run`'s processes and for the compose containers.

The soak names its components as ``infra.chaos.COMPONENTS`` does (`make run`'s
names); `SERVICES` says what each is called on each platform, the one place where
the names are mapped. What a fault kind means on each:

=========  =========================================  ==========================================
kind       `make run` (`MakeRunBreaker`)              compose (`ComposeBreaker`)
=========  =========================================  ==========================================
kill       SIGKILL of its process group; the          SIGKILL of the container's main process
           supervisor restarts it                     (not ``docker kill``, an operator's stop
                                                      that the restart policy leaves down); the
                                                      ``restart:`` policy restarts it
restart    SIGTERM (a graceful stop), restarted       SIGTERM to the main process, the same
freeze     SIGSTOP, SIGCONT after the hold            ``docker compose pause``/``unpause`` (the
                                                      cgroup freezer: Docker runs no health check
                                                      meanwhile, so nothing restarts it)
hang       SIGSTOP left to the supervisor's           SIGSTOP of every process but init, left to
           liveness probe (kill, restart)             the health check's watchdog (ADR 0013: three
                                                      unanswered ``live:`` checks kill the service,
                                                      its restart policy brings it back)
cut        the catalog: SIGSTOP, SIGCONT after        the catalog: pause, unpause after the hold
           the hold
=========  =========================================  ==========================================

The exchange's cut is the simulator's, through its control API, the same on both
(``infra.chaos_soak.Injector``). "Ready" is `make run`'s readiness probe of the
component, or compose's health check passed since the container's latest start
(and, for the pipeline and the relays, the pipeline's heartbeat heard by every
relay, as ``ComposePlatform.wait_ready`` has it).
"""

from __future__ import annotations

import signal
from collections.abc import Iterable, Mapping
from typing import Protocol

from infra.compose_platform import ComposePlatform
from infra.localstack.components import NotReadyError
from infra.localstack.process import PidFile, StackError
from infra.platform.__main__ import SUPERVISOR_PID_FILE
from infra.platform.config import PlatformConfig
from infra.platform.supervisor import Platform

#: Each soak component's name on each platform. They agree today (compose's services
#: were named after `make run`'s components); the S3 store and the extra live engines,
#: which do differ (``seaweedfs``/``minio``, ``live-engine-N``/``live-engine``), are
#: not broken by the soak.
SERVICES: Mapping[str, Mapping[str, str]] = {
    "make run": {
        "relay": "relay",
        "ingestor": "ingestor",
        "gateway": "gateway",
        "iceberg-rest": "iceberg-rest",
        "spark-pipeline": "spark-pipeline",
    },
    "compose": {
        "relay": "relay",
        "ingestor": "ingestor",
        "gateway": "gateway",
        "iceberg-rest": "iceberg-rest",
        "spark-pipeline": "spark-pipeline",
    },
}


class Breaker(Protocol):
    """What the soak does to one platform; components by their soak names (COMPONENTS)."""

    #: ``"make run"`` or ``"compose"`` (a key of SERVICES).
    label: str
    #: The exchange simulator's base URL (its control API: the exchange's cut).
    exchange_url: str
    #: The restart budget the fault plan keeps within (``infra.chaos.FaultPlan``).
    crash_limit: int
    crash_window_s: float

    def run_id(self, component: str) -> str | None:
        """Which run of the component this is (a pid, a container's start); None: down.
        A restart changes it."""

    def not_ready(self, components: Iterable[str]) -> list[str]:
        """Those of `components` that do not answer their readiness check now."""

    def alive(self) -> bool:
        """The platform still runs as a whole (`make run`'s supervisor has not given up)."""

    def kill(self, component: str) -> None:
        """SIGKILL: a crash the platform must restart by itself."""

    def terminate(self, component: str) -> None:
        """SIGTERM: a graceful stop the platform must restart by itself."""

    def freeze(self, component: str) -> None:
        """Stop it in place, sockets open, for a stall it must ride out (then `thaw`)."""

    def thaw(self, component: str) -> None:
        """End a `freeze`."""

    def hang(self, component: str) -> None:
        """Stop it in place and leave it: the platform's liveness check must restart it."""

    def wake(self, component: str) -> None:
        """End a `hang` the platform did not end (a fallback)."""


class MakeRunBreaker:
    """`Breaker` for a running `make run`: its pid files, its supervisor, signals."""

    label = "make run"

    def __init__(self, platform: Platform) -> None:
        assert platform.exchange_url is not None, "the soak needs the exchange simulator"
        self.platform = platform
        self.exchange_url = platform.exchange_url
        self.crash_limit = platform.config.crash_limit
        self.crash_window_s = platform.config.crash_window_s
        self.names = SERVICES[self.label]
        self.components = {c.name: c for phase in platform.phases for c in phase.components}

    @classmethod
    def attach(cls, config: PlatformConfig) -> MakeRunBreaker:
        """To the `make run` of `config`'s data dir (a user's second shell)."""
        return cls(Platform(config, use_simulator=True, log=lambda _: None))

    def _pid(self, name: str) -> int | None:
        record = PidFile(self.platform._phase_of(name).run_dir / f"{name}.pid").read()
        return record.pid if record is not None and record.alive else None

    def run_id(self, component: str) -> str | None:
        pid = self._pid(self.names[component])
        return None if pid is None else str(pid)

    def not_ready(self, components: Iterable[str]) -> list[str]:
        return [c for c in components if not self._ready(self.names[c])]

    def _ready(self, name: str) -> bool:
        if self._pid(name) is None:
            return False
        try:
            self.components[name].probe()
        except (NotReadyError, OSError, StackError):
            return False
        return True

    def alive(self) -> bool:
        run = self.platform.config.data_dir / "run" / SUPERVISOR_PID_FILE
        record = PidFile(run).read()
        return record is not None and record.alive

    def _signal(self, component: str, sig: signal.Signals) -> None:
        self.platform.send_signal(self.names[component], sig)

    def kill(self, component: str) -> None:
        self._signal(component, signal.SIGKILL)

    def terminate(self, component: str) -> None:
        self._signal(component, signal.SIGTERM)

    def freeze(self, component: str) -> None:
        self._signal(component, signal.SIGSTOP)

    def thaw(self, component: str) -> None:
        self._signal(component, signal.SIGCONT)

    hang = freeze  # the same signal; the supervisor's liveness probe tells them apart
    wake = thaw


class ComposeBreaker:
    """`Breaker` for a compose project (``ComposePlatform``): signals inside the
    containers, the cgroup freezer, container states and health."""

    label = "compose"
    #: Docker restarts a container forever (its own back-off), with no budget: the plan
    #: keeps within `make run`'s defaults, so a compose plan would not exhaust those.
    crash_limit = PlatformConfig.model_fields["crash_limit"].default
    crash_window_s = PlatformConfig.model_fields["crash_window_s"].default

    def __init__(self, compose: ComposePlatform) -> None:
        url = compose.endpoints.exchange_sim_url
        assert url is not None, "the soak needs the exchange simulator (the offline profile)"
        self.compose = compose
        self.exchange_url = url
        self.names = SERVICES[self.label]

    def run_id(self, component: str) -> str | None:
        state = self.compose.states().get(self.names[component])
        if state is None or state.get("Status") != "running":
            return None
        return f"{state.get('Pid')}@{state.get('StartedAt')}"

    def not_ready(self, components: Iterable[str]) -> list[str]:
        wanted = list(components)
        late = set(self.compose.not_ready(self.names[c] for c in wanted))
        return [c for c in wanted if self.names[c] in late]

    def alive(self) -> bool:
        return True  # no supervisor to give up: the restart policy has no budget

    def kill(self, component: str) -> None:
        self.compose.signal(self.names[component], "KILL")

    def terminate(self, component: str) -> None:
        self.compose.signal(self.names[component], "TERM")

    def freeze(self, component: str) -> None:
        self.compose.pause(self.names[component])

    def thaw(self, component: str) -> None:
        self.compose.unpause(self.names[component])

    def hang(self, component: str) -> None:
        self.compose.signal(self.names[component], "STOP", every=True)

    def wake(self, component: str) -> None:
        self.compose.signal(self.names[component], "CONT", every=True)
