"""Bad input never silences or kills the relay (hypothesis against a running relay)."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mdproto import envelope
from mdproto.envelope import MessageType
from mdproto.messages import (
    CEPTriggerAck,
    DataResponse,
    OHLCRequest,
    RequestStatusReply,
    Response,
    Status,
    SubmitHistoricalRequest,
    SubmitResponse,
)

if TYPE_CHECKING:
    from conftest import RelayFactory

REPLY_TYPES = (Response, SubmitResponse, CEPTriggerAck, RequestStatusReply)
VALID = SubmitHistoricalRequest(
    request_id="valid",
    client_id="c1",
    ticker="BINANCE:BTC/USDT",
    period_seconds=60,
    start_time_ms=0,
    end_time_ms=3_600_000,
)

random_frames = st.lists(st.binary(max_size=64), min_size=1, max_size=5)
# Well-formed envelopes of any type (request types included) with junk payloads.
typed_frames = st.builds(
    lambda t, payload: [b"\x01", bytes([t]) + payload],
    st.sampled_from([int(t) for t in MessageType] + [0x00, 0x7F, 0xFF]),
    st.binary(max_size=64),
)


def test_random_frames_always_get_one_reply(make_relay: RelayFactory) -> None:
    relay = make_relay(client_rate_limit=0, request_timeout_s=0.2)
    relay.ingestor()  # served: valid requests are accepted, not refused as no_ingestor
    dealer = relay.socket(zmq.DEALER)

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(frames=st.one_of(random_frames, typed_frames), delimiter=st.booleans())
    def one_exchange(frames: list[bytes], delimiter: bool) -> None:
        sent = [b"", *frames] if delimiter else frames
        dealer.send_multipart(sent)
        reply = relay.recv(dealer)
        decoded = envelope.decode(reply[-2:])
        assert isinstance(decoded, REPLY_TYPES)
        assert decoded.status in (Status.ERROR, Status.REJECTED, Status.TIMEOUT, Status.OK)

    one_exchange()
    assert relay.relay.health().ok
    client = relay.client()
    assert relay.request(client, VALID, SubmitResponse).status == Status.OK


def test_random_frames_from_ingestors_are_ignored(make_relay: RelayFactory) -> None:
    relay = make_relay()
    ingestor = relay.ingestor()

    @settings(max_examples=200, deadline=None)
    @given(frames=st.one_of(random_frames, typed_frames))
    def send(frames: list[bytes]) -> None:
        ingestor.dealer.send_multipart(frames)

    send()
    client = relay.client()
    client.send_multipart(
        envelope.encode(
            OHLCRequest(request_id="L", ticker=VALID.ticker, period_seconds=60, end_time_ms=60_000)
        )
    )
    _, work = ingestor.recv_work()
    ingestor.respond(DataResponse(request_id=work.request_id, status=Status.OK))
    assert envelope.decode(relay.recv(client), Response).request_id == "L"


def test_non_zmtp_garbage_on_the_tcp_port(make_relay: RelayFactory) -> None:
    relay = make_relay()
    relay.ingestor()
    url = urlparse(relay.endpoints.client_request)
    for junk in (b"GET / HTTP/1.1\r\n\r\n", b"\xff" * 10 + b"\x7f" + b"\x00" * 100, b""):
        with socket.create_connection((url.hostname, url.port)) as raw:
            raw.sendall(junk)
    assert relay.request(relay.client(), VALID, SubmitResponse).status == Status.OK
