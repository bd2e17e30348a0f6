"""Client request channel (:5559) against a running relay on real sockets."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import zmq

from mdproto import envelope
from mdproto.error_codes import BAD_PERIOD, UNKNOWN_TYPE
from mdproto.messages import (
    CEPCondition,
    CEPTriggerAck,
    CEPTriggerRequest,
    DataRequest,
    NotifyPattern,
    RequestStatusQuery,
    RequestStatusReply,
    Response,
    Status,
    SubmitHistoricalRequest,
    SubmitResponse,
    Tick,
)
from relay.client_requests import AcceptedIds, request_status
from relay.triggers import Stored, TriggerSinkError

if TYPE_CHECKING:
    from conftest import RelayFactory, RunningRelay

HOUR = 3_600_000


def submit(**fields: object) -> SubmitHistoricalRequest:
    values: dict[str, object] = {
        "request_id": "r1",
        "client_id": "c1",
        "ticker": "BINANCE:BTC/USDT",
        "period_seconds": 60,
        "start_time_ms": 1_700_000_000_000,
        "end_time_ms": 1_700_000_000_000 + HOUR,
    }
    values.update(fields)
    return SubmitHistoricalRequest(**values)  # type: ignore[arg-type]


def test_submit_is_acknowledged_and_published_to_the_exchange_prefix(
    relay: RunningRelay,
) -> None:
    ingestor = relay.ingestor()
    reply = relay.request(relay.client(), submit(), SubmitResponse)
    assert reply.status == Status.OK
    assert reply.request_id == "r1"
    assert reply.notification_topic == "RESPONSE:c1"
    topic, work = ingestor.recv_work()
    assert topic == "BINANCE:"
    assert work.kind == DataRequest.HISTORICAL
    assert (work.request_id, work.client_id, work.ticker) == ("r1", "c1", "BINANCE:BTC/USDT")
    assert work.notification_topic == "RESPONSE:c1"
    assert not work.legacy_sync
    assert relay.sample("relay_requests_total", type="submit", outcome="accepted") == 1
    assert relay.sample("relay_published_total", kind="historical") == 1


def test_a_batch_is_answered_in_order_and_a_bad_request_fails_only_itself(
    relay: RunningRelay,
) -> None:
    """One loop turn's batch (`on_batch` called here with the loop stopped, so the batch
    is exactly these requests): a reply per request in arrival order, a DataRequest per
    accepted submit in order, each bad request refused with its own code, and a status
    query answered from the submits before it."""
    ingestor = relay.ingestor()
    dealer = relay.socket(zmq.DEALER)
    relay.relay.stop()
    relay.thread.join(10)
    dealer.send_multipart([b"", *envelope.encode(submit(request_id="probe"))])
    router = relay.relay._client  # the ROUTER :5559, ours now that its loop is stopped
    assert router.poll(5000), "the probe did not arrive"
    identity = router.recv_multipart()[0]
    bodies = [
        envelope.encode(submit(request_id="b0")),
        envelope.encode(submit(request_id="b1")),
        envelope.encode(submit(request_id="bad", period_seconds=0)),
        envelope.encode(RequestStatusQuery(request_id="b0")),
        [b"\x01", b"\xff"],  # an unknown type
        envelope.encode(submit(request_id="b2")),
    ]
    relay.relay._requests.on_batch([[identity, b"", *body] for body in bodies], time.monotonic())
    replies = [envelope.decode(relay.recv(dealer)[1:]) for _ in bodies]
    assert [type(r) for r in replies] == [
        SubmitResponse, SubmitResponse, SubmitResponse, RequestStatusReply, Response, SubmitResponse
    ]  # fmt: skip
    assert [(r.request_id, r.status) for r in replies[:3]] == [
        ("b0", Status.OK), ("b1", Status.OK), ("bad", Status.REJECTED)
    ]  # fmt: skip
    assert replies[2].error_code == BAD_PERIOD
    assert (replies[3].status, replies[3].notification_topic) == (Status.OK, "RESPONSE:c1")
    assert (replies[4].status, replies[4].error_code) == (Status.ERROR, UNKNOWN_TYPE)
    assert (replies[5].request_id, replies[5].status) == ("b2", Status.OK)
    assert [ingestor.recv_work()[1].request_id for _ in range(3)] == ["b0", "b1", "b2"]
    assert relay.sample("relay_requests_total", type="submit", outcome="accepted") == 3
    assert relay.sample("relay_requests_total", type="submit", outcome="rejected") == 1
    assert relay.sample("relay_published_total", kind="historical") == 3


def test_pipelined_requests_get_their_replies_in_order(relay: RunningRelay) -> None:
    """A DEALER that sends many requests without waiting (they reach the loop in batches
    of whatever size): every one answered, in order, every DataRequest published."""
    ingestor = relay.ingestor()
    dealer = relay.socket(zmq.DEALER)
    ids = [f"p{i}" for i in range(200)]
    for request_id in ids:
        dealer.send_multipart([b"", *envelope.encode(submit(request_id=request_id))])
    acks = [envelope.decode(relay.recv(dealer)[1:], SubmitResponse) for _ in ids]
    assert [(a.request_id, a.status) for a in acks] == [(i, Status.OK) for i in ids]
    assert [ingestor.recv_work()[1].request_id for _ in ids] == ids


def test_dealer_clients_work_with_and_without_a_delimiter(relay: RunningRelay) -> None:
    dealer = relay.socket(zmq.DEALER)
    dealer.send_multipart([b"", *envelope.encode(submit(request_id="d1"))])
    frames = relay.recv(dealer)
    assert frames[0] == b""
    assert envelope.decode(frames[1:], SubmitResponse).request_id == "d1"
    dealer.send_multipart(envelope.encode(submit(request_id="d2")))
    assert envelope.decode(relay.recv(dealer), SubmitResponse).request_id == "d2"


def test_relay_generates_the_request_id_when_only_client_id_is_set(relay: RunningRelay) -> None:
    ingestor = relay.ingestor()
    reply = relay.request(relay.client(), submit(request_id=""), SubmitResponse)
    assert reply.status == Status.OK
    assert reply.request_id
    _, work = ingestor.recv_work()
    assert work.request_id == reply.request_id


def test_per_request_notification_topic(relay: RunningRelay) -> None:
    relay.ingestor()
    req = submit(client_id="", notify=NotifyPattern.NOTIFY_PER_REQUEST)
    reply = relay.request(relay.client(), req, SubmitResponse)
    assert reply.notification_topic == "HISTORY_READY:r1"


def test_invalid_submit_is_rejected_and_not_published(make_relay: RelayFactory) -> None:
    relay = make_relay(known_exchanges=["BINANCE"])  # a static list: KRAKEN is unknown
    ingestor = relay.ingestor()
    client = relay.client()
    for bad, code in [
        (submit(request_id="", client_id=""), "missing_id"),
        (submit(ticker="KRAKEN:BTC/USD"), "unknown_exchange"),
        (submit(period_seconds=0), "bad_period"),
        (submit(end_time_ms=1), "bad_time_range"),
        (submit(ticker="BTCUSDT"), "bad_ticker"),
    ]:
        reply = relay.request(client, bad, SubmitResponse)
        assert (reply.status, reply.error_code) == (Status.REJECTED, code)
        assert reply.reason
    relay.request(client, submit(request_id="after"), SubmitResponse)
    _, work = ingestor.recv_work()
    assert work.request_id == "after"  # none of the rejected ones was published
    assert relay.sample("relay_rejections_total", type="submit", error_code="bad_period") == 1
    assert relay.sample("relay_requests_total", type="submit", outcome="rejected") == 5


class RecordingSink:
    """Takes requests; answers them at once, or (`hold`) when the test says so, as the
    Kafka sink does when the broker acknowledges."""

    def __init__(self, fail: bool = False, hold: bool = False) -> None:
        self.received: list[CEPTriggerRequest] = []
        self.pending: list[Stored] = []
        self.fail = fail
        self.hold = hold

    def submit(self, request: CEPTriggerRequest, stored: Stored) -> None:
        if self.fail:
            raise TriggerSinkError("trigger store unavailable")
        self.received.append(request)
        if self.hold:
            self.pending.append(stored)
        else:
            stored(None)

    def start(self) -> None:
        pass

    def tickers(self) -> set[str]:
        return set()

    def close(self) -> None:
        pass


def trigger(**fields: object) -> CEPTriggerRequest:
    values: dict[str, object] = {
        "trigger_id": "t1",
        "client_id": "c1",
        "action": CEPTriggerRequest.REGISTER,
        "ticker": "BINANCE:BTC/USDT",
        "conditions": [CEPCondition(kind=CEPCondition.PRICE_ABOVE, threshold=50_000.0)],
    }
    values.update(fields)
    return CEPTriggerRequest(**values)  # type: ignore[arg-type]


def test_cep_trigger_is_acknowledged_and_handed_to_the_sink(make_relay: RelayFactory) -> None:
    sink = RecordingSink()
    relay = make_relay(sink=sink, known_exchanges=["BINANCE"])
    client = relay.client()
    ack = relay.request(client, trigger(), CEPTriggerAck)
    assert (ack.status, ack.trigger_id, ack.event_topic) == (Status.OK, "t1", "RESPONSE:c1")
    assert [t.trigger_id for t in sink.received] == ["t1"]
    rejected = relay.request(client, trigger(trigger_id="t2", conditions=[]), CEPTriggerAck)
    assert (rejected.status, rejected.error_code) == (Status.REJECTED, "bad_condition")
    rejected = relay.request(client, trigger(trigger_id="t3", ticker="KRAKEN:A/B"), CEPTriggerAck)
    assert (rejected.status, rejected.error_code) == (Status.REJECTED, "unknown_exchange")
    assert [t.trigger_id for t in sink.received] == ["t1"]  # rejected ones never reach it


def test_cep_sink_failure_is_an_error_ack(make_relay: RelayFactory) -> None:
    relay = make_relay(sink=RecordingSink(fail=True))
    ack = relay.request(relay.client(), trigger(), CEPTriggerAck)
    assert (ack.status, ack.error_code) == (Status.ERROR, "sink_error")
    assert "unavailable" in ack.reason


def test_a_trigger_is_acknowledged_only_once_the_store_has_it(make_relay: RelayFactory) -> None:
    sink = RecordingSink(hold=True)
    relay = make_relay(sink=sink)
    client = relay.client()
    client.send_multipart(envelope.encode(trigger(trigger_id="t1")))
    relay.wait_until(lambda: len(sink.pending) == 1, what="the sink to get the trigger")
    assert not client.poll(200), "acknowledged before the store had it"
    sink.pending.pop()(None)  # the broker's delivery report, from the sink's thread
    ack = envelope.decode(relay.recv(client), CEPTriggerAck)
    assert (ack.status, ack.trigger_id) == (Status.OK, "t1")

    # Not stored: an ERROR ack with the store's reason, counted, never an OK.
    client.send_multipart(envelope.encode(trigger(trigger_id="t2")))
    relay.wait_until(lambda: len(sink.pending) == 1, what="the sink to get the trigger")
    threading.Thread(target=sink.pending.pop(), args=("Message timed out",)).start()
    ack = envelope.decode(relay.recv(client), CEPTriggerAck)
    assert (ack.status, ack.error_code, ack.reason) == (
        Status.ERROR,
        "sink_error",
        "Message timed out",
    )
    assert relay.sample("relay_trigger_sink_errors_total") == 1
    assert relay.sample("relay_requests_total", type="cep", outcome="accepted") == 1


def test_undecodable_frames_get_an_error_response(relay: RunningRelay) -> None:
    relay.ingestor()
    client = relay.client()
    cases = [
        ([b"\x02", b"\x10"], "bad_version"),
        ([b"\x01", b"\x7f"], "unknown_type"),
        ([b"\x01", b"\x10\xff\xff\xff"], "bad_payload"),
        ([b"\x01"], "frame_count"),
        ([b"\x01", b""], "empty_frame"),
        (envelope.encode(Tick(ticker="BINANCE:BTC/USDT")), "unexpected_type"),
    ]
    for frames, code in cases:
        client.send_multipart(frames)
        reply = envelope.decode(relay.recv(client), Response)
        assert (reply.status, reply.error_code) == (Status.ERROR, code)
        assert reply.reason
    assert relay.sample("relay_bad_frames_total", socket="client", error_code="bad_version") == 1
    assert relay.request(client, submit(), SubmitResponse).status == Status.OK


def test_oversized_requests(make_relay: RelayFactory) -> None:
    relay = make_relay(max_request_payload=1000, max_message_size=100_000)
    relay.ingestor()
    client = relay.client()
    # Above the payload cap but below ZMQ_MAXMSGSIZE: answered with too_large.
    too_big = submit(client_id="x" * 2000)
    client.send_multipart(envelope.encode(too_big))
    reply = envelope.decode(relay.recv(client), Response)
    assert (reply.status, reply.error_code) == (Status.ERROR, "too_large")
    # Above ZMQ_MAXMSGSIZE: libzmq drops the connection; nobody else notices.
    huge = relay.socket(zmq.DEALER)
    huge.send_multipart([b"", b"\x01", b"\x10" + b"x" * 200_000])
    assert relay.request(relay.client(), submit(), SubmitResponse).status == Status.OK
    assert not huge.poll(100)


def test_flooding_client_is_refused_while_others_are_served(make_relay: RelayFactory) -> None:
    relay = make_relay(client_rate_limit=1, client_rate_burst=20)
    relay.ingestor()
    flood = relay.socket(zmq.DEALER)
    frames = envelope.encode(submit())
    for _ in range(300):
        flood.send_multipart([b"", *frames])
    polite = relay.client()
    assert relay.request(polite, submit(request_id="polite"), SubmitResponse).status == Status.OK
    replies = [envelope.decode(relay.recv(flood)[1:], SubmitResponse) for _ in range(300)]
    refused = [r for r in replies if r.status == Status.REJECTED]
    assert all(r.error_code == "rate_limited" for r in refused)
    assert 250 <= len(refused) <= 280  # every request answered; about the burst got through
    assert relay.sample("relay_rate_limited_total") == len(refused)
    assert relay.request(polite, submit(request_id="again"), SubmitResponse).status == Status.OK


def test_a_request_no_ingestor_can_serve_is_refused_at_once(relay: RunningRelay) -> None:
    """No OK followed by minutes of silence: while no ingestor subscribes to the
    exchange's work prefix, a submit is refused with the reason."""
    client = relay.client()
    reply = relay.request(client, submit(request_id="lonely"), SubmitResponse)
    assert (reply.status, reply.error_code) == (Status.REJECTED, "no_ingestor")
    assert "BINANCE" in reply.reason and reply.request_id == "lonely"
    assert relay.sample("relay_rejections_total", type="submit", error_code="no_ingestor") == 1
    assert relay.sample("relay_published_total", kind="historical") == 0

    ingestor = relay.ingestor()
    assert relay.request(client, submit(request_id="served"), SubmitResponse).status == Status.OK
    assert ingestor.recv_work()[1].request_id == "served"
    ingestor.work.close()  # its last subscription goes with it
    relay.wait_until(lambda: relay.sample("relay_exchange_served", prefix="BINANCE:") == 0)
    again = relay.request(client, submit(request_id="orphan"), SubmitResponse)
    assert (again.status, again.error_code) == (Status.REJECTED, "no_ingestor")


def test_a_status_query_tells_an_accepted_request_from_one_never_seen(relay: RunningRelay) -> None:
    """Issue 47: PENDING for an id never submitted; the relay's ack is the one trace of a
    request until market.requests holds its outcome (docs/protocol.md "Request status")."""
    relay.ingestor()
    client = relay.client()
    ack = relay.request(client, submit(request_id="", client_id="c9"), SubmitResponse)
    assert ack.status == Status.OK
    known = relay.request(client, RequestStatusQuery(request_id=ack.request_id), RequestStatusReply)
    assert (known.status, known.request_id, known.notification_topic) == (
        Status.OK,
        ack.request_id,
        "RESPONSE:c9",
    )
    assert known.accepted_at_ms > 0 and known.remembered_s == 86_400
    never = relay.request(client, RequestStatusQuery(request_id="never-sent"), RequestStatusReply)
    assert (never.status, never.accepted_at_ms) == (Status.NOT_FOUND, 0)
    assert "86400 s" in never.reason
    refused = relay.request(client, submit(request_id="refused", ticker="BTCUSDT"), SubmitResponse)
    assert refused.status == Status.REJECTED  # a refused submit is not remembered
    again = relay.request(client, RequestStatusQuery(request_id="refused"), RequestStatusReply)
    assert again.status == Status.NOT_FOUND
    for bad, code in (("", "missing_id"), ("a b", "bad_id")):
        reply = relay.request(client, RequestStatusQuery(request_id=bad), RequestStatusReply)
        assert (reply.status, reply.error_code) == (Status.REJECTED, code)
    assert relay.sample("relay_requests_total", type="status", outcome="accepted") == 3
    assert relay.sample("relay_requests_total", type="status", outcome="rejected") == 2


def test_accepted_ids_are_bounded_in_count_and_age() -> None:
    ids = AcceptedIds(capacity=2, max_age_s=10.0)
    ids.add("a", "HISTORY_READY:a", 1, now=0.0)
    ids.add("b", "HISTORY_READY:b", 2, now=1.0)
    ids.add("c", "HISTORY_READY:c", 3, now=2.0)  # the oldest, a, goes
    assert ids.get("a", now=2.0) is None and ids.get("b", now=2.0) is not None
    assert ids.get("b", now=11.5) is None  # older than 10 s
    found = ids.get("c", now=11.5)
    assert found is not None and (found.topic, found.at_ms) == ("HISTORY_READY:c", 3)
    assert len(ids) == 1
    off = AcceptedIds(capacity=0, max_age_s=10.0)
    off.add("a", "t", 1, now=0.0)
    reply = request_status(RequestStatusQuery(request_id="a"), off, now=0.0)
    assert (reply.status, reply.remembered_s) == (Status.NOT_FOUND, 0)
