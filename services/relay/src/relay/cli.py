"""`relay` console script: config from CONFIG_PATH, serve until SIGTERM/SIGINT.

`relay keys generate DIR NAME...` writes CURVE key pairs (docs/protocol.md, Security).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import IO

from pydantic import ValidationError

from relay import curve
from relay.app import Relay
from relay.config import config_path_from_env, load_settings
from relay.log_lines import BatchedLines, LineFormatter

log = logging.getLogger("relay")


def configure_logging(level: str | int, stream: IO[str] | None = None) -> BatchedLines:
    """Plain lines on stderr (or `stream`), written in batches by a thread (log_lines.py).

    The relay logs one line per forwarded request (the spec's INFO line), so the loop
    must not block on the stream or hand each record to another thread; call `close()`
    on the returned handler to write the rest before exiting. The format needs no
    thread, process or caller info, so none is collected (the last is
    `logging._srcfile`, the logging HOWTO's "Optimization" switch)."""
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging._srcfile = None
    handler = BatchedLines(stream or sys.stderr)
    handler.setFormatter(LineFormatter())
    logging.basicConfig(
        level=level.upper() if isinstance(level, str) else level, handlers=[handler], force=True
    )
    return handler


#: env_logger's levels (the spec's RUST_LOG) as Python's.
_RUST_LEVELS = {
    "trace": "DEBUG",
    "debug": "DEBUG",
    "info": "INFO",
    "warn": "WARNING",
    "error": "ERROR",
    "off": "CRITICAL",
}


def log_level(environ: Mapping[str, str]) -> tuple[str, str]:
    """(level, where it came from): LOG_LEVEL, else the spec's RUST_LOG, else INFO.

    RUST_LOG is env_logger syntax (`relay=info`, `warn`, `relay=debug,zmq=warn`):
    the `relay` directive, else a bare level, is used; anything else is named in
    the log rather than ignored without a word.
    """
    if environ.get("LOG_LEVEL"):
        return environ["LOG_LEVEL"].upper(), "LOG_LEVEL"
    rust = environ.get("RUST_LOG", "").strip()
    if not rust:
        return "INFO", "default"
    bare = None
    for directive in rust.split(","):
        target, _, level = directive.strip().rpartition("=")
        level = _RUST_LEVELS.get(level.strip().lower(), "")
        if target.strip() == "relay" and level:
            return level, "RUST_LOG"
        if not target and level:
            bare = level
    if bare:
        return bare, "RUST_LOG"
    return "INFO", f"default (RUST_LOG={rust!r} names no level for relay)"


def keys_main(argv: list[str]) -> int:
    """`relay keys generate DIR NAME...`: NAME.key (public) and NAME.key_secret per name."""
    parser = argparse.ArgumentParser(
        prog="relay keys",
        description="Generate CURVE key pairs with zmq.auth.create_certificates: give the "
        "relay its NAME.key_secret, copy each client's NAME.key into the relay's "
        "curve_client_keys_dir and the relay's NAME.key to the clients.",
    )
    parser.add_argument("action", choices=["generate"])
    parser.add_argument("directory", help="where the files go (created if missing)")
    parser.add_argument("names", nargs="+", metavar="NAME", help="e.g. relay alice")
    args = parser.parse_args(argv)
    for name in args.names:
        if (Path(args.directory) / f"{name}.key_secret").exists():
            print(f"{args.directory}/{name}.key_secret exists: not overwritten", file=sys.stderr)
            return 1
    for name in args.names:
        public, secret = curve.generate(args.directory, name)
        print(f"{name}: public {public}, secret {secret}")
    return 0


def main() -> int:
    if sys.argv[1:2] == ["keys"]:
        return keys_main(sys.argv[2:])
    level, source = log_level(os.environ)
    lines = configure_logging(level)
    try:
        log.info("log level %s (%s)", level, source)
        return serve()
    finally:
        lines.close()  # every kept line is written before the process exits


def serve() -> int:
    """Load the config, start the relay and run it until SIGTERM/SIGINT; the exit code."""
    path, explicit = config_path_from_env()
    try:
        settings = load_settings(path, required=explicit)
    except (OSError, ValueError, ValidationError) as exc:
        log.error("bad configuration (%s): %s", path, exc)
        return 2
    log.info("config: %s", path if path.exists() else "built-in defaults (no config file)")
    try:
        relay = Relay(settings)
    except curve.CurveConfigError as exc:
        log.error("%s", exc)
        return 2
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
