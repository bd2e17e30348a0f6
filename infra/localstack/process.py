"""Start, find and stop component processes through pid files.

Each component runs in its own session/process group so that ``down`` (possibly
from another process than the one that ran ``up``) can signal the whole group,
and a terminal closing does not take the stack down. The pid file records the
process start time too, so a recycled pid is never mistaken for ours.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


class StackError(RuntimeError):
    """A stack component could not be started, probed or stopped."""


class PortInUseError(StackError):
    """A configured port is already taken by another process."""


class ComponentStartError(StackError):
    """A component exited or did not become ready; the message has its log tail."""


def log_tail(path: Path, lines: int = 40) -> str:
    """Last lines of a log file, for error messages."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return "(no log file)"
    return "\n".join(text.splitlines()[-lines:])


#: What `spawn` writes before each start of a component into its log.
START_HEADER = "\n===== "


def this_start(log_file: Path) -> str:
    """What a component logged since its latest start (its log holds every start)."""
    try:
        text = log_file.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return text[max(0, text.rfind(START_HEADER)) :]


def start_failure(component: str, log_file: Path, reason: str) -> ComponentStartError:
    """Build the error naming the component and showing its log tail."""
    return ComponentStartError(
        f"{component} failed to start: {reason}\n"
        f"log file: {log_file}\n"
        f"----- last lines of {log_file.name} -----\n"
        f"{log_tail(log_file)}\n"
        f"-----"
    )


def port_is_free(port: int, host: str) -> bool:
    """True if a server could bind ``host:port`` now (SO_REUSEADDR, as servers use)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def check_ports_free(component: str, ports: Mapping[str, int], hosts: Sequence[str]) -> None:
    """Raise PortInUseError naming the component and port if any port is taken."""
    for name, port in ports.items():
        for host in hosts:
            if not port_is_free(port, host):
                env = f"INFRA_STACK_PORTS__{name.upper()}"
                raise PortInUseError(
                    f"{component}: port {port} ({name}) on {host} is already in use; "
                    f"stop whatever listens there (`ss -ltnp 'sport = :{port}'`) "
                    f"or choose another port with {env}=<port>"
                )


def wait_ports_free(
    component: str,
    ports: Mapping[str, int],
    hosts: Sequence[str],
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """`check_ports_free` once the ports are free or `timeout_s` has passed: a process
    killed a moment ago may hold its ports until its last thread has exited, after its
    main thread is already a zombie (what a liveness check sees as dead)."""
    deadline = clock() + timeout_s
    while clock() < deadline:
        if all(port_is_free(port, host) for port in ports.values() for host in hosts):
            return
        time.sleep(0.1)  # nothing to block on: a port is released by the kernel
    check_ports_free(component, ports, hosts)


def _proc_start_ticks(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot (field 22 of /proc/pid/stat)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces; fields resume after ')'.
    rest = stat.rsplit(")", 1)[1].split()
    state = rest[0]
    if state in ("Z", "X"):
        return None
    return int(rest[19])


def group_rss_bytes(pgid: int) -> int:
    """Resident memory of every process in a process group (a component's footprint)."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            statm = (entry / "statm").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid:
            total += int(statm.split()[1]) * page
    return total


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class ProcessRecord:
    """What a pid file holds about one running component."""

    component: str
    pid: int
    start_ticks: int
    ports: dict[str, int]
    log_file: str
    argv: list[str]

    @property
    def alive(self) -> bool:
        """The recorded process still runs (and is the same process, not a reused pid)."""
        return _proc_start_ticks(self.pid) == self.start_ticks


class PidFile:
    """JSON pid file of one component, under ``<data_dir>/run/``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, record: ProcessRecord) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record.__dict__, indent=2) + "\n")
        tmp.replace(self.path)

    def read(self) -> ProcessRecord | None:
        try:
            data = json.loads(self.path.read_text())
            return ProcessRecord(**data)
        except (OSError, ValueError, TypeError):
            return None

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def spawn(
    component: str,
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path,
    log_file: Path,
    ports: Mapping[str, int],
    pid_file: PidFile,
) -> tuple[subprocess.Popen[bytes], ProcessRecord]:
    """Start a component in its own session, output appended to its log file."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as log:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        log.write(f"{START_HEADER}{stamp} starting {component}: {' '.join(argv)}\n".encode())
        log.flush()
        try:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=dict(env),
                start_new_session=True,
            )
        except OSError as exc:
            raise start_failure(component, log_file, f"cannot execute {argv[0]}: {exc}") from exc
    ticks = _proc_start_ticks(proc.pid)
    record = ProcessRecord(
        component=component,
        pid=proc.pid,
        start_ticks=ticks if ticks is not None else -1,
        ports=dict(ports),
        log_file=str(log_file),
        argv=list(argv),
    )
    pid_file.write(record)
    return proc, record


class ExitWatcher:
    """Wait for a process to exit without sleeping, via a pidfd (works for non-children)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        try:
            self._fd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:
            self._fd = None

    def fileno(self) -> int | None:
        """The pidfd (readable once the process exits), None if it was already gone."""
        return self._fd

    def wait(self, timeout_s: float) -> bool:
        """True once the process has exited; False if still running after the timeout."""
        if self._fd is None:
            return True
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        return bool(poller.poll(max(0, int(timeout_s * 1000))))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _reap(pid: int) -> None:
    """Collect the exit status if the process is our child (avoids zombies)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def terminate(record: ProcessRecord, timeout_s: float) -> str:
    """SIGTERM the component's process group, SIGKILL it after ``timeout_s``.

    Returns how it ended: "stopped", "killed" or "not running".
    """
    if not record.alive:
        return "not running"
    watcher = ExitWatcher(record.pid)
    try:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record.pid, signal.SIGTERM)
        outcome = "stopped"
        if not watcher.wait(timeout_s):
            outcome = "killed"
            with contextlib.suppress(ProcessLookupError):
                os.killpg(record.pid, signal.SIGKILL)
            watcher.wait(10.0)
        _reap(record.pid)
        # Stragglers in the group (none expected) must not outlive the leader.
        if _group_alive(record.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(record.pid, signal.SIGKILL)
        return outcome
    finally:
        watcher.close()


def wait_group_gone(pgid: int, timeout_s: float) -> None:
    """Until no live process of the group is left: its children (the pipeline's PUB
    process, the Spark JVM) may outlive the leader by a moment and still hold their
    ports. Zombies count as gone: they hold no sockets, and their reaper may be slow."""
    deadline = time.monotonic() + timeout_s
    while live_group_members(pgid):
        if time.monotonic() > deadline:
            raise StackError(f"process group {pgid} still runs {timeout_s:g}s after the kill")
        time.sleep(0.05)


def live_group_members(pgid: int) -> list[int]:
    """Pids of the group's processes that are not zombies (Linux /proc; [] elsewhere)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # exited while we looked
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses.
        fields = text[text.rfind(")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members
