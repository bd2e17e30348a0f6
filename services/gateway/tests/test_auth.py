"""Token auth (real aiohttp server on loopback; the platform is never reached) and the
refusal rule for hosts beyond loopback."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from gateway.app import create_app
from gateway.cli import main
from gateway.config import GatewaySettings


def test_a_token_is_required_everywhere_but_healthz_and_static() -> None:
    async def scenario() -> dict[str, Any]:
        app = create_app(GatewaySettings(token="s3cret"), upstream=None)  # type: ignore[arg-type]
        async with TestServer(app, host="127.0.0.1") as server, aiohttp.ClientSession() as http:
            base = str(server.make_url(""))
            out: dict[str, Any] = {}
            async with http.get(f"{base}/info") as resp:
                out["none"] = (resp.status, await resp.json())
            async with http.get(f"{base}/info", headers={"Authorization": "Bearer nope"}) as resp:
                out["wrong"] = resp.status
            async with http.get(f"{base}/info", headers={"Authorization": "Bearer s3cret"}) as r:
                out["header"] = r.status
            async with http.get(f"{base}/info?token=s3cret") as resp:
                out["query"] = resp.status
            async with http.get(f"{base}/healthz") as resp:
                out["health"] = resp.status
            async with http.get(f"{base}/static/words.json") as resp:
                out["static"] = resp.status  # the page's own files carry no token
            async with http.get(f"{base}/static/../app.py") as resp:
                out["escape"] = resp.status
            async with http.get(f"{base}/") as resp:
                out["page"] = resp.status
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(f"{base}/ws")
            out["ws"] = refused.value.status
            async with http.ws_connect(f"{base}/ws?token=s3cret") as ws:
                await ws.send_str("not json")
                out["ws_error"] = await ws.receive_json(timeout=5)
            return out

    out = asyncio.run(scenario())
    assert out["none"] == (
        401,
        {"error_code": "unauthorized", "reason": "a valid bearer token is required"},
    )
    assert (out["wrong"], out["header"], out["query"], out["health"]) == (401, 200, 200, 200)
    assert (out["static"], out["page"]) == (200, 401)
    assert out["escape"] in (401, 403, 404)
    assert out["ws"] == 401
    assert out["ws_error"]["type"] == "error" and out["ws_error"]["error_code"] == "bad_request"


@pytest.mark.parametrize(
    ("host", "published", "token", "exposed"),
    [
        ("127.0.0.1", "", "", False),
        ("localhost", "", "", False),
        ("::1", "", "", False),
        ("0.0.0.0", "", "", True),
        ("10.1.2.3", "", "", True),
        ("0.0.0.0", "", "t", False),
        # A container listens on 0.0.0.0; where compose publishes the port decides.
        ("0.0.0.0", "127.0.0.1", "", False),
        ("0.0.0.0", "0.0.0.0", "", True),
        ("127.0.0.1", "192.168.1.5", "", True),
        ("0.0.0.0", "0.0.0.0", "t", False),
    ],
)
def test_beyond_loopback_needs_a_token(
    host: str, published: str, token: str, exposed: bool
) -> None:
    settings = GatewaySettings(host=host, published_host=published, token=token)
    assert settings.exposed_without_token() is exposed


def test_the_gateway_refuses_to_start_exposed_without_a_token(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("GATEWAY_HOST", "0.0.0.0")
    monkeypatch.delenv("CONFIG_PATH", raising=False)
    assert main([]) == 2
    assert "without a token" in caplog.text
