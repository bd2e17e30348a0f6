"""``python -m pipeline.engine``: one more live engine process, without Spark (ADR 0014).

    python -m pipeline.engine [--config config.yaml] [--ready-file PATH]

It runs the live engine the pipeline's PUB process runs (engine 1), in the same
consumer group (``live.group_id``), so Kafka gives it a share of the
``market.ticks`` and ``market.book`` partitions. Its XPUB *connects* to every relay's
bound engine port (``live.relay_engine_endpoints``, the relay's ``engines_port``):
the relay receives from every engine and K changes with no relay or client setting.
The XPUB answers a relay's subscriptions with the last values of its own tickers,
as the pipeline's does (`pub_server.Outlet`). Its ``publisher_epoch`` is its own
(per start): a ticker that moves here shows its subscribers a new epoch.

The process ends (exit 1) when its engine fails, for its supervisor to restart it;
SIGTERM or SIGINT stop it cleanly (its partitions' state saved on the revoke).
With ``live.metrics_port`` set it serves its own ``GET /metrics`` and ``/healthz``
(`live_metrics`) on ``metrics_host``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

import zmq

from mdproto.runtime.metrics_http import MetricsServer
from pipeline import live_metrics
from pipeline.blobs import is_local
from pipeline.config import Settings, load_settings
from pipeline.live_engine import LiveEngine
from pipeline.pub_server import SUBSCRIPTION_CHECK_MS, Outlet, Sequencer, new_epoch, xpub_socket

log = logging.getLogger("pipeline.engine")


class EngineConfigError(ValueError):
    """The settings cannot run an extra engine."""


def serve(settings: Settings, stop: threading.Event, ready_file: Path | None = None) -> int:
    """Connect the XPUB, run the engine until `stop` or its failure; the exit code."""
    endpoints = settings.live.relay_engine_endpoints
    if not endpoints:
        raise EngineConfigError(
            "live.relay_engine_endpoints is empty: an extra engine publishes through the "
            "relays' engine ports (e.g. tcp://127.0.0.1:5561)"
        )
    if not (settings.live.enabled or settings.cep.enabled):
        raise EngineConfigError("live and cep are both off: this engine would have nothing to do")
    if not is_local(settings.checkpoint_dir):
        raise EngineConfigError(
            f"checkpoint_dir {settings.checkpoint_dir!r} is not local: an extra engine's own "
            "snapshot (its trigger set and cep.triggers offsets) is its process's, and "
            "engines sharing one config would overwrite each other's there; give each a "
            "local checkpoint_dir (its partitions' state is in live.state_location anyway)"
        )
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    xpub = xpub_socket(ctx, settings.pub_sndhwm)
    for endpoint in endpoints:
        xpub.connect(endpoint)
    outlet = Outlet(xpub, Sequencer(new_epoch()))
    engine = LiveEngine(settings, outlet.send_many, books=outlet)
    metrics = _serve_metrics(settings, engine)
    engine.start()
    try:
        engine.wait_assigned()
        if ready_file is not None:
            ready_file.write_text(str(os.getpid()))
        log.info(
            "live engine up: epoch %d, group %s, publishing to %s",
            outlet.sequencer.epoch,
            settings.live_group_id,
            ", ".join(endpoints),
        )
        while not stop.wait(SUBSCRIPTION_CHECK_MS / 1000):
            outlet.answer_subscriptions()
            if not engine.alive:
                log.error("live engine stopped: %s", engine.error)
                return 1
        return 0
    finally:
        engine.stop()
        ctx.destroy(linger=1000)
        if metrics is not None:
            metrics.close()


def _serve_metrics(settings: Settings, engine: LiveEngine) -> MetricsServer | None:
    """Its /metrics and /healthz on ``live.metrics_port`` (0: none); bound before the
    engine joins its group, so a port in use stops the start, not a running engine."""
    port = settings.live.metrics_port
    if not port:
        return None
    try:
        return live_metrics.serve(engine.metrics, lambda: engine.alive, settings.metrics_host, port)
    except OSError as exc:
        raise EngineConfigError(
            f"cannot serve /metrics on {settings.metrics_host}:{port} (live.metrics_port): {exc}"
        ) from exc


def stop_on_signals(logger: logging.Logger) -> threading.Event:
    """An event SIGTERM and SIGINT set (the process then stops cleanly, in its own time)."""
    stop = threading.Event()

    def _on_signal(signum: int, _frame: FrameType | None) -> None:
        logger.info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    return stop


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.engine", description=__doc__)
    parser.add_argument("--config", help="YAML config (default: $CONFIG_PATH, else built-ins)")
    parser.add_argument("--ready-file", type=Path, help="written once the group assigned us")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    stop = stop_on_signals(log)
    if args.ready_file is not None:
        # One left from before a container restart would report ready too early.
        args.ready_file.unlink(missing_ok=True)
    try:
        return serve(load_settings(args.config), stop, args.ready_file)
    except (EngineConfigError, RuntimeError) as exc:
        log.error("cannot run the live engine: %s", exc)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
