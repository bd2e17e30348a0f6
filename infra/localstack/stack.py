"""``LocalStack``: bring the platform's infrastructure up, report on it, take it down.

State lives only on disk (pid files under ``<data_dir>/run``), so ``up`` in one
process and ``down``/``status`` in another work, and ``up`` on a running stack
is a no-op that just re-checks readiness.
"""

from __future__ import annotations

import contextlib
import fcntl
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from infra import artifacts
from infra.localstack.components import Component, NotReadyError, make_components
from infra.localstack.config import LOOPBACK, StackConfig
from infra.localstack.endpoints import ENDPOINTS_FILE, StackEndpoints
from infra.localstack.process import (
    ExitWatcher,
    PidFile,
    ProcessRecord,
    StackError,
    check_ports_free,
    group_rss_bytes,
    spawn,
    start_failure,
    terminate,
)

Log = Callable[[str], None]
PROBE_INTERVAL_S = 0.25


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def endpoints_for(config: StackConfig) -> StackEndpoints:
    """Endpoints are a pure function of the config (no process needs to run)."""
    p = config.ports
    return StackEndpoints(
        kafka_bootstrap=f"{LOOPBACK}:{p.kafka}",
        s3_endpoint=f"http://{LOOPBACK}:{p.s3}",
        s3_access_key=config.s3_access_key,
        s3_secret_key=config.s3_secret_key,
        s3_region=config.s3_region,
        s3_bucket=config.warehouse_bucket,
        warehouse=f"s3://{config.warehouse_bucket}/{config.warehouse_prefix}",
        catalog_uri=f"http://{LOOPBACK}:{p.catalog}",
        catalog_name=config.catalog_name,
    )


@dataclass(frozen=True)
class ComponentStatus:
    """One line of ``status``."""

    name: str
    state: str  # "running", "stopped" or "stale pid file"
    pid: int | None
    address: str
    ports: dict[str, int]
    rss_bytes: int  # 0: not running, or not measured (`status(memory=False)`)
    log_file: Path


@dataclass
class _Pending:
    component: Component
    record: ProcessRecord
    proc: subprocess.Popen[bytes] | None
    watcher: ExitWatcher
    started: float
    last_reason: str = "no probe yet"
    ready_s: float | None = field(default=None)


class LocalStack:
    """Kafka + SeaweedFS S3 + Iceberg REST catalog as local processes.

    >>> stack = LocalStack(StackConfig(data_dir=Path("/tmp/x"), ports=Ports.free()))
    >>> endpoints = stack.up()      # blocks until every component answers its probe
    >>> stack.down()
    """

    def __init__(
        self,
        config: StackConfig | None = None,
        *,
        log: Log | None = None,
        components: Callable[[StackConfig, StackEndpoints], list[Component]] = make_components,
        label: str = "localstack",
        clients: Callable[[], Mapping[str, object]] | None = None,
    ) -> None:
        """`components` and `label` let `infra.platform` supervise the services the same way;
        `clients` gives the platform's client-facing addresses for endpoints.json (every
        phase writes the whole file, so a restarted phase does not drop them)."""
        self.config = config or StackConfig.load()
        self._clients = clients
        self.endpoints: StackEndpoints = endpoints_for(self.config)
        self.components: list[Component] = components(self.config, self.endpoints)
        self.label = label
        self.timings: dict[str, float] = {}
        self._log = log or _stderr
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    # -- helpers -----------------------------------------------------------------

    @property
    def run_dir(self) -> Path:
        return self.config.data_dir / "run"

    def _pid_file(self, component: Component) -> PidFile:
        return PidFile(self.run_dir / f"{component.name}.pid")

    def _running_record(self, component: Component) -> ProcessRecord | None:
        pid_file = self._pid_file(component)
        record = pid_file.read()
        if record is None:
            return None
        if not record.alive:
            pid_file.remove()
            return None
        return record

    # -- lifecycle ---------------------------------------------------------------

    def up(self) -> StackEndpoints:
        """Start what is not running and wait until every component is ready.

        Raises PortInUseError if a port is taken, ComponentStartError (with the
        component's log tail) if a process dies or misses the start timeout.
        Components started by a failed call are stopped again.
        """
        with self._exclusive():
            return self._up()

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """One up/down at a time per data dir (two `make up-local` must not race)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with (self.run_dir / "lock").open("w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _up(self) -> StackEndpoints:
        t0 = time.monotonic()
        # Decide what runs already and check ports before anything slow happens.
        running: dict[str, ProcessRecord] = {}
        for comp in self.components:
            record = self._running_record(comp)
            if record is None:
                check_ports_free(comp.name, comp.ports, comp.bind_hosts)
            elif record.ports != comp.ports:
                raise StackError(
                    f"{comp.name} already runs (pid {record.pid}) with ports "
                    f"{record.ports}, not {comp.ports}: run `down` first"
                )
            else:
                running[comp.name] = record
        needed = {c.artifact for c in self.components if c.name not in running and c.artifact}
        if needed:
            artifacts.ensure_artifacts(tuple(sorted(needed)), cache=self.config.cache_dir)
        pending: list[_Pending] = []
        started_now: list[_Pending] = []
        try:
            for comp in self.components:
                record = running.get(comp.name)
                if record is not None:
                    self._log(f"[{self.label}] {comp.name}: already running (pid {record.pid})")
                    pending.append(
                        _Pending(comp, record, None, ExitWatcher(record.pid), time.monotonic())
                    )
                    continue
                comp.prepare()
                argv, env = comp.command()
                proc, record = spawn(
                    comp.name,
                    argv,
                    env=env,
                    cwd=comp.data_dir,
                    log_file=comp.log_file,
                    ports=comp.ports,
                    pid_file=self._pid_file(comp),
                )
                self._procs[comp.name] = proc
                self._log(
                    f"[{self.label}] {comp.name}: started pid {proc.pid}, log {comp.log_file}"
                )
                item = _Pending(comp, record, proc, ExitWatcher(proc.pid), time.monotonic())
                pending.append(item)
                started_now.append(item)
            self._wait_ready(pending)
        except BaseException:
            for item in reversed(started_now):
                self._stop_one(item.component, quiet=True)
            raise
        finally:
            for item in pending:
                item.watcher.close()
        path = self.config.data_dir / ENDPOINTS_FILE
        path.write_text(self.endpoints.to_json(self._clients() if self._clients else None))
        self.timings["total"] = time.monotonic() - t0
        self._log(f"[{self.label}] up in {self.timings['total']:.1f} s; endpoints in {path}")
        return self.endpoints

    def _wait_ready(self, pending: list[_Pending]) -> None:
        deadline = time.monotonic() + self.config.start_timeout_s
        waiting = list(pending)
        while waiting:
            for item in list(waiting):
                comp = item.component
                if not item.record.alive:
                    code = item.proc.poll() if item.proc is not None else None
                    raise start_failure(comp.name, comp.log_file, f"process exited (code {code})")
                try:
                    comp.probe()
                except NotReadyError as exc:
                    item.last_reason = str(exc)
                    continue
                comp.after_ready()
                item.ready_s = time.monotonic() - item.started
                self.timings[comp.name] = item.ready_s
                waiting.remove(item)
                self._log(
                    f"[{self.label}] {comp.name}: ready at {comp.address} in {item.ready_s:.1f} s"
                )
            if not waiting:
                return
            if time.monotonic() > deadline:
                item = waiting[0]
                raise start_failure(
                    item.component.name,
                    item.component.log_file,
                    f"not ready after {self.config.start_timeout_s:.0f} s "
                    f"(last probe: {item.last_reason})",
                )
            # Wait for the next probe round, waking at once if a process dies.
            poller = select.poll()
            for item in waiting:
                fd = item.watcher.fileno()
                if fd is not None:
                    poller.register(fd, select.POLLIN)
            poller.poll(int(PROBE_INTERVAL_S * 1000))

    def _stop_one(self, comp: Component, *, quiet: bool = False) -> str:
        t0 = time.monotonic()
        pid_file = self._pid_file(comp)
        record = pid_file.read()
        outcome = "not running"
        if record is not None:
            outcome = terminate(record, self.config.stop_timeout_s)
            pid_file.remove()
            comp.cleanup()
        proc = self._procs.pop(comp.name, None)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1)
        if not quiet:
            if record is not None and outcome != "not running":
                took = time.monotonic() - t0
                self._log(
                    f"[{self.label}] {comp.name}: {outcome} (pid {record.pid}) in {took:.1f} s"
                )
            else:
                self._log(f"[{self.label}] {comp.name}: {outcome}")
        return outcome

    def stop(self, name: str) -> str:
        """Stop one component (SIGTERM, then SIGKILL), e.g. an outage in a recovery test;
        its data stays and `up()` starts it (only it) again."""
        [comp] = [c for c in self.components if c.name == name]
        with self._exclusive():
            return self._stop_one(comp)

    def down(self) -> dict[str, str]:
        """Stop every component (SIGTERM, SIGKILL after ``stop_timeout_s``); data stays."""
        with self._exclusive():
            return {comp.name: self._stop_one(comp) for comp in reversed(self.components)}

    def status(self, *, memory: bool = True) -> list[ComponentStatus]:
        """What runs where, from the pid files (works from any process). ``memory``: each
        running component's resident memory too, a walk over every process of the
        machine: for people, not for a supervisor's loop."""
        result = []
        for comp in self.components:
            pid_file = self._pid_file(comp)
            record = pid_file.read()
            if record is None:
                state, pid, rss = "stopped", None, 0
            elif record.alive:
                rss = group_rss_bytes(record.pid) if memory else 0
                state, pid = "running", record.pid
            else:
                state, pid, rss = "stale pid file", record.pid, 0
            ports = record.ports if record is not None else comp.ports
            result.append(
                ComponentStatus(comp.name, state, pid, comp.address, ports, rss, comp.log_file)
            )
        return result

    def is_running(self) -> bool:
        """True if every component's process is alive (not a readiness check)."""
        return all(s.state == "running" for s in self.status(memory=False))

    def __enter__(self) -> LocalStack:
        self.up()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.down()


def start_on_free_ports(
    data_dir: Path,
    *,
    attempts: int = 3,
    log: Log | None = None,
    components: Callable[[StackConfig, StackEndpoints], list[Component]] = make_components,
    **overrides: Any,
) -> LocalStack:
    """Start a stack in ``data_dir`` on freshly picked free loopback ports.

    Retries with new ports when one was grabbed by another process between
    picking and binding (tests of several engineers run side by side).
    ``components`` picks a subset (e.g. Kafka alone for a benchmark that needs no lake).
    """
    from infra.localstack.config import Ports
    from infra.localstack.process import PortInUseError

    last: StackError | None = None
    for _ in range(attempts):
        config = StackConfig(data_dir=data_dir, ports=Ports.free(), **overrides)
        stack = LocalStack(config, log=log, components=components)
        try:
            stack.up()
        except PortInUseError as exc:
            last = exc
            continue
        except StackError as exc:
            # A port taken after the free-port check shows up in the log tail.
            if "address already in use" not in str(exc).lower():
                raise
            last = exc
            continue
        return stack
    assert last is not None
    raise last
