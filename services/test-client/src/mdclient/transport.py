"""ZeroMQ adapter: the only module that imports zmq.

`RequestChannel`: a REQ to :5559 as a *lazy pirate* (a timed-out socket is
closed and replaced, so no stale reply or late retry). `Subscriber`: a SUB to
:5558 owned by one thread that applies (un)subscribe commands and hands every
message to `on_message`; `subscribe()` returns once the subscription is on a
live connection and has had `settle_s` to reach the pipeline. Why: docs/adr/0003.

Both take several relays (active/active, docs/protocol.md "Failover and
chaining"): the SUB connects to every one (the SDK drops the second copy of
each message by its sequence number), the REQ to one at a time: a relay silent
for `failover_s` gets the same frames (same request_id) resent to the next, and
the one that answers is kept; a relay whose connection is lost or refused while
a reply is awaited is left at once (a socket monitor on the REQ), once per request.

Both take CURVE client keys when the relay requires them (`CurveKeys`,
docs/protocol.md "Security"). A refused key is silent in ZeroMQ (the handshake
fails and is retried), so timeouts name authentication as a possible cause and
the subscriber's socket monitor reports what it saw.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import zmq
import zmq.auth
from zmq.utils.monitor import recv_monitor_message

from mdclient.errors import ConfigError, RelayUnavailable, RequestTimeout
from mdproto.error_codes import (
    CLOSED,
    RELAY_UNAVAILABLE,
    RELAY_UNREACHABLE,
    REQUEST_TIMEOUT,
    SEND_TIMEOUT,
    SOCKET_ERROR,
    SUBSCRIBER_STUCK,
)

log = logging.getLogger(__name__)

_MONITOR_EVENTS = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_CLOSED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_MONITOR_STOPPED
)
_HEARTBEAT_IVL_MS = 5_000
_HEARTBEAT_TIMEOUT_MS = 15_000
#: A REQ's link: a relay that stops answering ZMTP pings (frozen, hung) or never ends a
#: handshake loses the connection within these, and the request on it ends at once
#: (relay_unreachable) rather than after the whole submit timeout: it is lost with it.
_REQ_HEARTBEAT_IVL_MS = 2_000
_REQ_HEARTBEAT_TIMEOUT_MS = 6_000
_REQ_HANDSHAKE_IVL_MS = 6_000
_SUB_RCVHWM = 100_000
_pipe_ids = itertools.count()
_CURVE_HINT = (
    "CURVE is on: a client key the relay does not allow, or a wrong relay public key "
    "(curve_server_key_file), looks like this too; the relay logs refused keys"
)


@dataclass(frozen=True, slots=True)
class CurveKeys:
    """This client's CURVE key pair and the relay's public key (z85)."""

    public: bytes
    secret: bytes
    server: bytes

    @classmethod
    def load(cls, secret_key_file: str, server_key_file: str) -> CurveKeys | None:
        """From `zmq.auth` certificate files; None when CURVE is not configured."""
        if not secret_key_file:
            return None
        try:
            public, secret = zmq.auth.load_certificate(secret_key_file)
            server, _ = zmq.auth.load_certificate(server_key_file)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read CURVE keys: {exc}") from None
        if not secret:
            raise ConfigError(
                f"{secret_key_file} holds no secret key: curve_secret_key_file is the "
                "client's .key_secret file"
            )
        return cls(public, secret, server)

    def apply(self, sock: zmq.Socket[bytes]) -> None:
        """Client options; set before connect."""
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret)
        sock.setsockopt(zmq.CURVE_SERVERKEY, self.server)


_GREETING_CLOSED = (
    "the connection closed during the ZMTP greeting (the relay still starting behind "
    "a port proxy, or something other than a relay at that address); retrying"
)


def handshake_problem(event: int, value: int, curve: bool) -> str | None:
    """What a failed-handshake monitor event tells the user, if anything (pure)."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return f"the relay refused this client's CURVE key (ZAP status {value})"
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == int(
        zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
    ):
        if curve:
            return "the relay does not use CURVE but this client does (curve_* settings)"
        return _REQUIRES_CURVE
    if event in (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL):
        if curve:
            return f"the CURVE handshake with the relay failed; {_CURVE_HINT}"
        # Without CURVE there is no security to fail: the peer closed the connection or did
        # not speak ZMTP. Behind a port proxy (docker-proxy) that is a relay not listening
        # yet; the socket reconnects on its own.
        return _GREETING_CLOSED
    return None


_REQUIRES_CURVE = (
    "the relay requires CURVE: set curve_secret_key_file and curve_server_key_file "
    "(MDCLIENT_CURVE_SECRET_KEY_FILE, MDCLIENT_CURVE_SERVER_KEY_FILE)"
)
# A ZMTP 3 greeting's signature and major version (RFC 23): what makes a peer send the
# rest of its own greeting, the mechanism included.
_GREETING_START = b"\xff" + bytes(8) + b"\x7f\x03"


def greeting_mechanism(greeting: bytes) -> str | None:
    """The security mechanism a ZMTP 3 greeting names (bytes 12-31), or None if the
    bytes are not the start of one (pure)."""
    if len(greeting) < 32 or greeting[0] != 0xFF or greeting[9] != 0x7F or greeting[10] < 3:
        return None
    return greeting[12:32].rstrip(b"\x00").decode("ascii", "replace")


def peer_mechanism(address: str, timeout_s: float = 0.5) -> str | None:
    """Which mechanism the ZMTP peer at a tcp:// address speaks, or None if unknown.

    libzmq cannot say: a NULL client meeting a CURVE server may see the mismatch, or,
    when the server's close resets the connection before the client read its greeting
    (likelier on a busy machine), only a closed connection. This sends a greeting's
    first 11 bytes and reads the peer's; sending nothing more, the peer waits rather
    than closes, so the answer does not race. pyzmq exposes no greeting, hence the
    socket code."""
    host, _, port = address.removeprefix("tcp://").rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout_s) as sock:
            sock.sendall(_GREETING_START)
            greeting = b""
            while len(greeting) < 32:
                chunk = sock.recv(64 - len(greeting))
                if not chunk:
                    break
                greeting += chunk
    except (OSError, ValueError):
        return None
    return greeting_mechanism(greeting)


def _addresses(address: str | Sequence[str]) -> list[str]:
    return [address] if isinstance(address, str) else list(address)


class RequestChannel:
    """REQ socket to one relay at a time with lazy-pirate recovery; one request at a time."""

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        address: str | Sequence[str],
        *,
        curve: CurveKeys | None = None,
        hint: Callable[[], str] = str,
        failover_s: float = 2.0,
    ) -> None:
        self._context = context
        self._addresses = _addresses(address)
        self._current = 0  # the relay requests go to; moves on when one is silent
        self._failover_s = failover_s
        self.failovers = 0  # requests resent to another relay (tests and logs)
        self._curve = curve
        self._hint = hint  # why the relay may be silent (the subscriber's handshake news)
        self._socket: zmq.Socket[bytes] | None = None
        self._monitor: zmq.Socket[bytes] | None = None  # several relays: the REQ's monitor
        self._lock = threading.Lock()
        self.resets = 0  # sockets discarded after a lost reply (for tests and logs)

    @property
    def _address(self) -> str:
        return self._addresses[self._current]

    @property
    def addresses(self) -> list[str]:
        return list(self._addresses)

    def request(self, frames: Sequence[bytes], timeout_s: float) -> list[bytes]:
        """Send `frames`, return the reply frames; RequestTimeout after `timeout_s`.

        With several relays, each gets `failover_s` (at most what is left of
        `timeout_s`) before the same frames go to the next one, round the list
        until `timeout_s` is spent. The frames are resent unchanged: every
        request the relay takes is idempotent by its id (docs/protocol.md).
        """
        if len(self._addresses) == 1:
            try:
                return self._request(frames, timeout_s, early=True)
            except RequestTimeout as exc:
                if exc.error_code != RELAY_UNREACHABLE:
                    raise
                raise RelayUnavailable(
                    f"{exc.reason}; the request was lost with the connection: retry once the "
                    "relay runs" + self._hint(),
                    error_code=RELAY_UNREACHABLE,
                ) from None
        deadline = time.monotonic() + timeout_s
        gone: set[int] = set()  # relays left at once for a lost connection: once each
        while True:
            left = deadline - time.monotonic()
            early = self._current not in gone
            try:
                return self._request(frames, min(self._failover_s, left), early=early)
            except RequestTimeout as exc:
                if exc.error_code == RELAY_UNREACHABLE:
                    gone.add(self._current)
                if deadline - time.monotonic() <= 0.001:
                    raise RequestTimeout(
                        f"no relay of {', '.join(self._addresses)} answered within "
                        f"{timeout_s:g}s" + self._hint(),
                        error_code=exc.error_code,
                    ) from None
                silent = self._address
                with self._lock:
                    self._current = (self._current + 1) % len(self._addresses)
                self.failovers += 1
                log.warning("relay %s silent: %s; resending to %s", silent, exc, self._address)

    def _request(
        self, frames: Sequence[bytes], timeout_s: float, *, early: bool = False
    ) -> list[bytes]:
        with self._lock:
            sock = self._socket if self._socket is not None else self._open()
            try:
                self._drain_monitor()  # news of an earlier connection is not this request's
                sock.send_multipart(list(frames))
                if not self._await_reply(sock, timeout_s, early):
                    raise RequestTimeout(
                        f"relay at {self._address} did not answer within {timeout_s:g}s"
                        + self._hint(),
                        error_code=REQUEST_TIMEOUT,
                    )
                return sock.recv_multipart()
            except zmq.Again:
                self._discard()
                raise RequestTimeout(
                    f"could not send to relay at {self._address} within {timeout_s:g}s"
                    + self._hint(),
                    error_code=SEND_TIMEOUT,
                ) from None
            except BaseException:
                # Lost reply, Ctrl-C or a socket error: this REQ is stuck mid-cycle.
                self._discard()
                raise

    def _await_reply(self, sock: zmq.Socket[bytes], timeout_s: float, early: bool) -> bool:
        """True once the reply waits, False after `timeout_s`. With `early`, a lost
        connection (several relays: or a refused one) raises
        RequestTimeout(relay_unreachable) at once."""
        deadline = time.monotonic() + timeout_s
        monitor = self._monitor if early else None
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        if monitor is not None:
            poller.register(monitor, zmq.POLLIN)
        while True:
            left_ms = max(1, int((deadline - time.monotonic()) * 1000))
            ready = dict(poller.poll(left_ms))
            if sock in ready:
                return True
            if monitor is not None and monitor in ready:
                event = recv_monitor_message(monitor)["event"]
                if event in (zmq.EVENT_DISCONNECTED, zmq.EVENT_CONNECT_RETRIED):
                    raise RequestTimeout(
                        f"relay at {self._address} is unreachable (connection lost or refused)",
                        error_code=RELAY_UNREACHABLE,
                    )
            if time.monotonic() >= deadline:
                return False

    def close(self) -> None:
        with self._lock:
            self._close_socket()

    def _open(self) -> zmq.Socket[bytes]:
        sock = self._context.socket(zmq.REQ)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDTIMEO, 5_000)
        sock.setsockopt(zmq.HEARTBEAT_IVL, _REQ_HEARTBEAT_IVL_MS)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, _REQ_HEARTBEAT_TIMEOUT_MS)
        sock.setsockopt(zmq.HANDSHAKE_IVL, _REQ_HANDSHAKE_IVL_MS)
        if self._curve is not None:
            self._curve.apply(sock)
        # One relay: a refused connection is waited for (a relay restarting takes the
        # queued request once up); several: the next relay is asked at once.
        refused = zmq.EVENT_CONNECT_RETRIED if len(self._addresses) > 1 else 0
        self._monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED | refused)
        sock.connect(self._address)
        self._socket = sock
        return sock

    def _drain_monitor(self) -> None:
        monitor = self._monitor
        while monitor is not None and monitor.poll(0):
            recv_monitor_message(monitor)

    def _close_socket(self) -> bool:
        if self._monitor is not None:
            if self._socket is not None:
                with contextlib.suppress(zmq.ZMQError):
                    self._socket.disable_monitor()
            self._monitor.close(linger=0)
            self._monitor = None
        if self._socket is None:
            return False
        self._socket.close(linger=0)
        self._socket = None
        return True

    def _discard(self) -> None:
        if self._close_socket():
            self.resets += 1
            log.debug("discarded REQ socket to %s (lazy pirate)", self._address)


@dataclass
class _Command:
    action: str  # "sub", "unsub" or "stop"
    topic: str = ""
    done: threading.Event = field(default_factory=threading.Event)
    newly: bool = False  # set by the thread: this changed the socket's subscriptions


class Subscriber:
    """SUB socket on a background thread; see the module docstring."""

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        address: str | Sequence[str],
        on_message: Callable[[list[bytes]], None],
        *,
        settle_s: float = 0.025,
        curve: CurveKeys | None = None,
    ) -> None:
        self._context = context
        self._addresses = _addresses(address)
        self._address = ", ".join(self._addresses)
        self._links: set[str] = set()  # relays with a live connection (subscriber thread)
        self._curve = curve
        # The last failed handshake's security news; cleared by a successful one.
        self.handshake_problem: str | None = None
        self._on_message = on_message
        self._settle_s = settle_s
        self._pipe_address = f"inproc://mdclient-sub-{next(_pipe_ids)}"
        self._pipe = context.socket(zmq.PAIR)
        self._pipe.setsockopt(zmq.LINGER, 0)
        self._pipe.bind(self._pipe_address)
        self._pipe_lock = threading.Lock()
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._connected = threading.Event()
        self._started = threading.Event()
        self._counts: dict[str, int] = {}
        self.handshakes = 0  # completed ZMTP handshakes (1 + reconnects)
        self._thread = threading.Thread(target=self._run, name="mdclient-sub", daemon=True)
        self._failure: BaseException | None = None
        self._thread.start()
        self._started.wait()
        if self._failure is not None:
            self._pipe.close(linger=0)
            raise RelayUnavailable(
                f"cannot open the market-data socket {address}: {self._failure}",
                error_code=SOCKET_ERROR,
            )

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def wait_connected(self, timeout_s: float) -> bool:
        """True once the SUB has a live, handshaken connection to a relay's XPUB."""
        return self._connected.wait(timeout_s)

    @property
    def links(self) -> int:
        """Relays the SUB is connected to right now (several: active/active)."""
        return len(self._links)

    def subscribe(self, topic: str, timeout_s: float) -> None:
        """Subscribe and return once the subscription is live (handshake above).

        All or nothing: on RelayUnavailable the subscription is taken back, so
        callers only unsubscribe what `subscribe` returned from normally.
        """
        command = self._send(_Command("sub", topic), timeout_s)
        if not self._connected.wait(timeout_s):
            self._send(_Command("unsub", topic), timeout_s)
            raise RelayUnavailable(
                f"no connection to the relay's market-data socket {self._address} "
                f"within {timeout_s:g}s{self.hint()}",
                error_code=RELAY_UNAVAILABLE,
            )
        if command.newly and self._settle_s > 0:
            # No ack exists in ZeroMQ: give the frame time to reach the XPUB.
            time.sleep(self._settle_s)

    def hint(self) -> str:
        """ "; <why>" when a handshake failed or CURVE could be the cause, else ""."""
        if self.handshake_problem:
            return f"; {self.handshake_problem}"
        return f"; {_CURVE_HINT}" if self._curve is not None and not self.connected else ""

    def unsubscribe(self, topic: str, timeout_s: float = 5.0) -> None:
        self._send(_Command("unsub", topic), timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        if self._thread.is_alive():
            try:
                self._send(_Command("stop"), timeout_s)
            except RelayUnavailable:
                log.warning("subscriber thread did not stop within %ss", timeout_s)
            self._thread.join(timeout_s)
        self._pipe.close(linger=0)

    def _send(self, command: _Command, timeout_s: float) -> _Command:
        if not self._thread.is_alive():
            raise RelayUnavailable("the subscriber thread is not running", error_code=CLOSED)
        self._commands.put(command)
        with self._pipe_lock:
            try:
                # Never block: a full or peerless pipe means the thread is gone.
                self._pipe.send(b"!", zmq.NOBLOCK)
            except zmq.Again:
                raise RelayUnavailable(
                    "the subscriber thread does not take commands", error_code=CLOSED
                ) from None
        if not command.done.wait(timeout_s):
            raise RelayUnavailable(
                f"subscriber thread did not apply {command.action} {command.topic!r}",
                error_code=SUBSCRIBER_STUCK,
            )
        return command

    # --- everything below runs on the subscriber thread ---

    def _run(self) -> None:
        sockets: list[zmq.Socket[bytes]] = []
        try:
            pipe = self._context.socket(zmq.PAIR)
            sockets.append(pipe)
            pipe.setsockopt(zmq.LINGER, 0)
            pipe.connect(self._pipe_address)
            sub = self._context.socket(zmq.SUB)
            sockets.append(sub)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.RCVHWM, _SUB_RCVHWM)
            # A relay that restarts gets the subscriptions resent from here, at most SNDHWM
            # of them (libzmq #2258: the default 1000 silently loses the rest).
            sub.setsockopt(zmq.SNDHWM, 0)
            sub.setsockopt(zmq.HEARTBEAT_IVL, _HEARTBEAT_IVL_MS)
            sub.setsockopt(zmq.HEARTBEAT_TIMEOUT, _HEARTBEAT_TIMEOUT_MS)
            if self._curve is not None:
                self._curve.apply(sub)
            monitor = sub.get_monitor_socket(_MONITOR_EVENTS)
            sockets.append(monitor)
            for address in self._addresses:
                sub.connect(address)
        except Exception as exc:
            self._failure = exc
            for sock in sockets:
                sock.close(linger=0)
            return
        finally:
            self._started.set()
        poller = zmq.Poller()
        for sock in (pipe, monitor, sub):
            poller.register(sock, zmq.POLLIN)
        try:
            while True:
                ready = dict(poller.poll())
                if monitor in ready:
                    self._on_monitor(monitor)
                if sub in ready:
                    self._drain(sub)
                if pipe in ready and not self._apply_commands(pipe, sub):
                    return
        except zmq.ContextTerminated:
            return
        except Exception:
            # Callers then get RelayUnavailable instead of waiting forever.
            log.exception("subscriber thread failed; no more market data or notifications")
        finally:
            self._connected.clear()
            with contextlib.suppress(zmq.ZMQError):
                sub.disable_monitor()
            for sock in (monitor, sub, pipe):
                sock.close(linger=0)

    def _on_monitor(self, monitor: zmq.Socket[bytes]) -> None:
        while monitor.poll(0, zmq.POLLIN):
            message = recv_monitor_message(monitor)
            event = message["event"]
            endpoint = message.get("endpoint", b"")
            relay = endpoint.decode() if isinstance(endpoint, bytes) else str(endpoint)
            problem = handshake_problem(event, message["value"], self._curve is not None)
            if problem == _GREETING_CLOSED:
                # Which event a CURVE relay's close produces is a race: a greeting cut
                # short says less than a named mismatch or refusal, so it never replaces
                # one, and without CURVE here the relay's greeting is asked (once per
                # problem: the same one again is not news).
                if self.handshake_problem is not None:
                    problem = None
                elif self._curve is None and peer_mechanism(relay) == "CURVE":
                    problem = _REQUIRES_CURVE
            if problem is not None and problem != self.handshake_problem:
                log.warning("handshake with %s failed: %s", self._address, problem)
                self.handshake_problem = problem
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.handshake_problem = None
                self.handshakes += 1
                self._links.add(relay)
                self._connected.set()
                log.debug("connected to %s", relay)
            elif event in (zmq.EVENT_DISCONNECTED, zmq.EVENT_CLOSED):
                self._links.discard(relay)
                if not self._links:
                    self._connected.clear()
                log.info(
                    "lost connection to %s; ZeroMQ reconnects (%d other relay(s) connected)",
                    relay,
                    len(self._links),
                )

    def _drain(self, sub: zmq.Socket[bytes]) -> None:
        for _ in range(1000):  # bounded so commands are never starved
            try:
                frames = sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                self._on_message(frames)
            except Exception:
                log.exception("message handler failed; message dropped")

    def _apply_commands(self, pipe: zmq.Socket[bytes], sub: zmq.Socket[bytes]) -> bool:
        while pipe.poll(0, zmq.POLLIN):
            pipe.recv()
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True
            if command.action == "stop":
                command.done.set()
                return False
            count = self._counts.get(command.topic, 0)
            if command.action == "sub":
                self._counts[command.topic] = count + 1
                if count == 0:
                    sub.setsockopt(zmq.SUBSCRIBE, command.topic.encode())
                    command.newly = True
            elif count > 0:
                if count == 1:
                    del self._counts[command.topic]
                    sub.setsockopt(zmq.UNSUBSCRIBE, command.topic.encode())
                    command.newly = True
                else:
                    self._counts[command.topic] = count - 1
            command.done.set()


class Transport:
    """Context plus both channels: what the rest of the SDK talks to."""

    def __init__(
        self,
        request_address: str | Sequence[str],
        market_data_address: str | Sequence[str],
        on_message: Callable[[list[bytes]], None],
        *,
        settle_s: float,
        curve: CurveKeys | None = None,
        failover_s: float = 2.0,
    ) -> None:
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.subscriber = Subscriber(
            self._context, market_data_address, on_message, settle_s=settle_s, curve=curve
        )
        self.requests = RequestChannel(
            self._context,
            request_address,
            curve=curve,
            hint=self.subscriber.hint,
            failover_s=failover_s,
        )
        self._curve = curve

    def request_each(
        self, frames: Sequence[bytes], timeout_s: float
    ) -> list[list[bytes] | RequestTimeout]:
        """The same request to every relay, one after another, each with `timeout_s`: for
        what each relay alone knows (the requests it accepted). A relay that does not
        answer gives its RequestTimeout in its place."""
        addresses = self.requests.addresses
        channels = (
            [self.requests]
            if len(addresses) == 1
            else [
                RequestChannel(self._context, a, curve=self._curve, hint=self.subscriber.hint)
                for a in addresses
            ]
        )
        answers: list[list[bytes] | RequestTimeout] = []
        for channel in channels:
            try:
                answers.append(channel.request(frames, timeout_s))
            except RequestTimeout as exc:
                answers.append(exc)
            finally:
                if channel is not self.requests:
                    channel.close()
        return answers

    def close(self) -> None:
        self.subscriber.close()
        self.requests.close()
        if self.subscriber.alive:
            # term() would wait for the thread's sockets forever: leak rather than hang.
            log.warning("subscriber thread still running; leaving its ZeroMQ context open")
            return
        self._context.term()
