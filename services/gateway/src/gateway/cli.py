"""`gateway [--config FILE]`: serve the WebSocket/HTTP gateway until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from aiohttp import web

from gateway import config, metrics
from gateway.app import CHART_JS, create_app
from gateway.platform import SdkUpstream
from mdclient import Client, MdClientError
from mdproto.runtime.metrics_http import MetricsServer

log = logging.getLogger("gateway")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gateway", description=__doc__)
    parser.add_argument("--config", help="YAML file (default: $CONFIG_PATH, else built-ins)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        settings = config.load(args.config)
        client_settings = config.client_settings(settings)
    except (ValueError, FileNotFoundError) as exc:
        log.error("invalid configuration: %s", exc)
        return 2
    if settings.exposed_without_token():
        log.error(
            "refusing to serve on %s without a token: set GATEWAY_TOKEN (docs/protocol.md "
            "'Gateway'), or bind 127.0.0.1",
            settings.published_host or settings.host,
        )
        return 2
    if not CHART_JS.is_file():
        log.warning(
            "chart library missing (%s): the page cannot draw; `make gateway-assets`", CHART_JS
        )
    try:
        client = Client(settings=client_settings)
    except MdClientError as exc:
        log.error("cannot reach the platform: %s", exc.reason)
        return 3
    try:
        app = create_app(settings, SdkUpstream(client, settings.book_levels))
        if settings.metrics_port:
            MetricsServer(
                settings.metrics_host,
                settings.metrics_port,
                metrics.registry(app),
                lambda: metrics.health(app),
                name="gateway-metrics",
            ).start()
        log.info(
            "gateway on http://%s:%d (relay %s)",
            settings.host,
            settings.port,
            client_settings.request_address,
        )
        web.run_app(app, host=settings.host, port=settings.port, print=None)
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
