"""URL rewrite: every REST and websocket URL of ccxt's urls['api'] points at the base."""

from __future__ import annotations

import pytest

from ingestor.urls import rewrite_api_urls, rewrite_url

BASE = "http://127.0.0.1:8765"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://api.binance.com/api/v3", "http://127.0.0.1:8765/api/v3"),
        ("https://api.binance.com", "http://127.0.0.1:8765"),
        ("wss://stream.binance.com:9443/ws", "ws://127.0.0.1:8765/stream/ws"),
        ("wss://fstream.binance.com/public/ws", "ws://127.0.0.1:8765/fstream/public/ws"),
        ("not a url", "not a url"),
        ("ftp://x/y", "ftp://x/y"),
    ],
)
def test_rewrite_url(url: str, expected: str) -> None:
    assert rewrite_url(url, BASE) == expected


def test_https_base_gives_wss_and_a_separate_ws_base_is_honoured() -> None:
    assert rewrite_url("wss://stream.binance.com/ws", "https://h:1") == "wss://h:1/stream/ws"
    assert rewrite_url("wss://stream.binance.com/ws", BASE, "ws://w:2/p") == "ws://w:2/p/stream/ws"


def test_nested_structure_is_rewritten_without_mutating_the_input() -> None:
    api = {
        "public": "https://api.x.com/v1",
        "ws": {"spot": "wss://stream.x.com/ws"},
        "n": 3,
        "l": ["https://a.b/c"],
    }
    out = rewrite_api_urls(api, BASE)
    assert out == {
        "public": "http://127.0.0.1:8765/v1",
        "ws": {"spot": "ws://127.0.0.1:8765/stream/ws"},
        "n": 3,
        "l": ["http://127.0.0.1:8765/c"],
    }
    assert api["public"] == "https://api.x.com/v1"


@pytest.mark.parametrize("exchange_id", ["binance", "coinbaseexchange"])
def test_same_rule_as_the_simulator(exchange_id: str) -> None:
    """The adapter must reach the simulator exactly as infra.exchange_sim documents."""
    import ccxt.pro

    from infra.exchange_sim import point_ccxt_at
    from ingestor.config import ExchangeSettings
    from ingestor.exchanges import ExchangeAdapter

    adapter = ExchangeAdapter(exchange_id, ExchangeSettings(prefix="X", api_base_url=BASE))
    reference = getattr(ccxt.pro, exchange_id)()
    point_ccxt_at(reference, BASE)
    assert adapter._exchange.urls["api"] == reference.urls["api"]
    # other instances keep the real endpoints
    assert "127.0.0.1" not in str(getattr(ccxt.pro, exchange_id)().urls["api"])
