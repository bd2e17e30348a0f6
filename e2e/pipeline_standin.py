"""A pipeline-and-ingestor stand-in for e2e/test_inflight.py: one process to SIGSTOP.

    python e2e/pipeline_standin.py PUB_PORT RELAY_WORK_ENDPOINT

It publishes `PipelineStatus` (history and triggers served) every second on its PUB,
as the pipeline does, and takes the relay's DataRequests for `BINANCE:` on a SUB, as
an ingestor does (so the relay counts the exchange served). Each request is printed
(`held ID` or `answered ID`); it is answered NOT_FOUND on its notification topic only
if it arrived after a SIGCONT: what the frozen process held stays unanswered, as a
hung pipeline leaves it.
"""

from __future__ import annotations

import signal
import sys
import time
from types import FrameType

import zmq

from mdproto import envelope, topics
from mdproto.messages import DataRequest, HistoryReadyNotification, PipelineStatus, Status

_resumed = False


def _on_cont(_signum: int, _frame: FrameType | None) -> None:
    global _resumed
    _resumed = True


def main(pub_port: int, work_endpoint: str) -> None:
    signal.signal(signal.SIGCONT, _on_cont)
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{pub_port}")
    work = ctx.socket(zmq.SUB)
    work.connect(work_endpoint)
    work.subscribe(b"BINANCE:")
    print("ready", flush=True)
    next_beat = time.monotonic()
    while True:
        now = time.monotonic()
        if now >= next_beat:
            beat = PipelineStatus(
                sent_at_ms=time.time_ns() // 1_000_000, interval_ms=1000, history=True,
                triggers=True,
            )  # fmt: skip
            pub.send_multipart(envelope.encode_pub(topics.PIPELINE_STATUS, beat))
            next_beat = now + 1.0
        if not work.poll(max(1, int((next_beat - now) * 1000))):
            continue
        _topic, request = envelope.decode_sub(work.recv_multipart())
        if not isinstance(request, DataRequest) or request.kind != DataRequest.HISTORICAL:
            continue
        print(f"{'answered' if _resumed else 'held'} {request.request_id}", flush=True)
        if _resumed:
            note = HistoryReadyNotification(
                request_id=request.request_id, client_id=request.client_id,
                status=Status.NOT_FOUND, ticker=request.ticker,
                period_seconds=request.period_seconds, start_time_ms=request.start_time_ms,
                end_time_ms=request.end_time_ms, reason="stand-in: nothing stored",
            )  # fmt: skip
            pub.send_multipart(envelope.encode_pub(request.notification_topic, note))


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
