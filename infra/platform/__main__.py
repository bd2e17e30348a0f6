"""`python -m infra.platform run|stop|status` (what `make run` and `make stop` call).

`run` starts everything, waits for readiness, answers one real history request
through the `mdclient` CLI (rows printed, candlestick chart written), then keeps
the platform running until Ctrl-C, or stops at once with `--once`.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from infra.localstack.components import base_env
from infra.localstack.process import StackError
from infra.platform.config import PlatformConfig
from infra.platform.services import BIN
from infra.platform.supervisor import Platform, PlatformEndpoints
from ingestor.venues import venue_for


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def history_demo(
    endpoints: PlatformEndpoints, data_dir: Path, ticker: str, period: str, start: str
) -> int:
    """Ask for history exactly as a user would: through the mdclient CLI."""
    chart = data_dir / "charts" / f"{ticker.replace(':', '_').replace('/', '-')}-{period}.png"
    chart.parent.mkdir(parents=True, exist_ok=True)
    argv = [str(BIN / "mdclient"), "history", ticker, "--period", period, "--start", start]
    argv += ["--chart", str(chart)]
    _say(f"[platform] history request: {' '.join(argv[1:])}")
    env = {**base_env(), **endpoints.client_env()}
    t0 = time.monotonic()
    code = subprocess.call(argv, env=env)
    took = time.monotonic() - t0
    if code == 0:
        _say(f"[platform] answered from Iceberg in {took:.1f} s; chart: {chart}")
    else:
        _say(f"[platform] history request failed with exit code {code} after {took:.1f} s")
    return code


def _print_status(platform: Platform) -> None:
    print(f"{'component':<15} {'state':<15} {'pid':>8} {'RSS MiB':>8}  address")
    for s in platform.status():
        pid = str(s.pid) if s.pid is not None else "-"
        rss = f"{s.rss_bytes / 2**20:.0f}" if s.rss_bytes else "-"
        print(f"{s.name:<15} {s.state:<15} {pid:>8} {rss:>8}  {s.address}")


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM (e.g. from `make stop`) shuts down like Ctrl-C."""
    raise KeyboardInterrupt


def _wait_for_ctrl_c(platform: Platform) -> None:
    e = platform.endpoints
    _say(
        "\n[platform] running. Open the live chart in a browser:\n"
        f"  {e.gateway}/?ticker={platform.config.prefixes[0]}:BTC/USDT\n"
        "Or try, in another shell:\n"
        f"  .venv/bin/mdclient live {platform.config.prefixes[0]}:BTC/USDT --ticks"
        f"     (relay {e.request})\n"
        f"  curl -s {e.relay_metrics}/metrics | grep relay_\n"
        f"  logs: {platform.config.data_dir / 'logs'}\n"
        "Ctrl-C stops everything (or `make stop` from another shell)."
    )
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        while all(s.state == "running" for s in platform.status()):
            time.sleep(2)
        stopped = [s.name for s in platform.status() if s.state != "running"]
        _say(f"[platform] {', '.join(stopped)} stopped (see its log); shutting down")
    except KeyboardInterrupt:
        _say("\n[platform] stopping ...")


def default_start(exchange_id: str) -> str:
    """The demo request's start: the last 24 h, or less where the exchange serves only
    its latest entries (Kraken: 720 one-minute ones, so the last 10 h), so that
    `make run EXCHANGES=kraken` answers instead of refusing an older range."""
    return "-24h" if venue_for(exchange_id).history_entries is None else "-10h"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.platform", description=__doc__)
    parser.add_argument("command", choices=["run", "stop", "status"])
    parser.add_argument("--once", action="store_true", help="run: stop after the demo request")
    parser.add_argument("--ticker", help="default: <first exchange's prefix>:BTC/USDT")
    parser.add_argument("--period", default="1m")
    parser.add_argument("--start", help="history start (default: last 24 h; Kraken: 10 h)")
    args = parser.parse_args(argv)
    config = PlatformConfig()
    args.ticker = args.ticker or f"{config.prefixes[0]}:BTC/USDT"
    args.start = args.start or default_start(config.exchanges[0])

    if args.command != "run":
        platform = Platform(config, use_simulator=True)
        if args.command == "stop":
            platform.down()
        else:
            _print_status(platform)
        return 0

    try:
        platform = Platform(config)
    except StackError as exc:  # e.g. an exchange the simulator does not speak
        _say(f"[platform] ERROR: {exc}")
        return 1
    t0 = time.monotonic()
    try:
        endpoints = platform.up()
    except StackError as exc:
        _say(f"[platform] ERROR: {exc}")
        platform.down()
        return 1
    except KeyboardInterrupt:
        platform.down()
        return 130
    _say(f"[platform] every component ready in {time.monotonic() - t0:.0f} s")
    try:
        code = history_demo(endpoints, config.data_dir, args.ticker, args.period, args.start)
        if not args.once:
            _wait_for_ctrl_c(platform)
    except KeyboardInterrupt:
        code = 130
    finally:
        platform.down()
    return code


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
