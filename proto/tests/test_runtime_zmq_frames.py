"""mdproto.runtime.zmq_frames against pyzmq's own multipart calls, on real sockets."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq

from mdproto.runtime.zmq_frames import NOBLOCK, recv_frames, send_frames


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://frames")
    b.connect("inproc://frames")
    yield a, b
    ctx.destroy(linger=0)


def test_a_message_sent_is_received_whole_by_pyzmq_and_by_recv_frames(pair) -> None:
    a, b = pair
    send_frames(a, [b"topic", b"\x01", b"body"])
    assert b.recv_multipart() == [b"topic", b"\x01", b"body"]
    a.send_multipart([b"one"])
    a.send_multipart([b"x", b"", b"y"])
    b.poll(1000)
    assert recv_frames(b) == [b"one"]
    assert recv_frames(b) == [b"x", b"", b"y"]
    assert recv_frames(b) is None  # nothing waiting: no exception


def test_noblock_raises_again_where_send_multipart_would(pair) -> None:
    a, _ = pair
    a.setsockopt(zmq.SNDHWM, 1)
    with pytest.raises(zmq.Again):
        for _ in range(100_000):
            send_frames(a, [b"t", b"v"], NOBLOCK)
