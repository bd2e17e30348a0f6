"""Point an unmodified ccxt exchange object at the simulator.

Why a URL rewrite and not a ccxt subclass: the ingestor must run the very
same ccxt code against the simulator and a real exchange, so only
configuration changes. The rule, which the ingestor applies from its config:

Every string in ``exchange.urls['api']`` (a nested dict; a plain string is
handled too) that starts with ``http://``, ``https://``, ``ws://`` or
``wss://`` is rewritten; nothing else in ``exchange.urls`` is touched:

* REST (``http(s)://HOST[:PORT]/PATH``) -> ``<base>/PATH``: only scheme, host
  and port change, e.g. ``https://api.binance.com/api/v3`` ->
  ``http://127.0.0.1:8765/api/v3``, ``https://api.{hostname}`` (Coinbase) ->
  ``http://127.0.0.1:8765``.
* Websocket (``ws(s)://HOST[:PORT]/PATH``) -> ``ws://<base host:port>/<first
  DNS label of HOST>/PATH`` (``wss://`` if the base is https), e.g.
  ``wss://stream.binance.com:9443/ws`` -> ``ws://127.0.0.1:8765/stream/ws``.
  Keeping the host's first label in the path keeps websocket URLs of
  different hosts apart and preserves what ccxt reads from the URL: ccxt.pro
  binance treats a connection as spot only if its URL contains ``/stream``
  (``is_spot_url``), which the real host name ``stream.binance.com`` provides.

Call it before ``load_markets()``. Works for ccxt, ccxt.async_support and
ccxt.pro objects alike.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

_REST_SCHEMES = ("http", "https")
_WS_SCHEMES = ("ws", "wss")


def rewrite_url(url: str, base_url: str) -> str:
    """Rewrite one exchange URL per the module rule; other strings are returned unchanged."""
    base = urlsplit(base_url)
    if base.scheme not in _REST_SCHEMES or not base.netloc:
        raise ValueError(f"base_url must be http(s)://host:port, got {base_url!r}")
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in _REST_SCHEMES + _WS_SCHEMES:
        return url
    host_port, slash, path_query = rest.partition("/")
    path = "/" + path_query if slash else ""
    base_path = base.path.rstrip("/")
    if scheme in _REST_SCHEMES:
        return f"{base.scheme}://{base.netloc}{base_path}{path}"
    host = host_port.split("@")[-1].split(":")[0]
    label = host.split(".")[0]
    ws_scheme = "wss" if base.scheme == "https" else "ws"
    return urlunsplit((ws_scheme, base.netloc, "", "", "")) + f"{base_path}/{label}{path}"


def _rewrite(node: Any, base_url: str, changes: dict[str, str]) -> Any:
    if isinstance(node, str):
        new = rewrite_url(node, base_url)
        if new != node:
            changes[node] = new
        return new
    if isinstance(node, dict):
        return {key: _rewrite(value, base_url, changes) for key, value in node.items()}
    if isinstance(node, list):
        return [_rewrite(value, base_url, changes) for value in node]
    return node


def point_ccxt_at(exchange: Any, base_url: str) -> dict[str, str]:
    """Rewrite ``exchange.urls['api']`` in place to target ``base_url``.

    Returns the ``{old_url: new_url}`` mapping that was applied (handy for logs).
    The dict is replaced rather than mutated so class-level defaults shared by
    other instances of the same exchange stay untouched.
    """
    changes: dict[str, str] = {}
    urls = dict(exchange.urls)
    urls["api"] = _rewrite(urls.get("api"), base_url, changes)
    exchange.urls = urls
    return changes
