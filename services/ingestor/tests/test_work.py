"""ZeroMQ intake on loopback: subscriptions, decoding, malformed input never stops it."""

from __future__ import annotations

import asyncio

import zmq
import zmq.asyncio

from ingestor.work import LegacyResponder, WorkIntake
from mdproto import envelope
from mdproto.messages import DataRequest, DataResponse, IngestorControl, Status, Tick


async def _wait_subscribed(xpub: zmq.asyncio.Socket, count: int) -> list[bytes]:
    subs = []
    while len(subs) < count:
        frame = await asyncio.wait_for(xpub.recv(), 5)
        subs.append(frame)
    return subs


def test_intake_decodes_filters_and_survives_garbage() -> None:
    async def scenario() -> tuple[list[DataRequest], list[IngestorControl], int, list[bytes]]:
        ctx = zmq.asyncio.Context()
        work, control = ctx.socket(zmq.XPUB), ctx.socket(zmq.XPUB)
        work.bind("tcp://127.0.0.1:*")
        control.bind("tcp://127.0.0.1:*")
        intake = WorkIntake(
            ctx,
            work.getsockopt_string(zmq.LAST_ENDPOINT),
            control.getsockopt_string(zmq.LAST_ENDPOINT),
            ["BINANCE:", "COINBASE:"],
            max_payload=1024,
            heartbeat_ivl_ms=1000,
        )
        subs = await _wait_subscribed(work, 2)
        await _wait_subscribed(control, 1)
        requests: list[DataRequest] = []
        controls: list[IngestorControl] = []
        done = asyncio.Event()

        def on_request(r: DataRequest) -> None:
            requests.append(r)
            if r.request_id == "last":
                done.set()
            if r.request_id == "boom":
                raise RuntimeError("handler bug")

        task = asyncio.create_task(intake.run(on_request, controls.append))
        good = DataRequest(request_id="a", ticker="BINANCE:BTC/USDT", kind=DataRequest.HISTORICAL)
        await work.send_multipart([b"BINANCE:", b"\x07", b"junk"])  # bad version
        await work.send_multipart([b"BINANCE:", b"only two"])  # frame count
        await work.send_multipart(envelope.encode_pub("BINANCE:", Tick(ticker="x")))  # wrong type
        await work.send_multipart([b"BINANCE:", b"\x01", b"\x01" + b"\xff" * 2000])  # too large
        await work.send_multipart([b"BINANCE:", b"\x01", b"\x01\xff\xff\xff"])  # bad payload
        await work.send_multipart(envelope.encode_pub("BINANCE:", DataRequest(request_id="boom")))
        await work.send_multipart(envelope.encode_pub("BINANCE:", good))
        await control.send_multipart(
            envelope.encode_pub("KRAKEN:", IngestorControl(action=IngestorControl.CANCEL_REALTIME))
        )
        await control.send_multipart(
            envelope.encode_pub("", IngestorControl(action=IngestorControl.CONFIG_UPDATE))
        )
        await control.send_multipart(
            envelope.encode_pub(
                "BINANCE:",
                IngestorControl(action=IngestorControl.CANCEL_REALTIME, ticker="BINANCE:BTC/USDT"),
            )
        )
        await work.send_multipart(envelope.encode_pub("COINBASE:", DataRequest(request_id="last")))
        await asyncio.wait_for(done.wait(), 5)
        for _ in range(50):
            if len(controls) == 2:
                break
            await asyncio.sleep(0.02)
        task.cancel()
        malformed = intake.stats.malformed
        intake.close()
        work.close(0)
        control.close(0)
        ctx.term()
        return requests, controls, malformed, subs

    requests, controls, malformed, subs = asyncio.run(scenario())
    assert sorted(subs) == [b"\x01BINANCE:", b"\x01COINBASE:"]
    assert [r.request_id for r in requests] == ["boom", "a", "last"]
    assert malformed == 5
    assert [c.action for c in controls] == [
        IngestorControl.CONFIG_UPDATE,
        IngestorControl.CANCEL_REALTIME,
    ]


def test_legacy_responder_reaches_a_router() -> None:
    async def scenario() -> tuple[bytes, DataResponse]:
        ctx = zmq.asyncio.Context()
        router = ctx.socket(zmq.ROUTER)
        router.bind("tcp://127.0.0.1:*")
        responder = LegacyResponder(ctx, router.getsockopt_string(zmq.LAST_ENDPOINT), "ing-7", 1000)
        await responder.send(DataResponse(request_id="L", status=Status.OK))
        frames = await asyncio.wait_for(router.recv_multipart(), 5)
        route, body = envelope.split_routed(frames)
        responder.close()
        router.close(0)
        ctx.term()
        return route[0], envelope.decode(body, DataResponse)

    identity, response = asyncio.run(scenario())
    assert identity == b"ing-7"
    assert response.request_id == "L" and response.status == Status.OK
