"""Container health checks for the platform images (stdlib only, no curl in slim images).

Docker runs ``python /opt/mdp/healthcheck.py CHECK [CHECK ...]``; exit 0 means every
check passed, exit 1 prints the first failure (``docker inspect`` shows it).

Checks:

- ``tcp:HOST:PORT``  something accepts TCP connections there (a ZeroMQ bind, Kafka ...)
- ``http:URL``       the URL answers 2xx within the timeout
- ``file:PATH``      the file exists and is not empty (e.g. the pipeline's ready file)
- ``peer:PORT``      this container holds an ESTABLISHED TCP connection to a remote PORT:
                     a ZeroMQ SUB that is really connected to the relay, not just started
- ``live:URL``       the URL answers at all, any HTTP status, within 5 s (the
                     service's /healthz: a 503 is a service that runs and says what it
                     lacks; silence is a hung one). Checked first, whatever the order.

Liveness: Docker marks a container unhealthy but never restarts it. So once a
``live:`` check has answered since the container started, ``MDP_LIVENESS_FAILURES``
(default 3) checks in a row without an answer make this check SIGKILL every
process of the service (all but the container's init, which `init: true` makes
docker-init): the container exits and its ``restart:`` policy starts it again. The
reason goes to the container's log (``docker compose logs``), after its last lines.
Why this and not a watchdog container: docs/adr/0013-liveness-restarts.md.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

TIMEOUT_S = 3.0
_TCP_ESTABLISHED = "01"
_PROC_TCP = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
# Health probes hit local ports: an http_proxy from the environment must not apply.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
#: A ``live:`` check's wait: inside the images' 10 s HEALTHCHECK timeout, which also
#: covers this script's start (2 s measured on two loaded cores); generous, because a
#: slow answer under load must not be taken for a hang.
LIVE_TIMEOUT_S = 5.0
#: Consecutive unanswered ``live:`` checks before the service is killed.
LIVENESS_FAILURES_ENV = "MDP_LIVENESS_FAILURES"
LIVENESS_FAILURES = 3
#: Between two checks (each is a process of its own): the count, per container start.
LIVENESS_STATE = Path("/tmp/mdp-liveness.json")


class UnhealthyError(Exception):
    """One check did not pass; the message says why."""


def check_tcp(target: str) -> None:
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"tcp check wants HOST:PORT, got {target!r}")
    try:
        with socket.create_connection((host, int(port)), timeout=TIMEOUT_S):
            return
    except OSError as exc:
        raise UnhealthyError(f"tcp {target}: {exc}") from None


def check_http(url: str) -> None:
    try:
        with _NO_PROXY.open(url, timeout=TIMEOUT_S) as resp:
            status = int(resp.status)
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (urllib.error.URLError, OSError) as exc:
        raise UnhealthyError(f"http {url}: {exc}") from None
    if not 200 <= status < 300:
        raise UnhealthyError(f"http {url}: HTTP {status}")


def check_live(url: str) -> None:
    try:
        with _NO_PROXY.open(url, timeout=LIVE_TIMEOUT_S):
            return
    except urllib.error.HTTPError:
        return  # an answer: the service runs
    except (urllib.error.URLError, OSError) as exc:
        raise UnhealthyError(f"live {url}: no answer: {exc}") from None


@dataclass(frozen=True)
class Liveness:
    """What one check tells the next: the container start it counts for (pid 1's start
    time), whether a ``live:`` check answered since, and the failures in a row."""

    boot: str
    answered: bool = False
    failures: int = 0

    def after(self, boot: str, answered: bool) -> Liveness:
        """The state after one check. Before the first answer (a service still starting,
        or one whose port is not configured) failures are not counted."""
        state = self if self.boot == boot else Liveness(boot)
        if answered:
            return Liveness(boot, answered=True)
        return Liveness(boot, state.answered, state.failures + 1 if state.answered else 0)

    def hung(self, limit: int) -> bool:
        return self.answered and self.failures >= limit


def check_file(path: str) -> None:
    p = Path(path)
    if not p.is_file() or p.stat().st_size == 0:
        raise UnhealthyError(f"file {path}: missing or empty")


def established_remote_ports(tables: Iterable[str]) -> set[int]:
    """Remote ports of ESTABLISHED connections in /proc/net/tcp-format text."""
    ports: set[int] = set()
    for table in tables:
        for line in table.splitlines()[1:]:
            fields = line.split()
            if len(fields) < 4 or fields[3] != _TCP_ESTABLISHED:
                continue
            _, _, port_hex = fields[2].rpartition(":")
            ports.add(int(port_hex, 16))
    return ports


def check_peer(port: str) -> None:
    if not port.isdigit():
        raise ValueError(f"peer check wants a port number, got {port!r}")
    tables = [p.read_text() for p in _PROC_TCP if p.is_file()]
    if int(port) not in established_remote_ports(tables):
        raise UnhealthyError(f"peer {port}: no established connection to a remote port {port}")


CHECKS = {
    "live": check_live,
    "tcp": check_tcp,
    "http": check_http,
    "file": check_file,
    "peer": check_peer,
}


def _boot() -> str:
    """The container's start: pid 1's start time (a restart starts a new pid 1)."""
    stat = Path("/proc/1/stat").read_text()
    return stat.rpartition(")")[2].split()[19]


def _kill_service(reason: str) -> None:
    """Say why in the container's log, then SIGKILL every process but init and this one
    (kill(-1) skips both); a frozen process dies too."""
    try:
        with open("/proc/1/fd/2", "w") as log:  # docker-init's stderr: the container log
            print(reason, file=log, flush=True)
    except OSError:
        print(reason, file=sys.stderr)  # then at least in `docker inspect`'s health log
    os.kill(-1, signal.SIGKILL)


def watch_liveness(
    answered: bool,
    failure: str,
    *,
    state_file: Path = LIVENESS_STATE,
    boot: Callable[[], str] = _boot,
    kill: Callable[[str], None] = _kill_service,
) -> None:
    """Count one ``live:`` result; kill the service once it is hung."""
    try:
        previous = Liveness(**json.loads(state_file.read_text()))
    except (OSError, ValueError, TypeError):
        previous = Liveness("")
    state = previous.after(boot(), answered)
    state_file.write_text(json.dumps(asdict(state)))
    limit = int(os.environ.get(LIVENESS_FAILURES_ENV) or LIVENESS_FAILURES)
    if state.hung(limit):
        kill(
            f"[healthcheck] {failure} ({state.failures} checks in a row,"
            f" {LIVENESS_FAILURES_ENV}={limit}): killing the service; the container"
            " restarts"
        )


def run(argv: Sequence[str], watch: Callable[[bool, str], None] = watch_liveness) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    live = [arg.partition(":")[2] for arg in argv if arg.startswith("live:")]
    if live:
        failure = next((f for f in (_failure(check_live, url) for url in live) if f), "")
        watch(not failure, failure)
        if failure:
            print(f"unhealthy: {failure}", file=sys.stderr)
            return 1
    for arg in argv:
        if arg.startswith("live:"):
            continue
        kind, sep, target = arg.partition(":")
        check = CHECKS.get(kind)
        if check is None or not sep:
            print(f"unknown check {arg!r}: use one of {', '.join(CHECKS)}", file=sys.stderr)
            return 2
        try:
            check(target)
        except UnhealthyError as exc:
            print(f"unhealthy: {exc}", file=sys.stderr)
            return 1
        except ValueError as exc:
            print(f"bad check: {exc}", file=sys.stderr)
            return 2
    return 0


def _failure(check: Callable[[str], None], target: str) -> str:
    try:
        check(target)
    except UnhealthyError as exc:
        return str(exc)
    return ""


if __name__ == "__main__":
    raise SystemExit(run(sys.argv[1:]))
