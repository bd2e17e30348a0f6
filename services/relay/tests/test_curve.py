"""CURVE on the client sockets: allow-listed keys served, others refused and counted,
traffic unreadable on the wire, and no start beyond loopback without keys."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import zmq
import zmq.auth

from infra.wiretap import WireTap
from mdproto import envelope
from mdproto.messages import (
    DataRequest,
    Status,
    SubmitHistoricalRequest,
    SubmitResponse,
    Tick,
)
from relay import Relay, RelaySettings, cli, curve
from relay.curve import exposure_problem

if TYPE_CHECKING:
    from conftest import FakePipeline, RelayFactory, RunningRelay

TICKER = "BINANCE:BTC/USDT"
TICK = f"{TICKER}|tick"
Keys = dict[str, tuple[bytes, bytes]]


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    """relay and alice (allowed: her public key in allowed/), mallory (unknown)."""
    pairs: Keys = {}
    for name in ("relay", "alice", "mallory"):
        _, secret = curve.generate(tmp_path / "keys", name)
        pairs[name] = zmq.auth.load_certificate(secret)
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "alice.key").write_bytes((tmp_path / "keys" / "alice.key").read_bytes())
    return pairs


def curve_overrides(tmp_path: Path) -> dict[str, str]:
    return {
        "curve_secret_key_file": str(tmp_path / "keys" / "relay.key_secret"),
        "curve_client_keys_dir": str(tmp_path / "allowed"),
    }


def client_socket(relay: RunningRelay, kind: int, endpoint: str, who: tuple[bytes, bytes],
                  server: bytes) -> zmq.Socket[bytes]:  # fmt: skip
    sock: zmq.Socket[bytes] = relay.ctx.socket(kind)
    sock.linger = 0
    sock.curve_publickey, sock.curve_secretkey = who
    sock.curve_serverkey = server
    sock.connect(endpoint)
    relay.sockets.append(sock)
    return sock


def send_refused(sock: zmq.Socket[bytes], request: SubmitHistoricalRequest) -> None:
    """Send on a REQ whose handshake the relay refuses, without blocking. Whether
    libzmq keeps retrying the connection (it saw the socket closed) or drops it for
    good (it read the refusal: a protocol error) is a race in its I/O thread; in the
    second case a REQ has no peer left and a blocking send waits forever (it hung a
    CI run once). Queued or refused at once, the request never reaches the relay."""
    with contextlib.suppress(zmq.Again):
        sock.send_multipart(envelope.encode(request), zmq.NOBLOCK)


def submit(request_id: str) -> SubmitHistoricalRequest:
    return SubmitHistoricalRequest(
        request_id=request_id,
        client_id="alice",
        ticker=TICKER,
        period_seconds=60,
        start_time_ms=0,
        end_time_ms=3_600_000,
    )


def test_an_allowed_key_submits_and_receives_live_data(
    make_relay: RelayFactory, pipeline: FakePipeline, keys: Keys, tmp_path: Path
) -> None:
    relay = make_relay(realtime_refresh_s=600, **curve_overrides(tmp_path))
    ingestor = relay.ingestor()  # the internal sockets stay NULL: a plain ingestor works
    server = keys["relay"][0]
    req = client_socket(relay, zmq.REQ, relay.endpoints.client_request, keys["alice"], server)
    reply = relay.request(req, submit("r-1"), SubmitResponse)
    assert (reply.request_id, reply.status) == ("r-1", Status.OK)
    _, work = ingestor.next_work(DataRequest.HISTORICAL)
    assert work.request_id == "r-1"

    sub = client_socket(relay, zmq.SUB, relay.endpoints.market_data, keys["alice"], server)
    sub.subscribe(TICK.encode())
    pipeline.wait_subscribed(TICK)
    pipeline.publish(TICK, Tick(ticker=TICKER, price=101.5))
    topic, tick = envelope.decode_sub(relay.recv(sub))
    assert (topic, tick) == (TICK, Tick(ticker=TICKER, price=101.5))
    assert relay.sample("relay_auth_failures_total", socket="requests") == 0


def test_an_unknown_key_is_refused_logged_and_counted(
    make_relay: RelayFactory,
    pipeline: FakePipeline,
    keys: Keys,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="relay.app")
    relay = make_relay(**curve_overrides(tmp_path))
    server = keys["relay"][0]
    req = client_socket(relay, zmq.REQ, relay.endpoints.client_request, keys["mallory"], server)
    send_refused(req, submit("m-1"))
    relay.wait_until(
        lambda: relay.sample("relay_auth_failures_total", socket="requests") >= 1,
        what="the refused request handshake to be counted",
    )
    sub = client_socket(relay, zmq.SUB, relay.endpoints.market_data, keys["mallory"], server)
    sub.subscribe(TICK.encode())
    relay.wait_until(
        lambda: relay.sample("relay_auth_failures_total", socket="market_data") >= 1,
        what="the refused subscriber handshake to be counted",
    )
    assert not req.poll(300)  # never answered
    pipeline.poll_subscriptions(0.3)
    assert TICK not in pipeline.subscriptions  # the subscription never got through
    mallory = keys["mallory"][0].decode()
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert any(mallory in line and "requests" in line for line in refusals), refusals
    # A client without CURVE at all does not get in either (mechanism mismatch).
    plain = relay.client()
    send_refused(plain, submit("p-1"))
    assert not plain.poll(300)
    assert relay.relay.health().details["zap_alive"] is True


def test_an_added_key_file_is_allowed_without_restart(
    make_relay: RelayFactory, keys: Keys, tmp_path: Path
) -> None:
    relay = make_relay(**curve_overrides(tmp_path))
    (tmp_path / "allowed" / "mallory.key").write_bytes(
        (tmp_path / "keys" / "mallory.key").read_bytes()
    )
    os.utime(tmp_path / "allowed", ns=(0, 1))  # a distinct mtime even on coarse clocks
    server = keys["relay"][0]
    req = client_socket(relay, zmq.REQ, relay.endpoints.client_request, keys["mallory"], server)
    reply = relay.request(req, submit("m-2"), SubmitResponse)
    assert reply.request_id == "m-2"


@pytest.mark.parametrize("curve_on", [False, True], ids=["plain", "curve"])
def test_traffic_is_unreadable_on_the_wire_with_curve(
    make_relay: RelayFactory,
    pipeline: FakePipeline,
    keys: Keys,
    tmp_path: Path,
    curve_on: bool,
) -> None:
    relay = make_relay(realtime_refresh_s=600, **(curve_overrides(tmp_path) if curve_on else {}))
    relay.ingestor()
    taps = [
        WireTap(int(endpoint.rsplit(":", 1)[1]))
        for endpoint in (relay.endpoints.client_request, relay.endpoints.market_data)
    ]
    try:
        if curve_on:
            server = keys["relay"][0]
            req = client_socket(relay, zmq.REQ, taps[0].endpoint, keys["alice"], server)
            sub = client_socket(relay, zmq.SUB, taps[1].endpoint, keys["alice"], server)
        else:
            req = relay.socket(zmq.REQ, taps[0].endpoint)
            sub = relay.socket(zmq.SUB, taps[1].endpoint)
        assert relay.request(req, submit("w-1"), SubmitResponse).status == Status.OK
        sub.subscribe(TICK.encode())
        pipeline.wait_subscribed(TICK)
        pipeline.publish(TICK, Tick(ticker=TICKER, price=42.0))
        assert envelope.decode_sub(relay.recv(sub))[0] == TICK  # it went through the tap
        wire = [tap.captured() for tap in taps]
    finally:
        for tap in taps:
            tap.close()
    assert all(wire), "the taps saw no traffic"
    for captured in wire:  # the request (ticker, request_id) and the topic and tick
        assert (TICKER.encode() in captured) is not curve_on
    assert (b"w-1" in wire[0]) is not curve_on


@pytest.mark.parametrize(
    ("bind", "published", "curve_on", "refused"),
    [
        ("tcp://127.0.0.1", "", False, False),
        ("tcp://localhost", "", False, False),
        ("tcp://[::1]", "", False, False),
        ("ipc:///tmp/relay", "", False, False),
        ("tcp://*", "", False, True),
        ("tcp://0.0.0.0", "", False, True),
        ("tcp://192.168.1.5", "", False, True),
        ("tcp://eth0;10.0.0.1", "", False, True),
        ("tcp://*", "127.0.0.1", False, False),  # a container: published on loopback only
        ("tcp://*", "0.0.0.0", False, True),  # compose with MDP_BIND=0.0.0.0
        ("tcp://127.0.0.1", "0.0.0.0", False, True),
        ("tcp://*", "0.0.0.0", True, False),
    ],
)
def test_exposure_rule(bind: str, published: str, curve_on: bool, refused: bool) -> None:
    problem = exposure_problem(bind, published, curve_on)
    assert (problem is not None) is refused
    if problem:
        assert "refusing to start" in problem and "RELAY_CURVE_SECRET_KEY_FILE" in problem


def test_relay_refuses_a_non_loopback_bind_without_keys(pipeline: FakePipeline) -> None:
    for overrides in ({"bind_address": "tcp://*"}, {"published_host": "0.0.0.0"}):
        with pytest.raises(curve.CurveConfigError, match="refusing to start"):
            Relay(RelaySettings.loopback(pipeline.endpoint, **overrides))


def test_relay_process_exits_with_a_clear_error() -> None:
    """The image's entry point: the defaults bind tcp://*; compose's MDP_BIND=0.0.0.0
    arrives as published_host."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    env.pop("CONFIG_PATH", None)  # no file: the built-in defaults (bind_address tcp://*)
    env["RELAY_PUBLISHED_HOST"] = "0.0.0.0"
    relay_bin = Path(sys.executable).parent / "relay"
    done = subprocess.run(
        [str(relay_bin)], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 2
    assert "refusing to start" in done.stderr and "published on 0.0.0.0" in done.stderr


def test_curve_settings_go_together(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="go together"):
        RelaySettings(curve_secret_key_file=str(tmp_path / "relay.key_secret"))


@pytest.mark.parametrize(
    ("secret", "allowed", "error"),
    [
        ("relay.key", "allowed", "key_secret"),  # the public file given as the secret one
        ("relay.key_secret", "nowhere", "does not exist"),
        ("relay.key_secret", "empty", "no client keys"),
    ],
)
def test_bad_key_files_are_reported(
    pipeline: FakePipeline, tmp_path: Path, keys: Keys, secret: str, allowed: str, error: str
) -> None:
    (tmp_path / "empty").mkdir()
    settings = RelaySettings.loopback(
        pipeline.endpoint,
        curve_secret_key_file=str(tmp_path / "keys" / secret),
        curve_client_keys_dir=str(tmp_path / allowed),
    )
    with pytest.raises(curve.CurveConfigError, match=error):
        Relay(settings)


def test_keys_generate_writes_loadable_pairs_and_never_overwrites(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "new"
    assert cli.keys_main(["generate", str(out), "relay", "bob"]) == 0
    public, secret = zmq.auth.load_certificate(out / "relay.key_secret")
    assert zmq.auth.load_certificate(out / "relay.key") == (public, None)
    assert secret and (out / "relay.key_secret").stat().st_mode & 0o077 == 0
    assert set(zmq.auth.load_certificates(out)) == {
        public,
        zmq.auth.load_certificate(out / "bob.key")[0],
    }
    assert cli.keys_main(["generate", str(out), "bob"]) == 1
    assert "not overwritten" in capsys.readouterr().err
