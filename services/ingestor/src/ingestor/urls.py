"""Point every exchange API URL at another host (the simulator, an offline demo).

ccxt keeps an exchange's endpoints in `exchange.urls['api']`, a nested dict of
REST and websocket URLs. The rule (the one infra/exchange_sim serves):

- REST `http(s)://HOST[:PORT]/PATH` -> `<base>/PATH` (scheme, host, port change);
- websocket `ws(s)://HOST[:PORT]/PATH` -> `ws(s)://<base host:port><base path>/<first
  DNS label of HOST>/PATH`, wss when the base is https. Keeping the host's first
  label keeps different websocket hosts apart and keeps what ccxt reads from
  the URL: ccxt.pro binance treats a connection as spot only if its URL
  contains `/stream`, which `stream.binance.com` provides.

Only strings that look like URLs are touched, nothing outside `urls['api']`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

_REST = ("http", "https")
_WS = ("ws", "wss")


def rewrite_url(url: str, rest_base: str, ws_base: str | None = None) -> str:
    """One URL per the rule; strings that are not http(s)/ws(s) URLs come back unchanged."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in _REST + _WS:
        return url
    authority, slash, tail = rest.partition("/")
    path = f"/{tail}" if slash else ""
    if scheme in _REST:
        base = urlsplit(rest_base)
        return f"{base.scheme}://{base.netloc}{base.path.rstrip('/')}{path}"
    base = urlsplit(ws_base or rest_base)
    ws_scheme = {"https": "wss", "http": "ws"}.get(base.scheme, base.scheme)
    host = authority.rsplit("@", 1)[-1].split(":", 1)[0]
    label = host.split(".", 1)[0]
    return f"{ws_scheme}://{base.netloc}{base.path.rstrip('/')}/{label}{path}"


def rewrite_api_urls(api: Any, rest_base: str, ws_base: str | None = None) -> Any:
    """A rewritten copy of ccxt's `urls['api']` (nested dicts, lists, strings)."""
    if isinstance(api, dict):
        return {key: rewrite_api_urls(value, rest_base, ws_base) for key, value in api.items()}
    if isinstance(api, list):
        return [rewrite_api_urls(value, rest_base, ws_base) for value in api]
    if isinstance(api, str):
        return rewrite_url(api, rest_base, ws_base)
    return api
