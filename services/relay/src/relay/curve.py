"""CURVE on the client sockets (:5558 market data, :5559 requests): keys, allow-list, exposure.

ZeroMQ CURVE encrypts every frame and authenticates both ends: clients must know
the relay's public key, and the relay admits only client public keys on its
allow-list, checked by a ZAP handler (pyzmq's ThreadAuthenticator, one thread on
the relay's context). The ingestor and pipeline sockets stay NULL: they are
internal and must not be published beyond a trusted network (docs/protocol.md,
"Security"). Key files are those `zmq.auth.create_certificates` writes
(`relay keys generate`): `NAME.key` (public) and `NAME.key_secret` (both keys).

The exposure rule: client sockets reachable from beyond loopback need CURVE.
`exposure_problem` is the pure check the relay runs before it binds anything.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

log = logging.getLogger(__name__)

# ZAP domains of the two client sockets: the authenticator learns which socket asks.
REQUESTS = "requests"
MARKET_DATA = "market_data"
DOMAINS = (REQUESTS, MARKET_DATA)

# (domain, z85 client key, peer address) of a refused handshake; runs on the ZAP thread.
OnRefused = Callable[[str, str, str], None]


class CurveConfigError(ValueError):
    """A key file or directory is missing or invalid, or CURVE is required and off."""


@dataclass(frozen=True, slots=True)
class ServerKeys:
    public: bytes  # z85, 40 bytes
    secret: bytes


def load_server_keys(path: str | Path) -> ServerKeys:
    """The relay's key pair from a `.key_secret` file (it holds both keys)."""
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise CurveConfigError(f"cannot read the CURVE secret key file {path}: {exc}") from None
    if not secret:
        raise CurveConfigError(
            f"{path} holds no secret key: give the `.key_secret` file, not the public `.key`"
        )
    return ServerKeys(public, secret)


def load_client_keys(directory: str | Path) -> frozenset[bytes]:
    """z85 public keys of every `*.key` file in `directory` (the allow-list)."""
    if not Path(directory).is_dir():
        raise CurveConfigError(f"CURVE client key directory {directory} does not exist")
    try:
        return frozenset(zmq.auth.load_certificates(directory))
    except (OSError, ValueError) as exc:
        raise CurveConfigError(f"cannot read CURVE client keys in {directory}: {exc}") from None


def generate(directory: str | Path, name: str) -> tuple[Path, Path]:
    """Write `NAME.key` and `NAME.key_secret` into `directory` (created, secret file 0600)."""
    os.makedirs(directory, exist_ok=True)
    public, secret = zmq.auth.create_certificates(directory, name)
    os.chmod(secret, 0o600)
    return Path(public), Path(secret)


def apply_client(sock: zmq.Socket[bytes], secret_key_file: str, server_key_file: str) -> None:
    """CURVE client options: a branch relay's XSUB to parent relays' :5558 (set before connect)."""
    own = load_server_keys(secret_key_file)  # the same `.key_secret` format: both keys
    try:
        server, _ = zmq.auth.load_certificate(server_key_file)
    except (OSError, ValueError) as exc:
        raise CurveConfigError(
            f"cannot read the parent relay's public key {server_key_file}: {exc}"
        ) from None
    sock.curve_publickey, sock.curve_secretkey = own.public, own.secret
    sock.curve_serverkey = server


# --- the exposure rule (pure) ----------------------------------------------------


def endpoint_host(bind_address: str) -> str | None:
    """`tcp://HOST` -> HOST (brackets of IPv6 removed); None for non-network transports."""
    scheme, _, rest = bind_address.partition("://")
    if scheme not in ("tcp", "ws", "wss"):
        return None  # ipc://, inproc://: not reachable over the network
    host = rest.split(";")[-1]  # tcp://iface;host form names the interface first
    return host.strip("[]")


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost; `*`, 0.0.0.0, interfaces and other names are not."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def exposure_problem(bind_address: str, published_host: str, curve_on: bool) -> str | None:
    """Why the relay must not start (client sockets beyond loopback, no CURVE), else None.

    `published_host` is where the ports are reachable when that differs from the
    bind address (a container binds tcp://* and its ports are published on the
    host's MDP_BIND); when set it decides.
    """
    if curve_on:
        return None
    host = published_host or endpoint_host(bind_address)
    if host is None or is_loopback(host):
        return None
    where = f"published on {published_host}" if published_host else f"bound to {bind_address}"
    return (
        f"refusing to start: the client sockets would be {where}, beyond loopback, "
        "without CURVE: anyone who can reach them could submit requests and read every feed. "
        "Set curve_secret_key_file and curve_client_keys_dir (RELAY_CURVE_SECRET_KEY_FILE, "
        "RELAY_CURVE_CLIENT_KEYS_DIR; keys from `relay keys generate`), or bind 127.0.0.1 "
        "(docs/protocol.md, Security)"
    )


# --- the allow-list and the ZAP thread ---------------------------------------------


class AllowList:
    """Client public keys from a directory, re-read when the directory changes.

    Adding or removing a `.key` file takes effect at the next handshake (the
    directory's mtime is checked on each one; handshakes are rare).
    """

    def __init__(self, directory: str | Path, on_refused: OnRefused) -> None:
        self._dir = Path(directory)
        self._on_refused = on_refused
        self._lock = threading.Lock()
        self._keys = load_client_keys(self._dir)
        self._mtime = self._dir.stat().st_mtime_ns
        if not self._keys:
            raise CurveConfigError(
                f"no client keys (*.key) in {directory}: CURVE would refuse every client"
            )
        self.peer = ""  # address of the handshake being checked (set by the authenticator)

    def __len__(self) -> int:
        return len(self._keys)

    def allowed(self, key: bytes) -> bool:
        with self._lock:
            self._reload()
            return key in self._keys

    def callback(self, domain: str, key: bytes) -> bool:
        """pyzmq's credentials-provider hook: `key` is the client's z85 public key."""
        if self.allowed(key):
            return True
        self._on_refused(domain, key.decode("ascii", "replace"), self.peer)
        return False

    def _reload(self) -> None:
        try:
            mtime = self._dir.stat().st_mtime_ns
            if mtime != self._mtime:
                self._keys = load_client_keys(self._dir)
                self._mtime = mtime
                log.info("CURVE allow-list reloaded: %d client keys", len(self._keys))
        except (OSError, CurveConfigError) as exc:  # keep the last good list
            log.error("CURVE allow-list not reloaded (%s); keeping %d keys", exc, len(self._keys))


class _Authenticator(ThreadAuthenticator):
    """Notes the peer address of each ZAP request for the refusal log line."""

    allow_list: AllowList

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        self.allow_list.peer = msg[3].decode("utf-8", "replace") if len(msg) > 3 else ""
        await super().handle_zap_message(msg)


class ClientAuth:
    """The server keys plus a ZAP thread answering for the client sockets' domains.

    Start it before the client sockets bind: a CURVE socket whose context has no
    ZAP handler admits every client key.
    """

    def __init__(self, keys: ServerKeys, allow_list: AllowList) -> None:
        self.keys = keys
        self.allow_list = allow_list
        self._auth: _Authenticator | None = None

    @classmethod
    def from_files(
        cls, secret_key_file: str, client_keys_dir: str, on_refused: OnRefused
    ) -> ClientAuth:
        return cls(load_server_keys(secret_key_file), AllowList(client_keys_dir, on_refused))

    def start(self, ctx: zmq.Context[Any]) -> None:
        auth = _Authenticator(ctx, log=logging.getLogger("relay.zap"))
        auth.allow_list = self.allow_list
        auth.start()
        for domain in DOMAINS:
            auth.configure_curve_callback(domain, credentials_provider=self.allow_list)
        self._auth = auth

    @property
    def alive(self) -> bool:
        return self._auth is not None and self._auth.is_alive()

    def stop(self) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None

    def public_key(self) -> str:
        return self.keys.public.decode("ascii")


def apply_server(sock: zmq.Socket[bytes], keys: ServerKeys, domain: str) -> None:
    """CURVE server options; set before bind (the handshake reads them per connection)."""
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
    sock.setsockopt(zmq.ZAP_DOMAIN, domain.encode())
