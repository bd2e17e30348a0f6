"""Fault injection on a running platform, the same for the local processes and Compose.

The e2e fault tests (e2e/test_faults.py, e2e/test_recovery.py) break one service
through ``Faults`` and do not care which stack they run on:

- ``LocalFaults`` drives ``infra.platform.Platform`` (local processes);
- ``infra.compose_platform.ComposePlatform`` drives the containers of a compose
  project (``docker compose kill/restart/up --wait``, same project and environment).

Service names are the compose services' and the local components' (they agree):
``kafka``, ``relay``, ``spark-pipeline``, ``ingestor``, ``exchange-sim``, ...
"""

from __future__ import annotations

import signal
from typing import Protocol, runtime_checkable

from infra.platform.supervisor import Platform


@runtime_checkable
class Faults(Protocol):
    """What a fault test may do to one service of a running platform."""

    #: ``"local"`` or ``"compose"``.
    stack: str

    def kill(self, service: str) -> None:
        """SIGKILL the service; it stays down until ``start``."""

    def start(self, service: str) -> None:
        """Start a killed service again; returns once it is ready."""

    def restart(self, service: str) -> None:
        """Stop the service gracefully (SIGTERM) and start it; returns once it is ready."""

    def crash(self, service: str) -> None:
        """SIGKILL the service's main process and let its supervisor bring it back.

        Compose: the container's restart policy restarts it, this returns at once.
        Local: a test's platform runs no supervisor (`make run`'s `supervise` is the
        restart policy), so this restarts it itself.
        """

    def wait_ready(self, service: str, timeout_s: float = 300.0) -> None:
        """Block until the service runs and answers its readiness probe."""

    def pause(self, service: str) -> None:
        """Freeze every process of the service (SIGSTOP; compose: the cgroup freezer):
        a hung service, its connections open."""

    def unpause(self, service: str) -> None:
        """Let a paused service run on."""


class LocalFaults:
    """``Faults`` for the local platform: ``Platform.kill`` and ``Platform.up``."""

    stack = "local"

    def __init__(self, platform: Platform) -> None:
        self.platform = platform

    def kill(self, service: str) -> None:
        self.platform.kill(service, signal.SIGKILL)

    def start(self, service: str) -> None:
        self.platform.up()  # starts only what is down, waits until every part is ready

    def restart(self, service: str) -> None:
        self.platform.kill(service, signal.SIGTERM)
        self.platform.up()

    def crash(self, service: str) -> None:
        self.platform.kill(service, signal.SIGKILL)
        self.platform.up()  # what a restart policy does, synchronously

    def wait_ready(self, service: str, timeout_s: float = 300.0) -> None:
        self.platform.up()

    def pause(self, service: str) -> None:
        self.platform.send_signal(service, signal.SIGSTOP)

    def unpause(self, service: str) -> None:
        self.platform.send_signal(service, signal.SIGCONT)
