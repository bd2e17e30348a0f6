"""The SDK against a real relay with CURVE on: an allowed key submits and streams,
an unknown key or no key fails within the connect timeout and says why."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import zmq

from mdclient import Client
from mdclient.config import ClientSettings
from mdclient.errors import ConfigError, RelayUnavailable
from mdclient.transport import (
    CurveKeys,
    Subscriber,
    Transport,
    greeting_mechanism,
    handshake_problem,
    peer_mechanism,
)
from mdproto import envelope, topics
from mdproto.messages import Status, SubmitHistoricalRequest, SubmitResponse, Tick
from relay import Relay, RelaySettings, curve

TICKER = "BINANCE:BTC/USDT"


@dataclass
class CurveRelay:
    relay: Relay
    pipeline: zmq.Socket[bytes]  # the XPUB the relay's XSUB connects to
    keys: Path

    def settings(self, who: str | None, **overrides: object) -> ClientSettings:
        assert self.relay.endpoints is not None
        values: dict[str, object] = {
            "request_endpoint": self.relay.endpoints.client_request,
            "market_data_endpoint": self.relay.endpoints.market_data,
            "connect_timeout_s": 2.0,
            "notify": "per_request",
        }
        if who:
            values["curve_secret_key_file"] = str(self.keys / f"{who}.key_secret")
            values["curve_server_key_file"] = str(self.keys / "relay.key")
        return ClientSettings(**{**values, **overrides})

    def refused(self, socket: str) -> float:
        return self.relay.metrics.sample("relay_auth_failures_total", {"socket": socket})


@pytest.fixture
def curve_relay(tmp_path: Path) -> Iterator[CurveRelay]:
    keys, allowed = tmp_path / "keys", tmp_path / "allowed"
    for name in ("relay", "alice", "mallory"):
        curve.generate(keys, name)
    allowed.mkdir()
    (allowed / "alice.key").write_bytes((keys / "alice.key").read_bytes())
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pipeline = ctx.socket(zmq.XPUB)
    pipeline.linger = 0
    port = pipeline.bind_to_random_port("tcp://127.0.0.1")
    relay = Relay(
        RelaySettings.loopback(
            f"tcp://127.0.0.1:{port}",
            curve_secret_key_file=str(keys / "relay.key_secret"),
            curve_client_keys_dir=str(allowed),
        )
    )
    relay.start()
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    try:
        yield CurveRelay(relay, pipeline, keys)
    finally:
        relay.stop()
        thread.join(10)
        relay.close()
        ctx.destroy(linger=0)


def _wait_subscription(pipeline: zmq.Socket[bytes], topic: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while pipeline.poll(max(1, int((deadline - time.monotonic()) * 1000))):
        if pipeline.recv() == b"\x01" + topic.encode():
            return
    raise AssertionError(f"{topic} never reached the pipeline")


def test_an_allowed_client_submits_and_streams_live_data(curve_relay: CurveRelay) -> None:
    with Client(settings=curve_relay.settings("alice")) as client:
        stream = client.live(TICKER, ticks=True)
        _wait_subscription(curve_relay.pipeline, topics.tick_topic(TICKER))
        tick = Tick(ticker=TICKER, trade_id="t1", price=101.5)
        curve_relay.pipeline.send_multipart(envelope.encode_pub(topics.tick_topic(TICKER), tick))
        assert next(stream) == tick
        request = SubmitHistoricalRequest(
            request_id="r-1",
            client_id=client.client_id,
            ticker=TICKER,
            period_seconds=60,
            start_time_ms=0,
            end_time_ms=3_600_000,
        )
        reply = envelope.decode(client.request(envelope.encode(request), 5.0), SubmitResponse)
        # No ingestor here: the relay's answer (decrypted and decoded) is the refusal.
        assert (reply.request_id, reply.status) == ("r-1", Status.REJECTED)
        assert reply.error_code == "no_ingestor"
    assert curve_relay.refused("requests") == curve_relay.refused("market_data") == 0


def test_an_unknown_key_fails_fast_and_names_authentication(curve_relay: CurveRelay) -> None:
    started = time.monotonic()
    with pytest.raises(RelayUnavailable) as caught:
        Client(settings=curve_relay.settings("mallory"))
    assert time.monotonic() - started < 5.0
    message = str(caught.value)
    assert "not reachable within 2s" in message and "CURVE" in message
    assert "not allow" in message or "refused" in message, message
    assert curve_relay.refused("market_data") >= 1


def test_no_keys_against_a_curve_relay_says_curve_is_required(curve_relay: CurveRelay) -> None:
    with pytest.raises(RelayUnavailable, match="the relay requires CURVE"):
        Client(settings=curve_relay.settings(None))


def test_a_greeting_cut_short_is_asked_about_again(curve_relay: CurveRelay) -> None:
    """Which handshake event a keyless client sees is a race (a busy machine often gets
    only the closed connection); that event makes the client ask the relay's greeting,
    which does not race."""
    assert curve_relay.relay.endpoints is not None
    address = curve_relay.relay.endpoints.market_data
    assert peer_mechanism(address) == "CURVE"
    assert peer_mechanism(curve_relay.relay.endpoints.client_request) == "CURVE"
    from infra.testing import free_port

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    nowhere = f"tcp://127.0.0.1:{free_port()}"  # its own connection makes no events of note
    subscriber = Subscriber(ctx, nowhere, lambda frames: None)
    events, monitor = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        monitor.bind("inproc://greeting-cut-short")
        events.connect("inproc://greeting-cut-short")
        # What the race's losing side reports: the connection closed, no detail.
        events.send_multipart(
            [struct.pack("=hi", zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 0), address.encode()]
        )
        assert monitor.poll(5000)
        subscriber._on_monitor(monitor)
        assert "the relay requires CURVE" in subscriber.hint()
    finally:
        subscriber.close()
        ctx.destroy(linger=0)


def test_a_peer_without_curve_or_without_zmtp_is_not_called_curve() -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    plain = ctx.socket(zmq.XPUB)
    port = plain.bind_to_random_port("tcp://127.0.0.1")
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never speaks ZMTP
    silent_address = f"tcp://127.0.0.1:{silent.getsockname()[1]}"
    try:
        assert peer_mechanism(f"tcp://127.0.0.1:{port}") == "NULL"
        assert peer_mechanism(silent_address, 0.2) is None
        silent.close()
        assert peer_mechanism(silent_address) is None  # refused
        assert peer_mechanism("ipc:///nowhere") is None
    finally:
        silent.close()
        ctx.destroy(linger=0)


def test_a_greeting_names_its_mechanism() -> None:
    greeting = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x01" + b"CURVE".ljust(20, b"\x00")
    assert greeting_mechanism(greeting + bytes(32)) == "CURVE"
    assert greeting_mechanism(greeting[:31]) is None  # cut short
    assert greeting_mechanism(b"HTTP/1.1 400 Bad Request\r\n" + bytes(40)) is None
    assert greeting_mechanism(greeting[:10] + b"\x02" + greeting[11:]) is None  # ZMTP 2


def test_a_request_timeout_names_authentication(curve_relay: CurveRelay) -> None:
    settings = curve_relay.settings("mallory")
    keys = CurveKeys.load(settings.curve_secret_key_file, settings.curve_server_key_file)
    transport = Transport(
        settings.request_address, settings.market_data_address, lambda _: None, settle_s=0,
        curve=keys,
    )  # fmt: skip
    try:
        # The relay drops a refused key's connection: the request ends then, not at 60 s.
        with pytest.raises(RelayUnavailable, match="CURVE") as caught:
            transport.requests.request([b"\x01", b"\x10"], 60.0)
        assert caught.value.error_code == "relay_unreachable"
    finally:
        transport.close()
    assert curve_relay.refused("requests") >= 1


def test_curve_settings_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="go together"):
        ClientSettings(curve_secret_key_file="x.key_secret")
    curve.generate(tmp_path, "alice")
    with pytest.raises(ConfigError, match="no secret key"):
        CurveKeys.load(str(tmp_path / "alice.key"), str(tmp_path / "alice.key"))
    with pytest.raises(ConfigError, match="cannot read CURVE keys"):
        CurveKeys.load(str(tmp_path / "absent.key_secret"), str(tmp_path / "alice.key"))
    assert CurveKeys.load("", "") is None


@pytest.mark.parametrize(
    "event", [zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL]
)
def test_a_closed_greeting_blames_curve_only_when_curve_is_on(event: int) -> None:
    """docker-proxy accepts before the relay listens and then closes: without CURVE the
    message must not send the user hunting for keys."""
    plain = handshake_problem(event, 0, curve=False)
    assert plain is not None and "ZMTP greeting" in plain
    assert "CURVE" not in plain and "security" not in plain
    with_curve = handshake_problem(event, 0, curve=True)
    assert with_curve is not None and "CURVE" in with_curve
    assert handshake_problem(zmq.EVENT_HANDSHAKE_SUCCEEDED, 0, curve=False) is None
