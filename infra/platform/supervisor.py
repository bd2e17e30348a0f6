"""`Platform`: the stack, then the services, started in dependency order.

Phases (each waits until every component in it answers its readiness probe):

    1. stack      Kafka, SeaweedFS S3, Iceberg REST catalog   (infra.localstack)
    2. services   exchange simulator, relay, Spark pipeline  (need the stack)
    3. ingestor   (needs the relay to subscribe to and the exchange to load markets)

State lives in pid files under the data dir, so `make stop` from another shell
stops what `make run` started.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from infra.localstack import LocalStack, StackConfig
from infra.localstack.components import Component
from infra.localstack.config import LOOPBACK
from infra.localstack.endpoints import StackEndpoints, client_addresses
from infra.localstack.process import (
    ExitWatcher,
    PidFile,
    StackError,
    wait_group_gone,
    wait_ports_free,
)
from infra.localstack.stack import ComponentStatus
from infra.platform.config import SIMULATED_EXCHANGES, PlatformConfig
from infra.platform.services import (
    ExchangeSimulator,
    Gateway,
    Ingestor,
    LiveEngine,
    Pipeline,
    Relay,
    Service,
    client_env,
)
from ingestor.venues import venue_for

Log = Callable[[str], None]
#: How long a restart waits for the dead process's ports to be released.
RELEASE_S = 10.0


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class PlatformEndpoints:
    """Where a client finds the running platform."""

    request: str
    market_data: str
    relay_metrics: str
    exchange_url: str | None
    stack: StackEndpoints

    gateway: str = ""  # the gateway's page and API ("" where none runs)
    #: Service name -> base URL of its `GET /metrics` and `GET /healthz` (empty on
    #: compose, which publishes only the relays' on the host).
    metrics: dict[str, str] = field(default_factory=dict)

    def client_env(self) -> dict[str, str]:
        """`mdclient` configuration (MDCLIENT_* environment) for this platform."""
        return client_env(self.request, self.market_data, self.stack)

    def clients(self) -> dict[str, object]:
        """endpoints.json's `clients` section: every client-facing address."""
        return client_addresses(
            request=self.request.split(","),
            market_data=self.market_data.split(","),
            gateway=self.gateway,
            catalog=self.stack.catalog_uri,
            s3=self.stack.s3_endpoint,
            metrics=self.metrics,
        )


def exchange_reachable(exchange_id: str, timeout_s: float = 3.0) -> bool:
    """One request to the real exchange's status endpoint, only when the user asked for it."""
    url = venue_for(exchange_id).status_url
    if not url:
        return False
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return int(resp.status) == 200
    except OSError:
        return False


class Platform:
    """Every part of the platform as local processes (no Docker)."""

    def __init__(
        self,
        config: PlatformConfig | None = None,
        *,
        stack_config: StackConfig | None = None,
        log: Log | None = None,
        use_simulator: bool | None = None,
    ) -> None:
        """`use_simulator=None` decides from `config.exchange` (and a reachability check)."""
        self.config = config or PlatformConfig()
        self.stack_config = stack_config or StackConfig.load(data_dir=self.config.data_dir)
        self._log = log or _stderr
        if use_simulator is None:
            use_simulator = self.config.exchange == "simulator" or not self._real_exchange_ok()
        if use_simulator and self.config.not_simulated():
            raise StackError(
                f"the exchange simulator speaks only {', '.join(SIMULATED_EXCHANGES)};"
                f" {', '.join(self.config.not_simulated())} need PLATFORM_EXCHANGE=real"
                " (and the real exchange reachable)"
            )
        self.use_simulator = use_simulator
        self._reap_lock = threading.Lock()  # `kill` and a supervisor thread both reap
        self._exits: dict[int, int] = {}  # pid -> exit status, once reaped
        port = self.config.ports.exchange_sim
        self.exchange_url = f"http://{LOOPBACK}:{port}" if use_simulator else None

        services_config = self.stack_config.model_copy(
            update={"start_timeout_s": self.config.start_timeout_s}
        )
        clients = self._client_addresses  # in endpoints.json, whichever phase writes it
        self.stack = LocalStack(self.stack_config, log=self._log, clients=clients)
        self.phases = [
            self.stack,
            LocalStack(
                services_config,
                log=self._log,
                label="platform",
                components=self._services,
                clients=clients,
            ),
            LocalStack(
                services_config,
                log=self._log,
                label="platform",
                components=self._relay_clients,
                clients=clients,
            ),
        ]

    def _real_exchange_ok(self) -> bool:
        names = ", ".join(self.config.exchanges)
        self._log(f"[platform] checking that the real exchange APIs are reachable ({names}) ...")
        unreachable = [i for i in self.config.exchanges if not exchange_reachable(i)]
        if not unreachable:
            return True
        self._log(
            f"[platform] {', '.join(unreachable)} not reachable: using the bundled exchange"
            " simulator"
        )
        return False

    def _services(self, config: StackConfig, endpoints: StackEndpoints) -> list[Component]:
        services: list[Component] = [
            Relay(config, endpoints, self.config),
            Pipeline(config, endpoints, self.config),
        ]
        services += [
            LiveEngine(config, endpoints, self.config, n)
            for n in range(2, self.config.live_engines + 1)
        ]
        if self.use_simulator:
            services.insert(0, ExchangeSimulator(config, endpoints, self.config))
        return services

    def _relay_clients(self, config: StackConfig, endpoints: StackEndpoints) -> list[Component]:
        """Started once the relay is ready: the gateway connects at start."""
        return [
            Ingestor(config, endpoints, self.config, self.exchange_url),
            Gateway(config, endpoints, self.config),
        ]

    @property
    def endpoints(self) -> PlatformEndpoints:
        p = self.config.ports
        return PlatformEndpoints(
            request=f"tcp://{LOOPBACK}:{p.client_request}",
            market_data=f"tcp://{LOOPBACK}:{p.market_data}",
            relay_metrics=f"http://{LOOPBACK}:{p.relay_metrics}",
            exchange_url=self.exchange_url,
            stack=self.stack.endpoints,
            gateway=f"http://{LOOPBACK}:{p.gateway}",
            metrics=self.metrics_urls(),
        )

    def _client_addresses(self) -> dict[str, object]:
        return self.endpoints.clients()

    def metrics_urls(self) -> dict[str, str]:
        """Every service's `/metrics` and `/healthz` base URL, in start order."""
        return {
            c.name: c.metrics_url
            for phase in self.phases
            for c in phase.components
            if isinstance(c, Service) and c.metrics_url
        }

    def up(self) -> PlatformEndpoints:
        """Start every phase in order; on failure stop what this call started."""
        started: list[LocalStack] = []
        try:
            for phase in self.phases:
                phase.up()
                started.append(phase)
        except BaseException:
            for phase in reversed(started):
                phase.down()
            raise
        return self.endpoints

    def _phase_of(self, name: str) -> LocalStack:
        for phase in self.phases:
            if any(component.name == name for component in phase.components):
                return phase
        raise StackError(f"no component named {name}")

    def restart(self, name: str) -> None:
        """Start `name` again after a crash; returns once it answers its readiness probe.

        Only its phase is brought up: `LocalStack.up` starts just what is not running
        there, re-probes the rest, and on failure stops only what it started
        (`up()` would also stop the earlier phases, the whole stack). The dead process's
        ports are waited for first (`RELEASE_S`): they outlive its main thread.
        """
        phase = self._phase_of(name)
        [component] = [c for c in phase.components if c.name == name]
        wait_ports_free(name, component.ports, component.bind_hosts, RELEASE_S)
        phase.up()

    def exit_status(self, pid: int) -> int | None:
        """How a dead component process ended: its exit code, or minus the signal that
        killed it; None if unknown (another process started it, or it still runs).
        Reaps it when this process started it (`kill` reaps its own victims)."""
        with self._reap_lock:
            try:
                reaped, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return self._exits.get(pid)
            if not reaped:
                return None
            self._exits[pid] = os.waitstatus_to_exitcode(status)
            return self._exits[pid]

    def pid(self, name: str) -> int:
        """A running component's pid, the leader of its process group."""
        record = PidFile(self._phase_of(name).run_dir / f"{name}.pid").read()
        if record is None or not record.alive:
            raise StackError(f"{name} is not running")
        return record.pid

    def send_signal(self, name: str, sig: signal.Signals) -> None:
        """Send `sig` to a component's whole process group and return (SIGSTOP/SIGCONT)."""
        os.killpg(self.pid(name), sig)

    def kill(self, name: str, sig: signal.Signals = signal.SIGKILL) -> int:
        """Signal a component's whole process group (a crash, for recovery tests).

        `up()` or `restart(name)` afterwards restarts it (and only it). Returns the
        killed pid.
        """
        record = PidFile(self._phase_of(name).run_dir / f"{name}.pid").read()
        if record is None or not record.alive:
            raise StackError(f"{name} is not running")
        watcher = ExitWatcher(record.pid)
        os.killpg(record.pid, sig)
        watcher.wait(timeout_s=30)
        watcher.close()
        self.exit_status(record.pid)  # reaped here when this process started it
        wait_group_gone(record.pid, timeout_s=30)
        return record.pid

    def down(self) -> None:
        for phase in reversed(self.phases):
            phase.down()

    def status(self, *, memory: bool = True) -> list[ComponentStatus]:
        return [row for phase in self.phases for row in phase.status(memory=memory)]

    def __enter__(self) -> Platform:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()
