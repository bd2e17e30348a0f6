"""`ingestor` console script: load settings, run until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from pydantic import ValidationError

from ingestor import metrics
from ingestor.app import Ingestor
from ingestor.config import Settings, load_settings
from mdproto.runtime.metrics_http import MetricsServer


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("ccxt", "asyncio", "urllib3"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))


async def _serve(settings: Settings) -> None:
    ingestor = Ingestor(settings)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(ingestor.stop()))
    http: MetricsServer | None = None
    if settings.metrics_port:
        http = MetricsServer(
            settings.metrics_host,
            settings.metrics_port,
            metrics.registry_for(ingestor),
            lambda: metrics.health(ingestor),
            name="ingestor-metrics",
        )
        http.start()
    try:
        await ingestor.run()
    finally:
        if http is not None:
            http.close()


def main() -> int:
    try:
        settings = load_settings()
    except (ValidationError, FileNotFoundError) as exc:
        print(f"ingestor: bad configuration: {exc}", file=sys.stderr)
        return 2
    _setup_logging(os.environ.get("LOG_LEVEL", settings.log_level))
    asyncio.run(_serve(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
