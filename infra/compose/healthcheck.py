"""Container health checks for the platform images (stdlib only, no curl in slim images).

Docker runs ``python /opt/mdp/healthcheck.py CHECK [CHECK ...]``; exit 0 means every
check passed, exit 1 prints the first failure (``docker inspect`` shows it).

Checks:

- ``tcp:HOST:PORT``  something accepts TCP connections there (a ZeroMQ bind, Kafka ...)
- ``http:URL``       the URL answers 2xx within the timeout
- ``file:PATH``      the file exists and is not empty (e.g. the pipeline's ready file)
- ``peer:PORT``      this container holds an ESTABLISHED TCP connection to a remote PORT:
                     a ZeroMQ SUB that is really connected to the relay, not just started
"""

from __future__ import annotations

import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path

TIMEOUT_S = 3.0
_TCP_ESTABLISHED = "01"
_PROC_TCP = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
# Health probes hit local ports: an http_proxy from the environment must not apply.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


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


CHECKS = {"tcp": check_tcp, "http": check_http, "file": check_file, "peer": check_peer}


def run(argv: Sequence[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    for arg in argv:
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


if __name__ == "__main__":
    raise SystemExit(run(sys.argv[1:]))
