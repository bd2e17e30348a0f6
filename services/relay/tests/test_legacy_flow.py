"""Legacy synchronous flow (spec 000) on real sockets: OHLCRequest -> ... -> Response."""

from __future__ import annotations

from typing import TYPE_CHECKING

import zmq

from mdproto import envelope
from mdproto.messages import OHLC, DataRequest, DataResponse, OHLCRequest, Response, Status

if TYPE_CHECKING:
    from conftest import RelayFactory, RunningRelay

HOUR = 3_600_000


def ohlc_request(request_id: str = "L1", **fields: object) -> OHLCRequest:
    values: dict[str, object] = {
        "request_id": request_id,
        "ticker": "BINANCE:BTC/USDT",
        "period_seconds": 60,
        "start_time_ms": 1_700_000_000_000,
        "end_time_ms": 1_700_000_000_000 + HOUR,
        "limit": 2,
    }
    values.update(fields)
    return OHLCRequest(**values)  # type: ignore[arg-type]


def test_response_from_the_ingestor_reaches_the_waiting_client(relay: RunningRelay) -> None:
    ingestor = relay.ingestor()
    client = relay.client()
    client.send_multipart(envelope.encode(ohlc_request()))
    topic, work = ingestor.recv_work()
    assert topic == "BINANCE:"
    assert work.legacy_sync and work.kind == DataRequest.HISTORICAL
    assert (work.request_id, work.limit) == ("L1", 2)
    assert relay.sample("relay_legacy_pending") == 1
    candles = [
        OHLC(
            ticker=work.ticker,
            period_seconds=60,
            open_time_ms=t,
            open=1,
            high=2,
            low=0.5,
            close=1.5,
        )
        for t in (work.start_time_ms, work.start_time_ms + 60_000)
    ]
    ingestor.respond(
        DataResponse(request_id="L1", status=Status.OK, candles=candles, ingestor_id="i1")
    )
    response = envelope.decode(relay.recv(client), Response)
    assert (response.request_id, response.status) == ("L1", Status.OK)
    assert list(response.candles) == candles
    assert relay.sample("relay_legacy_pending") == 0
    assert relay.sample("relay_legacy_responses_total", outcome="matched") == 1


def test_responses_are_matched_by_request_id_across_clients(relay: RunningRelay) -> None:
    ingestor = relay.ingestor()
    first, second = relay.socket(zmq.DEALER), relay.client()
    first.send_multipart(envelope.encode(ohlc_request("A")))  # a DEALER needs no delimiter
    second.send_multipart(envelope.encode(ohlc_request("B")))
    ids = {ingestor.recv_work()[1].request_id, ingestor.recv_work()[1].request_id}
    assert ids == {"A", "B"}
    ingestor.respond(DataResponse(request_id="B", status=Status.NOT_FOUND, reason="no rows"))
    ingestor.respond(DataResponse(request_id="A", status=Status.ERROR, reason="exchange down"))
    b = envelope.decode(relay.recv(second), Response)
    a = envelope.decode(relay.recv(first), Response)
    assert (a.request_id, a.status, a.reason) == ("A", Status.ERROR, "exchange down")
    assert (b.request_id, b.status, b.reason) == ("B", Status.NOT_FOUND, "no rows")
    # A second ingestor's late answer to A has nobody waiting: counted, not sent.
    ingestor.respond(DataResponse(request_id="A", status=Status.OK))
    relay.wait_until(lambda: relay.sample("relay_legacy_responses_total", outcome="unmatched") == 1)
    assert not first.poll(50)


def test_unanswered_request_times_out(make_relay: RelayFactory) -> None:
    relay = make_relay(request_timeout_s=0.3)
    relay.ingestor()  # subscribed, never answers
    client = relay.client()
    client.send_multipart(envelope.encode(ohlc_request("slow")))
    response = envelope.decode(relay.recv(client, timeout=5), Response)
    assert (response.request_id, response.status, response.error_code) == (
        "slow",
        Status.TIMEOUT,
        "timeout",
    )
    assert relay.sample("relay_legacy_timeouts_total") == 1
    assert relay.sample("relay_legacy_pending") == 0


def test_pending_map_is_bounded(make_relay: RelayFactory) -> None:
    relay = make_relay(max_pending_requests=2)
    relay.ingestor()
    clients = [relay.client() for _ in range(3)]
    for i, client in enumerate(clients[:2]):
        client.send_multipart(envelope.encode(ohlc_request(f"P{i}")))
    relay.wait_until(lambda: relay.sample("relay_legacy_pending") == 2)
    full = relay.request(clients[2], ohlc_request("P2"), Response)
    assert (full.status, full.error_code) == (Status.REJECTED, "pending_full")


def test_duplicate_and_invalid_legacy_requests_are_refused(relay: RunningRelay) -> None:
    relay.ingestor()
    waiting = relay.client()
    waiting.send_multipart(envelope.encode(ohlc_request("D")))
    relay.wait_until(lambda: relay.sample("relay_legacy_pending") == 1)
    duplicate = relay.request(relay.client(), ohlc_request("D"), Response)
    assert (duplicate.status, duplicate.error_code) == (Status.REJECTED, "duplicate_request")
    invalid = relay.request(relay.client(), ohlc_request("E", period_seconds=0), Response)
    assert (invalid.status, invalid.error_code) == (Status.REJECTED, "bad_period")


def test_bad_frames_from_an_ingestor_are_counted_and_ignored(relay: RunningRelay) -> None:
    ingestor = relay.ingestor()
    ingestor.dealer.send_multipart([b"\x01", b"\x7f"])
    ingestor.dealer.send_multipart(envelope.encode(OHLCRequest()))  # wrong type on :5556
    relay.wait_until(
        lambda: (
            relay.sample("relay_bad_frames_total", socket="ingestor", error_code="unknown_type")
            == 1
            and relay.sample(
                "relay_bad_frames_total", socket="ingestor", error_code="unexpected_type"
            )
            == 1
        )
    )
    client = relay.client()
    client.send_multipart(envelope.encode(ohlc_request("ok")))
    ingestor.recv_work()
    ingestor.respond(DataResponse(request_id="ok", status=Status.OK))
    assert envelope.decode(relay.recv(client), Response).status == Status.OK


def test_legacy_request_no_ingestor_can_serve_is_refused_at_once(relay: RunningRelay) -> None:
    reply = relay.request(relay.client(), ohlc_request("lonely"), Response)
    assert (reply.status, reply.error_code) == (Status.REJECTED, "no_ingestor")
    assert "BINANCE" in reply.reason
    assert relay.sample("relay_legacy_pending") == 0
    assert relay.sample("relay_rejections_total", type="legacy", error_code="no_ingestor") == 1
