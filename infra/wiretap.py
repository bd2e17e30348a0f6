"""A TCP forwarder that records every byte it passes: what an eavesdropper on the wire sees.

Tests put it between a ZeroMQ client and the relay (connect to `tap.endpoint`
instead of the relay's port) and then look for plaintext in `tap.captured()`.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading


class WireTap:
    def __init__(self, target_port: int, host: str = "127.0.0.1") -> None:
        self._target = (host, target_port)
        self._listener = socket.create_server((host, 0))
        self._listener.setblocking(False)
        self.port = int(self._listener.getsockname()[1])
        self._wake_r, self._wake_w = socket.socketpair()
        self._lock = threading.Lock()
        self._bytes = bytearray()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="wiretap", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"tcp://{self._target[0]}:{self.port}"

    def captured(self) -> bytes:
        """Everything forwarded so far, both directions, in arrival order."""
        with self._lock:
            return bytes(self._bytes)

    def close(self) -> None:
        self._stopping = True
        self._wake_w.send(b"x")
        self._thread.join(5)
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ)
        sel.register(self._wake_r, selectors.EVENT_READ)
        peers: dict[socket.socket, socket.socket] = {}
        try:
            while not self._stopping:
                for key, _ in sel.select():
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    if sock is self._listener:
                        client, _addr = self._listener.accept()
                        upstream = socket.create_connection(self._target)
                        for a, b in ((client, upstream), (upstream, client)):
                            peers[a] = b
                            sel.register(a, selectors.EVENT_READ)
                    elif sock is not self._wake_r:
                        self._forward(sock, peers, sel)
        finally:
            for sock in peers:
                with contextlib.suppress(OSError):
                    sock.close()
            sel.close()

    def _forward(
        self,
        sock: socket.socket,
        peers: dict[socket.socket, socket.socket],
        sel: selectors.BaseSelector,
    ) -> None:
        try:
            data = sock.recv(65536)
        except OSError:
            data = b""
        other = peers.get(sock)
        if data and other is not None:
            with self._lock:
                self._bytes += data
            with contextlib.suppress(OSError):
                other.sendall(data)
            return
        for s in (sock, other):  # one side closed: close the pair
            if s is not None and s in peers:
                sel.unregister(s)
                peers.pop(s)
                s.close()
