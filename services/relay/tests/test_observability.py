"""Prometheus metrics and the health endpoint over HTTP."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import TYPE_CHECKING

from mdproto.messages import Status, SubmitHistoricalRequest, SubmitResponse

if TYPE_CHECKING:
    from conftest import FakePipeline, RelayFactory

VALID = SubmitHistoricalRequest(
    request_id="r1",
    client_id="c1",
    ticker="BINANCE:BTC/USDT",
    period_seconds=60,
    start_time_ms=0,
    end_time_ms=3_600_000,
)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_metrics_and_health_over_http(
    make_relay: RelayFactory, pipeline: FakePipeline, free_tcp_port: int
) -> None:
    relay = make_relay(
        metrics_host="127.0.0.1", metrics_port=free_tcp_port, known_exchanges=["BINANCE"]
    )
    relay.ingestor()
    base = f"http://127.0.0.1:{relay.relay.metrics_port}"
    client = relay.client()
    assert relay.request(client, VALID, SubmitResponse).status == Status.OK
    bad = SubmitHistoricalRequest(request_id="r2", ticker="KRAKEN:BTC/USD", period_seconds=60)
    assert relay.request(client, bad, SubmitResponse).error_code == "unknown_exchange"
    relay.subscriber("BINANCE:BTC/USDT|tick")
    pipeline.wait_subscribed("BINANCE:BTC/USDT|tick")
    relay.wait_until(lambda: relay.sample("relay_live_tickers") == 1)
    relay.wait_until(lambda: relay.sample("relay_market_data_connections") == 1)

    status, text = get(f"{base}/metrics")
    assert status == 200
    assert 'relay_requests_total{outcome="accepted",type="submit"} 1.0' in text
    assert 'relay_rejections_total{error_code="unknown_exchange",type="submit"} 1.0' in text
    assert "relay_subscribed_topics 1.0" in text
    assert "relay_live_tickers 1.0" in text
    assert 'relay_proxy_frames_total{direction="downstream"}' in text
    assert "relay_legacy_pending 0.0" in text

    relay.wait_until(lambda: relay.sample("relay_upstream_connected") == 1)
    status, text = get(f"{base}/healthz")
    assert status == 200
    health = json.loads(text)
    assert health["status"] == "ok"
    assert health["proxy_alive"] is True
    assert health["upstream_connected"] is True
    assert health["live_tickers"] == 1
    assert get(f"{base}/nope")[0] == 404


def test_metrics_port_zero_disables_http(make_relay: RelayFactory) -> None:
    relay = make_relay(metrics_port=0)
    assert relay.relay.metrics_port == 0


def test_exchange_served_follows_ingestor_subscriptions(make_relay: RelayFactory) -> None:
    """The alert "no ingestor for an exchange" reads this: 0 from the start, 1 while an
    ingestor subscribes to the exchange's work prefix, 0 again once the last one leaves.
    (From the start only with a static exchange list; else from the first ingestor on.)"""
    relay = make_relay(known_exchanges=["BINANCE"])

    def served() -> float | None:
        return relay.relay.metrics.registry.get_sample_value(
            "relay_exchange_served", {"prefix": "BINANCE:"}
        )

    assert served() == 0.0  # present before any ingestor: an alert can see the absence
    ingestor = relay.ingestor()
    relay.wait_until(lambda: served() == 1.0)
    ingestor.work.close()  # the ingestor's process is gone: its subscription with it
    relay.wait_until(lambda: served() == 0.0)


def post(url: str, body: bytes) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(url, data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        is_json = exc.headers["Content-Type"] == "application/json"
        return exc.code, json.loads(exc.read()) if is_json else {}


def test_operator_config_update_reaches_the_exchange_ingestors(
    make_relay: RelayFactory, free_tcp_port: int
) -> None:
    """CONFIG_UPDATE is sent from the operator's HTTP port, never from client sockets."""
    from mdproto.messages import IngestorControl

    relay = make_relay(metrics_host="127.0.0.1", metrics_port=free_tcp_port)
    url = f"http://127.0.0.1:{relay.relay.metrics_port}/control/config-update"
    code, answer = post(f"{url}?exchange=BINANCE", b'{"batch_size": "250"}')
    assert code == 409 and "no ingestor of BINANCE" in str(answer["error"])

    ingestor = relay.ingestor()
    code, answer = post(f"{url}?exchange=binance", b'{"batch_size": "250"}')
    assert (code, answer) == (202, {"exchange": "BINANCE", "keys": ["batch_size"]})
    topic, control = ingestor.recv_control()
    assert topic == "BINANCE:"
    assert control.action == IngestorControl.CONFIG_UPDATE
    assert dict(control.config) == {"batch_size": "250"}
    assert relay.sample("relay_published_total", kind="config_update") == 1

    assert post(f"{url}?exchange=BINANCE", b"not json")[0] == 400
    assert post(f"{url}?exchange=BINANCE", b'{"batch_size": 250}')[0] == 409  # not a string
    assert post(url, b'{"batch_size": "1"}')[0] == 409  # no exchange
    assert post(url.replace("config-update", "nope"), b"{}")[0] == 404
