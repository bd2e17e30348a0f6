"""`relay` console script: config from CONFIG_PATH, serve until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import os
import signal
import sys
from types import FrameType
from typing import IO

from pydantic import ValidationError

from relay.app import Relay
from relay.config import config_path_from_env, load_settings

log = logging.getLogger("relay")


def configure_logging(level: str | int, stream: IO[str] | None = None) -> None:
    """Plain lines on stderr; the format needs no thread/process info, so skip collecting it
    (the relay logs one line per forwarded request: it adds up)."""
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging.basicConfig(
        level=level.upper() if isinstance(level, str) else level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=stream,
    )


def main() -> int:
    configure_logging(os.environ.get("LOG_LEVEL", "INFO"))
    path, explicit = config_path_from_env()
    try:
        settings = load_settings(path, required=explicit)
    except (OSError, ValueError, ValidationError) as exc:
        log.error("bad configuration (%s): %s", path, exc)
        return 2
    log.info("config: %s", path if path.exists() else "built-in defaults (no config file)")
    relay = Relay(settings)
    try:
        relay.start()
    except Exception as exc:
        log.error("relay failed to start: %r", exc)
        return 1

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("%s received: shutting down", signal.Signals(signum).name)
        relay.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        relay.run()
    finally:
        relay.close()
    log.info("shutdown complete")
    return 0


if __name__ == "__main__":
    sys.exit(main())
