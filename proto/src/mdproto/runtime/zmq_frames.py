"""Multipart ZeroMQ messages sent and received without pyzmq's per-frame Python.

pyzmq's ``send_multipart`` type-checks every frame, builds each frame's flags with
enum arithmetic and goes through the Python ``Socket`` subclass (which exists for the
DRAFT routing ids and groups the platform never uses): for the platform's small frames
that costs several times the libzmq call itself (docs/relay-benchmarks.md,
docs/pipeline-benchmarks.md (n)). These call pyzmq's compiled ``send`` and ``recv``
with plain int flags; what reaches the wire, and the errors raised, are the same.
"""

from __future__ import annotations

from typing import Any

import zmq

NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE = int(zmq.SNDMORE)
_send = zmq.backend.Socket.send
_recv = zmq.backend.Socket.recv


def send_frames(sock: zmq.Socket[Any], frames: list[bytes], flags: int = 0) -> None:
    """``sock.send_multipart(frames, flags)``, cheaper: raises `zmq.Again` / `ZMQError`
    like it, and libzmq delivers a multipart message whole or not at all."""
    more = flags | _SNDMORE
    last = len(frames) - 1
    for i in range(last):
        _send(sock, frames[i], more)
    _send(sock, frames[last], flags)


def recv_frames(sock: zmq.Socket[Any]) -> list[bytes] | None:
    """``sock.recv_multipart(NOBLOCK)``, cheaper (``Frame.more`` instead of a
    getsockopt per frame); None when no message is waiting."""
    try:
        frame = _recv(sock, NOBLOCK, False)
    except zmq.Again:
        return None
    frames = [frame.bytes]
    while frame.more:
        frame = _recv(sock, NOBLOCK, False)
        frames.append(frame.bytes)
    return frames
